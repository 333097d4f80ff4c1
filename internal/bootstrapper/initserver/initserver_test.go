package initserver_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/openconstellation/constellation/api/init/initpb"
	"github.com/openconstellation/constellation/api/join/joinpb"
	"github.com/openconstellation/constellation/internal/attestation/akca"
	"github.com/openconstellation/constellation/internal/attestation/softfirmware"
	"github.com/openconstellation/constellation/internal/bootstrapper/bootstraptest"
	"github.com/openconstellation/constellation/internal/bootstrapper/initserver"
	"github.com/openconstellation/constellation/internal/diskowner"
	"github.com/openconstellation/constellation/internal/handshakelimit"
	"github.com/openconstellation/constellation/internal/kms"
	"github.com/openconstellation/constellation/internal/kube/kubeadmconfig"
	"github.com/openconstellation/constellation/internal/kube/kubeletcsr"
	"github.com/openconstellation/constellation/internal/kube/kubetest"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/pki"
	"github.com/openconstellation/constellation/internal/statedisk"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/choose"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/qemu"
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

// env is one fresh control-plane node running the init server, and a CLI that verifies it.
type env struct {
	t                     *testing.T
	ca                    *akca.CA
	node                  *bootstraptest.Node
	meta                  *metadata.Static
	kubeadm               *bootstraptest.Kubeadm
	server                *initserver.Server
	addr                  string
	paramsMu              sync.Mutex
	params                []initserver.InitParams
	pkiDir, kubeletPKIDir string
	// kubeletConf is the kubelet's kubeconfig the server writes before kubeadm runs;
	// apiServerDir where the API server's authorizer files go.
	kubeletConf, apiServerDir string
	// registryDir is where the node's registry hosts go.
	registryDir string
	deploy      initserver.DeployFunc
	opts        envOptions
	// hashReads counts the init-secret hash reads of the server: an attempt that reads it
	// goes on to a bcrypt comparison.
	hashReads atomic.Int32
}

// envOptions change what the server is built with; its limits stay the defaults.
type envOptions struct {
	deploy initserver.DeployFunc
	// wrapIssuer, when set, wraps the node's issuer (to count or hold its quotes).
	wrapIssuer func(attestation.Issuer) attestation.Issuer
	// now is the limiters' clock; frozen by default, so that rates do not depend on how
	// fast the test runs.
	now func() time.Time
	// accept bounds connections before their handshake (zero: the server's defaults).
	accept handshakelimit.AcceptLimits
}

// countingMetadata counts init-secret hash reads.
type countingMetadata struct {
	metadata.Provider
	reads *atomic.Int32
}

func (c countingMetadata) InitSecretHash(ctx context.Context) ([]byte, error) {
	c.reads.Add(1)
	return c.Provider.InitSecretHash(ctx)
}

// callers hands out loopback source addresses: every CLI of a test is its own caller, as
// for the server's per-caller limits (tests of those limits pick their addresses).
var callers atomic.Int32

func nextCaller() string {
	n := callers.Add(1)
	return fmt.Sprintf("127.1.%d.%d", n/250, n%250+1)
}

var settings = kubeadmconfig.NodeSettings{CRISocket: "unix:///run/containerd/containerd.sock", Sandbox: true}

func newEnv(t *testing.T) *env {
	return newEnvWithDeploy(t, nil)
}

// newEnvWithDeploy is newEnv with the init server deploying the services with deploy.
func newEnvWithDeploy(t *testing.T, deploy initserver.DeployFunc) *env {
	return newEnvWith(t, envOptions{deploy: deploy})
}

