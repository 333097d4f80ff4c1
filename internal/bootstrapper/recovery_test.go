package bootstrapper_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/openconstellation/constellation/internal/attestation/akca"
	"github.com/openconstellation/constellation/internal/bootstrapper"
	"github.com/openconstellation/constellation/internal/bootstrapper/bootstraptest"
	"github.com/openconstellation/constellation/internal/bootstrapper/joinclient"
	"github.com/openconstellation/constellation/internal/bootstrapper/node"
	"github.com/openconstellation/constellation/internal/bootstrapper/recoveryserver"
	"github.com/openconstellation/constellation/internal/cmdutil"
	"github.com/openconstellation/constellation/internal/joinservice"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/recovery"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

func newCA(t *testing.T) *akca.CA {
	t.Helper()
	ca, err := akca.New("local AK CA", time.Now(), time.Hour)
	require.NoError(t, err)
	return ca
}

// progress records the phases Run reports.
type progress struct {
	mu     sync.Mutex
	phases []string
}

func (p *progress) report(phase string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.phases = append(p.phases, phase)
}

func (p *progress) list() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.phases)
}

func (p *progress) waitFor(t *testing.T, phase string) {
	t.Helper()
	require.Eventually(t, func() bool { return slices.Contains(p.list(), phase) }, 30*time.Second, 10*time.Millisecond,
		"phase %q never reported (got %v)", phase, p.list())
}

// rebooted is a node of a cluster after a full-cluster shutdown: rebooted, with the
// bootstrapper parts nodeboot builds for it (rejoin client; on a control plane the recovery
// server), and join endpoints in metadata where, for now, nothing answers.
type rebooted struct {
	t        *testing.T
	ca       *akca.CA
	keys     bootstraptest.ClusterKeys
	node     *bootstraptest.Node
	meta     *metadata.Static
	kubelet  *bootstraptest.Kubelet
	progress *progress
	logs     *cmdutil.SyncBuffer
	cfg      bootstrapper.Config
	// joinDelay: the rejoin client dials after a random delay up to it.
	joinDelay time.Duration
}

func newRebooted(t *testing.T, name string, role metadata.Role, ca *akca.CA, keys bootstraptest.ClusterKeys) *rebooted {
	t.Helper()
	if testing.Short() {
		t.Skip("runs swtpm and gocryptfs")
	}
	r := &rebooted{t: t, ca: ca, keys: keys, kubelet: &bootstraptest.Kubelet{}, progress: &progress{}, logs: &cmdutil.SyncBuffer{}}
	r.node = bootstraptest.NewNode(t, name, role, ca)
	keys.CommitAndReboot(t, r.node)
	// An address where no join service answers (yet).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	nobody := ln.Addr().String()
	require.NoError(t, ln.Close())
	r.meta = &metadata.Static{
		Instance:  metadata.Instance{Name: name, Role: role, IPs: []netip.Addr{netip.MustParseAddr("10.42.0.3")}},
		Endpoints: []string{nobody},
	}
	return r
}

// build makes the bootstrapper's configuration as nodeboot does: the recovery server on
// rebooted control planes only.
func (r *rebooted) build() {
	t := r.t
	issuer := r.node.Issuer(t)
	check, err := joinservice.ServiceCheck{Variant: variant.QEMUVTPM}.Validator(r.node.TPM)
	require.NoError(t, err)
	attested, err := joinclient.AttestedDialer(issuer, check)
	require.NoError(t, err)
	dial := func(ctx context.Context, endpoint string) (*grpc.ClientConn, error) {
		if r.joinDelay > 0 {
			time.Sleep(time.Duration(rand.Int64N(int64(r.joinDelay))))
		}
		return attested(ctx, endpoint)
	}
	log := slog.New(slog.NewTextHandler(r.logs, nil))
	join, err := joinclient.New(joinclient.Config{
		Node: r.node.Node, Metadata: r.meta, Dial: dial, Kubeadm: &bootstraptest.Kubeadm{}, Kubelet: r.kubelet,
		KubeadmConfig: func(p joinclient.JoinParams) ([]byte, error) { return json.Marshal(p) },
		PKIDir:        filepath.Join(t.TempDir(), "pki"), KubeletPKIDir: filepath.Join(t.TempDir(), "kubelet"),
		DiscoveryFile: filepath.Join(t.TempDir(), "discovery.conf"), APIServerConfigDir: t.TempDir(),
		Backoff: func() wait.Backoff { b := joinclient.NewBackoff(); b.Duration /= 100; b.Cap /= 100; return b },
		Log:     log,
	})
	require.NoError(t, err)
	r.cfg = bootstrapper.Config{Node: r.node.Node, JoinClient: join, Progress: r.progress.report, WaitingAfter: 100 * time.Millisecond, Log: log}
	if r.meta.Instance.Role == metadata.ControlPlane && r.node.Node.State() == node.Rebooted {
		rs, err := recoveryserver.New(recoveryserver.Config{Node: r.node.Node, Issuer: issuer, Kubelet: r.kubelet, RenewKubeletCredential: r.kubelet.RenewCredential, Log: log})
		require.NoError(t, err)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		t.Cleanup(func() { ln.Close() })
		r.cfg.RecoveryServer, r.cfg.RecoveryListener = rs, ln
	}
}

