package initserver_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/openconstellation/constellation/api/init/initpb"
	"github.com/openconstellation/constellation/internal/bootstrapper/bootstraptest"
	"github.com/openconstellation/constellation/internal/bootstrapper/initserver"
	"github.com/openconstellation/constellation/internal/handshakelimit"
	"github.com/openconstellation/constellation/internal/handshakelimit/floodtest"
	"github.com/openconstellation/constellation/internal/statedisk"
	"github.com/openconstellation/constellation/pkg/atls"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/qemu"
)

// A caller without the init secret gets the same answer from a fresh node, a node that
// joined a cluster, and a node that was initialized: it cannot tell which nodes are still
// up for grabs.
func TestWrongSecretSameAnswerWhateverTheNodeState(t *testing.T) {
	guess := func(e *env) (codes.Code, string) {
		req, _ := request(t)
		req.InitSecret = []byte("guess")
		res := e.call(req)
		require.Error(t, res.Err)
		assert.Empty(t, res.Progress)
		assert.Empty(t, res.Log)
		return status.Code(res.Err), status.Convert(res.Err).Message()
	}

	fresh := newEnv(t)
	freshCode, freshMsg := guess(fresh)
	assert.Equal(t, codes.PermissionDenied, freshCode)
	assert.Equal(t, "wrong init secret", freshMsg)

	joined := newEnv(t)
	diskKey, err := statedisk.NewRandomKey()
	require.NoError(t, err)
	require.NoError(t, joined.node.Node.Claim(context.Background(), "join", bytes.Repeat([]byte{7}, 32), diskKey))
	code, msg := guess(joined)
	assert.Equal(t, freshCode, code, "joined node: %s", msg)
	assert.Equal(t, freshMsg, msg)

	// The fresh node, now initialized by its owner.
	req, _ := request(t)
	require.NoError(t, fresh.call(req).Err)
	code, msg = guess(fresh)
	assert.Equal(t, freshCode, code, "initialized node: %s", msg)
	assert.Equal(t, freshMsg, msg)
}

// Anonymous callers make the node quote with every attested handshake: one caller gets the
// burst of DefaultHandshakeLimits, then nothing until its bucket refills, and the node
// quotes no more.
func TestAnonymousHellosAreRateLimited(t *testing.T) {
	iss := &floodtest.Issuer{}
	now := time.Now()
	var mu sync.Mutex
	e := newEnvWith(t, envOptions{
		wrapIssuer: func(inner attestation.Issuer) attestation.Issuer { iss.Issuer = inner; return iss },
		now:        func() time.Time { mu.Lock(); defer mu.Unlock(); return now },
	})
	hello := func(local string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return floodtest.Handshake(ctx, floodtest.Attacker(qemu.Variant), local, e.addr)
	}
	burst := initserver.DefaultHandshakeLimits.Burst
	for i := range 10 {
		err := hello("127.0.2.1")
		if i < burst {
			require.NoError(t, err, "hello %d", i)
			continue
		}
		require.Error(t, err, "hello %d", i)
		assert.ErrorContains(t, err, fmt.Sprintf("peer aborted: rate limited: too many attested handshakes from 127.0.2.1 (limit 0.2/s, burst %d)", burst))
	}
	assert.Equal(t, burst, iss.Issued(), "quotes for ten hellos")

	require.NoError(t, hello("127.0.2.2"), "another caller has its own bucket")
	mu.Lock()
	now = now.Add(5 * time.Second)
	mu.Unlock()
	require.NoError(t, hello("127.0.2.1"), "one more hello once a token refilled")
	require.Error(t, hello("127.0.2.1"))
	assert.Equal(t, burst+2, iss.Issued())

	// The CLI still initializes the node from an address of its own.
	req, _ := request(t)
	require.NoError(t, e.call(req).Err)
}

