package joinservice_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/handshakelimit"
	"github.com/openconstellation/constellation/internal/handshakelimit/floodtest"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/qemu"
)

// heldIssuer wraps the service's issuer so that its quotes are counted and held until the
// test lets them go.
func heldIssuer() (*floodtest.Issuer, func(attestation.Issuer) attestation.Issuer) {
	iss := &floodtest.Issuer{Hold: make(chan struct{})}
	return iss, func(inner attestation.Issuer) attestation.Issuer {
		iss.Issuer = inner
		return iss
	}
}

// An attacker without a TPM opens many handshakes at once from one address, each demanding
// the service's evidence: beyond the per-peer bound they are refused before the service
// quotes, and counted.
func TestFloodFromOnePeerCostsNoQuotes(t *testing.T) {
	iss, wrap := heldIssuer()
	// The accept-time bound lets all of them reach the handshake: this is step 1's test.
	e := newEnv(t, envOptions{perPeer: 2, wrapIssuer: wrap, accept: handshakelimit.AcceptLimits{PerPeer: 16}})
	const n = 10
	done := make(chan []error, 1)
	go func() {
		done <- floodtest.Flood(floodtest.Attacker(qemu.Variant), e.addr, floodtest.Repeat("127.0.0.77", n), time.Minute)
	}()
	require.Eventually(t, func() bool {
		return e.counter("constellation_joinservice_rejections_total", "stage", "handshake", "reason", "peer-busy") == n-2 && iss.InFlight() == 2
	}, 30*time.Second, 10*time.Millisecond, "two handshakes quote, the other %d are refused", n-2)
	assert.Equal(t, 2, iss.Issued(), "quotes made for the flood")
	close(iss.Hold)

	refused := 0
	for _, err := range <-done {
		require.Error(t, err, "the attacker's garbage evidence never passes")
		if strings.Contains(err.Error(), "127.0.0.77 already has 2 join attempts in progress (limit 2)") {
			refused++
		}
	}
	assert.Equal(t, n-2, refused)
	assert.Equal(t, 2, iss.Issued(), "no quote after the flood either")
	// The peer is served again once its handshakes ended.
	_, err := e.join(e.joiner("worker-0", "127.0.0.77"), false)
	require.NoError(t, err)
}

// An attacker with many addresses: beyond the global bound (working plus waiting) handshakes
// are refused before the service quotes.
func TestFloodFromManyPeersIsBoundedGlobally(t *testing.T) {
	iss, wrap := heldIssuer()
	e := newEnv(t, envOptions{concurrent: 2, waiting: 1, wrapIssuer: wrap})
	var locals []string
	for i := range 8 {
		locals = append(locals, fmt.Sprintf("127.0.0.%d", 81+i))
	}
	done := make(chan []error, 1)
	go func() { done <- floodtest.Flood(floodtest.Attacker(qemu.Variant), e.addr, locals, time.Minute) }()
	require.Eventually(t, func() bool {
		return e.counter("constellation_joinservice_rejections_total", "stage", "handshake", "reason", "busy") == 5 && iss.InFlight() == 2
	}, 30*time.Second, 10*time.Millisecond, "two handshakes quote, one waits, five are refused")
	assert.Equal(t, 2, iss.Issued(), "the waiting handshake has not quoted")
	close(iss.Hold)

	refused := 0
	for _, err := range <-done {
		require.Error(t, err)
		if strings.Contains(err.Error(), "join attempts in progress (limit 2 working, 1 waiting)") {
			refused++
		}
	}
	assert.Equal(t, 5, refused)
	assert.Equal(t, 3, iss.Issued(), "the waiting handshake quoted once a slot was free")
}
