package joinservice_test

import (
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/handshakelimit"
	"github.com/openconstellation/constellation/internal/handshakelimit/floodtest"
)

const rejections = "constellation_joinservice_rejections_total"

// goroutinesSlack absorbs what the test process starts and ends by itself meanwhile (gRPC
// and HTTP/2 client connections winding down, the API server client's watchers).
const goroutinesSlack = 10

// An attacker opens many TCP connections from one address and never completes TLS (half of
// them send half a ClientHello and stop). Beyond the per-peer bound they are refused when
// accepted: closed at once, counted, and they keep no goroutine. A node from another address
// gets its ticket meanwhile.
func TestStalledConnectionsFromOnePeer(t *testing.T) {
	const perPeer, n = 4, 300
	// A deadline far beyond the test: every connection closed here was refused.
	e := newEnv(t, envOptions{accept: handshakelimit.AcceptLimits{PerPeer: perPeer, Total: 64, Timeout: 10 * time.Minute}})
	_, err := e.join(e.joiner("worker-0", "127.0.0.10"), false)
	require.NoError(t, err)
	baseline := runtime.NumGoroutine()

	flood, err := floodtest.StallAll(floodtest.Repeat("127.0.60.1", n), e.addr, true)
	require.NoError(t, err)
	t.Cleanup(flood.Close)
	require.Eventually(t, func() bool {
		return e.counter(rejections, "stage", "accept", "reason", "peer-busy") == n-perPeer
	}, 30*time.Second, 10*time.Millisecond, "all but %d refused at accept", perPeer)
	// Accepted in the order they were opened: the first perPeer are pending, the others were
	// closed when refused.
	refused := &floodtest.Stalled{Open: flood.Open[perPeer:], ResetAtDial: flood.ResetAtDial}
	assert.Equal(t, n-perPeer, refused.ClosedByServer(30*time.Second))
	for i, c := range flood.Open[:perPeer] {
		assert.False(t, floodtest.Closed(c, 50*time.Millisecond), "pending connection %d is open until its deadline", i)
	}
	assert.LessOrEqual(t, runtime.NumGoroutine(), baseline+perPeer*4+goroutinesSlack, "refused connections keep no goroutine")

	_, err = e.join(e.joiner("worker-1", "127.0.0.11"), false)
	require.NoError(t, err, "a node from another address is served during the flood")
	assert.Zero(t, e.counter(rejections, "stage", "accept", "reason", "busy"))
}

// An attacker with many addresses (100, three connections each, half ClientHellos) fills
// the bound on pending connections. A new peer displaces the oldest connection of the
// largest holder instead of being refused, so a node still gets its ticket; the attacker's
// connections beyond the bound cost nothing.
func TestStalledConnectionsFromManyPeers(t *testing.T) {
	const total, peers, each = 32, 100, 3
	e := newEnv(t, envOptions{accept: handshakelimit.AcceptLimits{PerPeer: 4, Total: total, Timeout: 10 * time.Minute}})
	_, err := e.join(e.joiner("worker-0", "127.0.0.10"), false)
	require.NoError(t, err)
	baseline := runtime.NumGoroutine()

	var locals []string
	for _, local := range floodtest.Locals("127.0.70.0", peers) {
		locals = append(locals, floodtest.Repeat(local, each)...)
	}
	flood, err := floodtest.StallAll(locals, e.addr, true)
	require.NoError(t, err)
	t.Cleanup(flood.Close)
	closedAtAccept := func() float64 {
		return e.counter(rejections, "stage", "accept", "reason", "busy") + e.counter(rejections, "stage", "accept", "reason", "displaced")
	}
	require.Eventually(t, func() bool { return closedAtAccept() == peers*each-total }, 30*time.Second, 10*time.Millisecond,
		"%d pending, the rest refused or displaced", total)
	assert.Positive(t, e.counter(rejections, "stage", "accept", "reason", "displaced"), "new peers displaced the largest holders")
	assert.Equal(t, peers*each-total, flood.ClosedByServer(50*time.Millisecond), "the displaced and refused connections are closed")
	assert.LessOrEqual(t, runtime.NumGoroutine(), baseline+total*4+goroutinesSlack)

	displaced := e.counter(rejections, "stage", "accept", "reason", "displaced")
	_, err = e.join(e.joiner("worker-1", "127.0.0.11"), false)
	require.NoError(t, err, "a node is served while the attacker holds every slot")
	assert.Equal(t, displaced+1, e.counter(rejections, "stage", "accept", "reason", "displaced"), "its connection took an attacker's slot")
}

// Stalled connections end at the handshake deadline: afterwards the service runs no more
// goroutines than before the flood (from one address and from many).
func TestStalledConnectionsEndAtTheDeadline(t *testing.T) {
	const timeout = 2 * time.Second
	e := newEnv(t, envOptions{accept: handshakelimit.AcceptLimits{PerPeer: 4, Total: 64, Timeout: timeout}})
	_, err := e.join(e.joiner("worker-0", "127.0.0.10"), false)
	require.NoError(t, err)
	baseline := runtime.NumGoroutine()

	locals := floodtest.Repeat("127.0.80.1", 50)
	locals = append(locals, floodtest.Locals("127.0.81.0", 200)...)
	flood, err := floodtest.StallAll(locals, e.addr, true)
	require.NoError(t, err)
	t.Cleanup(flood.Close)
	require.Eventually(t, func() bool { return flood.ClosedByServer(time.Millisecond) == len(locals) }, timeout+30*time.Second, 50*time.Millisecond,
		"every stalled connection is closed once its deadline passed")
	got := floodtest.Goroutines(baseline+goroutinesSlack/2, 30*time.Second)
	assert.LessOrEqual(t, got, baseline+goroutinesSlack/2, "goroutines back to the baseline (%d)", baseline)
	assert.Positive(t, e.counter(rejections, "stage", "accept", "reason", "timeout"), "closed at the deadline")

	_, err = e.join(e.joiner("worker-1", "127.0.80.1"), false)
	require.NoError(t, err, "the flooding address is served again once its connections ended")
}