func newEnvWith(t *testing.T, opts envOptions) *env {
	kube = shared.Get(t)
	t.Helper()
	ca, err := akca.New("local AK CA", time.Now(), time.Hour)
	require.NoError(t, err)
	e := &env{t: t, ca: ca, pkiDir: filepath.Join(t.TempDir(), "pki"), kubeletPKIDir: filepath.Join(t.TempDir(), "kubelet-pki"), kubeletConf: filepath.Join(t.TempDir(), "etc", "kubelet.conf"), apiServerDir: filepath.Join(t.TempDir(), "constellation"), registryDir: filepath.Join(t.TempDir(), "certs.d")}
	e.node = bootstraptest.NewNode(t, "control-plane-0", metadata.ControlPlane, ca)
	e.meta = &metadata.Static{
		Instance: metadata.Instance{Name: "control-plane-0", Role: metadata.ControlPlane, IPs: []netip.Addr{netip.MustParseAddr("10.42.0.2")}},
		Hash:     bootstraptest.InitSecretHash,
		API:      "10.42.0.254:6443", // the platform's load balancer
	}
	admin, err := os.ReadFile(kube.Kubeconfig)
	require.NoError(t, err)
	e.kubeadm = &bootstraptest.Kubeadm{
		AdminKubeconfig: admin, AdminKubeconfigPath: filepath.Join(t.TempDir(), "admin.conf"),
		Output: "[init] Using Kubernetes version: v1.34.4\n[certs] Generating \"ca\" certificate and key\n",
	}
	e.deploy = opts.deploy
	if opts.now == nil {
		frozen := time.Now()
		opts.now = func() time.Time { return frozen }
	}
	e.opts = opts
	e.start()
	t.Cleanup(e.forgetCluster)
	return e
}

func (e *env) start() {
	t := e.t
	var err error
	var issuer attestation.Issuer = e.node.Issuer(t)
	if e.opts.wrapIssuer != nil {
		issuer = e.opts.wrapIssuer(issuer)
	}
	e.server, err = initserver.New(initserver.Config{
		Node: e.node.Node, Metadata: countingMetadata{e.meta, &e.hashReads}, Issuer: issuer, Kubeadm: e.kubeadm,
		Now: e.opts.now, AcceptLimits: e.opts.accept,
		KubeadmConfig: func(p initserver.InitParams) ([]byte, error) {
			e.paramsMu.Lock()
			defer e.paramsMu.Unlock()
			e.params = append(e.params, p)
			return initserver.KubeadmConfig(settings)(p)
		},
		PKIDir: e.pkiDir, KubeletPKIDir: e.kubeletPKIDir, KubeletKubeconfig: e.kubeletConf, APIServerConfigDir: e.apiServerDir,
		RegistryHostsDir:  e.registryDir,
		KubernetesVersion: kubetest.Version,
		AdminKubeconfig:   e.kubeadm.AdminKubeconfigPath,
		NodeLogs:          func(context.Context) []byte { return []byte("kubelet: node log line\n") },
		Deploy:            e.deploy,
	})
	require.NoError(t, err)
	// Served as bootstrapper.Run serves it.
	g := e.server.NewGRPCServer()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)
	e.addr = ln.Addr().String()
}

// forgetCluster removes what an init recorded in the shared API server.
func (e *env) forgetCluster() {
	ctx := context.Background()
	_ = kube.Admin.CoreV1().Secrets(initserver.RecordNamespace).Delete(ctx, initserver.MasterSecretSecretName, metav1.DeleteOptions{})
	_ = kube.Admin.CoreV1().ConfigMaps(initserver.RecordNamespace).Delete(ctx, initserver.ClusterConfigMapName, metav1.DeleteOptions{})
	if uuid, err := e.node.Storage.UUID(); err == nil {
		if name, err := diskowner.ObjectName(uuid); err == nil {
			_ = kube.Admin.CoreV1().ConfigMaps(diskowner.Namespace).Delete(ctx, name, metav1.DeleteOptions{})
		}
	}
}

func request(t *testing.T) (*initpb.InitRequest, kms.MasterSecret) {
	master, err := kms.NewMasterSecret()
	require.NoError(t, err)
	return &initpb.InitRequest{
		MasterSecret: master.Key, MasterSalt: master.Salt,
		MeasurementSalt:   bytes.Repeat([]byte{0x42}, 32),
		InitSecret:        []byte(bootstraptest.InitSecret),
		ClusterName:       "demo",
		KubernetesVersion: kubetest.Version,
		KubernetesComponents: []*joinpb.KubernetesComponent{
			{Name: "kubelet", Url: "file:///opt/kube/kubelet", Hash: "sha256:" + strings.Repeat("ab", 32), InstallPath: "/usr/bin/kubelet"},
		},
		ApiServerCertSans: []string{"demo.example.com", "192.0.2.10"},
		ServiceCidr:       "10.96.0.0/12",
		PodCidr:           "10.244.0.0/16",
	}, master
}

