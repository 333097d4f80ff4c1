package recoveryserver_test

import (
	"bytes"
	"context"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/openconstellation/constellation/api/recover/recoverpb"
	"github.com/openconstellation/constellation/internal/attestation/akca"
	"github.com/openconstellation/constellation/internal/bootstrapper/bootstraptest"
	"github.com/openconstellation/constellation/internal/bootstrapper/node"
	"github.com/openconstellation/constellation/internal/bootstrapper/recoveryserver"
	"github.com/openconstellation/constellation/internal/handshakelimit"
	"github.com/openconstellation/constellation/internal/handshakelimit/floodtest"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/recovery"
	"github.com/openconstellation/constellation/internal/retry"
	"github.com/openconstellation/constellation/pkg/atls"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/qemu"
)

// env is a control-plane node of a cluster after a full-cluster shutdown: rebooted (PCR 15
// zero, storage locked), serving recovery, with no join service anywhere.
type env struct {
	t    *testing.T
	ca   *akca.CA
	keys bootstraptest.ClusterKeys
	node *bootstraptest.Node
	srv  *bootstraptest.RecoveryServer
}

func newEnv(t *testing.T, opts bootstraptest.RecoveryServerOptions) *env {
	t.Helper()
	if testing.Short() {
		t.Skip("runs swtpm and gocryptfs")
	}
	ca, err := akca.New("local AK CA", time.Now(), time.Hour)
	require.NoError(t, err)
	e := &env{t: t, ca: ca, keys: bootstraptest.NewClusterKeys(t)}
	e.node = bootstraptest.NewNode(t, "control-plane-0", metadata.ControlPlane, ca)
	e.keys.CommitAndReboot(t, e.node)
	e.srv = bootstraptest.StartRecoveryServer(t, e.node, opts)
	return e
}

// loose are limits that never refuse the tests' own repeated calls.
var loose = handshakelimit.Limits{Rate: rate.Inf, Burst: 100, PerPeer: 10, Concurrent: 10, Waiting: 10}

// recover runs the CLI's side with the cluster's keys.
func (e *env) recover() ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return recovery.Recover(ctx, recovery.Config{
		Endpoint: e.srv.Addr, Validator: bootstraptest.Validator(e.t, e.ca), ExpectedNode: "control-plane-0", Disk: e.node.DiskUUID(e.t),
		MasterSecret: e.keys.Master, MeasurementSalt: e.keys.MeasurementSalt, ClusterID: e.keys.ClusterID,
	})
}

// attacker is a client on the attested channel that sends what it likes.
func (e *env) attacker() recoverpb.RecoverServiceClient {
	creds, err := atls.NewCredentials(atls.Config{Validators: []attestation.Validator{bootstraptest.Validator(e.t, e.ca)}})
	require.NoError(e.t, err)
	conn, err := grpc.NewClient("passthrough:///"+e.srv.Addr, grpc.WithTransportCredentials(creds))
	require.NoError(e.t, err)
	e.t.Cleanup(func() { conn.Close() })
	return recoverpb.NewRecoverServiceClient(conn)
}

// assertWaiting asserts the node is as the reboot left it: PCR 15 zero, storage locked,
// kubelet not restarted, nobody holding the node lock.
func (e *env) assertWaiting(msg string) {
	e.t.Helper()
	assert.Equal(e.t, make([]byte, 32), e.node.ClusterIDRegister(e.t), "%s: PCR 15 still zero", msg)
	assert.False(e.t, e.node.Unlocked(e.t), "%s: storage still locked", msg)
	assert.Zero(e.t, e.srv.Kubelet.Restarts(), "%s: kubelet not restarted", msg)
	assert.Empty(e.t, e.node.Node.LockHolder(), "%s: node lock free", msg)
	select {
	case <-e.srv.Server.Committed():
		e.t.Errorf("%s: the server reports a commit", msg)
	default:
	}
}

// assertRecovered asserts the node is back in its cluster by recovery.
func (e *env) assertRecovered() {
	e.t.Helper()
	assert.Equal(e.t, variant.QEMUVTPM.ClusterIDMarker(e.keys.ClusterID), e.node.ClusterIDRegister(e.t), "PCR 15 carries the cluster's marker")
	assert.True(e.t, e.node.Unlocked(e.t), "storage unlocked: the state written before the shutdown is readable")
	assert.Equal(e.t, 1, e.srv.Kubelet.Restarts())
	renewals, stale := e.srv.Kubelet.Renewals()
	assert.Equal(e.t, 1, renewals, "the kubelet's client certificate renewed once")
	assert.Zero(e.t, stale, "the kubelet restarted before its client certificate was renewed")
	assert.Equal(e.t, node.HolderRecover, e.node.Node.LockHolder())
	select {
	case <-e.srv.Server.Finished():
		assert.NoError(e.t, e.srv.Server.Err())
	default:
		e.t.Error("the server does not report the recovery finished")
	}
}

