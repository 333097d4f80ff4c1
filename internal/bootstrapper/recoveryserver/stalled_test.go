package recoveryserver_test

import (
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/bootstrapper/bootstraptest"
	"github.com/openconstellation/constellation/internal/handshakelimit"
	"github.com/openconstellation/constellation/internal/handshakelimit/floodtest"
)

// While an attacker holds connections to a rebooted control plane that never complete TLS
// (from one address, and one each from many; half of them half a ClientHello), the operator
// still recovers the node: connections beyond the bounds are refused or displaced when
// accepted and keep no goroutine, and the stalled ones end at the handshake deadline.
func TestStalledConnectionsDoNotStopRecovery(t *testing.T) {
	const perPeer, total, timeout = 2, 8, 5 * time.Second
	e := newEnv(t, bootstraptest.RecoveryServerOptions{AcceptLimits: handshakelimit.AcceptLimits{PerPeer: perPeer, Total: total, Timeout: timeout}})
	accept := e.srv.Server.AcceptLimiter()
	baseline := runtime.NumGoroutine()

	locals := append(floodtest.Repeat("127.0.14.1", 40), floodtest.Locals("127.0.15.0", 20)...)
	flood, err := floodtest.StallAll(locals, e.srv.Addr, true)
	require.NoError(t, err)
	t.Cleanup(flood.Close)
	// Accepted in order: 40 from one address (all but perPeer refused), then 20 new peers, each
	// taking a slot from the largest holder once all are taken.
	require.Eventually(t, func() bool {
		return accept.Count(handshakelimit.AcceptPeerBusy) == 40-perPeer &&
			accept.Count(handshakelimit.AcceptDisplaced)+accept.Count(handshakelimit.AcceptBusy) == int64(perPeer+20-total)
	}, 30*time.Second, 10*time.Millisecond, "every connection decided on at accept")
	assert.Positive(t, accept.Count(handshakelimit.AcceptDisplaced), "many addresses: the largest holder made room")
	assert.LessOrEqual(t, accept.Pending(), total)
	assert.LessOrEqual(t, runtime.NumGoroutine(), baseline+total*4+10, "refused connections keep no goroutine")

	_, err = e.recover()
	require.NoError(t, err, "the operator recovers the node during the flood")
	e.assertRecovered()

	require.Eventually(t, func() bool { return flood.ClosedByServer(time.Millisecond) == len(locals) }, timeout+30*time.Second, 50*time.Millisecond)
	got := floodtest.Goroutines(baseline+5, 30*time.Second)
	assert.LessOrEqual(t, got, baseline+5, "goroutines back to the baseline (%d)", baseline)
	assert.Zero(t, accept.Pending())
}