type result = bootstraptest.InitResult

// call is the CLI: it verifies the node (image measurements, AK certified by the provider's
// CA) and then sends the request.
func (e *env) call(req *initpb.InitRequest) result {
	return e.callWith(bootstraptest.Validator(e.t, e.ca), req)
}

func (e *env) callWith(v attestation.Validator, req *initpb.InitRequest) result {
	return bootstraptest.CallInitFrom(e.t, nextCaller(), e.addr, v, req)
}

func TestInit(t *testing.T) {
	e := newEnv(t)
	req, master := request(t)
	req.RegistryMirrors = []byte(`{"docker.io":["https://mirror.gcr.io"]}`)
	res := e.call(req)
	require.NoError(t, res.Err)
	require.NotNil(t, res.Success)

	// The request's registry mirrors are the node's containerd's.
	hosts, err := os.ReadFile(filepath.Join(e.registryDir, "docker.io", "hosts.toml"))
	require.NoError(t, err)
	assert.Contains(t, string(hosts), `[host."https://mirror.gcr.io"]`)

	// The cluster ID follows docs/design.md "2.3 Cluster ID", and PCR 15 carries it
	// (extended exactly once).
	ms, err := master.MeasurementSecret()
	require.NoError(t, err)
	wantID, err := kms.ClusterID(ms, req.MeasurementSalt)
	require.NoError(t, err)
	assert.Equal(t, wantID, res.Success.ClusterId)
	assert.Equal(t, variant.QEMUVTPM.ClusterIDMarker(wantID), e.node.ClusterIDRegister(t))
	assert.Equal(t, "init", e.node.Node.LockHolder())

	// The admin kubeconfig kubeadm wrote is returned, and it works against the API server.
	admin, err := os.ReadFile(kube.Kubeconfig)
	require.NoError(t, err)
	assert.Equal(t, admin, res.Success.Kubeconfig)
	restCfg, err := clientcmd.RESTConfigFromKubeConfig(res.Success.Kubeconfig)
	require.NoError(t, err)
	client, err := kubernetes.NewForConfig(restCfg)
	require.NoError(t, err)

	// The cluster is recorded: the master secret for the key service, the public facts for
	// the join service and verifiers.
	ctx := context.Background()
	secret, err := client.CoreV1().Secrets("kube-system").Get(ctx, initserver.MasterSecretSecretName, metav1.GetOptions{})
	require.NoError(t, err)
	var stored kms.MasterSecret
	require.NoError(t, json.Unmarshal(secret.Data["mastersecret.json"], &stored))
	assert.Equal(t, master, stored)
	assert.True(t, *secret.Immutable)
	cm, err := client.CoreV1().ConfigMaps("kube-system").Get(ctx, initserver.ClusterConfigMapName, metav1.GetOptions{})
	require.NoError(t, err)
	var rec initserver.ClusterRecord
	require.NoError(t, json.Unmarshal([]byte(cm.Data["cluster.json"]), &rec))
	assert.Equal(t, initserver.ClusterRecord{
		Name: "demo", ClusterID: hex.EncodeToString(wantID),
		MeasurementSalt:   base64.StdEncoding.EncodeToString(req.MeasurementSalt),
		KubernetesVersion: kubetest.Version,
		KubernetesComponents: []initserver.ComponentRecord{
			{Name: "kubelet", URL: "file:///opt/kube/kubelet", Hash: "sha256:" + strings.Repeat("ab", 32), InstallPath: "/usr/bin/kubelet"},
		},
		ClusterIDMarker: hex.EncodeToString(variant.QEMUVTPM.ClusterIDMarker(wantID)),
	}, rec)

	// This node's state disk is recorded as its own: it never gets a join ticket, and the
	// join service releases a disk's key only to the disk's recorded owner.
	diskUUID, err := e.node.Storage.UUID()
	require.NoError(t, err)
	owner, err := diskowner.Store{Client: client}.Owner(ctx, diskUUID)
	require.NoError(t, err)
	assert.Equal(t, "control-plane-0", owner)

	// kubeadm ran once, with the configuration built from the request and the node's metadata.
	assert.Equal(t, []string{"init"}, e.kubeadm.CallList())
	require.Len(t, e.params, 1)
	assert.Equal(t, initserver.InitParams{
		Self: e.meta.Instance, ClusterName: "demo", KubernetesVersion: kubetest.Version,
		APIServerCertSANs: []string{"demo.example.com", "192.0.2.10"},
		ServiceCIDR:       netip.MustParsePrefix("10.96.0.0/12"), PodCIDR: netip.MustParsePrefix("10.244.0.0/16"),
		ControlPlaneEndpoint: "10.42.0.254:6443",
	}, e.params[0])
	wantConfig, err := initserver.KubeadmConfig(settings)(e.params[0])
	require.NoError(t, err)
	assert.Equal(t, string(wantConfig), string(e.kubeadm.Configs[0]))
	for _, want := range []string{"name: control-plane-0", "advertiseAddress: 10.42.0.2", "controlPlaneEndpoint: 10.42.0.254:6443", "- demo.example.com", "podSubnet: 10.244.0.0/16", "serviceSubnet: 10.96.0.0/12", "clusterName: demo", "kubernetesVersion: " + kubetest.Version} {
		assert.Contains(t, string(e.kubeadm.Configs[0]), want)
	}

	// The cluster CAs were created before kubeadm ran (kubeadm uses them), and the first
	// kubelet's serving certificate is signed by the cluster CA for the node's name and IP.
	ca, err := pki.LoadCA(filepath.Join(e.pkiDir, pki.CACert), filepath.Join(e.pkiDir, pki.CAKey))
	require.NoError(t, err)
	for _, f := range pki.ControlPlaneFiles {
		assert.FileExists(t, filepath.Join(e.pkiDir, f))
	}
	certPEM, err := os.ReadFile(filepath.Join(e.kubeletPKIDir, "kubelet.crt"))
	require.NoError(t, err)
	kubeletCert, err := pki.ParseCert(certPEM)
	require.NoError(t, err)
	_, err = kubeletCert.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	require.NoError(t, err)
	assert.Equal(t, "system:node:control-plane-0", kubeletCert.Subject.CommonName)
	assert.Equal(t, "10.42.0.2", kubeletCert.IPAddresses[0].String())
	info, err := os.Stat(filepath.Join(e.kubeletPKIDir, "kubelet.key"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())
	assert.Equal(t, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, kubeletCert.ExtKeyUsage, "the serving certificate authenticates nobody")

	// The kubelet's kubeconfig (kubeadm keeps it): the node's address, the cluster CA, and a
	// client certificate for this node only, from the cluster CA, living ClientValidity.
	info, err = os.Stat(e.kubeletConf)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())
	kubeletConf, err := clientcmd.LoadFromFile(e.kubeletConf)
	require.NoError(t, err)
	kubeletRest, err := clientcmd.NewDefaultClientConfig(*kubeletConf, nil).ClientConfig()
	require.NoError(t, err)
	assert.Equal(t, "https://10.42.0.2:6443", kubeletRest.Host)
	assert.Equal(t, pki.EncodeCert(ca.Cert), kubeletRest.CAData)
	clientCert, err := pki.ParseCert(kubeletRest.CertData)
	require.NoError(t, err)
	_, err = clientCert.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	require.NoError(t, err)
	assert.Equal(t, "system:node:control-plane-0", clientCert.Subject.CommonName)
	assert.Equal(t, []string{"system:nodes"}, clientCert.Subject.Organization)
	assert.WithinDuration(t, time.Now().Add(kubeletcsr.ClientValidity), clientCert.NotAfter, time.Minute)
	// The API server's removed-node authorizer configuration.
	authz, err := os.ReadFile(filepath.Join(e.apiServerDir, "authorization.yaml"))
	require.NoError(t, err)
	assert.Contains(t, string(authz), "kind: AuthorizationConfiguration")

	// Progress was streamed, kubeadm's output included, in order.
	joined := strings.Join(res.Progress, "\n")
	assert.Contains(t, joined, "node lock taken: PCR 15 extended")
	assert.Contains(t, joined, "kubeadm: [certs] Generating \"ca\" certificate and key")
	assert.Less(t, strings.Index(joined, "node lock taken"), strings.Index(joined, "running kubeadm init"))
	assert.Empty(t, res.Log, "no log is streamed on success")

	// The storage is keyed with the disk key derived from its UUID; the random key is gone.
	uuid, err := e.node.Storage.UUID()
	require.NoError(t, err)
	diskKey, err := master.StateDiskKey(uuid)
	require.NoError(t, err)
	initialized, err := e.node.Storage.Initialized()
	require.NoError(t, err)
	assert.True(t, initialized)
	require.NoError(t, e.node.Storage.Lock(ctx))
	require.NoError(t, e.node.Storage.Unlock(ctx, diskKey))
	select {
	case <-e.server.Finished():
		assert.NoError(t, e.server.Err())
	default:
		t.Error("Finished not closed after a successful init")
	}

	// A second init is refused and changes nothing.
	again, _ := request(t)
	res2 := e.call(again)
	assert.Equal(t, codes.FailedPrecondition, status.Code(res2.Err))
	assert.ErrorContains(t, res2.Err, "already part of a cluster (node lock taken by init)")
	assert.Equal(t, variant.QEMUVTPM.ClusterIDMarker(wantID), e.node.ClusterIDRegister(t))
	assert.Equal(t, []string{"init"}, e.kubeadm.CallList())
	assert.Empty(t, res2.Progress)
}

