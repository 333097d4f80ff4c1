package joinclient_test

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/openconstellation/constellation/internal/attestation/akca"
	"github.com/openconstellation/constellation/internal/bootstrapper/bootstraptest"
	"github.com/openconstellation/constellation/internal/bootstrapper/joinclient"
	"github.com/openconstellation/constellation/internal/cmdutil"
	"github.com/openconstellation/constellation/internal/joinservice"
	"github.com/openconstellation/constellation/internal/kube/kubeadmconfig"
	"github.com/openconstellation/constellation/internal/kube/kubeletcsr"
	"github.com/openconstellation/constellation/internal/kube/kubetest"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/pki"
	"github.com/openconstellation/constellation/internal/statedisk"
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

type env struct {
	t       testing.TB
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
	// discovery is where the client writes the discovery kubeconfig for kubeadm.
	discovery string
	// apiServerDir is where a control plane's API server files go (nodeauthz).
	apiServerDir string
	logs         cmdutil.SyncBuffer
	// clock drives the client's waits: nil for the real clock and the schedule at a
	// hundredth of its delays, a fake clock for the real schedule.
	clock clock.Clock
	// attempts counts the client's attempts (each asks metadata for the endpoints once).
	attempts atomic.Int32
}

// countingMetadata counts the calls of JoinEndpoints: one per attempt.
type countingMetadata struct {
	*metadata.Static
	calls *atomic.Int32
}

func (m countingMetadata) JoinEndpoints(ctx context.Context) ([]string, error) {
	m.calls.Add(1)
	return m.Static.JoinEndpoints(ctx)
}

// newEnv starts a join service (swtpm, real kube-apiserver) and a node to join it; it skips
// the test under -short.
func newEnv(t testing.TB, role metadata.Role, opts bootstraptest.ClusterOptions) *env {
	if testing.Short() {
		t.Skip("starts swtpm, a join service and a kube-apiserver")
	}
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
	e.discovery = filepath.Join(t.TempDir(), "discovery.conf")
	e.apiServerDir = filepath.Join(t.TempDir(), "constellation")
	e.newClient()
	return e
}

// newClient builds the join client of the node as it is now (after a reboot, too).
func (e *env) newClient() {
	t := e.t
	// The node's check of the service, built from its TPM as nodeboot builds it.
	check, err := joinservice.ServiceCheck{Variant: variant.QEMUVTPM}.Validator(e.node.TPM)
	require.NoError(t, err)
	dial, err := joinclient.AttestedDialer(e.node.Issuer(t), check)
	require.NoError(t, err)
	poll, backoff := fastPoll, fastBackoff
	if e.clock != nil {
		poll, backoff = 0, nil // the defaults: the real schedule
	}
	e.client, err = joinclient.New(joinclient.Config{
		Node: e.node.Node, Metadata: countingMetadata{e.meta, &e.attempts}, Dial: dial, Clock: e.clock,
		Kubeadm: e.kubeadm, Kubelet: e.kubelet,
		KubeadmConfig: func(p joinclient.JoinParams) ([]byte, error) {
			e.params = append(e.params, p)
			return joinclient.KubeadmConfig(kubeadmconfig.NodeSettings{CRISocket: "unix:///run/containerd/containerd.sock", Sandbox: true})(p)
		},
		PKIDir: e.pkiDir, KubeletPKIDir: e.kpkiDir, DiscoveryFile: e.discovery, APIServerConfigDir: e.apiServerDir,
		PollInterval: poll, Backoff: backoff, Log: slog.New(slog.NewTextHandler(&e.logs, nil)),
	})
	require.NoError(t, err)
}

