package verifyservice_test

import (
	"context"
	"net/http"
	"runtime"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/handshakelimit"
	"github.com/openconstellation/constellation/internal/handshakelimit/floodtest"
	"github.com/openconstellation/constellation/internal/verifyservice"
	"github.com/openconstellation/constellation/pkg/api/verify/verifypb"
)

// requests returns requests_total{protocol, result} of reg.
func requests(t *testing.T, reg *prometheus.Registry, protocol, result string) float64 {
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range families {
		if mf.GetName() != "constellation_verificationservice_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["protocol"] == protocol && labels["result"] == result {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// halfRequest is the start of an HTTP request that never ends.
var halfRequest = []byte("GET /v1/attest?nonce=")

// An attacker opens many connections from one address to both ports and never sends a whole
// request (nothing, or half a request line). Beyond the per-peer bound they are refused when
// accepted, closed at once and counted; other callers are served over gRPC and HTTP.
func TestStalledConnectionsAreRefusedAtAccept(t *testing.T) {
	const perPeer, n = 2, 100
	reg := prometheus.NewRegistry()
	srv, err := verifyservice.New(verifyservice.Config{
		Issuer: fixedIssuer{}, Registerer: reg,
		AcceptLimits: handshakelimit.AcceptLimits{PerPeer: perPeer, Total: 16, Timeout: 10 * time.Minute},
	})
	require.NoError(t, err)
	url := serveHTTP(t, srv)
	grpcAddr := serveGRPC(t, srv)
	baseline := runtime.NumGoroutine()

	for _, port := range []struct{ protocol, addr string }{{"grpc", grpcAddr}, {"http", url[len("http://"):]}} {
		var flood floodtest.Stalled
		for i := range n {
			var send []byte
			if i%2 == 1 {
				send = halfRequest
			}
			c, err := floodtest.Stall("127.0.11.1", port.addr, send)
			require.NoError(t, err)
			if c == nil {
				flood.ResetAtDial++
				continue
			}
			flood.Open = append(flood.Open, c)
		}
		t.Cleanup(flood.Close)
		require.Eventually(t, func() bool { return requests(t, reg, port.protocol, "accept-peer-busy") == n-perPeer }, 30*time.Second, 10*time.Millisecond, port.protocol)
		refused := &floodtest.Stalled{Open: flood.Open[perPeer:], ResetAtDial: flood.ResetAtDial}
		assert.Equal(t, n-perPeer, refused.ClosedByServer(30*time.Second), port.protocol)
	}
	assert.LessOrEqual(t, runtime.NumGoroutine(), baseline+2*perPeer*4+10, "refused connections keep no goroutine")

	code, body := get(t, httpFrom("127.0.11.2"), url)
	assert.Equal(t, http.StatusOK, code, body)
	_, err = grpcFrom(t, "127.0.11.2", grpcAddr).GetAttestation(context.Background(), &verifypb.GetAttestationRequest{Nonce: make([]byte, 32)})
	require.NoError(t, err)
}

// Connections that never send a request end at the deadline; goroutines return to the
// baseline.
func TestStalledConnectionsEndAtTheDeadline(t *testing.T) {
	reg := prometheus.NewRegistry()
	srv, err := verifyservice.New(verifyservice.Config{
		Issuer: fixedIssuer{}, Registerer: reg,
		AcceptLimits: handshakelimit.AcceptLimits{PerPeer: 2, Total: 64, Timeout: time.Second},
	})
	require.NoError(t, err)
	url := serveHTTP(t, srv)
	grpcAddr := serveGRPC(t, srv)
	baseline := runtime.NumGoroutine()

	locals := floodtest.Locals("127.0.12.0", 50)
	var all []*floodtest.Stalled
	for _, addr := range []string{grpcAddr, url[len("http://"):]} {
		flood, err := floodtest.StallAll(locals, addr, false)
		require.NoError(t, err)
		t.Cleanup(flood.Close)
		all = append(all, flood)
	}
	for _, flood := range all {
		require.Eventually(t, func() bool { return flood.ClosedByServer(time.Millisecond) == len(locals) }, 30*time.Second, 50*time.Millisecond)
	}
	got := floodtest.Goroutines(baseline+5, 30*time.Second)
	assert.LessOrEqual(t, got, baseline+5, "goroutines back to the baseline (%d)", baseline)
	assert.Positive(t, requests(t, reg, "grpc", "accept-timeout")+requests(t, reg, "http", "accept-timeout"))

	code, _ := get(t, httpFrom("127.0.12.1"), url)
	assert.Equal(t, http.StatusOK, code)
}
