package joinservice

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"golang.org/x/time/rate"
)

func TestLogLimiter(t *testing.T) {
	peerA, peerB := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	type event struct {
		after  time.Duration // since the previous event
		key    logKey
		want   bool
		wantN  int // suppressed reported on a written line
		wantNO int // others reported on a written line
	}
	a := logKey{"handshake", "protocol", peerA}
	aJoin := logKey{"join", "disk-owned-by-other-node", peerA}
	b := logKey{"handshake", "protocol", peerB}
	testCases := map[string]struct {
		burst  int
		events []event
	}{
		"first occurrence logged, repeats suppressed, next after interval counts them": {
			burst: 100,
			events: []event{
				{key: a, want: true},
				{after: time.Second, key: a},
				{after: time.Second, key: a},
				{after: 9 * time.Second, key: a, want: true, wantN: 2},
				{after: time.Second, key: a},
			},
		},
		"keys are independent: another reason or peer is logged at once": {
			burst: 100,
			events: []event{
				{key: a, want: true},
				{key: aJoin, want: true},
				{key: b, want: true},
				{key: a},
			},
		},
		"global cap: new keys beyond the burst wait, and are counted": {
			burst: 2,
			events: []event{
				{key: a, want: true},
				{key: b, want: true},
				{key: aJoin},
				{key: aJoin},
				{after: time.Second, key: aJoin, want: true, wantN: 2},
			},
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			now := time.Unix(1_700_000_000, 0)
			l := newLogLimiter(10*time.Second, rate.Limit(1), tc.burst, func() time.Time { return now })
			for i, ev := range tc.events {
				now = now.Add(ev.after)
				d := l.allow(ev.key)
				assert.Equal(t, ev.want, d.write, "event %d", i)
				if ev.want {
					assert.Equal(t, ev.wantN, d.suppressed, "event %d", i)
					assert.Equal(t, ev.wantNO, d.other, "event %d", i)
				}
			}
		})
	}
}

// A flood from more addresses than the limiter tracks: memory stays bounded, the lines stay
// within the global budget, and the suppressed rejections are still reported.
func TestLogLimiterBounded(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	l := newLogLimiter(10*time.Second, rate.Limit(1), 100, func() time.Time { return now })
	written, reported := 0, 0
	const n = 3 * maxLogKeys
	for i := range n {
		d := l.allow(logKey{"handshake", "protocol", netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})})
		if d.write {
			written++
			reported += 1 + d.suppressed + d.other
		}
		assert.LessOrEqual(t, len(l.keys), maxLogKeys, fmt.Sprintf("after %d", i))
	}
	assert.Equal(t, 100, written, "the global burst, no more, at a fixed time")
	// Later, the next line carries what was dropped untracked.
	now = now.Add(time.Minute)
	d := l.allow(logKey{"handshake", "protocol", netip.MustParseAddr("10.255.255.255")})
	assert.True(t, d.write)
	reported += 1 + d.suppressed + d.other
	tracked := 0
	for _, st := range l.keys {
		tracked += st.suppressed
	}
	assert.Equal(t, n+1, reported+tracked+l.dropped, "every rejection is logged, reported or still pending")
}