func TestRecover(t *testing.T) {
	e := newEnv(t, bootstraptest.RecoveryServerOptions{})
	e.assertWaiting("before")
	id, err := e.recover()
	require.NoError(t, err)
	assert.Equal(t, e.keys.ClusterID, id)
	e.assertRecovered()

	// A second recovery changes nothing.
	_, err = e.recover()
	assert.ErrorIs(t, err, recovery.ErrNotWaiting)
	assert.ErrorContains(t, err, "back in its cluster")
	e.assertRecovered()
	resp, err := e.attacker().Recover(context.Background(), &recoverpb.RecoverRequest{
		StateDiskKey: e.keys.DiskKey(t, e.node), MeasurementSecret: e.keys.MeasurementSecret(t), MeasurementSalt: e.keys.MeasurementSalt,
	})
	assert.Equal(t, codes.FailedPrecondition, status.Code(err), "%v", err)
	assert.Nil(t, resp)
	e.assertRecovered()
}

// Whoever reaches the port without the node's disk key changes nothing, whatever else it
// sends; the owner's recovery still works afterwards.
func TestWrongKeyChangesNothing(t *testing.T) {
	e := newEnv(t, bootstraptest.RecoveryServerOptions{AttemptLimits: loose, HandshakeLimits: loose})
	other := bootstraptest.NewClusterKeys(t)
	bogus := bytes.Repeat([]byte{0x42}, 32)
	for name, req := range map[string]*recoverpb.RecoverRequest{
		"wrong disk key, the cluster's measurement secret": {
			StateDiskKey: bogus, MeasurementSecret: e.keys.MeasurementSecret(t), MeasurementSalt: e.keys.MeasurementSalt,
		},
		"wrong disk key, bogus measurement secret and salt": {
			StateDiskKey: bogus, MeasurementSecret: bogus, MeasurementSalt: bogus,
		},
		"another cluster's keys for this disk": {
			StateDiskKey: other.DiskKey(t, e.node), MeasurementSecret: other.MeasurementSecret(t), MeasurementSalt: other.MeasurementSalt,
		},
		"the measurement secret as the disk key": {
			StateDiskKey: e.keys.MeasurementSecret(t), MeasurementSecret: e.keys.MeasurementSecret(t), MeasurementSalt: e.keys.MeasurementSalt,
		},
	} {
		t.Run(name, func(t *testing.T) {
			resp, err := e.attacker().Recover(context.Background(), req)
			assert.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
			assert.ErrorContains(t, err, "wrong disk key")
			assert.Nil(t, resp)
			e.assertWaiting(name)
		})
	}
	t.Run("through the client, with another cluster's master secret", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := recovery.Recover(ctx, recovery.Config{
			Endpoint: e.srv.Addr, Validator: bootstraptest.Validator(t, e.ca), ExpectedNode: "control-plane-0", Disk: e.node.DiskUUID(t),
			MasterSecret: other.Master, MeasurementSalt: other.MeasurementSalt, ClusterID: other.ClusterID,
		})
		assert.ErrorIs(t, err, recovery.ErrWrongKey)
		e.assertWaiting("other cluster's master secret")
	})

	id, err := e.recover()
	require.NoError(t, err)
	assert.Equal(t, e.keys.ClusterID, id)
	e.assertRecovered()
}

func TestInvalidRequestChangesNothing(t *testing.T) {
	e := newEnv(t, bootstraptest.RecoveryServerOptions{AttemptLimits: loose, HandshakeLimits: loose})
	_, err := e.attacker().Recover(context.Background(), &recoverpb.RecoverRequest{StateDiskKey: []byte("short"), MeasurementSalt: make([]byte, 33)})
	assert.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	for _, want := range []string{"state disk key has 5 bytes, want 32", "measurement secret has 0 bytes, want 32", "measurement salt has 33 bytes, want 32"} {
		assert.ErrorContains(t, err, want)
	}
	e.assertWaiting("invalid request")
}

func TestHello(t *testing.T) {
	e := newEnv(t, bootstraptest.RecoveryServerOptions{})
	resp, err := e.attacker().Hello(context.Background(), &recoverpb.HelloRequest{})
	require.NoError(t, err)
	want, err := e.node.Storage.UUID()
	require.NoError(t, err)
	assert.Equal(t, want, resp.DiskUuid)
	e.assertWaiting("hello")
}