func (r *rebooted) run(ctx context.Context) chan runResult {
	out := make(chan runResult, 1)
	go func() {
		by, err := bootstrapper.Run(ctx, r.cfg)
		out <- runResult{by, err}
	}()
	return out
}

// recover is the operator's `constellation recover` against this node.
func (r *rebooted) recover() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := recovery.Recover(ctx, recovery.Config{
		Endpoint: r.cfg.RecoveryListener.Addr().String(), Validator: bootstraptest.Validator(r.t, r.ca),
		ExpectedNode: r.meta.Instance.Name, Disk: r.node.DiskUUID(r.t), MasterSecret: r.keys.Master, MeasurementSalt: r.keys.MeasurementSalt,
		ClusterID: r.keys.ClusterID,
	})
	return err
}

// After a full-cluster shutdown a control plane finds no join service, says it waits for
// recovery, and the operator's recovery brings it back: PCR 15 carries the cluster's marker,
// the state is readable, the kubelet was restarted once, and the recovery port is closed.
func TestRecoveryWithoutJoinService(t *testing.T) {
	r := newRebooted(t, "control-plane-0", metadata.ControlPlane, newCA(t), bootstraptest.NewClusterKeys(t))
	r.build()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := r.run(ctx)

	r.progress.waitFor(t, metadata.PhaseWaitingForRecovery)
	assert.Contains(t, r.logs.String(), "no join service answers: waiting for rejoin or for `constellation recover`")
	assert.Equal(t, make([]byte, 32), r.node.ClusterIDRegister(t), "waiting: PCR 15 zero")
	assert.False(t, r.node.Unlocked(t))

	require.NoError(t, r.recover())
	res := <-done
	require.NoError(t, res.err)
	assert.Equal(t, bootstrapper.ByRecover, res.by)
	assert.Equal(t, []string{metadata.PhaseWaitingForRecovery, metadata.PhaseRecovered}, r.progress.list())
	assert.Equal(t, variant.QEMUVTPM.ClusterIDMarker(r.keys.ClusterID), r.node.ClusterIDRegister(t))
	assert.True(t, r.node.Unlocked(t))
	assert.Equal(t, 1, r.kubelet.Restarts(), "restarted once: by the recovery, not again by the rejoin")
	assert.Equal(t, node.HolderRecover, r.node.Node.LockHolder())

	// The rejoin stopped with Run, and so did the recovery server.
	err := r.recover()
	assert.ErrorIs(t, err, recovery.ErrNotWaiting)
	assert.ErrorContains(t, err, "no recovery server answers")
}

// A rebooted worker has no recovery server: it says it waits for the join service and keeps
// retrying until the control planes are back.
func TestRebootedWorkerWaitsForJoinService(t *testing.T) {
	r := newRebooted(t, "worker-0", metadata.Worker, newCA(t), bootstraptest.NewClusterKeys(t))
	r.build()
	require.Nil(t, r.cfg.RecoveryServer, "workers serve no recovery")
	ctx, cancel := context.WithCancel(context.Background())
	done := r.run(ctx)
	r.progress.waitFor(t, metadata.PhaseWaitingForJoinService)
	assert.Contains(t, r.logs.String(), "no join service answers: waiting for the control planes to come back")
	select {
	case res := <-done:
		t.Fatalf("Run returned while no join service answers: %v, %v", res.by, res.err)
	default:
	}
	cancel()
	res := <-done
	assert.ErrorIs(t, res.err, context.Canceled)
	assert.Equal(t, []string{metadata.PhaseWaitingForJoinService}, r.progress.list())
	assert.Equal(t, make([]byte, 32), r.node.ClusterIDRegister(t))
	assert.False(t, r.node.Unlocked(t))
}

