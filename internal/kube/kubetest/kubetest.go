// Package kubetest starts a real Kubernetes control plane for tests: etcd and kube-apiserver,
// built from the Go module proxy by hack/build-kube.sh, on loopback, with PKI in kubeadm's layout,
// bootstrap-token authentication, Node,RBAC authorization and the NodeRestriction admission
// plugin (as kubeadm configures them), and gives tests an admin client.
// On request it also runs kube-controller-manager with the controllers a test names (for example
// the disruption controller, which computes PodDisruptionBudget status).
//
// Every test that talks to Kubernetes uses it; nothing is faked. A control plane takes about
// 3 s to become ready, so a package with many tests shares one (TestMain + StartProcesses).
package kubetest

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/openconstellation/constellation/internal/kube/kubeletcred"
	"github.com/openconstellation/constellation/internal/kubeversion"
	"github.com/openconstellation/constellation/internal/pki"
	"github.com/openconstellation/constellation/internal/testnet"
	"github.com/openconstellation/constellation/internal/testtier"
)

// Version is the Kubernetes version of the test control plane: the default of the supported
// versions hack/build-kube.sh builds.
const Version = kubeversion.Default

// Cluster is a running control plane.
type Cluster struct {
	// Dir holds everything of this control plane: pki/, etcd data, logs, admin.conf.
	Dir string
	// PKIDir is Dir/pki in kubeadm's layout (ca.crt, ca.key, sa.*, front-proxy-ca.*, etcd/ca.*).
	PKIDir string
	// Host is the API server's host:port; Endpoint its https URL.
	Host, Endpoint string
	// PKI holds the cluster's CAs.
	PKI *pki.Cluster
	// AdminConfig authenticates as a cluster admin (group system:masters); Admin uses it.
	AdminConfig *rest.Config
	Admin       kubernetes.Interface
	// Kubeconfig is the path of an admin kubeconfig file (for kubectl and kubeadm).
	Kubeconfig string

	procs []*exec.Cmd
}

// PIDs returns the process ID of each running process by its binary's name ("etcd",
// "kube-apiserver", ...), for benchmarks that account the control plane's CPU.
func (c *Cluster) PIDs() map[string]int {
	pids := map[string]int{}
	for _, p := range c.procs {
		if p.Process != nil {
			pids[filepath.Base(p.Path)] = p.Process.Pid
		}
	}
	return pids
}

// Options tune a control plane.
type Options struct {
	// Fsync keeps etcd's fsync on every commit. Off by default: tests do not survive a power
	// loss and run several times faster without it; benchmarks turn it on to measure what a
	// real cluster does.
	Fsync bool
	// Controllers, when not empty, starts kube-controller-manager with only these controllers
	// (its --controllers names, e.g. "disruption-controller"), authenticated as the admin. None
	// by default: most tests want the objects they write to stay exactly as written.
	Controllers []string
	// AuthorizationConfig, when set, writes the API server's --authorization-config file
	// (given the control plane's PKI directory, whose ca.crt the file may name) and returns its
	// path; it replaces --authorization-mode=Node,RBAC. Constellation's control planes use one:
	// the removed-node authorizer, then Node and RBAC (internal/nodeauthz).
	AuthorizationConfig func(pkiDir string) (string, error)
}

// BinDir returns the directory of the built Kubernetes binaries of Version, etcd and etcdctl
// included (VersionBinDir).
func BinDir() (string, error) { return VersionBinDir(Version) }

// VersionBinDir returns the directory of the built Kubernetes binaries of a version, etcd and
// etcdctl included: <dir>/<version>/bin, where dir is $CONSTELLATION_KUBE_DIR or _output/kube
// of the repository the working directory is in (hack/build-kube.sh).
func VersionBinDir(version string) (string, error) {
	if dir := os.Getenv("CONSTELLATION_KUBE_DIR"); dir != "" {
		return filepath.Join(dir, version, "bin"), nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "hack", "build-kube.sh")); err == nil {
			return filepath.Join(dir, "_output", "kube", version, "bin"), nil
		}
		if filepath.Dir(dir) == dir {
			return "", fmt.Errorf("no repository above %s", wd)
		}
	}
}