// Guessing disk keys over one connection is rate-limited per caller before the key is
// checked: the burst of DefaultAttemptLimits, then ResourceExhausted, even for the right key,
// and still nothing changes.
func TestKeyGuessingIsRateLimited(t *testing.T) {
	now := time.Now()
	var mu sync.Mutex
	e := newEnv(t, bootstraptest.RecoveryServerOptions{Now: func() time.Time { mu.Lock(); defer mu.Unlock(); return now }})
	client := e.attacker()
	guess := &recoverpb.RecoverRequest{StateDiskKey: bytes.Repeat([]byte{1}, 32), MeasurementSecret: e.keys.MeasurementSecret(t), MeasurementSalt: e.keys.MeasurementSalt}
	for i := range recoveryserver.DefaultAttemptLimits.Burst {
		_, err := client.Recover(context.Background(), guess)
		assert.Equal(t, codes.PermissionDenied, status.Code(err), "guess %d: %v", i, err)
	}
	_, err := client.Recover(context.Background(), guess)
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	// The refusal says when to come back: when one attempt's token refilled.
	delay, ok := retry.After(err)
	assert.True(t, ok, "RetryInfo")
	assert.Equal(t, recovery.MinAttemptInterval, delay)
	right := &recoverpb.RecoverRequest{StateDiskKey: e.keys.DiskKey(t, e.node), MeasurementSecret: e.keys.MeasurementSecret(t), MeasurementSalt: e.keys.MeasurementSalt}
	_, err = client.Recover(context.Background(), right)
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	e.assertWaiting("rate-limited")

	// Once the bucket refilled, the owner gets in.
	mu.Lock()
	now = now.Add(time.Minute)
	mu.Unlock()
	_, err = client.Recover(context.Background(), right)
	require.NoError(t, err)
	e.assertRecovered()
}

// Anonymous attested handshakes make the node quote: one caller gets the burst of
// DefaultHandshakeLimits, then no more quotes until its bucket refills.
func TestAnonymousHandshakesAreRateLimited(t *testing.T) {
	if testing.Short() {
		t.Skip("runs swtpm and gocryptfs")
	}
	ca, err := akca.New("local AK CA", time.Now(), time.Hour)
	require.NoError(t, err)
	n := bootstraptest.NewNode(t, "control-plane-0", metadata.ControlPlane, ca)
	bootstraptest.NewClusterKeys(t).CommitAndReboot(t, n)
	iss := &floodtest.Issuer{Issuer: n.Issuer(t)}
	srv, err := recoveryserver.New(recoveryserver.Config{
		Node: n.Node, Issuer: iss, Kubelet: &bootstraptest.Kubelet{}, RenewKubeletCredential: func() error { return nil },
		Now: func() time.Time { return time.Unix(1000, 0) },
	})
	require.NoError(t, err)
	g := srv.NewGRPCServer()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)

	hello := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return floodtest.Handshake(ctx, floodtest.Attacker(qemu.Variant), "127.0.0.9", ln.Addr().String())
	}
	burst := recoveryserver.DefaultHandshakeLimits.Burst
	for i := range burst {
		assert.NoError(t, hello(), "handshake %d", i)
	}
	err = hello()
	require.Error(t, err)
	assert.ErrorContains(t, err, "rate limited")
	assert.Equal(t, burst, iss.Issued(), "no quote beyond the burst")
}

func TestNewRefusesFreshNode(t *testing.T) {
	if testing.Short() {
		t.Skip("runs swtpm and gocryptfs")
	}
	ca, err := akca.New("local AK CA", time.Now(), time.Hour)
	require.NoError(t, err)
	n := bootstraptest.NewNode(t, "control-plane-0", metadata.ControlPlane, ca)
	_, err = recoveryserver.New(recoveryserver.Config{Node: n.Node, Issuer: n.Issuer(t), Kubelet: &bootstraptest.Kubelet{}, RenewKubeletCredential: func() error { return nil }})
	assert.ErrorContains(t, err, "node is fresh, not rebooted")
	_, err = recoveryserver.New(recoveryserver.Config{})
	assert.ErrorContains(t, err, "missing Node, Issuer, Kubelet, RenewKubeletCredential")
}

func TestCheckRequest(t *testing.T) {
	k := bytes.Repeat([]byte{1}, 32)
	assert.NoError(t, recoveryserver.CheckRequest(&recoverpb.RecoverRequest{StateDiskKey: k, MeasurementSecret: k, MeasurementSalt: k}))
	err := recoveryserver.CheckRequest(&recoverpb.RecoverRequest{})
	assert.ErrorContains(t, err, "state disk key has 0 bytes")
	assert.ErrorContains(t, err, "measurement secret has 0 bytes")
	assert.ErrorContains(t, err, "measurement salt has 0 bytes")
}
