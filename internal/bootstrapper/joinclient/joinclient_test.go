package joinclient_test

import (
	"context"
	"crypto"
	"errors"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/openconstellation/constellation/internal/attestation/akca"
	"github.com/openconstellation/constellation/internal/bootstrapper/bootstraptest"
	"github.com/openconstellation/constellation/internal/bootstrapper/joinclient"
	"github.com/openconstellation/constellation/internal/cmdutil"
	"github.com/openconstellation/constellation/internal/joinservice"
	"github.com/openconstellation/constellation/internal/kms"
	"github.com/openconstellation/constellation/internal/kube/kubeadmconfig"
	"github.com/openconstellation/constellation/internal/kube/kubetest"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/pki"
	"github.com/openconstellation/constellation/internal/statedisk"
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

type env struct {
	t       *testing.T
	ca      *akca.CA
	cluster *bootstraptest.Cluster
	node    *bootstraptest.Node
	meta    *metadata.Static
	kubeadm *bootstraptest.Kubeadm
	kubelet *bootstraptest.Kubelet
	client  *joinclient.Client
	params  []joinclient.JoinParams
	pkiDir  string
	kpkiDir string
	logs    cmdutil.SyncBuffer
}

func newEnv(t *testing.T, role metadata.Role, opts bootstraptest.ClusterOptions) *env {
	kube = shared.Get(t)
	ca, err := akca.New("local AK CA", time.Now(), time.Hour)
	require.NoError(t, err)
	e := &env{t: t, ca: ca, kubeadm: &bootstraptest.Kubeadm{Output: "[preflight] Running pre-flight checks\n"}, kubelet: &bootstraptest.Kubelet{}}
	e.cluster = bootstraptest.StartJoinService(t, ca, kube, opts)
	ip := netip.MustParseAddr("10.42.0.10")
	e.cluster.Admit("node-1", ip, role == metadata.ControlPlane)
	e.node = bootstraptest.NewNode(t, "node-1", role, ca)
	e.meta = &metadata.Static{
		Instance:  metadata.Instance{Name: "node-1", Role: role, IPs: []netip.Addr{ip}},
		Endpoints: []string{e.cluster.Addr},
	}
	e.pkiDir = filepath.Join(t.TempDir(), "pki")
	e.kpkiDir = filepath.Join(t.TempDir(), "kubelet-pki")
	e.newClient()
	return e
}

// newClient builds the join client of the node as it is now (after a reboot, too).
func (e *env) newClient() {
	t := e.t
	// The node's check of the service, built from its TPM as nodeboot builds it.
	check, err := joinservice.ServiceCheck{}.Validator(e.node.TPM)
	require.NoError(t, err)
	dial, err := joinclient.AttestedDialer(e.node.Issuer(t), check)
	require.NoError(t, err)
	e.client, err = joinclient.New(joinclient.Config{
		Node: e.node.Node, Metadata: e.meta, Dial: dial,
		Kubeadm: e.kubeadm, Kubelet: e.kubelet,
		KubeadmConfig: func(p joinclient.JoinParams) ([]byte, error) {
			e.params = append(e.params, p)
			return joinclient.KubeadmConfig(kubeadmconfig.NodeSettings{CRISocket: "unix:///run/containerd/containerd.sock", Sandbox: true})(p)
		},
		PKIDir: e.pkiDir, KubeletPKIDir: e.kpkiDir,
		Backoff: fastBackoff, Log: slog.New(slog.NewTextHandler(&e.logs, nil)),
	})
	require.NoError(t, err)
}

// fastBackoff keeps the schedule's shape at a hundredth of its delays.
func fastBackoff() wait.Backoff {
	b := joinclient.NewBackoff()
	b.Duration /= 100
	b.Cap /= 100
	return b
}

func (e *env) join() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return e.client.Join(ctx)
}