// Binary returns the path of a built binary, or an error telling how to build it.
func Binary(name string) (string, error) {
	dir, err := BinDir()
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, name)
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("%s is not built (run hack/build-kube.sh; `make test` does): %w", name, err)
	}
	return path, nil
}

// Start starts a control plane for t and stops it when t ends.
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	testtier.Integration(t, "etcd and kube-apiserver")
	c, err := StartProcesses(context.Background(), t.TempDir(), opts)
	if err != nil {
		t.Fatalf("starting Kubernetes control plane: %v", err)
	}
	t.Cleanup(c.Stop)
	return c
}

// StartProcesses starts etcd and kube-apiserver with state under dir and waits until the API
// server is ready (at most 60 s or ctx). The caller must call Stop. In order:
//
//  1. find the binaries and three free ports (etcd client, etcd peer, API server);
//  2. the PKI: cluster CAs, the API server's serving certificate, the admin kubeconfig;
//  3. etcd, then kube-apiserver, then wait until it is ready;
//  4. kube-controller-manager, if opts name controllers.
func StartProcesses(ctx context.Context, dir string, opts Options) (c *Cluster, err error) {
	etcdBin, err := Binary("etcd")
	if err != nil {
		return nil, err
	}
	apiserverBin, err := Binary("kube-apiserver")
	if err != nil {
		return nil, err
	}
	c = &Cluster{Dir: dir, PKIDir: filepath.Join(dir, "pki")}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	ports, err := testnet.Ports(3)
	if err != nil {
		return nil, err
	}
	etcdClient := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	etcdPeer := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	c.Host = "127.0.0.1:" + strconv.Itoa(ports[2])
	c.Endpoint = "https://" + c.Host

	if err := c.writeCredentials(); err != nil {
		return nil, err
	}
	if err := c.startEtcd(etcdBin, etcdClient, etcdPeer, opts.Fsync); err != nil {
		return nil, err
	}
	if err := c.startAPIServer(apiserverBin, etcdClient, ports[2], opts.AuthorizationConfig); err != nil {
		return nil, err
	}
	if err := c.waitReady(ctx, 60*time.Second); err != nil {
		return nil, err
	}
	if len(opts.Controllers) > 0 {
		if err := c.startControllerManager(opts.Controllers); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// writeCredentials creates the cluster's CAs in PKIDir, the API server's serving certificate
// and the admin kubeconfig.
func (c *Cluster) writeCredentials() error {
	now := time.Now()
	var err error
	if c.PKI, err = pki.NewCluster(now); err != nil {
		return err
	}
	if err := c.PKI.Write(c.PKIDir); err != nil {
		return err
	}
	if err := c.writeLeaf("apiserver", pki.Leaf{
		CommonName: "kube-apiserver", Server: true,
		DNSNames:  []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		IPs:       []net.IP{net.IPv4(127, 0, 0, 1), net.IPv4(10, 96, 0, 1)},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(24 * time.Hour),
	}); err != nil {
		return err
	}
	adminCert, adminKey, err := c.PKI.CA.NewLeaf(pki.Leaf{CommonName: "kubernetes-admin", Organizations: []string{"system:masters"}, Client: true, NotBefore: now.Add(-time.Minute), NotAfter: now.Add(24 * time.Hour)})
	if err != nil {
		return err
	}
	return c.writeAdmin(adminCert, adminKey)
}

// startEtcd starts a one-member etcd with its data under Dir; without fsync unless asked.
func (c *Cluster) startEtcd(bin, client, peer string, fsync bool) error {
	args := []string{
		"--name=kubetest", "--data-dir=" + filepath.Join(c.Dir, "etcd"),
		"--listen-client-urls=" + client, "--advertise-client-urls=" + client,
		"--listen-peer-urls=" + peer, "--initial-advertise-peer-urls=" + peer,
		"--initial-cluster=kubetest=" + peer, "--log-level=warn",
	}
	if !fsync {
		args = append(args, "--unsafe-no-fsync")
	}
	return c.start(bin, "etcd", args...)
}

// startAPIServer starts kube-apiserver on 127.0.0.1:port against etcd, authorizing with
// Node and RBAC or with the file authorizationConfig writes.
func (c *Cluster) startAPIServer(bin, etcdClient string, port int, authorizationConfig func(pkiDir string) (string, error)) error {
	authz := "--authorization-mode=Node,RBAC"
	if authorizationConfig != nil {
		file, err := authorizationConfig(c.PKIDir)
		if err != nil {
			return fmt.Errorf("authorization configuration: %w", err)
		}
		authz = "--authorization-config=" + file
	}
	return c.start(bin, "kube-apiserver",
		"--etcd-servers="+etcdClient,
		"--bind-address=127.0.0.1", "--secure-port="+strconv.Itoa(port), "--advertise-address=127.0.0.1",
		"--tls-cert-file="+filepath.Join(c.PKIDir, "apiserver.crt"),
		"--tls-private-key-file="+filepath.Join(c.PKIDir, "apiserver.key"),
		"--client-ca-file="+filepath.Join(c.PKIDir, pki.CACert),
		"--service-account-key-file="+filepath.Join(c.PKIDir, pki.ServiceAccountPub),
		"--service-account-signing-key-file="+filepath.Join(c.PKIDir, pki.ServiceAccountKey),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-cluster-ip-range=10.96.0.0/12",
		authz,
		// As kubeadm runs it: a node may write only its own Node and its pods' status.
		"--enable-admission-plugins=NodeRestriction",
		"--enable-bootstrap-token-auth",
		// The endpoint reconciler refuses loopback addresses; tests do not need it.
		"--endpoint-reconciler-type=none",
		"--cert-dir="+filepath.Join(c.Dir, "apiserver-certs"),
	)
}

// startControllerManager runs kube-controller-manager with the given controllers against the
// ready API server. It serves nothing itself (--secure-port=0) and does not elect a leader (one
// instance); tests wait for the effects of its controllers, which is also how they learn that
// it runs.
func (c *Cluster) startControllerManager(controllers []string) error {
	bin, err := Binary("kube-controller-manager")
	if err != nil {
		return err
	}
	return c.start(bin, "kube-controller-manager",
		"--kubeconfig="+c.Kubeconfig,
		"--controllers="+strings.Join(controllers, ","),
		"--leader-elect=false",
		"--secure-port=0",
		"--v=1",
	)
}

func (c *Cluster) writeLeaf(name string, l pki.Leaf) error {
	cert, key, err := c.PKI.CA.NewLeaf(l)
	if err != nil {
		return err
	}
	return pki.WriteCertAndKey(c.PKIDir, name, cert, key)
}

func (c *Cluster) writeAdmin(cert *x509.Certificate, key crypto.Signer) error {
	keyPEM, err := pki.EncodeKey(key)
	if err != nil {
		return err
	}
	certPEM := pki.EncodeCert(cert)
	caPEM := pki.EncodeCert(c.PKI.CA.Cert)
	c.AdminConfig = &rest.Config{
		Host:            c.Endpoint,
		TLSClientConfig: rest.TLSClientConfig{CAData: caPEM, CertData: certPEM, KeyData: keyPEM},
		QPS:             -1, // no client-side throttling: tests and benchmarks measure the server
		// Protobuf, as kubeadm and the controllers use for built-in types: cheaper to encode
		// here and to decode in the API server than JSON.
		ContentConfig: rest.ContentConfig{ContentType: "application/vnd.kubernetes.protobuf"},
		Timeout:       30 * time.Second,
	}
	admin, err := kubernetes.NewForConfig(c.AdminConfig)
	if err != nil {
		return err
	}
	c.Admin = admin
	kubeconfig := clientcmdapi.NewConfig()
	kubeconfig.Clusters["kubetest"] = &clientcmdapi.Cluster{Server: c.Endpoint, CertificateAuthorityData: caPEM}
	kubeconfig.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: keyPEM}
	kubeconfig.Contexts["admin@kubetest"] = &clientcmdapi.Context{Cluster: "kubetest", AuthInfo: "admin"}
	kubeconfig.CurrentContext = "admin@kubetest"
	c.Kubeconfig = filepath.Join(c.Dir, "admin.conf")
	return clientcmd.WriteToFile(*kubeconfig, c.Kubeconfig)
}

// start runs a control-plane process with its output in Dir/<name>.log. Pdeathsig ends it
// when the test binary dies without cleaning up.
func (c *Cluster) start(bin, name string, args ...string) error {
	logFile, err := os.Create(filepath.Join(c.Dir, name+".log"))
	if err != nil {
		return err
	}
	defer logFile.Close()
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", name, err)
	}
	c.procs = append(c.procs, cmd)
	return nil
}

