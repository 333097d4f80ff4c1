package handshakelimit_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/handshakelimit"
)

// fakeConn is an accepted connection from a chosen address; it records its Close.
type fakeConn struct {
	net.Conn // nil: only the methods below are used
	remote   net.Addr
	closed   chan struct{}
}

func newFakeConn(ip string, port int) *fakeConn {
	return &fakeConn{remote: &net.TCPAddr{IP: net.ParseIP(ip), Port: port}, closed: make(chan struct{})}
}

func (c *fakeConn) RemoteAddr() net.Addr { return c.remote }
func (c *fakeConn) LocalAddr() net.Addr  { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 443} }
func (c *fakeConn) Close() error {
	select {
	case <-c.closed:
	default:
		close(c.closed)
	}
	return nil
}

func (c *fakeConn) isClosed() bool {
	select {
	case <-c.closed:
		return true
	default:
		return false
	}
}

// fakeListener hands out queued connections; with none queued Accept fails with errEmpty, so
// a test sees a refusal as Accept returning errEmpty (the refused connection was consumed).
type fakeListener struct{ queue chan net.Conn }

var errEmpty = errors.New("no connection queued")

func (l *fakeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.queue:
		return c, nil
	default:
		return nil, errEmpty
	}
}
func (l *fakeListener) Close() error   { return nil }
func (l *fakeListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 443} }

// acceptEnv offers fake connections to an AcceptLimiter's listener.
type acceptEnv struct {
	t        *testing.T
	lim      *handshakelimit.AcceptLimiter
	inner    *fakeListener
	ln       net.Listener
	observed chan string
	port     int
}

func newAcceptEnv(t *testing.T, limits handshakelimit.AcceptLimits) *acceptEnv {
	e := &acceptEnv{t: t, inner: &fakeListener{queue: make(chan net.Conn, 1)}, observed: make(chan string, 1024)}
	var err error
	e.lim, err = handshakelimit.NewAcceptLimiter(limits, func(remote netip.Addr, outcome string) {
		e.observed <- remote.String() + " " + outcome
	})
	require.NoError(t, err)
	e.ln = e.lim.Listener(e.inner)
	return e
}

// offer offers one connection from ip: it returns the pending connection the server gets, or
// nil when the limiter refused (and closed) it.
func (e *acceptEnv) offer(ip string) (*fakeConn, net.Conn) {
	e.port++
	c := newFakeConn(ip, e.port)
	e.inner.queue <- c
	got, err := e.ln.Accept()
	if errors.Is(err, errEmpty) {
		require.True(e.t, c.isClosed(), "a refused connection is closed at once")
		return c, nil
	}
	require.NoError(e.t, err)
	return c, got
}

func (e *acceptEnv) next() string {
	select {
	case o := <-e.observed:
		return o
	case <-time.After(30 * time.Second):
		e.t.Fatal("no outcome observed")
		return ""
	}
}

const longTimeout = time.Hour // tests that do not wait for the deadline

func TestAcceptPerPeer(t *testing.T) {
	e := newAcceptEnv(t, handshakelimit.AcceptLimits{PerPeer: 2, Total: 10, Timeout: longTimeout})
	_, a1 := e.offer("192.0.2.1")
	_, a2 := e.offer("192.0.2.1")
	require.NotNil(t, a1)
	require.NotNil(t, a2)
	raw, a3 := e.offer("192.0.2.1")
	assert.Nil(t, a3, "a third pending connection from one peer is refused")
	assert.True(t, raw.isClosed())
	assert.Equal(t, "192.0.2.1 peer-busy", e.next())
	assert.EqualValues(t, 1, e.lim.Count(handshakelimit.AcceptPeerBusy))

	_, b := e.offer("192.0.2.2")
	require.NotNil(t, b, "another peer is accepted")
	// One IPv6 host spreading connections over its /64 is one peer.
	_, v1 := e.offer("2001:db8::1")
	_, v2 := e.offer("2001:db8::2")
	require.NotNil(t, v1)
	require.NotNil(t, v2)
	_, v3 := e.offer("2001:db8::ffff")
	assert.Nil(t, v3)
	assert.Equal(t, "2001:db8::ffff peer-busy", e.next())
	assert.Equal(t, 5, e.lim.Pending())
	assert.Equal(t, 3, e.lim.Tracked())

	// A handshake that finished and a closed connection free their peer's slots.
	e.lim.Established(a1)
	e.lim.Established(a1) // a second time changes nothing
	require.NoError(t, a2.Close())
	assert.Equal(t, 3, e.lim.Pending())
	_, a4 := e.offer("192.0.2.1")
	require.NotNil(t, a4)
	assert.Equal(t, 4, e.lim.Pending())
}

