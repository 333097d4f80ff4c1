package initserver_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/bootstrapper/bootstraptest"
	"github.com/openconstellation/constellation/internal/handshakelimit"
	"github.com/openconstellation/constellation/internal/handshakelimit/floodtest"
	"github.com/openconstellation/constellation/pkg/atls"
	"github.com/openconstellation/constellation/pkg/attestation"
)

// An attacker holds connections to a fresh control plane that never complete TLS (from one
// address, and one each from many; half of them half a ClientHello). Beyond the bounds they
// are refused or displaced when accepted and keep no goroutine; the CLI's attested handshake
// goes through during the flood; the stalled connections end at the deadline, after which
// the node runs no more goroutines than before and the CLI initializes it.
func TestStalledConnectionsDoNotStopInit(t *testing.T) {
	const perPeer, total, timeout = 2, 8, 5 * time.Second
	e := newEnvWith(t, envOptions{accept: handshakelimit.AcceptLimits{PerPeer: perPeer, Total: total, Timeout: timeout}})
	accept := e.server.AcceptLimiter()
	baseline := runtime.NumGoroutine()

	locals := append(floodtest.Repeat("127.0.16.1", 40), floodtest.Locals("127.0.17.0", 20)...)
	flood, err := floodtest.StallAll(locals, e.addr, true)
	require.NoError(t, err)
	t.Cleanup(flood.Close)
	// Accepted in order: 40 from one address (all but perPeer refused), then 20 new peers,
	// each taking a slot from the largest holder once all are taken.
	require.Eventually(t, func() bool {
		return accept.Count(handshakelimit.AcceptPeerBusy) == 40-perPeer &&
			accept.Count(handshakelimit.AcceptDisplaced)+accept.Count(handshakelimit.AcceptBusy) == int64(perPeer+20-total)
	}, 30*time.Second, 10*time.Millisecond, "every connection decided on at accept")
	assert.Positive(t, accept.Count(handshakelimit.AcceptDisplaced))
	assert.LessOrEqual(t, runtime.NumGoroutine(), baseline+total*4+10, "refused connections keep no goroutine")

	cli, err := atls.NewCredentials(atls.Config{Validators: []attestation.Validator{bootstraptest.Validator(t, e.ca)}})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, floodtest.Handshake(ctx, cli, "127.0.16.200", e.addr), "the CLI verifies the node during the flood")

	require.Eventually(t, func() bool { return flood.ClosedByServer(time.Millisecond) == len(locals) }, timeout+30*time.Second, 50*time.Millisecond)
	got := floodtest.Goroutines(baseline+5, 30*time.Second)
	assert.LessOrEqual(t, got, baseline+5, "goroutines back to the baseline (%d)", baseline)
	assert.Zero(t, accept.Pending())

	req, _ := request(t)
	res := e.call(req)
	require.NoError(t, res.Err)
	require.NotNil(t, res.Success)
}