func (c *Cluster) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var lastErr error
	for {
		for _, p := range c.procs {
			if p.ProcessState != nil {
				return fmt.Errorf("%s exited: %s", filepath.Base(p.Path), c.LogTail(filepath.Base(p.Path)))
			}
		}
		body, err := c.Admin.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err == nil && bytes.Equal(bytes.TrimSpace(body), []byte("ok")) {
			return nil
		}
		lastErr = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("API server not ready after %s (last error: %v); log: %s", timeout, lastErr, c.LogTail("kube-apiserver"))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// LogTail returns the end of a control-plane process's log.
func (c *Cluster) LogTail(name string) string {
	data, _ := os.ReadFile(filepath.Join(c.Dir, name+".log"))
	if len(data) > 4096 {
		data = data[len(data)-4096:]
	}
	return string(data)
}

// Stop ends the processes (SIGTERM, then SIGKILL after 10 s) and waits for them.
func (c *Cluster) Stop() {
	for i := len(c.procs) - 1; i >= 0; i-- {
		p := c.procs[i]
		_ = p.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = p.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = p.Process.Kill()
			<-done
		}
	}
	c.procs = nil
}

// ClientFor returns a client that authenticates with cfg's credentials against this cluster.
func (c *Cluster) ClientFor(auth rest.Config) (kubernetes.Interface, error) {
	auth.Host = c.Endpoint
	auth.TLSClientConfig.CAData = pki.EncodeCert(c.PKI.CA.Cert)
	auth.Timeout = 30 * time.Second
	return kubernetes.NewForConfig(&auth)
}