// Requests refused before the node lock: no side effect at all, and a correct request
// afterwards still initializes the node.
func TestRefusedWithoutSideEffects(t *testing.T) {
	e := newEnv(t)
	for name, tc := range map[string]struct {
		mutate func(*initpb.InitRequest)
		code   codes.Code
		want   []string
	}{
		"wrong init secret": {
			mutate: func(r *initpb.InitRequest) { r.InitSecret = []byte("guess") },
			code:   codes.PermissionDenied, want: []string{"wrong init secret"},
		},
		"no init secret": {
			mutate: func(r *initpb.InitRequest) { r.InitSecret = nil },
			code:   codes.PermissionDenied, want: []string{"wrong init secret"},
		},
		// A wrong secret is refused before the request is looked at.
		"wrong secret and invalid request": {
			mutate: func(r *initpb.InitRequest) { r.InitSecret = []byte("guess"); r.MasterSecret = nil },
			code:   codes.PermissionDenied, want: []string{"wrong init secret"},
		},
		"everything invalid": {
			mutate: func(r *initpb.InitRequest) {
				r.MasterSecret = r.MasterSecret[:16]
				r.MasterSalt = nil
				r.MeasurementSalt = []byte{1}
				r.ClusterName = "Demo_Cluster"
				r.KubernetesVersion = "1.34"
				r.KubernetesComponents[0].Hash = "md5:00"
				r.ApiServerCertSans = []string{"bad name!"}
				r.ServiceCidr = "10.96.0.1/12"
				r.PodCidr = "not-a-cidr"
			},
			code: codes.InvalidArgument,
			want: []string{
				"key has 16 bytes, want 32", "salt has 0 bytes, want 32", "measurement salt has 1 bytes, want 32",
				`cluster name "Demo_Cluster"`, `kubernetes version "1.34" is not of the form v1.X.Y`,
				`component "kubelet": hash "md5:00"`, `API server SAN "bad name!"`,
				"service CIDR: 10.96.0.1/12 has host bits set", "pod CIDR:",
			},
		},
		"other kubernetes version": {
			mutate: func(r *initpb.InitRequest) { r.KubernetesVersion = "v1.33.0" },
			code:   codes.InvalidArgument, want: []string{"v1.33.0 is not the version this node's image runs (v1.34.4)"},
		},
		"attestation configuration incomplete": {
			mutate: func(r *initpb.InitRequest) { setReference(t, r, choose.Reference{Variant: variant.QEMUVTPM}) },
			code:   codes.InvalidArgument, want: []string{"attestation configuration: measurements: at least one reference-value set is required"},
		},
		// The hardware block must be the variant's: a record the join service could not build
		// its validator from is never committed.
		"hardware block for the wrong variant": {
			mutate: func(r *initpb.InitRequest) {
				ref := withAttestation(t, e, r)
				ref.SNP = snpHardware()
				setReference(t, r, ref)
			},
			code: codes.InvalidArgument, want: []string{"attestation configuration: snp: qemu-vtpm evidence has no SEV-SNP report"},
		},
		"hardware block without a variant": {
			mutate: func(r *initpb.InitRequest) {
				setReference(t, r, choose.Reference{Values: choose.Values{HardwareValues: choose.HardwareValues{SNP: snpHardware()}}})
			},
			code: codes.InvalidArgument, want: []string{`attestation configuration: decoding the attestation reference: unknown attestation variant ""`},
		},
		"hardware reference malformed": {
			mutate: func(r *initpb.InitRequest) {
				withAttestation(t, e, r)
				r.AttestationReference = append(r.AttestationReference[:len(r.AttestationReference)-1], `,"snp":{},"hardware":{}}`...)
			},
			code: codes.InvalidArgument, want: []string{`attestation configuration: decoding the attestation reference: unknown field "hardware"`},
		},
		"attestation configuration malformed": {
			mutate: func(r *initpb.InitRequest) {
				r.AttestationReference = []byte(`{"variant":"qemu-vtpm","measurements":[{"name":"x"`)
			},
			code: codes.InvalidArgument, want: []string{"attestation configuration:"},
		},
		"registry mirrors that escape their directory": {
			mutate: func(r *initpb.InitRequest) { r.RegistryMirrors = []byte(`{"..": ["https://m.example.com"]}`) },
			code:   codes.InvalidArgument, want: []string{`registry "..": want a host name`},
		},
		"overlapping networks": {
			mutate: func(r *initpb.InitRequest) { r.PodCidr = "10.100.0.0/16" },
			code:   codes.InvalidArgument, want: []string{"service CIDR 10.96.0.0/12 and pod CIDR 10.100.0.0/16 overlap"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			req, _ := request(t)
			tc.mutate(req)
			res := e.call(req)
			assert.Equal(t, tc.code, status.Code(res.Err), "%v", res.Err)
			for _, w := range tc.want {
				assert.ErrorContains(t, res.Err, w)
			}
			assert.Empty(t, res.Progress)
			assert.Empty(t, res.Log, "nothing of the node's log reaches a refused caller")
		})
	}
	// Nothing happened: PCR 15 zero, lock free, storage still the fresh node's, kubeadm idle.
	assert.Equal(t, make([]byte, 32), e.node.ClusterIDRegister(t))
	assert.Empty(t, e.node.Node.LockHolder())
	initialized, err := e.node.Storage.Initialized()
	require.NoError(t, err)
	assert.False(t, initialized)
	assert.Empty(t, e.kubeadm.CallList())

	req, _ := request(t)
	res := e.call(req)
	require.NoError(t, res.Err)
	assert.NotNil(t, res.Success)
}

