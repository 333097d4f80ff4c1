package handshakelimit_test

import (
	"context"
	"math/rand/v2"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"

	"github.com/openconstellation/constellation/internal/handshakelimit"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func newClock() *clock { return &clock{t: time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)} }

func newLimiter(t *testing.T, l handshakelimit.Limits, c *clock) *handshakelimit.Limiter {
	t.Helper()
	lim, err := handshakelimit.New(l, c.now)
	require.NoError(t, err)
	return lim
}

var (
	peerA = netip.MustParseAddr("10.0.0.1")
	peerB = netip.MustParseAddr("10.0.0.2")
)

func TestRatePerPeer(t *testing.T) {
	c := newClock()
	l := newLimiter(t, handshakelimit.Limits{Rate: 1, Burst: 2, PerPeer: 10, Concurrent: 10, What: "join attempts"}, c)
	ctx := context.Background()
	for range 2 {
		release, err := l.AdmitAddr(ctx, peerA)
		require.NoError(t, err)
		release()
	}
	_, err := l.AdmitAddr(ctx, peerA)
	require.ErrorIs(t, err, handshakelimit.ErrRateLimited)
	assert.Equal(t, "rate-limited", handshakelimit.Reason(err))
	assert.ErrorContains(t, err, "too many join attempts from 10.0.0.1 (limit 1/s, burst 2); retry later")

	release, err := l.AdmitAddr(ctx, peerB)
	require.NoError(t, err, "peers have separate buckets")
	release()

	c.t = c.t.Add(time.Second)
	release, err = l.AdmitAddr(ctx, peerA)
	require.NoError(t, err, "the bucket refills with the injected clock")
	release()
	_, err = l.AdmitAddr(ctx, peerA)
	require.ErrorIs(t, err, handshakelimit.ErrRateLimited)
}

func TestConcurrencyPerPeerAndGlobal(t *testing.T) {
	c := newClock()
	l := newLimiter(t, handshakelimit.Limits{Rate: rate.Inf, Burst: 1, PerPeer: 2, Concurrent: 3}, c)
	ctx := context.Background()
	a1, err := l.AdmitAddr(ctx, peerA)
	require.NoError(t, err)
	a2, err := l.AdmitAddr(ctx, peerA)
	require.NoError(t, err)
	_, err = l.AdmitAddr(ctx, peerA)
	require.ErrorIs(t, err, handshakelimit.ErrPeerBusy)
	assert.Equal(t, "peer-busy", handshakelimit.Reason(err))
	assert.ErrorContains(t, err, "10.0.0.1 already has 2 handshakes in progress (limit 2)")

	b1, err := l.AdmitAddr(ctx, peerB)
	require.NoError(t, err)
	// Three working, none may wait: a fourth peer is refused at once.
	_, err = l.AdmitAddr(ctx, netip.MustParseAddr("10.0.0.3"))
	require.ErrorIs(t, err, handshakelimit.ErrBusy)
	assert.Equal(t, "busy", handshakelimit.Reason(err))
	assert.Equal(t, 3, l.InProgress())

	a1()
	a1() // a second release changes nothing
	assert.Equal(t, 2, l.InProgress())
	a3, err := l.AdmitAddr(ctx, peerA)
	require.NoError(t, err, "a released slot is free again, for the peer and globally")
	for _, r := range []func(){a2, a3, b1} {
		r()
	}
	assert.Zero(t, l.InProgress())
}

// Beyond Concurrent, up to Waiting attempts wait for a slot (no work done yet); an attempt
// whose deadline passes gives up and leaves no trace.
func TestWaiting(t *testing.T) {
	l := newLimiter(t, handshakelimit.Limits{Rate: rate.Inf, Burst: 1, PerPeer: 5, Concurrent: 1, Waiting: 1}, newClock())
	first, err := l.AdmitAddr(context.Background(), peerA)
	require.NoError(t, err)

	got := make(chan func(), 1)
	go func() {
		release, err := l.AdmitAddr(context.Background(), peerB)
		assert.NoError(t, err)
		got <- release
	}()
	require.Eventually(t, func() bool { return l.InProgress() == 2 }, 10*time.Second, time.Millisecond)
	_, err = l.AdmitAddr(context.Background(), netip.MustParseAddr("10.0.0.3"))
	require.ErrorIs(t, err, handshakelimit.ErrBusy, "the waiting room is full")
	select {
	case <-got:
		t.Fatal("a waiter got a slot while the only slot was held")
	default:
	}
	first()
	(<-got)()

	hold, err := l.AdmitAddr(context.Background(), peerA)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = l.AdmitAddr(ctx, peerB)
	require.ErrorIs(t, err, handshakelimit.ErrBusy)
	require.ErrorIs(t, err, context.Canceled)
	hold()
	assert.Zero(t, l.InProgress())
}