// NodeClient returns a client that authenticates as node name's kubelet, with a client
// certificate from the cluster CA issued as Constellation issues every node's
// (kubeletcred.Issue).
func (c *Cluster) NodeClient(name string) (kubernetes.Interface, error) {
	certPEM, keyPEM, err := kubeletcred.Issue(c.PKI.CA, name, time.Now())
	if err != nil {
		return nil, err
	}
	return c.ClientFor(rest.Config{TLSClientConfig: rest.TLSClientConfig{CertData: certPEM, KeyData: keyPEM}})
}

// Shared is one control plane for all tests of a package, started on first use: test
// binaries that run only fuzz targets or other tests never start it. Stop it from TestMain
// after m.Run.
type Shared struct {
	// Options of the control plane; read on first use.
	Options Options

	once sync.Once
	c    *Cluster
	dir  string
	err  error
}

// Get returns the shared control plane, starting it on first use.
func (s *Shared) Get(t testing.TB) *Cluster {
	t.Helper()
	testtier.Integration(t, "etcd and kube-apiserver")
	s.once.Do(func() {
		if s.dir, s.err = os.MkdirTemp("", "kubetest"); s.err != nil {
			return
		}
		s.c, s.err = StartProcesses(context.Background(), s.dir, s.Options)
	})
	if s.err != nil {
		t.Fatalf("starting the shared Kubernetes control plane: %v", s.err)
	}
	return s.c
}

// Stop stops the control plane if it was started and removes its files.
func (s *Shared) Stop() {
	if s.c != nil {
		s.c.Stop()
	}
	if s.dir != "" {
		os.RemoveAll(s.dir)
	}
}

// PostCSR asks, as client, for a client certificate of subject CN cn and organizations orgs
// from signer, with a fresh key, and returns the CertificateSigningRequest's name: what a
// kubelet does to renew its certificate, and what an attacker holding node credentials
// tries for other names.
func PostCSR(ctx context.Context, client kubernetes.Interface, cn string, orgs []string, signer string) (string, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", err
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: cn, Organization: orgs}}, key)
	if err != nil {
		return "", err
	}
	csr, err := client.CertificatesV1().CertificateSigningRequests().Create(ctx, &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "csr-"},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			Request:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
			SignerName: signer,
			Usages:     []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	return csr.Name, nil
}
