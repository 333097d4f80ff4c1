package bootstraptest

import (
	"context"
	"crypto/rand"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/openconstellation/constellation/internal/bootstrapper/node"
	"github.com/openconstellation/constellation/internal/bootstrapper/recoveryserver"
	"github.com/openconstellation/constellation/internal/handshakelimit"
	"github.com/openconstellation/constellation/internal/kms"
	"github.com/openconstellation/constellation/pkg/attestation"
)

// ClusterKeys are a cluster's secrets as the CLI holds them: the master secret file and, from
// the state file, the measurement salt and the cluster ID.
type ClusterKeys struct {
	Master          kms.MasterSecret
	MeasurementSalt []byte
	ClusterID       []byte
}

// NewClusterKeys returns the keys of a new cluster.
func NewClusterKeys(t testing.TB) ClusterKeys {
	t.Helper()
	master, err := kms.NewMasterSecret()
	require.NoError(t, err)
	salt := make([]byte, 32)
	_, err = rand.Read(salt)
	require.NoError(t, err)
	ms, err := master.MeasurementSecret()
	require.NoError(t, err)
	id, err := kms.ClusterID(ms, salt)
	require.NoError(t, err)
	return ClusterKeys{Master: master, MeasurementSalt: salt, ClusterID: id}
}

// MeasurementSecret derives the cluster's measurement secret.
func (k ClusterKeys) MeasurementSecret(t testing.TB) []byte {
	t.Helper()
	ms, err := k.Master.MeasurementSecret()
	require.NoError(t, err)
	return ms
}

// DiskKey derives the key of n's state disk.
func (k ClusterKeys) DiskKey(t testing.TB, n *Node) []byte {
	t.Helper()
	id, err := n.Storage.UUID()
	require.NoError(t, err)
	key, err := k.Master.StateDiskKey(id)
	require.NoError(t, err)
	return key
}

// StateFile is a file CommitAndReboot writes into the node's state; it is visible only
// while the storage is unlocked.
const StateFile = "etcd-member"

// StateFileContent is what CommitAndReboot writes to StateFile.
const StateFileContent = "state of the cluster, readable only with the disk key"

// CommitAndReboot brings fresh node n into the cluster of keys as a join would (node lock,
// re-key to the derived disk key, mark, unlock), writes StateFile into its state, and
// reboots it: PCR 15 zero, storage locked, the node opened in the rebooted state.
func (k ClusterKeys) CommitAndReboot(t testing.TB, n *Node) {
	t.Helper()
	require.NoError(t, n.Node.Claim(context.Background(), "join", k.ClusterID, k.DiskKey(t, n)))
	require.NoError(t, os.WriteFile(filepath.Join(n.StateDir, StateFile), []byte(StateFileContent), 0o600))
	n.Reboot(t)
	require.Equal(t, node.Rebooted, n.Node.State())
}

// HoldDiskOf gives rebooted node n a copy of rebooted node other's state disk in place of its
// own (whoever controls the platform's disks can attach or clone any of them: the UUID and
// the encrypted contents are other's, byte for byte), and reopens n. n's TPM is untouched:
// it is still the genuine, certified node n, waiting for its keys.
func (n *Node) HoldDiskOf(t testing.TB, other *Node) {
	t.Helper()
	require.NoError(t, n.Storage.Lock(context.Background()))
	require.NoError(t, os.RemoveAll(n.Storage.Dir))
	// cp -a keeps gocryptfs' file modes.
	out, err := exec.Command("cp", "-a", other.Storage.Dir, n.Storage.Dir).CombinedOutput()
	require.NoError(t, err, "%s", out)
	n.Restart(t)
	require.Equal(t, node.Rebooted, n.Node.State())
}

// DiskUUID reads the UUID of n's state disk.
func (n *Node) DiskUUID(t testing.TB) string {
	t.Helper()
	id, err := n.Storage.UUID()
	require.NoError(t, err)
	return id
}

// Unlocked reports whether n's state storage is unlocked (StateFile readable).
func (n *Node) Unlocked(t testing.TB) bool {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(n.StateDir, StateFile))
	return err == nil && string(data) == StateFileContent
}

// RecoveryServer is a node's recovery server, built with the constructor the bootstrapper
// uses and served as bootstrapper.Run serves it, with every call recorded.
type RecoveryServer struct {
	Server  *recoveryserver.Server
	Addr    string
	Kubelet *Kubelet
	Calls   *CallRecorder
	grpc    *handshakelimit.GRPCServer
}

// RecoveryServerOptions tune StartRecoveryServer.
type RecoveryServerOptions struct {
	// AcceptLimits, AttemptLimits, HandshakeLimits and Now are passed on (defaults: the
	// server's).
	AcceptLimits                   handshakelimit.AcceptLimits
	AttemptLimits, HandshakeLimits handshakelimit.Limits
	Now                            func() time.Time
	// Issuer, when set, attests instead of the node's TPM (an impostor).
	Issuer attestation.Issuer
}

// StartRecoveryServer serves n's recovery server on loopback until the test ends.
func StartRecoveryServer(t testing.TB, n *Node, opts RecoveryServerOptions) *RecoveryServer {
	t.Helper()
	r := &RecoveryServer{Kubelet: &Kubelet{}, Calls: &CallRecorder{}}
	var issuer attestation.Issuer = opts.Issuer
	if issuer == nil {
		issuer = n.Issuer(t)
	}
	var err error
	r.Server, err = recoveryserver.New(recoveryserver.Config{
		Node: n.Node, Issuer: issuer, Kubelet: r.Kubelet, RenewKubeletCredential: r.Kubelet.RenewCredential,
		AcceptLimits: opts.AcceptLimits, AttemptLimits: opts.AttemptLimits, HandshakeLimits: opts.HandshakeLimits, Now: opts.Now,
	})
	require.NoError(t, err)
	r.grpc = r.Server.NewGRPCServer(grpc.UnaryInterceptor(r.Calls.intercept))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = r.grpc.Serve(ln) }()
	t.Cleanup(r.grpc.Stop)
	r.Addr = ln.Addr().String()
	return r
}

// Call is one RPC a server received.
type Call struct {
	Method  string
	Request proto.Message
}

// CallRecorder records the unary calls a gRPC server received (after the attested
// handshake, before the handler).
type CallRecorder struct {
	mu    sync.Mutex
	calls []Call
}

func (c *CallRecorder) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	c.mu.Lock()
	m, _ := req.(proto.Message)
	if m != nil {
		m = proto.Clone(m)
	}
	c.calls = append(c.calls, Call{Method: info.FullMethod, Request: m})
	c.mu.Unlock()
	return handler(ctx, req)
}

// List returns the calls so far.
func (c *CallRecorder) List() []Call {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Call(nil), c.calls...)
}

// Methods returns the full method names of the calls so far.
func (c *CallRecorder) Methods() []string {
	var out []string
	for _, call := range c.List() {
		out = append(out, call.Method)
	}
	return out
}