func TestJoinWorkerThenReboot(t *testing.T) {
	e := newEnv(t, metadata.Worker, bootstraptest.ClusterOptions{})
	require.NoError(t, e.join())

	// PCR 15 carries the ticket's cluster (extended once), the lock is join's.
	assert.Equal(t, kms.InitializedPCR15(e.cluster.ClusterID), e.node.PCR15(t))
	assert.Equal(t, "join", e.node.Node.LockHolder())

	// The storage is keyed with the disk key of its UUID and marked.
	uuid, err := e.node.Storage.UUID()
	require.NoError(t, err)
	diskKey, err := e.cluster.Master.DeriveKey(uuid, statedisk.KeySize)
	require.NoError(t, err)
	initialized, err := e.node.Storage.Initialized()
	require.NoError(t, err)
	assert.True(t, initialized)

	// PKI: the cluster CA, the kubelet's certificate (signed by it, for this node) and key;
	// a worker gets no CA keys.
	caPEM, err := os.ReadFile(filepath.Join(e.pkiDir, pki.CACert))
	require.NoError(t, err)
	assert.Equal(t, pki.EncodeCert(kube.PKI.CA.Cert), caPEM)
	_, err = os.Stat(filepath.Join(e.pkiDir, pki.CAKey))
	assert.ErrorIs(t, err, os.ErrNotExist)
	certPEM, err := os.ReadFile(filepath.Join(e.kpkiDir, joinclient.KubeletCertFile))
	require.NoError(t, err)
	cert, err := pki.ParseCert(certPEM)
	require.NoError(t, err)
	assert.Equal(t, "system:node:node-1", cert.Subject.CommonName)
	assert.Equal(t, []string{"node-1"}, cert.DNSNames)
	keyPEM, err := os.ReadFile(filepath.Join(e.kpkiDir, joinclient.KubeletKeyFile))
	require.NoError(t, err)
	key, err := pki.ParseKey(keyPEM)
	require.NoError(t, err)
	assert.True(t, key.Public().(interface{ Equal(crypto.PublicKey) bool }).Equal(cert.PublicKey))
	info, err := os.Stat(filepath.Join(e.kpkiDir, joinclient.KubeletKeyFile))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())

	// kubeadm join ran once, configured from the ticket.
	assert.Equal(t, []string{"join"}, e.kubeadm.CallList())
	require.Len(t, e.params, 1)
	p := e.params[0]
	assert.Equal(t, e.meta.Instance, p.Self)
	assert.Equal(t, kube.Host, p.APIServerEndpoint)
	assert.Equal(t, []string{pki.DiscoveryHash(kube.PKI.CA.Cert)}, p.CACertHashes)
	assert.Regexp(t, `^[a-z0-9]{6}\.[a-z0-9]{16}$`, p.Token)
	assert.False(t, p.ControlPlane)
	assert.Equal(t, kubetest.Version, p.KubernetesVersion)
	config := string(e.kubeadm.Configs[0])
	for _, want := range []string{"kind: JoinConfiguration", "name: node-1", "apiServerEndpoint: " + kube.Host, "token: " + p.Token, "- " + p.CACertHashes[0], "node-ip"} {
		assert.Contains(t, config, want)
	}
	assert.NotContains(t, config, "controlPlane:")

	// Reboot: PCR 15 resets, the storage is locked. The node re-enters with a rejoin
	// ticket: PCR 15 extended again with the same cluster ID, storage unlocked with the
	// same key, the kubelet restarted; kubeadm is not run again.
	e.node.Reboot(t)
	assert.Equal(t, make([]byte, 32), e.node.PCR15(t))
	e.newClient()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.ErrorContains(t, e.client.Join(ctx), "not fresh")
	require.NoError(t, e.client.Rejoin(ctx))
	assert.Equal(t, kms.InitializedPCR15(e.cluster.ClusterID), e.node.PCR15(t))
	assert.Equal(t, "rejoin", e.node.Node.LockHolder())
	assert.Equal(t, 1, e.kubelet.Restarts())
	assert.Equal(t, []string{"join"}, e.kubeadm.CallList())
	require.NoError(t, e.node.Storage.Lock(ctx))
	require.NoError(t, e.node.Storage.Unlock(ctx, diskKey))

	// The bootstrapper crashes and restarts within this boot: PCR 15 already carries the
	// cluster's marker, so it resumes without a second extend.
	e.node.Restart(t)
	e.newClient()
	require.NoError(t, e.client.Rejoin(ctx))
	assert.Equal(t, "rejoin (resumed)", e.node.Node.LockHolder())
	assert.Equal(t, kms.InitializedPCR15(e.cluster.ClusterID), e.node.PCR15(t))
	assert.Equal(t, 2, e.kubelet.Restarts())
}

