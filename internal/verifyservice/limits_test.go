package verifyservice_test

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/openconstellation/constellation/internal/handshakelimit/floodtest"
	"github.com/openconstellation/constellation/internal/verifyservice"
	"github.com/openconstellation/constellation/pkg/api/verify/verifypb"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/qemu"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// fixedIssuer answers every nonce with the same bytes: these tests count quotes, not check
// them.
type fixedIssuer struct{}

func (fixedIssuer) Variant() variant.Variant { return qemu.Variant }
func (fixedIssuer) Issue(context.Context, attestation.Purpose, []byte) ([]byte, error) {
	return []byte("evidence"), nil
}

// httpFrom is an HTTP client whose connections come from source address local.
func httpFrom(local string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	return &http.Client{Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}, Timeout: time.Minute}
}

func grpcFrom(t *testing.T, local, addr string) verifypb.VerificationServiceClient {
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
			return d.DialContext(ctx, "tcp", addr)
		}))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return verifypb.NewVerificationServiceClient(conn)
}

func get(t *testing.T, c *http.Client, url string) (int, string) {
	resp, err := c.Get(url + verifyservice.HTTPPath + "?nonce=" + hex.EncodeToString(make([]byte, 32)))
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// One caller asking for quotes in a loop (the verification service quotes any caller's
// nonce): after its burst it is refused before the TPM is touched, over HTTP and gRPC alike,
// while other callers are served.
func TestCallerRateIsLimited(t *testing.T) {
	iss := &floodtest.Issuer{Issuer: fixedIssuer{}}
	frozen := time.Now()
	srv, err := verifyservice.New(verifyservice.Config{Issuer: iss, PeerRate: rate.Every(time.Minute), PeerBurst: 3, Now: func() time.Time { return frozen }})
	require.NoError(t, err)
	url := serveHTTP(t, srv)
	grpcAddr := serveGRPC(t, srv)

	attacker := httpFrom("127.0.7.1")
	for i := range 3 {
		code, body := get(t, attacker, url)
		require.Equal(t, http.StatusOK, code, "request %d: %s", i, body)
	}
	for range 5 {
		code, body := get(t, attacker, url)
		assert.Equal(t, http.StatusTooManyRequests, code)
		assert.Contains(t, body, "too many attestation requests from 127.0.7.1 (limit 0.0167/s, burst 3)")
	}
	// The same caller over gRPC shares its bucket.
	_, err = grpcFrom(t, "127.0.7.1", grpcAddr).GetAttestation(context.Background(), &verifypb.GetAttestationRequest{Nonce: make([]byte, 32)})
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	assert.Equal(t, 3, iss.Issued(), "quotes for nine requests")

	code, _ := get(t, httpFrom("127.0.7.2"), url)
	assert.Equal(t, http.StatusOK, code, "another caller is served")
	_, err = grpcFrom(t, "127.0.7.3", grpcAddr).GetAttestation(context.Background(), &verifypb.GetAttestationRequest{Nonce: make([]byte, 32)})
	require.NoError(t, err)
	assert.Equal(t, 5, iss.Issued())
}

// One caller holding requests open (the TPM is slow or busy): beyond MaxPerPeer its requests
// are refused at once, and other callers still get the remaining global slots.
func TestCallerConcurrencyIsLimited(t *testing.T) {
	iss := &floodtest.Issuer{Issuer: fixedIssuer{}, Hold: make(chan struct{})}
	srv, err := verifyservice.New(verifyservice.Config{Issuer: iss, MaxPerPeer: 2, MaxWaiting: 4, IssueTimeout: time.Minute})
	require.NoError(t, err)
	url := serveHTTP(t, srv)

	attacker := httpFrom("127.0.8.1")
	held := make(chan int, 2)
	for range 2 {
		go func() {
			code, _ := get(t, attacker, url)
			held <- code
		}()
	}
	require.Eventually(t, func() bool { return iss.InFlight() == 2 }, 30*time.Second, 10*time.Millisecond)
	for range 5 {
		code, body := get(t, attacker, url)
		assert.Equal(t, http.StatusTooManyRequests, code)
		assert.Contains(t, body, "127.0.8.1 already has 2 attestation requests in progress (limit 2)")
	}
	assert.Equal(t, 2, iss.Issued(), "quotes started for seven requests of one caller")

	// Another caller takes a free global slot (and waits for the TPM like the others).
	other := make(chan int, 1)
	go func() {
		code, _ := get(t, httpFrom("127.0.8.2"), url)
		other <- code
	}()
	require.Eventually(t, func() bool { return iss.InFlight() == 3 }, 30*time.Second, 10*time.Millisecond)
	close(iss.Hold)
	for range 2 {
		assert.Equal(t, http.StatusOK, <-held)
	}
	assert.Equal(t, http.StatusOK, <-other)
	assert.Equal(t, 3, iss.Issued())
}

// Many callers at once: beyond MaxWaiting requests in progress, every caller is refused with
// 503 before its request touches the TPM.
func TestManyCallersAreBoundedGlobally(t *testing.T) {
	iss := &floodtest.Issuer{Issuer: fixedIssuer{}, Hold: make(chan struct{})}
	srv, err := verifyservice.New(verifyservice.Config{Issuer: iss, MaxWaiting: 3, IssueTimeout: time.Minute})
	require.NoError(t, err)
	url := serveHTTP(t, srv)
	held := make(chan int, 3)
	for i := range 3 {
		go func() {
			code, _ := get(t, httpFrom(fmt.Sprintf("127.0.9.%d", i+1)), url)
			held <- code
		}()
	}
	require.Eventually(t, func() bool { return iss.InFlight() == 3 }, 30*time.Second, 10*time.Millisecond)
	for i := range 4 {
		code, body := get(t, httpFrom(fmt.Sprintf("127.0.9.%d", 10+i)), url)
		assert.Equal(t, http.StatusServiceUnavailable, code)
		assert.Contains(t, body, "too many requests waiting for the TPM (limit 3)")
	}
	assert.Equal(t, 3, iss.Issued())
	close(iss.Hold)
	for range 3 {
		assert.Equal(t, http.StatusOK, <-held)
	}
}