// When all slots are taken, a peer with fewer pending connections displaces the oldest one
// of a peer with more; a peer that holds as many as any other is refused.
func TestAcceptDisplacesTheLargestHolders(t *testing.T) {
	e := newAcceptEnv(t, handshakelimit.AcceptLimits{PerPeer: 3, Total: 4, Timeout: longTimeout})
	attacker := make([]*fakeConn, 3)
	for i := range attacker {
		var pc net.Conn
		attacker[i], pc = e.offer("198.51.100.1")
		require.NotNil(t, pc)
	}
	b1Raw, b1 := e.offer("192.0.2.2")
	require.NotNil(t, b1)
	require.Equal(t, 4, e.lim.Pending())

	_, c1 := e.offer("192.0.2.3")
	require.NotNil(t, c1, "a peer with no pending connection gets a slot")
	assert.True(t, attacker[0].isClosed(), "the largest holder's oldest connection made room")
	assert.False(t, attacker[1].isClosed())
	assert.Equal(t, "198.51.100.1 displaced", e.next())

	_, b2 := e.offer("192.0.2.2")
	require.NotNil(t, b2, "1 pending < the attacker's 2")
	assert.True(t, attacker[1].isClosed())
	assert.Equal(t, "198.51.100.1 displaced", e.next())

	// Now 192.0.2.2 holds 2, the others 1 each: nobody holds more than it.
	raw, b3 := e.offer("192.0.2.2")
	assert.Nil(t, b3)
	assert.True(t, raw.isClosed())
	assert.Equal(t, "192.0.2.2 busy", e.next())
	assert.False(t, attacker[2].isClosed())
	// The shares even out: the attacker's 1 < 192.0.2.2's 2, whose oldest goes.
	_, a := e.offer("198.51.100.1")
	require.NotNil(t, a)
	assert.Equal(t, "192.0.2.2 displaced", e.next())
	assert.True(t, b1Raw.isClosed())
	assert.Equal(t, 4, e.lim.Pending())
	assert.EqualValues(t, 3, e.lim.Count(handshakelimit.AcceptDisplaced))
	assert.EqualValues(t, 1, e.lim.Count(handshakelimit.AcceptBusy))
}

// A connection still pending at the deadline is closed; one whose handshake finished is not.
func TestAcceptTimeout(t *testing.T) {
	e := newAcceptEnv(t, handshakelimit.AcceptLimits{PerPeer: 4, Total: 4, Timeout: 200 * time.Millisecond})
	doneRaw, done := e.offer("192.0.2.1")
	require.NotNil(t, done)
	e.lim.Established(done)
	// Accepted after done: its deadline comes after done's would have.
	stalledRaw, stalled := e.offer("192.0.2.1")
	require.NotNil(t, stalled)
	assert.Equal(t, "192.0.2.1 timeout", e.next())
	require.Eventually(t, stalledRaw.isClosed, 30*time.Second, time.Millisecond, "closed right after it was reported")
	assert.False(t, doneRaw.isClosed(), "an established connection outlives the deadline")
	assert.Zero(t, e.lim.Pending())
	assert.Zero(t, e.lim.Tracked())
	assert.EqualValues(t, 1, e.lim.Count(handshakelimit.AcceptTimeout))
}

// Closing the listener (a server stopping) closes the connections still pending.
func TestAcceptListenerClose(t *testing.T) {
	e := newAcceptEnv(t, handshakelimit.AcceptLimits{PerPeer: 4, Total: 4, Timeout: longTimeout})
	pendingRaw, pending := e.offer("192.0.2.1")
	require.NotNil(t, pending)
	doneRaw, done := e.offer("192.0.2.1")
	require.NotNil(t, done)
	e.lim.Established(done)
	require.NoError(t, e.ln.Close())
	assert.True(t, pendingRaw.isClosed())
	assert.False(t, doneRaw.isClosed(), "an established connection is the server's to close")
	assert.Zero(t, e.lim.Pending())
}

// Under any mix of peers, arrivals, finished handshakes and closes, the table of peers never
// holds more than Total entries, and its counts add up.
func TestAcceptTableBounded(t *testing.T) {
	const total = 16
	e := newAcceptEnv(t, handshakelimit.AcceptLimits{PerPeer: 3, Total: total, Timeout: longTimeout})
	rng := rand.New(rand.NewPCG(1, 2))
	var open []net.Conn
	for i := range 20000 {
		switch op := rng.IntN(10); {
		case op < 7 || len(open) == 0:
			// Mostly new peers (a flood from many addresses), some repeated ones.
			ip := fmt.Sprintf("10.%d.%d.%d", rng.IntN(4), rng.IntN(256), rng.IntN(256))
			if rng.IntN(3) == 0 {
				ip = fmt.Sprintf("192.0.2.%d", rng.IntN(4))
			}
			if _, pc := e.offer(ip); pc != nil {
				open = append(open, pc)
			}
		case op < 9:
			k := rng.IntN(len(open))
			e.lim.Established(open[k])
			open = append(open[:k], open[k+1:]...)
		default:
			k := rng.IntN(len(open))
			require.NoError(t, open[k].Close())
			open = append(open[:k], open[k+1:]...)
		}
		require.LessOrEqual(t, e.lim.Tracked(), total, "step %d", i)
		require.LessOrEqual(t, e.lim.Pending(), total, "step %d", i)
		require.LessOrEqual(t, e.lim.Tracked(), e.lim.Pending(), "step %d: only peers with pending connections are tracked", i)
		for len(e.observed) > 0 {
			<-e.observed
		}
	}
	for _, c := range open {
		e.lim.Established(c)
	}
	assert.Zero(t, e.lim.Tracked())
	assert.Zero(t, e.lim.Pending())
}

func TestAcceptLimitsValidate(t *testing.T) {
	_, err := handshakelimit.NewAcceptLimiter(handshakelimit.AcceptLimits{PerPeer: 0, Total: handshakelimit.MaxTrackedPeers + 1}, nil)
	require.Error(t, err)
	for _, want := range []string{"pending connections per peer 0: must be at least 1", "pending connections 65537: must be 1..65536", "handshake timeout 0s: must be positive"} {
		assert.ErrorContains(t, err, want)
	}
	defaults := handshakelimit.AcceptLimits{PerPeer: 4, Total: 1024, Timeout: time.Second}
	assert.Equal(t, defaults, handshakelimit.AcceptLimits{}.Or(defaults))
	assert.Equal(t, handshakelimit.AcceptLimits{PerPeer: 1, Total: 1024, Timeout: time.Minute},
		handshakelimit.AcceptLimits{PerPeer: 1, Total: -1, Timeout: time.Minute}.Or(defaults))
}