func TestWorkerRefusesInit(t *testing.T) {
	e := newEnv(t)
	e.meta.Instance.Role = metadata.Worker
	req, _ := request(t)
	res := e.call(req)
	assert.Equal(t, codes.FailedPrecondition, status.Code(res.Err))
	assert.ErrorContains(t, res.Err, "is a worker node: only control-plane nodes initialize clusters")
	assert.Equal(t, make([]byte, 32), e.node.ClusterIDRegister(t))
}

// Once a join won the node lock, init fails clearly and changes nothing.
func TestInitAfterJoin(t *testing.T) {
	e := newEnv(t)
	diskKey, err := statedisk.NewRandomKey()
	require.NoError(t, err)
	joinedID := bytes.Repeat([]byte{7}, 32)
	require.NoError(t, e.node.Node.Claim(context.Background(), "join", joinedID, diskKey))

	req, _ := request(t)
	res := e.call(req)
	assert.Equal(t, codes.FailedPrecondition, status.Code(res.Err))
	assert.ErrorContains(t, res.Err, "already part of a cluster (node lock taken by join)")
	assert.Equal(t, variant.QEMUVTPM.ClusterIDMarker(joinedID), e.node.ClusterIDRegister(t))
	assert.Empty(t, e.kubeadm.CallList())
}