// fastPoll and fastBackoff keep the schedule's shape at a hundredth of its delays (tests on
// a fake clock use the real schedule).
const fastPoll = joinclient.PollInterval / 100

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
	assert.Equal(t, variant.QEMUVTPM.ClusterIDMarker(e.cluster.ClusterID), e.node.ClusterIDRegister(t))
	assert.Equal(t, "join", e.node.Node.LockHolder())

	// The storage is keyed with the disk key of its UUID and marked.
	uuid, err := e.node.Storage.UUID()
	require.NoError(t, err)
	diskKey, err := e.cluster.Master.StateDiskKey(uuid)
	require.NoError(t, err)
	initialized, err := e.node.Storage.Initialized()
	require.NoError(t, err)
	assert.True(t, initialized)

	// PKI: the cluster CA, the kubelet's serving certificate (signed by it, for this node,
	// serving only) and key; a worker gets no CA keys.
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
	assert.Equal(t, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, cert.ExtKeyUsage, "the serving certificate authenticates nobody")
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
	assert.Equal(t, e.discovery, p.DiscoveryFile)
	assert.False(t, p.ControlPlane)
	assert.Equal(t, kubetest.Version, p.KubernetesVersion)
	config := string(e.kubeadm.Configs[0])
	for _, want := range []string{"kind: JoinConfiguration", "name: node-1", "kubeConfigPath: " + e.discovery, "node-ip"} {
		assert.Contains(t, config, want)
	}
	for _, unwanted := range []string{"controlPlane:", "token", "bootstrapToken"} {
		assert.NotContains(t, config, unwanted)
	}
	// kubeadm joined with the ticket's API server and CA, authenticated as this node by its
	// client certificate (the real API server says who it is), and the file holding the
	// client key is gone afterwards.
	require.Len(t, e.kubeadm.Discovery, 1)
	discovery, err := clientcmd.Load(e.kubeadm.Discovery[0])
	require.NoError(t, err)
	restCfg, err := clientcmd.NewDefaultClientConfig(*discovery, nil).ClientConfig()
	require.NoError(t, err)
	assert.Equal(t, "https://"+kube.Host, restCfg.Host)
	assert.Equal(t, pki.EncodeCert(kube.PKI.CA.Cert), restCfg.CAData)
	assert.Equal(t, "system:node:node-1", whoami(t, *restCfg).Username)
	_, err = os.Stat(e.discovery)
	assert.ErrorIs(t, err, os.ErrNotExist, "the discovery file with the client key outlived the join")

	// Reboot: PCR 15 resets, the storage is locked. The node re-enters with a rejoin
	// ticket: PCR 15 extended again with the same cluster ID, storage unlocked with the
	// same key, the kubelet restarted; kubeadm is not run again.
	e.node.Reboot(t)
	assert.Equal(t, make([]byte, 32), e.node.ClusterIDRegister(t))
	e.newClient()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.ErrorContains(t, e.client.Join(ctx), "not fresh")
	require.NoError(t, e.client.Rejoin(ctx))
	assert.Equal(t, variant.QEMUVTPM.ClusterIDMarker(e.cluster.ClusterID), e.node.ClusterIDRegister(t))
	assert.Equal(t, "rejoin", e.node.Node.LockHolder())
	assert.Equal(t, 1, e.kubelet.Restarts())
	// The rejoin ticket renewed the kubelet's client certificate in its store, where the
	// kubelet reads it: this node's, from the cluster CA, short-lived, and accepted by the
	// API server.
	renewed, err := tls.LoadX509KeyPair(filepath.Join(e.kpkiDir, "kubelet-client-current.pem"), filepath.Join(e.kpkiDir, "kubelet-client-current.pem"))
	require.NoError(t, err)
	assert.Equal(t, "system:node:node-1", renewed.Leaf.Subject.CommonName)
	assert.Equal(t, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, renewed.Leaf.ExtKeyUsage)
	assert.WithinDuration(t, time.Now().Add(kubeletcsr.ClientValidity), renewed.Leaf.NotAfter, time.Minute)
	pairPEM, err := os.ReadFile(filepath.Join(e.kpkiDir, "kubelet-client-current.pem"))
	require.NoError(t, err)
	assert.Equal(t, "system:node:node-1", whoami(t, rest.Config{TLSClientConfig: rest.TLSClientConfig{CertData: pairPEM, KeyData: pairPEM}}).Username)
	assert.Equal(t, []string{"join"}, e.kubeadm.CallList())
	require.NoError(t, e.node.Storage.Lock(ctx))
	require.NoError(t, e.node.Storage.Unlock(ctx, diskKey))

	// The bootstrapper crashes and restarts within this boot: PCR 15 already carries the
	// cluster's marker, so it resumes without a second extend.
	e.node.Restart(t)
	e.newClient()
	require.NoError(t, e.client.Rejoin(ctx))
	assert.Equal(t, "rejoin (resumed)", e.node.Node.LockHolder())
	assert.Equal(t, variant.QEMUVTPM.ClusterIDMarker(e.cluster.ClusterID), e.node.ClusterIDRegister(t))
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
	// The API server's removed-node authorizer configuration, written before kubeadm join.
	authz, err := os.ReadFile(filepath.Join(e.apiServerDir, "authorization.yaml"))
	require.NoError(t, err)
	assert.Contains(t, string(authz), "kind: AuthorizationConfiguration")
	assert.FileExists(t, filepath.Join(e.apiServerDir, "removed-node-authorizer.conf"))
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
	assert.Equal(t, make([]byte, 32), e.node.ClusterIDRegister(t))
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