func TestPeerKey(t *testing.T) {
	for in, want := range map[string]string{
		"192.0.2.7":            "192.0.2.7/32",
		"::ffff:192.0.2.7":     "192.0.2.7/32",
		"2001:db8:1:2:3:4:5:6": "2001:db8:1:2::/64",
		"2001:db8:1:2:ffff::1": "2001:db8:1:2::/64",
		"fe80::1%eth0":         "fe80::/64",
	} {
		assert.Equal(t, want, handshakelimit.PeerKey(netip.MustParseAddr(in)).String(), in)
	}
	assert.False(t, handshakelimit.PeerKey(netip.Addr{}).IsValid())

	// One host spreading attempts over its /64 is one peer.
	l := newLimiter(t, handshakelimit.Limits{Rate: 1, Burst: 1, PerPeer: 1, Concurrent: 1}, newClock())
	r, err := l.AdmitAddr(context.Background(), netip.MustParseAddr("2001:db8::1"))
	require.NoError(t, err)
	r()
	_, err = l.AdmitAddr(context.Background(), netip.MustParseAddr("2001:db8::2"))
	require.ErrorIs(t, err, handshakelimit.ErrRateLimited)
	assert.ErrorContains(t, err, "from 2001:db8::/64")
}

func TestAddrOf(t *testing.T) {
	assert.Equal(t, "127.0.0.9", handshakelimit.AddrOf(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 9), Port: 1}).String())
	assert.Equal(t, "2001:db8::1", handshakelimit.AddrOf(&net.UDPAddr{IP: net.ParseIP("2001:db8::1")}).String())
	assert.Equal(t, "192.0.2.1", handshakelimit.AddrOf(stringAddr("192.0.2.1:443")).String())
	assert.False(t, handshakelimit.AddrOf(stringAddr("pipe")).IsValid())
	assert.False(t, handshakelimit.AddrOf(nil).IsValid())
}

type stringAddr string

func (s stringAddr) Network() string { return "test" }
func (s stringAddr) String() string  { return string(s) }

// An attacker with many addresses cannot grow the table without bound; the most recent
// peers keep their state.
func TestTableBounded(t *testing.T) {
	c := newClock()
	l := newLimiter(t, handshakelimit.Limits{Rate: 1, Burst: 1, PerPeer: 1, Concurrent: 1}, c)
	ctx := context.Background()
	for i := range handshakelimit.MaxTrackedPeers {
		c.t = c.t.Add(time.Microsecond)
		r, err := l.AdmitAddr(ctx, netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}))
		require.NoError(t, err)
		r()
	}
	require.Equal(t, handshakelimit.MaxTrackedPeers, l.Tracked())
	r, err := l.AdmitAddr(ctx, netip.MustParseAddr("192.0.2.1"))
	require.NoError(t, err)
	r()
	assert.Less(t, l.Tracked(), handshakelimit.MaxTrackedPeers, "memory stays bounded")
	// The most recent peer keeps its (empty) bucket.
	_, err = l.AdmitAddr(ctx, netip.AddrFrom4([4]byte{10, 0, 255, 255}))
	assert.ErrorIs(t, err, handshakelimit.ErrRateLimited)
}

func TestLimitsValidate(t *testing.T) {
	_, err := handshakelimit.New(handshakelimit.Limits{Rate: 0, Burst: 0, PerPeer: 0, Concurrent: 0, Waiting: -1}, nil)
	require.Error(t, err)
	for _, want := range []string{"rate 0 per second: must be positive", "burst 0: must be at least 1", "per-peer concurrency 0", "concurrency 0", "waiting -1: must be at least 0"} {
		assert.ErrorContains(t, err, want)
	}
}

func TestLimitsOr(t *testing.T) {
	defaults := handshakelimit.Limits{Rate: 1, Burst: 5, PerPeer: 2, Concurrent: 16, Waiting: 256, What: "join attempts"}
	assert.Equal(t, defaults, handshakelimit.Limits{}.Or(defaults), "nothing set: the defaults")
	set := handshakelimit.Limits{Rate: 3, Burst: 7, PerPeer: 1, Concurrent: 4, Waiting: 8, What: "tests"}
	assert.Equal(t, set, set.Or(defaults), "everything set: nothing taken")
	assert.Equal(t, handshakelimit.Limits{Rate: 1, Burst: 9, PerPeer: 2, Concurrent: 16, Waiting: 256, What: "join attempts"},
		handshakelimit.Limits{Rate: -1, Burst: 9, Waiting: -3}.Or(defaults), "negative is unset")
}