// A control plane whose bootstrapper restarted after it had re-entered finds PCR 15
// carrying the cluster's marker and its storage locked: recovery resumes without a second
// extend.
func TestRecoveryAfterBootstrapperRestart(t *testing.T) {
	r := newRebooted(t, "control-plane-0", metadata.ControlPlane, newCA(t), bootstraptest.NewClusterKeys(t))
	require.NoError(t, r.node.Node.ReenterAs(context.Background(), node.HolderRecover, r.keys.ClusterID, r.keys.DiskKey(t, r.node)))
	r.node.Restart(t)
	r.build()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := r.run(ctx)
	r.progress.waitFor(t, metadata.PhaseWaitingForRecovery)
	require.NoError(t, r.recover())
	res := <-done
	require.NoError(t, res.err)
	assert.Equal(t, bootstrapper.ByRecover, res.by)
	assert.Equal(t, variant.QEMUVTPM.ClusterIDMarker(r.keys.ClusterID), r.node.ClusterIDRegister(t), "no second extend")
	assert.True(t, r.node.Unlocked(t))
	assert.Equal(t, node.HolderRecover+" (resumed)", r.node.Node.LockHolder())
}

// joinable is a rebooted control plane of the cluster a running join service serves (its
// disk recorded as its own by a join before the reboot).
func joinable(t *testing.T) (*rebooted, *bootstraptest.Cluster) {
	t.Helper()
	if testing.Short() {
		t.Skip("runs swtpm, gocryptfs, etcd and kube-apiserver")
	}
	// A join, as TestJoinWins does, records the disk; then the reboot.
	e := newEnv(t)
	res := <-e.run()
	require.NoError(t, res.err)
	require.Equal(t, bootstrapper.ByJoin, res.by)
	require.NoError(t, os.WriteFile(filepath.Join(e.node.StateDir, bootstraptest.StateFile), []byte(bootstraptest.StateFileContent), 0o600))
	e.node.Reboot(t)
	r := &rebooted{
		t: t, ca: e.ca, node: e.node, meta: e.meta, kubelet: &bootstraptest.Kubelet{}, progress: &progress{}, logs: &cmdutil.SyncBuffer{},
		keys: bootstraptest.ClusterKeys{Master: e.cluster.Master, MeasurementSalt: e.cluster.MeasurementSalt, ClusterID: e.cluster.ClusterID},
	}
	return r, e.cluster
}

// The join service answers first: the node rejoins, and its recovery server stops.
func TestRejoinWinsOverRecovery(t *testing.T) {
	r, _ := joinable(t)
	r.build()
	r.cfg.WaitingAfter = 0 // the default: a rejoin that answers is not reported as waiting
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res := <-r.run(ctx)
	require.NoError(t, res.err)
	assert.Equal(t, bootstrapper.ByRejoin, res.by)
	assert.Equal(t, metadata.PhaseRejoined, r.progress.list()[len(r.progress.list())-1])
	assert.Equal(t, node.HolderRejoin, r.node.Node.LockHolder())
	assert.Equal(t, 1, r.kubelet.Restarts())

	err := r.recover()
	assert.ErrorIs(t, err, recovery.ErrNotWaiting)
	assert.ErrorContains(t, err, "no recovery server answers")
}

// Rejoin and recovery deliver keys at about the same time: exactly one re-enters the node,
// PCR 15 is extended once, the kubelet restarted once, and the other stops cleanly.
func TestRejoinAndRecoveryRace(t *testing.T) {
	outcomes := map[string]int{}
	for round := range 6 {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			r, _ := joinable(t)
			r.joinDelay = 40 * time.Millisecond
			r.build()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			done := r.run(ctx)
			time.Sleep(time.Duration(rand.Int64N(int64(40 * time.Millisecond))))
			recoverErr := r.recover()
			res := <-done
			require.NoError(t, res.err)
			outcomes[res.by]++
			switch res.by {
			case bootstrapper.ByRecover:
				require.NoError(t, recoverErr)
				assert.Equal(t, node.HolderRecover, r.node.Node.LockHolder())
			case bootstrapper.ByRejoin:
				assert.ErrorIs(t, recoverErr, recovery.ErrNotWaiting)
				assert.Equal(t, node.HolderRejoin, r.node.Node.LockHolder())
			default:
				t.Fatalf("unexpected outcome %q", res.by)
			}
			assert.Equal(t, variant.QEMUVTPM.ClusterIDMarker(r.keys.ClusterID), r.node.ClusterIDRegister(t), "one extend")
			assert.True(t, r.node.Unlocked(t))
			assert.Equal(t, 1, r.kubelet.Restarts())
		})
	}
	t.Logf("outcomes: %v", outcomes)
}