// A failing kubeadm: progress up to the failure, then the init's log (with kubeadm's output
// and the node's logs), then the error.
func TestInitFailureStreamsLogs(t *testing.T) {
	e := newEnv(t)
	e.kubeadm.Output = "[preflight] Running pre-flight checks\nerror execution phase wait-control-plane: timed out\n"
	e.kubeadm.Fail = errors.New("exit status 1")
	req, _ := request(t)
	res := e.call(req)
	assert.Equal(t, codes.Internal, status.Code(res.Err))
	assert.ErrorContains(t, res.Err, "init failed: kubeadm init: exit status 1")
	assert.Nil(t, res.Success)
	log := string(res.Log)
	assert.Contains(t, log, "node lock taken: PCR 15 extended")
	assert.Contains(t, log, "kubeadm: error execution phase wait-control-plane: timed out")
	assert.Contains(t, log, "init failed: kubeadm init: exit status 1")
	assert.Contains(t, log, "kubelet: node log line")
	// The node is marked: the lock is the point of no return.
	assert.NotEqual(t, make([]byte, 32), e.node.ClusterIDRegister(t))
}

// The CLI refuses a node that does not run the expected image: the handshake fails and the
// request (with the master secret) is never sent.
func TestCLIRefusesUnexpectedNode(t *testing.T) {
	e := newEnv(t)
	other := []softfirmware.Component{softfirmware.BytesComponent("bootstrapper", bootstraptest.PCRBootstrapper, []byte("another bootstrapper"))}
	v, err := qemu.NewValidator(qemu.ValidatorConfig{
		ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: measurements.ReferenceSets{{Name: "other", Measurements: softfirmware.ExpectedPCRs(other)}}},
		AKRoots:         e.ca.Pool(),
	})
	require.NoError(t, err)
	req, _ := request(t)
	res := e.callWith(v, req)
	require.Error(t, res.Err)
	assert.Contains(t, res.Err.Error(), fmt.Sprintf("PCR %d", bootstraptest.PCRBootstrapper))
	assert.Empty(t, e.kubeadm.CallList())
	assert.Equal(t, make([]byte, 32), e.node.ClusterIDRegister(t))
}

// Two concurrent inits: exactly one succeeds, PCR 15 is extended once.
func TestConcurrentInits(t *testing.T) {
	e := newEnv(t)
	var wg sync.WaitGroup
	results := make([]result, 2)
	ids := make([][]byte, 2)
	for i := range results {
		req, master := request(t)
		ms, err := master.MeasurementSecret()
		require.NoError(t, err)
		ids[i], err = kms.ClusterID(ms, req.MeasurementSalt)
		require.NoError(t, err)
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = e.call(req)
		}()
	}
	wg.Wait()
	var won []int
	for i, r := range results {
		if r.Err == nil {
			won = append(won, i)
		} else {
			assert.Equal(t, codes.FailedPrecondition, status.Code(r.Err), "%v", r.Err)
		}
	}
	require.Len(t, won, 1)
	assert.Equal(t, variant.QEMUVTPM.ClusterIDMarker(ids[won[0]]), e.node.ClusterIDRegister(t))
	assert.Equal(t, []string{"init"}, e.kubeadm.CallList())
}