// A small table full of peers that all have attempts in progress: nothing can be forgotten,
// so a new peer is refused (not inserted); known peers go on, and once a peer is idle a new
// one takes its place.
func TestTableFullOfBusyPeersRefusesNewPeers(t *testing.T) {
	c := newClock()
	l := newLimiter(t, handshakelimit.Limits{Rate: rate.Every(time.Hour), Burst: 5, PerPeer: 2, Concurrent: 10, MaxPeers: 3}, c)
	ctx := context.Background()
	releases := map[string]func(){}
	for _, ip := range []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"} {
		r, err := l.AdmitAddr(ctx, netip.MustParseAddr(ip))
		require.NoError(t, err)
		releases[ip] = r
	}
	_, err := l.AdmitAddr(ctx, netip.MustParseAddr("10.0.0.4"))
	require.ErrorIs(t, err, handshakelimit.ErrTableFull)
	assert.Equal(t, "peer-table-full", handshakelimit.Reason(err))
	assert.ErrorContains(t, err, "3 peers with handshakes in progress (limit 3)")
	assert.Equal(t, 3, l.Tracked(), "the table keeps its bound")

	again, err := l.AdmitAddr(ctx, netip.MustParseAddr("10.0.0.1"))
	require.NoError(t, err, "a tracked peer is not affected")
	again()

	releases["10.0.0.1"]()
	r, err := l.AdmitAddr(ctx, netip.MustParseAddr("10.0.0.4"))
	require.NoError(t, err, "an idle peer is forgotten for the new one")
	r()
	assert.Equal(t, 3, l.Tracked())
	releases["10.0.0.2"]()
	releases["10.0.0.3"]()
	assert.Zero(t, l.InProgress())
}

// The busy peers are the oldest, so the idle ones are all newer than the mean last-seen time:
// one of them is still forgotten for a new peer, and the table does not grow.
func TestTableForgetsIdlePeersNewerThanBusyOnes(t *testing.T) {
	c := newClock()
	l := newLimiter(t, handshakelimit.Limits{Rate: rate.Every(time.Hour), Burst: 5, PerPeer: 2, Concurrent: 10, MaxPeers: 4}, c)
	ctx := context.Background()
	var held []func()
	for _, ip := range []string{"10.0.0.1", "10.0.0.2"} {
		r, err := l.AdmitAddr(ctx, netip.MustParseAddr(ip))
		require.NoError(t, err)
		held = append(held, r)
	}
	c.t = c.t.Add(time.Minute)
	for _, ip := range []string{"10.0.0.3", "10.0.0.4"} {
		r, err := l.AdmitAddr(ctx, netip.MustParseAddr(ip))
		require.NoError(t, err)
		r()
	}
	r, err := l.AdmitAddr(ctx, netip.MustParseAddr("10.0.0.5"))
	require.NoError(t, err)
	r()
	assert.Equal(t, 4, l.Tracked())
	for _, r := range held {
		r()
	}
}

// Under any mix of peers and attempts (many new peers, some returning, attempts held and
// released in any order), the table never exceeds its bound.
func TestTableBoundedUnderAnyMix(t *testing.T) {
	c := newClock()
	const maxPeers = 8
	// More may be in progress than the table holds, so it can fill with busy peers.
	l := newLimiter(t, handshakelimit.Limits{Rate: rate.Every(time.Minute), Burst: 3, PerPeer: 2, Concurrent: 12, MaxPeers: maxPeers}, c)
	rng := rand.New(rand.NewPCG(3, 4))
	var held []func()
	refused := map[string]int{}
	for i := range 20000 {
		c.t = c.t.Add(time.Duration(rng.IntN(1000)) * time.Millisecond)
		if rng.IntN(3) > 0 || len(held) == 0 {
			addr := netip.AddrFrom4([4]byte{10, 0, byte(rng.IntN(4)), byte(rng.IntN(64))})
			r, err := l.AdmitAddr(context.Background(), addr)
			if err != nil {
				refused[handshakelimit.Reason(err)]++
			} else {
				held = append(held, r)
			}
		} else {
			k := rng.IntN(len(held))
			held[k]()
			held = append(held[:k], held[k+1:]...)
		}
		require.LessOrEqual(t, l.Tracked(), maxPeers, "step %d", i)
	}
	for _, r := range held {
		r()
	}
	assert.Zero(t, l.InProgress())
	assert.Positive(t, refused["peer-table-full"], "the mix reached a full table of busy peers: %v", refused)
}
