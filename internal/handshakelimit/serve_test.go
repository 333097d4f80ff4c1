package handshakelimit_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/openconstellation/constellation/internal/handshakelimit"
)

// listen returns a loopback listener closed when the test ends.
func listen(t *testing.T) net.Listener {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	return ln
}

// stall opens a TCP connection from local that sends nothing.
func stall(t *testing.T, local, addr string) net.Conn {
	c, err := dialFrom(local, addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

func dialFrom(local, addr string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	return d.Dial("tcp", addr)
}

// refusedWithin opens a TCP connection from local and reports whether the server closes it
// within d: the reset may even reach the dial.
func refusedWithin(t *testing.T, local, addr string, d time.Duration) bool {
	c, err := dialFrom(local, addr)
	if errors.Is(err, syscall.ECONNRESET) {
		return true
	}
	require.NoError(t, err)
	defer c.Close()
	return closedWithin(c, d)
}

// closedWithin reports whether the server closes c within d: a read ends with EOF or a
// reset rather than at the read deadline.
func closedWithin(c net.Conn, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	return !errors.As(err, &ne) || !ne.Timeout()
}

// gRPC: a connection is pending until its HTTP/2 transport is up; then it outlives the
// deadline. A connection that sends nothing is closed at the deadline.
func TestGRPCServerPendingUntilTransport(t *testing.T) {
	lim, err := handshakelimit.NewAcceptLimiter(handshakelimit.AcceptLimits{PerPeer: 2, Total: 8, Timeout: time.Second}, nil)
	require.NoError(t, err)
	g := handshakelimit.NewGRPCServer(lim, nil)
	healthpb.RegisterHealthServer(g, health.NewServer())
	ln := listen(t)
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)

	conn, err := grpc.NewClient("passthrough:///"+ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	client := healthpb.NewHealthClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = client.Check(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return lim.Pending() == 0 }, 10*time.Second, 5*time.Millisecond, "the established connection is no longer pending")

	// Accepted after the client's connection: it times out after the client's would have.
	stalled := stall(t, "127.0.0.2", ln.Addr().String())
	assert.True(t, closedWithin(stalled, 30*time.Second), "a connection that sends nothing is closed")
	// By the limiter or by gRPC's own deadline (ConnectionTimeout), whichever fires first.
	require.Eventually(t, func() bool { return lim.Pending() == 0 }, 10*time.Second, 5*time.Millisecond)
	_, err = client.Check(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err, "the established connection outlived the deadline")
	assert.Equal(t, connectivityReady, conn.GetState().String())

	// Refused at accept: closed at once, long before the deadline.
	lim2, err := handshakelimit.NewAcceptLimiter(handshakelimit.AcceptLimits{PerPeer: 1, Total: 8, Timeout: time.Hour}, nil)
	require.NoError(t, err)
	g2 := handshakelimit.NewGRPCServer(lim2, nil)
	ln2 := listen(t)
	go func() { _ = g2.Serve(ln2) }()
	t.Cleanup(g2.Stop)
	first := stall(t, "127.0.0.3", ln2.Addr().String())
	assert.True(t, refusedWithin(t, "127.0.0.3", ln2.Addr().String(), 30*time.Second))
	assert.EqualValues(t, 1, lim2.Count(handshakelimit.AcceptPeerBusy))
	assert.False(t, closedWithin(first, 100*time.Millisecond), "the first one is still pending")
}

const connectivityReady = "READY"

// HTTP: a connection is pending until its first request header is read.
func TestHTTPServerPendingUntilRequest(t *testing.T) {
	lim, err := handshakelimit.NewAcceptLimiter(handshakelimit.AcceptLimits{PerPeer: 2, Total: 8, Timeout: time.Second}, nil)
	require.NoError(t, err)
	var active atomic.Int32
	srv := handshakelimit.NewHTTPServer(lim, &http.Server{
		Handler:           http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }),
		ReadHeaderTimeout: time.Minute,
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateActive {
				active.Add(1)
			}
		},
	})
	ln := listen(t)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })

	client := &http.Client{Timeout: 30 * time.Second}
	t.Cleanup(client.CloseIdleConnections)
	resp, err := client.Get("http://" + ln.Addr().String() + "/")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	assert.Equal(t, "ok", string(body))
	assert.Zero(t, lim.Pending())

	stalled := stall(t, "127.0.0.2", ln.Addr().String())
	assert.True(t, closedWithin(stalled, 30*time.Second), "closed at the limiter's deadline, before the server's own")
	assert.EqualValues(t, 1, lim.Count(handshakelimit.AcceptTimeout))
	resp, err = client.Get("http://" + ln.Addr().String() + "/")
	require.NoError(t, err, "the kept-alive connection outlived the deadline")
	resp.Body.Close()
	assert.Positive(t, active.Load(), "the server's own ConnState still runs")
}