func TestJoinControlPlane(t *testing.T) {
	e := newEnv(t, metadata.ControlPlane, bootstraptest.ClusterOptions{})
	require.NoError(t, e.join())
	for _, name := range pki.ControlPlaneFiles {
		want, err := os.ReadFile(filepath.Join(kube.PKIDir, name))
		require.NoError(t, err)
		got, err := os.ReadFile(filepath.Join(e.pkiDir, name))
		require.NoError(t, err, name)
		assert.Equal(t, want, got, name)
	}
	require.Len(t, e.params, 1)
	assert.True(t, e.params[0].ControlPlane)
}

// The node refuses a join service whose node is initialized for another cluster than the
// ticket's: nothing is claimed, written or run; the client keeps trying until its context
// ends.
func TestJoinRefusesServiceOfOtherCluster(t *testing.T) {
	e := newEnv(t, metadata.Worker, bootstraptest.ClusterOptions{WrongMarker: true})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	err := e.client.Join(ctx)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Equal(t, make([]byte, 32), e.node.PCR15(t))
	assert.Empty(t, e.kubeadm.CallList())
	_, err = os.Stat(e.kpkiDir)
	assert.ErrorIs(t, err, os.ErrNotExist)
}

// Join retries while no service is listed, and while the listed one is down, and joins once
// it is up.
func TestJoinRetriesUntilServiceAnswers(t *testing.T) {
	e := newEnv(t, metadata.Worker, bootstraptest.ClusterOptions{})
	e.meta.Endpoints = nil
	done := make(chan error, 1)
	go func() { done <- e.join() }()
	time.Sleep(100 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("join returned without a service: %v", err)
	default:
	}
	assert.Empty(t, e.kubeadm.CallList())
	e.meta.SetJoinEndpoints([]string{"127.0.0.1:1", e.cluster.Addr})
	require.NoError(t, <-done)
	assert.Equal(t, []string{"join"}, e.kubeadm.CallList())
}

// When init wins the node lock, the join client stops promptly with ErrInitWon and changes
// nothing.
func TestJoinStopsWhenInitWins(t *testing.T) {
	e := newEnv(t, metadata.ControlPlane, bootstraptest.ClusterOptions{})
	e.meta.Endpoints = nil
	done := make(chan error, 1)
	go func() { done <- e.join() }()
	time.Sleep(50 * time.Millisecond)
	key, err := statedisk.NewRandomKey()
	require.NoError(t, err)
	require.NoError(t, e.node.Node.Claim(context.Background(), "init", []byte("init's cluster"), key))
	select {
	case err := <-done:
		assert.ErrorIs(t, err, joinclient.ErrInitWon)
	case <-time.After(10 * time.Second):
		t.Fatal("join client did not stop after init won")
	}
	assert.Empty(t, e.kubeadm.CallList())
	assert.Equal(t, kms.InitializedPCR15([]byte("init's cluster")), e.node.PCR15(t))
}

func TestKubeadmJoinFailure(t *testing.T) {
	e := newEnv(t, metadata.Worker, bootstraptest.ClusterOptions{})
	e.kubeadm.Fail = errors.New("exit status 1")
	assert.ErrorContains(t, e.join(), "kubeadm join: exit status 1")
}
