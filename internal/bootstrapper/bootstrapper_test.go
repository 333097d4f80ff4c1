package bootstrapper_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/openconstellation/constellation/api/init/initpb"
	"github.com/openconstellation/constellation/internal/attestation/akca"
	"github.com/openconstellation/constellation/internal/bootstrapper"
	"github.com/openconstellation/constellation/internal/bootstrapper/bootstraptest"
	"github.com/openconstellation/constellation/internal/bootstrapper/initserver"
	"github.com/openconstellation/constellation/internal/bootstrapper/joinclient"
	"github.com/openconstellation/constellation/internal/joinservice"
	"github.com/openconstellation/constellation/internal/kms"
	"github.com/openconstellation/constellation/internal/kube/kubetest"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// One real kube-apiserver + etcd for the package, started by the first test that needs it
// (fuzz workers of this binary never start it).
var (
	shared kubetest.Shared
	kube   *kubetest.Cluster // shared, once a test started it
)

func TestMain(m *testing.M) {
	code := m.Run()
	shared.Stop()
	os.Exit(code)
}

// env is a fresh control-plane node whose bootstrapper runs both init server and join
// client, next to a running join service of another cluster it could join.
type env struct {
	t       *testing.T
	ca      *akca.CA
	cluster *bootstraptest.Cluster
	node    *bootstraptest.Node
	meta    *metadata.Static
	kubeadm *bootstraptest.Kubeadm
	cfg     bootstrapper.Config
	kubelet *bootstraptest.Kubelet
	// joinDelay: see build.
	joinDelay time.Duration
}

func newEnv(t *testing.T) *env {
	kube = shared.Get(t)
	ca, err := akca.New("local AK CA", time.Now(), time.Hour)
	require.NoError(t, err)
	e := &env{t: t, ca: ca, kubelet: &bootstraptest.Kubelet{}}
	e.cluster = bootstraptest.StartJoinService(t, ca, kube, bootstraptest.ClusterOptions{})
	ip := netip.MustParseAddr("10.42.0.3")
	e.cluster.Admit("control-plane-1", ip, true)
	e.node = bootstraptest.NewNode(t, "control-plane-1", metadata.ControlPlane, ca)
	e.meta = &metadata.Static{
		Instance:  metadata.Instance{Name: "control-plane-1", Role: metadata.ControlPlane, IPs: []netip.Addr{ip}},
		Endpoints: []string{e.cluster.Addr},
		Hash:      bootstraptest.InitSecretHash,
	}
	admin, err := os.ReadFile(kube.Kubeconfig)
	require.NoError(t, err)
	e.kubeadm = &bootstraptest.Kubeadm{AdminKubeconfig: admin, AdminKubeconfigPath: filepath.Join(t.TempDir(), "admin.conf")}
	t.Cleanup(func() {
		ctx := context.Background()
		_ = kube.Admin.CoreV1().Secrets(initserver.RecordNamespace).Delete(ctx, initserver.MasterSecretSecretName, metav1.DeleteOptions{})
		_ = kube.Admin.CoreV1().ConfigMaps(initserver.RecordNamespace).Delete(ctx, initserver.ClusterConfigMapName, metav1.DeleteOptions{})
	})

	e.build()
	return e
}

// build makes the bootstrapper's parts for the node as it is now (again after a reboot).
// The join client dials after a random delay of up to joinDelay, so init and join arrive
// at the node lock in either order.
func (e *env) build() {
	t := e.t
	issuer := e.node.Issuer(t)
	init, err := initserver.New(initserver.Config{
		Node: e.node.Node, Metadata: e.meta, Issuer: issuer, Kubeadm: e.kubeadm,
		KubeadmConfig:   func(p initserver.InitParams) ([]byte, error) { return json.Marshal(p) },
		AdminKubeconfig: e.kubeadm.AdminKubeconfigPath, KubeletKubeconfig: filepath.Join(t.TempDir(), "kubelet.conf"), APIServerConfigDir: t.TempDir(),
		PKIDir: filepath.Join(t.TempDir(), "pki"), KubeletPKIDir: filepath.Join(t.TempDir(), "kubelet"),
	})
	require.NoError(t, err)
	check, err := joinservice.ServiceCheck{Variant: variant.QEMUVTPM}.Validator(e.node.TPM)
	require.NoError(t, err)
	attested, err := joinclient.AttestedDialer(issuer, check)
	require.NoError(t, err)
	dial := func(ctx context.Context, endpoint string) (*grpc.ClientConn, error) {
		if e.joinDelay > 0 {
			time.Sleep(time.Duration(rand.Int64N(int64(e.joinDelay))))
		}
		return attested(ctx, endpoint)
	}
	join, err := joinclient.New(joinclient.Config{
		Node: e.node.Node, Metadata: e.meta, Dial: dial, Kubeadm: e.kubeadm, Kubelet: e.kubelet,
		KubeadmConfig: func(p joinclient.JoinParams) ([]byte, error) { return json.Marshal(p) },
		PKIDir:        filepath.Join(t.TempDir(), "pki"), KubeletPKIDir: filepath.Join(t.TempDir(), "kubelet"),
		DiscoveryFile: filepath.Join(t.TempDir(), "discovery.conf"), APIServerConfigDir: t.TempDir(),
		Backoff: func() wait.Backoff { b := joinclient.NewBackoff(); b.Duration /= 100; b.Cap /= 100; return b },
	})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	e.cfg = bootstrapper.Config{Node: e.node.Node, InitServer: init, InitListener: ln, JoinClient: join}
}