// Parallel hellos: from one caller, at most PerPeer quote at once; from many callers, at
// most Concurrent quote and Waiting wait. The rest are refused before the node quotes.
func TestHelloFloodIsBounded(t *testing.T) {
	limits := initserver.DefaultHandshakeLimits
	t.Run("one caller", func(t *testing.T) {
		iss := &floodtest.Issuer{Hold: make(chan struct{})}
		// All ten pass the accept-time bound (its own test: TestStalledConnections...).
		e := newEnvWith(t, envOptions{
			wrapIssuer: func(inner attestation.Issuer) attestation.Issuer { iss.Issuer = inner; return iss },
			accept:     handshakelimit.AcceptLimits{PerPeer: 16},
		})
		const n = 10
		results := floodtest.Start(floodtest.Attacker(qemu.Variant), e.addr, floodtest.Repeat("127.0.3.1", n), time.Minute)
		refused := floodtest.Collect(results, n-limits.PerPeer)
		for _, err := range refused {
			require.Error(t, err)
			assert.Regexp(t, `rate limited: too many attested handshakes from 127\.0\.3\.1|127\.0\.3\.1 already has 2 attested handshakes in progress`, err.Error())
		}
		require.Eventually(t, func() bool { return iss.InFlight() == limits.PerPeer }, 30*time.Second, 10*time.Millisecond)
		assert.Equal(t, limits.PerPeer, iss.Issued(), "quotes started for %d parallel hellos", n)
		close(iss.Hold)
		for _, err := range floodtest.Collect(results, limits.PerPeer) {
			require.NoError(t, err)
		}
		assert.Equal(t, limits.PerPeer, iss.Issued())
	})
	t.Run("many callers", func(t *testing.T) {
		iss := &floodtest.Issuer{Hold: make(chan struct{})}
		e := newEnvWith(t, envOptions{wrapIssuer: func(inner attestation.Issuer) attestation.Issuer { iss.Issuer = inner; return iss }})
		const n = 10
		var locals []string
		for i := range n {
			locals = append(locals, fmt.Sprintf("127.0.4.%d", i+1))
		}
		admitted := limits.Concurrent + limits.Waiting
		results := floodtest.Start(floodtest.Attacker(qemu.Variant), e.addr, locals, time.Minute)
		for _, err := range floodtest.Collect(results, n-admitted) {
			require.Error(t, err)
			assert.ErrorContains(t, err, fmt.Sprintf("server busy: %d attested handshakes in progress (limit %d working, %d waiting)", admitted, limits.Concurrent, limits.Waiting))
		}
		require.Eventually(t, func() bool { return iss.InFlight() == limits.Concurrent }, 30*time.Second, 10*time.Millisecond)
		assert.Equal(t, limits.Concurrent, iss.Issued(), "quotes started for %d parallel hellos", n)
		close(iss.Hold)
		for _, err := range floodtest.Collect(results, admitted) {
			require.NoError(t, err)
		}
		assert.Equal(t, admitted, iss.Issued())
	})
}

// A caller guessing the init secret over one connection (one handshake, many calls): after
// the burst its calls are refused before the hash is read and bcrypt runs.
func TestInitSecretGuessingIsRateLimited(t *testing.T) {
	e := newEnv(t)
	conn := cliConn(t, e, "127.0.5.1")
	burst := initserver.DefaultAttemptLimits.Burst
	for i := range 10 {
		req, _ := request(t)
		req.InitSecret = fmt.Appendf(nil, "guess %d", i)
		err := initOnce(conn, req)
		if i < burst {
			assert.Equal(t, codes.PermissionDenied, status.Code(err), "guess %d: %v", i, err)
			continue
		}
		assert.Equal(t, codes.ResourceExhausted, status.Code(err), "guess %d: %v", i, err)
		assert.ErrorContains(t, err, fmt.Sprintf("too many init attempts from 127.0.5.1 (limit 0.2/s, burst %d)", burst))
	}
	assert.Equal(t, int32(burst), e.hashReads.Load(), "init-secret checks for ten guesses")

	// Another caller is not affected.
	req, _ := request(t)
	req.InitSecret = []byte("guess")
	assert.Equal(t, codes.PermissionDenied, status.Code(initOnce(cliConn(t, e, "127.0.5.2"), req)))
}

// cliConn is a CLI's connection to the node, verifying it, from source address local.
func cliConn(t *testing.T, e *env, local string) *grpc.ClientConn {
	creds, err := atls.NewCredentials(atls.Config{Validators: []attestation.Validator{bootstraptest.Validator(t, e.ca)}})
	require.NoError(t, err)
	conn, err := grpc.NewClient("passthrough:///"+e.addr, grpc.WithTransportCredentials(creds),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
			return d.DialContext(ctx, "tcp", addr)
		}))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return conn
}

// initOnce calls Init and returns the error that ends the stream (nil on success).
func initOnce(conn *grpc.ClientConn, req *initpb.InitRequest) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stream, err := initpb.NewInitServiceClient(conn).Init(ctx, req)
	if err != nil {
		return err
	}
	for {
		if _, err := stream.Recv(); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}