// A node waiting for its cluster is admitted at its first poll after the join service starts
// listening. The client runs on a fake clock and the real schedule: metadata first lists no
// endpoint, then one where nothing listens yet (TCP connection refused); each wait is at most
// one poll interval (0.6 s: stepping the clock by that much always releases the next
// attempt). The service (the real fixture, swtpm on both sides) starts listening while the
// node waits, and the very next attempt gets the ticket: no refusal, no back-off.
func TestJoinAtFirstPollAfterServiceListens(t *testing.T) {
	e := newEnv(t, metadata.Worker, bootstraptest.ClusterOptions{})
	clk := clocktesting.NewFakeClock(time.Now())
	e.clock = clk
	e.newClient()
	e.meta.SetJoinEndpoints(nil)
	addr := freeAddr(t)

	done := make(chan error, 1)
	go func() { done <- e.join() }()
	waitsAfter := func(attempt int) {
		t.Helper()
		require.Eventually(t, func() bool { return int(e.attempts.Load()) == attempt && clk.HasWaiters() }, 30*time.Second, time.Millisecond,
			"attempt %d did not happen within one poll interval; log:\n%s", attempt, e.logs.String())
	}
	poll := func() { clk.Step(pollWait.max) }

	waitsAfter(1) // no endpoint listed
	poll()
	waitsAfter(2)
	e.meta.SetJoinEndpoints([]string{addr})
	poll()
	waitsAfter(3) // nothing listens
	poll()
	waitsAfter(4)

	// The service starts listening while the node waits for its next poll.
	ln, err := net.Listen("tcp", addr)
	require.NoError(t, err, "the reserved address was taken in the meantime")
	go func() { _ = e.cluster.Server.Serve(ln) }()
	poll()
	select {
	case err := <-done:
		require.NoError(t, err, "log:\n%s", e.logs.String())
	case <-time.After(time.Minute):
		t.Fatalf("no ticket after the service listened; log:\n%s", e.logs.String())
	}
	assert.Equal(t, int32(5), e.attempts.Load(), "the ticket came with the first attempt after the service listened")
	logs := e.logs.String()
	assert.Contains(t, logs, `msg="ticket received" attempt=5 unreachableAttempts=4 refusedAttempts=0`)
	assert.Contains(t, logs, `msg="waiting for a join service" kind=unreachable attempt=1 reason="metadata lists no join endpoint yet"`)
	assert.Contains(t, logs, `msg="waiting for a join service" kind=unreachable attempt=3 reason="`+addr+`: `)
	assert.Contains(t, logs, "connection refused")
	assert.NotContains(t, logs, "refused attempt")
	assert.NotContains(t, logs, "kind=refused")
	assert.Equal(t, []string{"join"}, e.kubeadm.CallList())
}

// A service that answers and refuses is not polled: the client backs off exponentially. The
// node refuses the real service of another cluster; on the fake clock, one poll interval
// does not release the next attempt, the back-off's first wait (≤ 1 s) does, and the second
// wait is longer again.
func TestJoinBacksOffAfterRefusal(t *testing.T) {
	e := newEnv(t, metadata.Worker, bootstraptest.ClusterOptions{WrongMarker: true})
	clk := clocktesting.NewFakeClock(time.Now())
	e.clock = clk
	e.newClient()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.client.Join(ctx) }()
	waitsAfter := func(attempt int) {
		t.Helper()
		require.Eventually(t, func() bool { return int(e.attempts.Load()) == attempt && clk.HasWaiters() }, 30*time.Second, time.Millisecond,
			"attempt %d; log:\n%s", attempt, e.logs.String())
	}
	// stillWaitingAfter asserts that the client still waits after attempt: a timer a step
	// made due fires within Step, so HasWaiters is false right after the step if it did.
	stillWaitingAfter := func(attempt int, msg string) {
		t.Helper()
		require.True(t, clk.HasWaiters(), "%s; log:\n%s", msg, e.logs.String())
		require.Equal(t, int32(attempt), e.attempts.Load(), msg)
	}

	waitsAfter(1)
	clk.Step(pollWait.max)
	stillWaitingAfter(1, "the client polled after a refusal")
	clk.Step(joinclient.FirstDelayMax - pollWait.max)
	waitsAfter(2)
	clk.Step(backoffWait(1).min - time.Millisecond)
	stillWaitingAfter(2, "the back-off did not grow")
	clk.Step(backoffWait(1).max - backoffWait(1).min + time.Millisecond)
	waitsAfter(3)
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)

	logs := e.logs.String()
	assert.Equal(t, 3, strings.Count(logs, `msg="join attempt refused" kind=refused`), "every refusal logged; log:\n%s", logs)
	assert.Contains(t, logs, "join service belongs to another cluster")
	assert.NotContains(t, logs, "kind=unreachable")
	assert.Empty(t, e.kubeadm.CallList())
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
	assert.Equal(t, variant.QEMUVTPM.ClusterIDMarker([]byte("init's cluster")), e.node.ClusterIDRegister(t))
}

func TestKubeadmJoinFailure(t *testing.T) {
	e := newEnv(t, metadata.Worker, bootstraptest.ClusterOptions{})
	e.kubeadm.Fail = errors.New("exit status 1")
	assert.ErrorContains(t, e.join(), "kubeadm join: exit status 1")
}

// whoami asks the real API server who cfg's credentials authenticate as.
func whoami(t *testing.T, cfg rest.Config) authv1.UserInfo {
	t.Helper()
	client, err := kube.ClientFor(cfg)
	require.NoError(t, err)
	review, err := client.AuthenticationV1().SelfSubjectReviews().Create(context.Background(), &authv1.SelfSubjectReview{}, metav1.CreateOptions{})
	require.NoError(t, err)
	return review.Status.UserInfo
}