func (e *env) run() chan runResult {
	out := make(chan runResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		by, err := bootstrapper.Run(ctx, e.cfg)
		out <- runResult{by, err}
	}()
	return out
}

type runResult struct {
	by  string
	err error
}

func (e *env) initRequest() (*initpb.InitRequest, []byte) {
	master, err := kms.NewMasterSecret()
	require.NoError(e.t, err)
	salt := bytes.Repeat([]byte{0x11}, 32)
	ms, err := master.MeasurementSecret()
	require.NoError(e.t, err)
	id, err := kms.ClusterID(ms, salt)
	require.NoError(e.t, err)
	return &initpb.InitRequest{
		MasterSecret: master.Key, MasterSalt: master.Salt, MeasurementSalt: salt,
		InitSecret: []byte(bootstraptest.InitSecret), ClusterName: "race", KubernetesVersion: kubetest.Version,
	}, id
}

// Init and join race on one node: exactly one wins, PCR 15 is extended exactly once (with
// the winner's cluster ID), kubeadm runs once, and the loser stops cleanly.
func TestInitAndJoinRace(t *testing.T) {
	outcomes := map[string]int{}
	for round := range 8 {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			e := newEnv(t)
			// Both sides start after random delays: init and join reach the lock in
			// either order, sometimes within a millisecond of each other.
			e.joinDelay = 30 * time.Millisecond
			req, initID := e.initRequest()
			done := e.run()
			time.Sleep(time.Duration(rand.Int64N(int64(30 * time.Millisecond))))
			cli := bootstraptest.CallInit(t, e.cfg.InitListener.Addr().String(), bootstraptest.Validator(t, e.ca), req)
			res := <-done
			require.NoError(t, res.err)
			outcomes[res.by]++
			switch res.by {
			case bootstrapper.ByInit:
				require.NoError(t, cli.Err)
				assert.NotNil(t, cli.Success)
				assert.Equal(t, variant.QEMUVTPM.ClusterIDMarker(initID), e.node.ClusterIDRegister(t))
			case bootstrapper.ByJoin:
				// The CLI's init is refused (lock taken) or finds the server gone.
				require.Error(t, cli.Err)
				assert.Contains(t, []codes.Code{codes.FailedPrecondition, codes.Unavailable}, status.Code(cli.Err), "%v", cli.Err)
				assert.Equal(t, variant.QEMUVTPM.ClusterIDMarker(e.cluster.ClusterID), e.node.ClusterIDRegister(t))
			default:
				t.Fatalf("unexpected outcome %q", res.by)
			}
			assert.Equal(t, res.by, e.node.Node.LockHolder())
			assert.Equal(t, []string{res.by}, e.kubeadm.CallList())
		})
	}
	t.Logf("outcomes: %v", outcomes)
}

// With no join service listed, init wins and the join client stops.
func TestInitWins(t *testing.T) {
	e := newEnv(t)
	e.meta.Endpoints = nil
	req, initID := e.initRequest()
	done := e.run()
	cli := bootstraptest.CallInit(t, e.cfg.InitListener.Addr().String(), bootstraptest.Validator(t, e.ca), req)
	require.NoError(t, cli.Err)
	res := <-done
	require.NoError(t, res.err)
	assert.Equal(t, bootstrapper.ByInit, res.by)
	assert.Equal(t, variant.QEMUVTPM.ClusterIDMarker(initID), e.node.ClusterIDRegister(t))
	assert.Equal(t, []string{"init"}, e.kubeadm.CallList())
}

// Join wins without any init call; an init afterwards finds the server gone.
func TestJoinWins(t *testing.T) {
	e := newEnv(t)
	res := <-e.run()
	require.NoError(t, res.err)
	assert.Equal(t, bootstrapper.ByJoin, res.by)
	req, _ := e.initRequest()
	cli := bootstraptest.CallInit(t, e.cfg.InitListener.Addr().String(), bootstraptest.Validator(t, e.ca), req)
	require.Error(t, cli.Err)
	assert.Equal(t, variant.QEMUVTPM.ClusterIDMarker(e.cluster.ClusterID), e.node.ClusterIDRegister(t))
	assert.Equal(t, []string{"join"}, e.kubeadm.CallList())

	// After a reboot the bootstrapper takes the rejoin path: no init server, no kubeadm.
	e.node.Reboot(t)
	e.build()
	res = <-e.run()
	require.NoError(t, res.err)
	assert.Equal(t, bootstrapper.ByRejoin, res.by)
	assert.Equal(t, variant.QEMUVTPM.ClusterIDMarker(e.cluster.ClusterID), e.node.ClusterIDRegister(t))
	assert.Equal(t, 1, e.kubelet.Restarts())
	assert.Equal(t, []string{"join"}, e.kubeadm.CallList())
}
