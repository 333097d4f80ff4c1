package joinservice_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	authv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/rest"

	"github.com/openconstellation/constellation/api/join/joinpb"
	"github.com/openconstellation/constellation/internal/attestation/akca"
	"github.com/openconstellation/constellation/internal/attestation/softfirmware"
	"github.com/openconstellation/constellation/internal/cmdutil"
	"github.com/openconstellation/constellation/internal/diskowner"
	"github.com/openconstellation/constellation/internal/handshakelimit"
	"github.com/openconstellation/constellation/internal/joinservice"
	"github.com/openconstellation/constellation/internal/joinservice/refusals"
	"github.com/openconstellation/constellation/internal/kms"
	"github.com/openconstellation/constellation/internal/kube/kubeletcsr"
	"github.com/openconstellation/constellation/internal/kube/kubetest"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/pki"
	"github.com/openconstellation/constellation/internal/provider/local"
	"github.com/openconstellation/constellation/internal/registries"
	"github.com/openconstellation/constellation/internal/testtier"
	"github.com/openconstellation/constellation/pkg/atls"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/measurements/measurementstest"
	"github.com/openconstellation/constellation/pkg/attestation/qemu"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm/vtpmtest"
)

// kube is the real control plane every test in this package joins nodes to.
var kube *kubetest.Cluster

func TestMain(m *testing.M) {
	// The attacker process of BenchmarkStalledConnections needs no control plane.
	if spec := os.Getenv(stallHelperEnv); spec != "" {
		os.Exit(runStallHelper(spec))
	}
	flag.Parse()
	if testing.Short() {
		// The unit tier: every test that needs kube skips (newEnv).
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "joinservice-kube")
	if err != nil {
		panic(err)
	}
	// Benchmarks measure what a real cluster does, with etcd fsyncing every commit.
	benchmarking := flag.Lookup("test.bench").Value.String() != ""
	kube, err = kubetest.StartProcesses(context.Background(), dir, kubetest.Options{Fsync: benchmarking})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	// Init creates the disk-owner namespace before the join service runs (internal/diskowner).
	if err := diskowner.EnsureNamespace(context.Background(), kube.Admin); err != nil {
		fmt.Fprintln(os.Stderr, err)
		kube.Stop()
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	kube.Stop()
	os.RemoveAll(dir)
	os.Exit(code)
}

func image(bootstrapper string) []softfirmware.Component {
	return []softfirmware.Component{
		softfirmware.BytesComponent("bootstrapper", local.PCRBootstrapper, []byte(bootstrapper)),
		softfirmware.BytesComponent("node config", local.PCRNodeConfig, []byte("image config v1")),
	}
}

var imageV1 = image("bootstrapper v1")

// env is a join service on an initialized, measured control-plane node, with a real key
// service behind it and a real API server, and TPMs for joining nodes.
type env struct {
	t testing.TB
	// serviceSwtpm is the PID of the service's swtpm process.
	serviceSwtpm int
	addr         string
	svc          *joinservice.Service
	active       *measurements.Active
	akCA         *akca.CA
	secret       kms.MasterSecret
	salt         []byte
	keys         *countingKeys
	logs         *syncBuffer
	registry     *prometheus.Registry
	nodeTPM      *vtpm.TPM // measured with imageV1, shared by the simulated joining nodes
	directory    joinservice.StaticDirectory
	// removed are nodes the platform no longer lists (deleted instances).
	removed sync.Map
	// clock is added to the real time of the service's clock (Config.Now).
	clock atomic.Int64
}

type envOptions struct {
	rateLimit   rate.Limit
	rateBurst   int
	serviceImg  []softfirmware.Component
	noClusterID bool
	// perPeer, concurrent and waiting bound handshakes (0: the service's defaults).
	perPeer, concurrent, waiting int
	// accept bounds connections before their handshake (zero: the service's defaults).
	accept handshakelimit.AcceptLimits
	// wrapIssuer, when set, wraps the service's issuer (to count or hold its quotes).
	wrapIssuer func(attestation.Issuer) attestation.Issuer
	// mirrors is the service's source of the cluster's registry mirrors (nil: none).
	mirrors func() (registries.Mirrors, error)
}

func newEnv(t testing.TB, opts envOptions) *env {
	t.Helper()
	testtier.Integration(t, "etcd and kube-apiserver")
	if opts.serviceImg == nil {
		opts.serviceImg = imageV1
	}
	if opts.rateLimit == 0 {
		opts.rateLimit, opts.rateBurst = rate.Inf, 1
	}
	e := &env{t: t, logs: &syncBuffer{}, registry: prometheus.NewRegistry()}
	var err error
	e.akCA, err = akca.New("local AK CA", time.Now(), time.Hour)
	require.NoError(t, err)
	e.secret, err = kms.NewMasterSecret()
	require.NoError(t, err)
	e.salt = bytes.Repeat([]byte{0x5a}, 32)
	e.keys = &countingKeys{secret: e.secret}

	// The service's node: booted from the image, AK certified, initialized (PCR 15).
	serviceTPM, serviceSwtpm := vtpmtest.Swtpm(t)
	e.serviceSwtpm = serviceSwtpm.Pid()
	serviceLog, err := softfirmware.MeasureLogged(serviceTPM, opts.serviceImg)
	require.NoError(t, err)
	require.NoError(t, softfirmware.CertifyAK(serviceTPM, e.akCA, "control-plane-0", metadata.ControlPlane, time.Now()))
	if !opts.noClusterID {
		ms, err := e.secret.MeasurementSecret()
		require.NoError(t, err)
		id, err := kms.ClusterID(ms, e.salt)
		require.NoError(t, err)
		digest := sha256.Sum256(id)
		require.NoError(t, serviceTPM.ExtendPCR(int(markerRegister), digest[:]))
	}
	// The service quotes with its ECC AK (vtpm.AKAlgorithm): its quote is on every join's path.
	var issuer attestation.Issuer
	issuer, err = vtpm.NewIssuer(serviceTPM, qemu.VTPMIssuerConfig(qemu.IssuerConfig{AK: vtpm.AKECC, EventLog: func() ([]byte, error) { return serviceLog, nil }}))
	require.NoError(t, err)
	if opts.wrapIssuer != nil {
		issuer = opts.wrapIssuer(issuer)
	}

	e.nodeTPM, _ = vtpmtest.Swtpm(t)
	measure(t, e.nodeTPM, imageV1)
	provisionRoot(t, e.nodeTPM, e.akCA)

	e.active, err = measurements.NewActive(qemu.Variant, measurements.ReferenceSets{{Name: "image-v1", Measurements: softfirmware.ExpectedPCRs(imageV1)}})
	require.NoError(t, err)
	validator, err := qemu.NewValidator(qemu.ValidatorConfig{ValidatorCommon: attestation.ValidatorCommon{Active: e.active}, AKRoots: e.akCA.Pool()})
	require.NoError(t, err)

	e.directory = joinservice.StaticDirectory{
		"control-plane-0": {Name: "control-plane-0", Addresses: []netip.Addr{netip.MustParseAddr("10.42.0.1")}, ControlPlane: true},
		"control-plane-1": {Name: "control-plane-1", Addresses: []netip.Addr{netip.MustParseAddr("10.42.0.2")}, ControlPlane: true},
		"worker-0":        {Name: "worker-0", Addresses: []netip.Addr{netip.MustParseAddr("10.42.0.10")}},
		"worker-1":        {Name: "worker-1", Addresses: []netip.Addr{netip.MustParseAddr("10.42.0.11")}},
		"worker-2":        {Name: "worker-2", Addresses: []netip.Addr{netip.MustParseAddr("10.42.0.12")}},
		"worker-9":        {Name: "worker-9", Addresses: []netip.Addr{netip.MustParseAddr("10.42.0.19")}},
	}
	for i := range 256 {
		name := fmt.Sprintf("node-%03d", i)
		e.directory[name] = joinservice.Node{Name: name, Addresses: []netip.Addr{netip.AddrFrom4([4]byte{10, 43, byte(i / 250), byte(i%250 + 1)})}}
	}
	// The API client cmd/joinservice makes, as the cluster admin here.
	apiClient, err := joinservice.APIClient(kube.AdminConfig)
	require.NoError(t, err)
	e.svc, err = joinservice.New(joinservice.Config{
		Issuer:            issuer,
		Validator:         validator,
		Active:            e.active,
		Keys:              e.keys,
		MeasurementSalt:   e.salt,
		Kube:              apiClient,
		PKIDir:            kube.PKIDir,
		Platform:          joinservice.CertifiedNames{Directory: removableDirectory{e}},
		APIServerEndpoint: kube.Host,
		KubernetesVersion: kubetest.Version,
		KubernetesComponents: []*joinpb.KubernetesComponent{
			{Name: "kubelet", Url: "file:///opt/kube/kubelet", Hash: "sha256:" + strings.Repeat("ab", 32), InstallPath: "/usr/bin/kubelet"},
		},
		RegistryMirrors:         opts.mirrors,
		RateLimit:               opts.rateLimit,
		RateBurst:               opts.rateBurst,
		MaxHandshakesPerPeer:    opts.perPeer,
		MaxConcurrentHandshakes: opts.concurrent,
		MaxWaitingHandshakes:    opts.waiting,
		AcceptLimits:            opts.accept,
		Log:                     slog.New(slog.NewJSONHandler(e.logs, nil)),
		Registerer:              e.registry,
		Now:                     func() time.Time { return time.Now().Add(time.Duration(e.clock.Load())) },
	})
	require.NoError(t, err)
	// Served as cmd/joinservice serves it.
	server := cmdutil.GRPC("joinservice", "", e.svc.NewGRPCServer())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = server.Serve(ln)
	}()
	t.Cleanup(func() {
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // no graceful stop: tests leave connections open
		server.Stop(ctx)
		<-served
	})
	e.addr = ln.Addr().String()
	return e
}

// removableDirectory is the env's directory without the nodes removed from the platform.
type removableDirectory struct{ e *env }

func (d removableDirectory) Lookup(ctx context.Context, name string) (joinservice.Node, error) {
	if _, gone := d.e.removed.Load(name); gone {
		return joinservice.Node{}, errors.New("unknown to the platform")
	}
	return d.e.directory.Lookup(ctx, name)
}

// newDiskUUID is a fresh state disk's UUID, in upper case: the service must use the
// lower-case form for the key and the record.
func newDiskUUID() string { return strings.ToUpper(uuid.NewString()) }

// joiner is one simulated joining node.
type joiner struct {
	name    string
	tpm     *vtpm.TPM
	local   net.IP // source address of its connections (127.0.0.0/8 is all loopback)
	attests bool
	csr     func(key *ecdsa.PrivateKey) []byte
	// clientCSR is its kubelet client certificate request, for clientKey.
	clientCSR func(key *ecdsa.PrivateKey) []byte
	diskUUID  string
	check     *joinservice.ServiceCheck // options of the joiner's check of the service
	// serviceValidator, when set, replaces the validator built from check: simulated joiners
	// of a benchmark share one, as the load generator's work is not what is measured.
	serviceValidator attestation.Validator
	key              *ecdsa.PrivateKey
	clientKey        *ecdsa.PrivateKey
	lastPeer         *attestation.Verified
	creds            *atls.Credentials
}

func (e *env) joiner(name string, local string) *joiner {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(e.t, err)
	clientKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(e.t, err)
	j := &joiner{name: name, tpm: e.nodeTPM, local: net.ParseIP(local), attests: true, key: key, clientKey: clientKey, diskUUID: newDiskUUID()}
	j.csr = func(key *ecdsa.PrivateKey) []byte {
		return csrFor(e.t, key, "system:node:"+name, e.directory[name].Addresses)
	}
	j.clientCSR = func(key *ecdsa.PrivateKey) []byte {
		return csrFor(e.t, key, "system:node:"+name, nil)
	}
	return j
}

func csrFor(t testing.TB, key *ecdsa.PrivateKey, cn string, addrs []netip.Addr) []byte {
	tmpl := &x509.CertificateRequest{Subject: pkix.Name{CommonName: cn, Organization: []string{"system:nodes"}}}
	for _, a := range addrs {
		tmpl.IPAddresses = append(tmpl.IPAddresses, a.AsSlice())
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	require.NoError(t, err)
	return der
}

// prepare builds the joiner's attested-channel credentials: its evidence issuer with an AK
// certificate for its name, and its check of the service.
func (e *env) prepare(j *joiner) *atls.Credentials {
	if j.creds != nil {
		return j.creds
	}
	t := e.t
	if j.serviceValidator == nil {
		j.serviceValidator = e.serviceValidator(j)
	}
	cfg := atls.Config{Validators: []attestation.Validator{j.serviceValidator}}
	if j.attests {
		role := metadata.Worker
		if e.directory[j.name].ControlPlane {
			role = metadata.ControlPlane
		}
		akCert, err := e.akCA.CertifyAK(ak(t, j.tpm), j.name, role, time.Now(), time.Hour)
		require.NoError(t, err)
		cfg.Issuer, err = qemu.NewIssuer(j.tpm, akCert, bootLog(j.tpm))
		require.NoError(t, err)
	}
	creds, err := atls.NewCredentials(cfg)
	require.NoError(t, err)
	j.creds = creds
	return creds
}

// serviceValidator is the joiner's check of the service, as a node builds it from its TPM:
// by default, the same boot measurements as its own TPM's.
func (e *env) serviceValidator(j *joiner) attestation.Validator {
	check := joinservice.ServiceCheck{Variant: variant.QEMUVTPM}
	if j.check != nil {
		check = *j.check
	}
	v, err := check.Validator(j.tpm)
	require.NoError(e.t, err)
	return v
}

// provisionRoot does what the provider does for a node's TPM: it provisions ca as the AK
// root and locks the platform hierarchy (softfirmware.CertifyAK, softfirmware.LockPlatform).
func provisionRoot(t testing.TB, tpm *vtpm.TPM, ca *akca.CA) {
	t.Helper()
	require.NoError(t, tpm.WritePlatformNV(vtpm.AKRootsNVIndex, ca.Certificate().Raw))
	require.NoError(t, softfirmware.LockPlatform(tpm))
}

func (e *env) conn(j *joiner) *grpc.ClientConn {
	t := e.t
	creds := e.prepare(j)
	local := j.local
	conn, err := grpc.NewClient("passthrough:///"+e.addr,
		grpc.WithTransportCredentials(creds),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: local}}
			return d.DialContext(ctx, "tcp", addr)
		}))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return conn
}

var akCache sync.Map

// bootLogs are the event logs of the tests' TPMs (*vtpm.TPM), as measure recorded them.
var bootLogs sync.Map

// measure boots tpm with image as the provider does, and keeps the event log for the
// issuers on tpm (bootLog): qemu-vtpm evidence carries it.
func measure(t testing.TB, tpm *vtpm.TPM, image []softfirmware.Component) {
	t.Helper()
	log, err := softfirmware.MeasureLogged(tpm, image)
	require.NoError(t, err)
	bootLogs.Store(tpm, log)
}

// bootLog returns the event log measure recorded for tpm, as an issuer reads it.
func bootLog(tpm *vtpm.TPM) func() ([]byte, error) {
	return func() ([]byte, error) {
		log, _ := bootLogs.Load(tpm)
		b, _ := log.([]byte)
		return b, nil
	}
}

func ak(t testing.TB, tpm *vtpm.TPM) []byte {
	if v, ok := akCache.Load(tpm); ok {
		return v.([]byte)
	}
	iss, err := qemu.NewIssuer(tpm, nil, nil)
	require.NoError(t, err)
	akCache.Store(tpm, iss.AKPublic())
	return iss.AKPublic()
}

func (e *env) join(j *joiner, controlPlane bool) (*joinpb.IssueJoinTicketResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var p peer.Peer
	// A node hangs up once it has its ticket; many open connections would tax the service.
	conn := e.conn(j)
	defer conn.Close()
	resp, err := joinpb.NewJoinServiceClient(conn).IssueJoinTicket(ctx, &joinpb.IssueJoinTicketRequest{
		DiskUuid: j.diskUUID, CertificateRequest: j.csr(j.key), ClientCertificateRequest: j.clientCSR(j.clientKey),
		IsControlPlane: controlPlane,
	}, grpc.Peer(&p))
	if info, ok := p.AuthInfo.(atls.AuthInfo); ok {
		j.lastPeer = info.Peer
	}
	return resp, err
}

func bootstrapSecrets(t *testing.T) int {
	list, err := kube.Admin.CoreV1().Secrets(metav1.NamespaceSystem).List(context.Background(), metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("type", "bootstrap.kubernetes.io/token").String(),
	})
	require.NoError(t, err)
	return len(list.Items)
}

func whoami(t *testing.T, auth rest.Config) (*authv1.UserInfo, error) {
	client, err := kube.ClientFor(auth)
	require.NoError(t, err)
	review, err := client.AuthenticationV1().SelfSubjectReviews().Create(context.Background(), &authv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	return &review.Status.UserInfo, nil
}

func TestJoinWorker(t *testing.T) {
	e := newEnv(t, envOptions{})
	j := e.joiner("worker-0", "127.0.0.10")
	resp, err := e.join(j, false)
	require.NoError(t, err)

	// Keys: derived from the master secret, the disk key by the lower-case UUID.
	wantDisk, err := e.secret.StateDiskKey(strings.ToLower(j.diskUUID))
	require.NoError(t, err)
	assert.Equal(t, wantDisk, resp.StateDiskKey)
	wantMS, err := e.secret.MeasurementSecret()
	require.NoError(t, err)
	assert.Equal(t, wantMS, resp.MeasurementSecret)
	assert.Equal(t, e.salt, resp.MeasurementSalt)
	assert.Equal(t, kube.Host, resp.ApiServerEndpoint)
	assert.Equal(t, kubetest.Version, resp.KubernetesVersion)
	require.Len(t, resp.KubernetesComponents, 1)
	assert.Empty(t, resp.ControlPlaneFiles, "a worker gets no CA keys")

	// The node can now pin the service to this cluster (docs/design.md "1.5.1 The node
	// checks the join service").
	require.NoError(t, joinservice.CheckClusterID(j.lastPeer, resp.MeasurementSecret, resp.MeasurementSalt))
	assert.Error(t, joinservice.CheckClusterID(j.lastPeer, resp.MeasurementSecret, []byte("another cluster's salt")))

	// The client certificate authenticates as the node and nothing else, for a day; the
	// serving certificate authenticates nobody. No bootstrap token exists.
	clientCert := clientCertOf(t, resp.KubeletClientCert, j.clientKey, "worker-0")
	assert.WithinDuration(t, time.Now().Add(kubeletcsr.ClientValidity), clientCert.NotAfter, time.Minute)
	servingKeyPEM, err := pki.EncodeKey(j.key)
	require.NoError(t, err)
	_, err = whoami(t, rest.Config{TLSClientConfig: rest.TLSClientConfig{CertData: resp.KubeletCert, KeyData: servingKeyPEM}})
	require.Error(t, err, "the kubelet's serving certificate authenticated to the API server")
	assert.ErrorContains(t, err, "Unauthorized")
	assert.Equal(t, pki.EncodeCert(kube.PKI.CA.Cert), resp.ClusterCaCert)
	assert.Zero(t, bootstrapSecrets(t), "the join service created a bootstrap token")

	// A reboot: the rejoin ticket unlocks the same disk and renews the client certificate.
	rejoin, err := e.rejoin(j)
	require.NoError(t, err)
	assert.Equal(t, wantDisk, rejoin.StateDiskKey)
	assert.Equal(t, e.salt, rejoin.MeasurementSalt)
	assert.Equal(t, wantMS, rejoin.MeasurementSecret)
	renewed := clientCertOf(t, rejoin.KubeletClientCert, j.clientKey, "worker-0")
	assert.NotEqual(t, clientCert.SerialNumber, renewed.SerialNumber)

	// One log line per decision, naming peer, node, variant and the matching set.
	accepted := e.logLines("admission accepted")
	require.Len(t, accepted, 2)
	assert.Equal(t, "127.0.0.10", accepted[0]["peer"])
	assert.Equal(t, "worker-0", accepted[0]["node"])
	assert.Equal(t, "qemu-vtpm", accepted[0]["variant"])
	assert.Equal(t, "image-v1", accepted[0]["referenceSet"])
	assert.Equal(t, "rejoin", accepted[1]["method"])
	assert.Equal(t, 1.0, e.counter("constellation_joinservice_tickets_issued_total", "method", "join", "role", "worker"))
	assert.Equal(t, 1.0, e.counter("constellation_joinservice_tickets_issued_total", "method", "rejoin", "role", "any"))
}

// TestTicketsCarryRegistryMirrors: join and rejoin tickets carry the registry mirrors as the
// cluster records them at the moment of the ticket, and a record the service cannot read
// refuses the ticket, naming why.
func TestTicketsCarryRegistryMirrors(t *testing.T) {
	var current atomic.Pointer[registries.Mirrors]
	var broken atomic.Bool
	e := newEnv(t, envOptions{mirrors: func() (registries.Mirrors, error) {
		if broken.Load() {
			return nil, errors.New("registry-mirrors.json: not JSON")
		}
		return *current.Load(), nil
	}})
	first := registries.Mirrors{"docker.io": {"https://mirror.gcr.io"}}
	current.Store(&first)
	j := e.joiner("worker-0", "127.0.0.10")
	resp, err := e.join(j, false)
	require.NoError(t, err)
	got, err := registries.Parse(resp.RegistryMirrors)
	require.NoError(t, err)
	assert.Equal(t, first, got)

	second := registries.Mirrors{"10.0.2.2:5000": {"http://10.0.2.2:5000"}}
	current.Store(&second)
	rejoin, err := e.rejoin(j)
	require.NoError(t, err)
	got, err = registries.Parse(rejoin.RegistryMirrors)
	require.NoError(t, err)
	assert.Equal(t, second, got, "a rebooted node gets the mirrors recorded now")

	broken.Store(true)
	_, err = e.rejoin(j)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "registry mirrors")
}

func TestJoinControlPlane(t *testing.T) {
	e := newEnv(t, envOptions{})
	resp, err := e.join(e.joiner("control-plane-1", "127.0.0.11"), true)
	require.NoError(t, err)
	got := map[string][]byte{}
	for _, f := range resp.ControlPlaneFiles {
		got[f.Name] = f.Data
	}
	want, err := pki.ReadControlPlaneFiles(kube.PKIDir)
	require.NoError(t, err)
	assert.Equal(t, want, got)
	assert.Len(t, got, 8)
	_, err = pki.ParseKey(got[pki.CAKey])
	require.NoError(t, err)
	assert.Equal(t, 1.0, e.counter("constellation_joinservice_tickets_issued_total", "method", "join", "role", "control-plane"))
}

// Every rejection leaves nothing behind: no key derived, no certificate signed; it is logged
// once with its reason and counted.
func TestRejections(t *testing.T) {
	e := newEnv(t, envOptions{rateLimit: rate.Every(time.Hour), rateBurst: 2})
	otherTPM, _ := vtpmtest.Swtpm(t)
	measure(t, otherTPM, image("bootstrapper v1 with a backdoor"))
	provisionRoot(t, otherTPM, e.akCA)

	testCases := map[string]struct {
		setup        func(j *joiner)
		controlPlane bool
		name         string
		wantCode     codes.Code
		wantMsg      string
		wantReason   string
		wantStage    string
	}{
		"unattested client": {
			setup: func(j *joiner) { j.attests = false }, wantCode: codes.Unavailable,
			wantMsg: "no compatible evidence", wantReason: "incompatible", wantStage: "handshake",
		},
		"wrong measurements": {
			setup: func(j *joiner) { j.tpm = otherTPM }, wantCode: codes.Unavailable,
			wantMsg: "PCR 11: expected", wantReason: "measurement-mismatch", wantStage: "handshake",
		},
		"CSR for another node name": {
			setup: func(j *joiner) {
				j.csr = func(key *ecdsa.PrivateKey) []byte {
					return csrFor(e.t, key, "system:node:control-plane-1", nil)
				}
			},
			wantCode: codes.PermissionDenied, wantMsg: `common name "system:node:control-plane-1", want "system:node:worker-0"`,
			wantReason: "certificate-request", wantStage: "join",
		},
		"CSR with foreign IP SANs": {
			setup: func(j *joiner) {
				j.csr = func(key *ecdsa.PrivateKey) []byte {
					return csrFor(e.t, key, "system:node:worker-0", []netip.Addr{netip.MustParseAddr("10.42.0.10"), netip.MustParseAddr("10.42.0.2")})
				}
			},
			wantCode: codes.PermissionDenied, wantMsg: "IP address 10.42.0.2 is not one of the node's addresses",
			wantReason: "certificate-request", wantStage: "join",
		},
		"client CSR for a control plane's name": {
			setup: func(j *joiner) {
				j.clientCSR = func(key *ecdsa.PrivateKey) []byte { return csrFor(e.t, key, "system:node:control-plane-0", nil) }
			},
			wantCode: codes.PermissionDenied, wantMsg: `client certificate: kubelet certificate request rejected for node "worker-0": common name "system:node:control-plane-0"`,
			wantReason: "certificate-request", wantStage: "join",
		},
		"client CSR in the masters group": {
			setup: func(j *joiner) {
				j.clientCSR = func(key *ecdsa.PrivateKey) []byte {
					der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{
						CommonName: "system:node:worker-0", Organization: []string{"system:nodes", "system:masters"},
					}}, key)
					require.NoError(e.t, err)
					return der
				}
			},
			wantCode: codes.PermissionDenied, wantMsg: `organization ["system:nodes", "system:masters"], want ["system:nodes"]`,
			wantReason: "certificate-request", wantStage: "join",
		},
		"client CSR with SANs": {
			setup: func(j *joiner) {
				j.clientCSR = func(key *ecdsa.PrivateKey) []byte {
					return csrFor(e.t, key, "system:node:worker-0", []netip.Addr{netip.MustParseAddr("10.42.0.10")})
				}
			},
			wantCode: codes.PermissionDenied, wantMsg: "1 SANs in a client certificate request, want none",
			wantReason: "certificate-request", wantStage: "join",
		},
		"no client CSR": {
			setup:    func(j *joiner) { j.clientCSR = func(*ecdsa.PrivateKey) []byte { return nil } },
			wantCode: codes.PermissionDenied, wantMsg: "client certificate: kubelet certificate request rejected: empty",
			wantReason: "certificate-request", wantStage: "join",
		},
		"worker asks for the control-plane keys": {
			controlPlane: true, wantCode: codes.PermissionDenied, wantMsg: "platform says it is a worker",
			wantReason: "role", wantStage: "join",
		},
		"node unknown to the platform": {
			name: "intruder", wantCode: codes.PermissionDenied, wantMsg: `platform does not know this node: node "intruder"`,
			wantReason: "unknown-node", wantStage: "join",
		},
		"malformed disk UUID": {
			setup: func(j *joiner) { j.diskUUID = "../../etc/passwd" }, wantCode: codes.InvalidArgument,
			wantMsg: "is not of the form 8-4-4-4-12", wantReason: "invalid-request", wantStage: "join",
		},
		"node that does not trust the service's AK": {
			setup: func(j *joiner) {
				// The node's platform provisioned another AK root: it aborts the handshake.
				other, err := akca.New("another platform", time.Now(), time.Hour)
				require.NoError(t, err)
				tpm, _ := vtpmtest.Swtpm(t)
				measure(t, tpm, imageV1)
				provisionRoot(t, tpm, other)
				j.serviceValidator, err = joinservice.ServiceCheck{Variant: variant.QEMUVTPM}.Validator(tpm)
				require.NoError(t, err)
			},
			wantCode: codes.Unavailable, wantMsg: "AK certificate", wantReason: "peer-abort", wantStage: "handshake",
		},
	}
	i := 20
	for name, tc := range testCases {
		i++
		t.Run(name, func(t *testing.T) {
			nodeName := "worker-0"
			if tc.name != "" {
				nodeName = tc.name
			}
			j := e.joiner(nodeName, fmt.Sprintf("127.0.0.%d", i))
			if tc.setup != nil {
				tc.setup(j)
			}
			keysBefore := e.keys.calls.Load()
			rejectedBefore := e.counter("constellation_joinservice_rejections_total", "stage", tc.wantStage, "reason", tc.wantReason)
			logsBefore := len(e.logLines("admission rejected"))

			resp, err := e.join(j, tc.controlPlane)
			require.Error(t, err)
			assert.Nil(t, resp)
			assert.Equal(t, tc.wantCode, status.Code(err), "%v", err)
			assert.ErrorContains(t, err, tc.wantMsg)

			assert.Equal(t, keysBefore, e.keys.calls.Load(), "a rejected join must not derive keys")
			// A handshake-stage rejection reaches the client before the server has recorded
			// it (the server's side of the aborted handshake finishes concurrently): wait
			// for the record, then check there is exactly one.
			require.Eventually(t, func() bool {
				return len(e.logLines("admission rejected")) > logsBefore &&
					e.counter("constellation_joinservice_rejections_total", "stage", tc.wantStage, "reason", tc.wantReason) > rejectedBefore
			}, 10*time.Second, 10*time.Millisecond, "the rejection is logged and counted")
			assert.Equal(t, rejectedBefore+1, e.counter("constellation_joinservice_rejections_total", "stage", tc.wantStage, "reason", tc.wantReason))
			lines := e.logLines("admission rejected")
			require.Len(t, lines, logsBefore+1, "one log line per decision")
			assert.Equal(t, tc.wantReason, lines[len(lines)-1]["reason"])
			// The refusal is in the book the CLI reads (internal/joinservice/refusals), once.
			book, _ := e.svc.Refusals().Snapshot()
			idx := slices.IndexFunc(book, func(r refusals.Refusal) bool { return r.Peer == lines[len(lines)-1]["peer"] })
			require.GreaterOrEqual(t, idx, 0, "the refusal of %v is in the book", lines[len(lines)-1]["peer"])
			assert.Equal(t, 1, book[idx].Count)
			assert.Equal(t, tc.wantReason, book[idx].Reason)
		})
	}

	t.Run("rate-limited peer", func(t *testing.T) {
		keysBefore := e.keys.calls.Load()
		// Burst 2 from one address, then refused before any attestation work.
		for range 2 {
			_, err := e.join(e.joiner("worker-0", "127.0.0.99"), false)
			require.NoError(t, err)
		}
		_, err := e.join(e.joiner("worker-0", "127.0.0.99"), false)
		require.Error(t, err)
		assert.Equal(t, codes.Unavailable, status.Code(err))
		assert.ErrorContains(t, err, "too many join attempts from 127.0.0.99")
		assert.Equal(t, keysBefore+4, e.keys.calls.Load(), "two tickets, two keys each")
		// The server records a handshake-stage rejection concurrently with the client's error.
		require.Eventually(t, func() bool {
			return e.counter("constellation_joinservice_rejections_total", "stage", "handshake", "reason", "rate-limited") == 1.0
		}, 10*time.Second, 10*time.Millisecond, "the rate-limited handshake is counted once")
		// Another address is not affected.
		_, err = e.join(e.joiner("worker-0", "127.0.0.98"), false)
		require.NoError(t, err)
	})
}

// A service that does not run the node's image is refused by the node (mutual attestation),
// and the node never sends its request. The service records that the node refused it, with
// the node's label, in a streak: what apply reads to stop an upgrade whose new nodes refuse
// the cluster's join services (docs/upgrades.md, "Failure is safe").
func TestNodeRefusesForeignService(t *testing.T) {
	e := newEnv(t, envOptions{serviceImg: image("a different bootstrapper")})
	for range 2 {
		j := e.joiner("worker-0", "127.0.0.40")
		_, err := e.join(j, false)
		require.Error(t, err)
		assert.ErrorContains(t, err, "PCR 11: expected")
	}
	assert.Zero(t, e.keys.calls.Load())
	var got refusals.Refusal
	require.Eventually(t, func() bool {
		book, _ := e.svc.Refusals().Snapshot()
		i := slices.IndexFunc(book, func(r refusals.Refusal) bool { return r.Peer == "127.0.0.40" })
		if i >= 0 {
			got = book[i]
		}
		return i >= 0 && got.Count == 2
	}, 10*time.Second, 10*time.Millisecond, "both refusals are in the book")
	assert.True(t, got.RefusedByPeer(), "the node refused the service: %+v", got)
	assert.Equal(t, "measurement-mismatch", got.PeerReason)
	assert.True(t, got.Definitive())
	assert.Equal(t, 2, got.Streak)
	assert.True(t, strings.HasPrefix(got.Error, "measurements do not match"), "the node's own text: %q", got.Error)

	e2 := newEnv(t, envOptions{noClusterID: true})
	_, err := e2.join(e2.joiner("worker-0", "127.0.0.41"), false)
	require.Error(t, err)
	assert.ErrorContains(t, err, "not initialized (PCR 15 is zero)")
}

func TestConcurrentJoins(t *testing.T) {
	e := newEnv(t, envOptions{})
	const n = 200
	serials := make([]string, n)
	errs := make([]error, n)
	joiners := make([]*joiner, n)
	for i := range n {
		joiners[i] = e.joiner(fmt.Sprintf("node-%03d", i), fmt.Sprintf("127.0.%d.%d", 1+i/250, i%250+1))
	}
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			resp, err := e.join(joiners[i], false)
			errs[i] = err
			if err == nil {
				serials[i] = clientCertOf(t, resp.KubeletClientCert, joiners[i].clientKey, joiners[i].name).SerialNumber.String()
			}
		})
	}
	wg.Wait()
	seen := map[string]bool{}
	for i := range n {
		require.NoError(t, errs[i], "join %d", i)
		assert.False(t, seen[serials[i]], "certificate issued twice")
		seen[serials[i]] = true
	}
	assert.Equal(t, float64(n), e.counter("constellation_joinservice_tickets_issued_total", "method", "join", "role", "worker"))
}

// Reference sets swapped while joins run: nodes of the kept image never fail, and no node of
// a retired image is admitted once the retirement is in force.
func TestReferenceSetSwap(t *testing.T) {
	e := newEnv(t, envOptions{})
	v2TPM, _ := vtpmtest.Swtpm(t)
	imageV2 := image("bootstrapper v2")
	measure(t, v2TPM, imageV2)
	provisionRoot(t, v2TPM, e.akCA)
	setV1 := measurements.ReferenceSet{Name: "image-v1", Measurements: softfirmware.ExpectedPCRs(imageV1)}
	setV1b := measurements.ReferenceSet{Name: "image-v1-rebuilt", Measurements: softfirmware.ExpectedPCRs(imageV1)}
	setV2 := measurements.ReferenceSet{Name: "image-v2", Measurements: softfirmware.ExpectedPCRs(imageV2)}
	require.NoError(t, e.active.Store(measurements.ReferenceSets{setV1, setV2}))

	var retired atomic.Bool
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var v1Fail, v1OK, v2OKAfterRetire, v2Refused atomic.Int32
	for w := range 6 {
		wg.Go(func() {
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				default:
				}
				name := fmt.Sprintf("node-%03d", (w*40+k)%256)
				j := e.joiner(name, fmt.Sprintf("127.0.2.%d", w*40+k%40+1))
				isV2 := w%2 == 1
				if isV2 {
					j.tpm = v2TPM
					// The v2 node accepts the v1 service (an upgrade in progress).
					j.check = &joinservice.ServiceCheck{Variant: variant.QEMUVTPM, ReferenceSets: measurements.ReferenceSets{setV1}}
				}
				startedAfterRetire := retired.Load()
				_, err := e.join(j, false)
				switch {
				case !isV2 && err != nil:
					v1Fail.Add(1)
					t.Errorf("v1 join failed during swaps: %v", err)
				case !isV2:
					v1OK.Add(1)
				case err == nil && startedAfterRetire:
					v2OKAfterRetire.Add(1)
				case err != nil && retired.Load():
					v2Refused.Add(1)
				}
			}
		})
	}
	// Swap the v1 set back and forth under running joins, then retire v2.
	for i := range 10 {
		time.Sleep(100 * time.Millisecond)
		sets := measurements.ReferenceSets{setV1, setV2}
		if i%2 == 0 {
			sets = measurements.ReferenceSets{setV1b, setV2}
		}
		require.NoError(t, e.active.Store(sets))
	}
	require.NoError(t, e.active.Store(measurements.ReferenceSets{setV1}))
	retired.Store(true)
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()
	assert.Zero(t, v1Fail.Load())
	assert.Positive(t, v1OK.Load())
	assert.Zero(t, v2OKAfterRetire.Load(), "a v2 node was admitted after its set was retired")
	assert.Positive(t, v2Refused.Load())
	t.Logf("v1 joins: %d; v2 joins refused after retirement: %d", v1OK.Load(), v2Refused.Load())
}

// A set retired between the handshake and the request: the request is refused.
func TestSetRetiredDuringJoin(t *testing.T) {
	e := newEnv(t, envOptions{})
	j := e.joiner("worker-0", "127.0.0.50")
	conn := e.conn(j)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn.Connect()
	for s := conn.GetState(); s != connectivity.Ready; s = conn.GetState() {
		require.True(t, conn.WaitForStateChange(ctx, s), "connection not ready")
	}
	other := measurements.ReferenceSet{Name: "image-v9", Measurements: softfirmware.ExpectedPCRs(image("v9"))}
	require.NoError(t, e.active.Store(measurements.ReferenceSets{other}))
	keysBefore := e.keys.calls.Load()
	_, err := joinpb.NewJoinServiceClient(conn).IssueJoinTicket(ctx, &joinpb.IssueJoinTicketRequest{DiskUuid: j.diskUUID, CertificateRequest: j.csr(j.key), ClientCertificateRequest: j.clientCSR(j.clientKey)})
	require.Error(t, err)
	assert.Equal(t, codes.PermissionDenied, status.Code(err))
	assert.ErrorContains(t, err, "retired during the join")
	assert.ErrorContains(t, err, `closest is "image-v9"`)
	assert.Equal(t, keysBefore, e.keys.calls.Load())
	assert.Equal(t, 1.0, e.counter("constellation_joinservice_rejections_total", "stage", "join", "reason", "reference-set-retired"))
}

// countingKeys derives keys like the key service and counts requests.
type countingKeys struct {
	secret kms.MasterSecret
	calls  atomic.Int32
}

func (c *countingKeys) DataKey(_ context.Context, id string, length int) ([]byte, error) {
	c.calls.Add(1)
	return c.secret.DeriveKey(id, length)
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (e *env) logLines(msg string) []map[string]any {
	e.logs.mu.Lock()
	defer e.logs.mu.Unlock()
	var out []map[string]any
	for _, line := range bytes.Split(e.logs.buf.Bytes(), []byte("\n")) {
		var m map[string]any
		if json.Unmarshal(line, &m) == nil && m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// rawLogLines returns the service's log lines with message msg, as written.
func (e *env) rawLogLines(msg string) []string {
	e.logs.mu.Lock()
	defer e.logs.mu.Unlock()
	var out []string
	for _, line := range bytes.Split(e.logs.buf.Bytes(), []byte("\n")) {
		var m struct{ Msg string }
		if json.Unmarshal(line, &m) == nil && m.Msg == msg {
			out = append(out, string(line))
		}
	}
	return out
}

// counter returns the value of the counter name with the given labels (name, value pairs).
func (e *env) counter(name string, labels ...string) float64 {
	want := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		want[labels[i]] = labels[i+1]
	}
	families, err := e.registry.Gather()
	require.NoError(e.t, err)
	for _, mf := range families {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if want[l.GetName()] != l.GetValue() {
					continue metrics
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// A node's check of the join service cannot pin the cluster-ID register through reference
// values (the marker is checked against the cluster instead): such a check is refused when
// it is built, naming PCR 15. (An uninitialized service is refused by the marker check:
// TestNodeRefusesForeignService, "not initialized (PCR 15 is zero)".)
func TestServiceCheckRefusesPinnedClusterID(t *testing.T) {
	pinned := measurementstest.Image(qemu.Variant, nil)
	pinned[15] = measurements.Measurement{Expected: make([]byte, 32)}
	tpm, _ := vtpmtest.Swtpm(t)
	ca, err := akca.New("local AK CA", time.Now(), time.Hour)
	require.NoError(t, err)
	provisionRoot(t, tpm, ca)
	_, err = joinservice.ServiceCheck{Variant: variant.QEMUVTPM, ReferenceSets: measurements.ReferenceSets{{Name: "pinned", Measurements: pinned}}}.Validator(tpm)
	require.Error(t, err)
	assert.ErrorContains(t, err, "PCR 15 must not be in a reference set")
}

// clientCertOf parses a ticket's kubelet client certificate and checks what every one must
// be: for key, client authentication only, and accepted by the API server as the node name
// and nothing more.
func clientCertOf(t *testing.T, certPEM []byte, key *ecdsa.PrivateKey, name string) *x509.Certificate {
	t.Helper()
	cert, err := pki.ParseCert(certPEM)
	require.NoError(t, err)
	assert.True(t, key.PublicKey.Equal(cert.PublicKey))
	assert.Equal(t, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, cert.ExtKeyUsage)
	assert.Empty(t, cert.DNSNames)
	assert.Empty(t, cert.IPAddresses)
	keyPEM, err := pki.EncodeKey(key)
	require.NoError(t, err)
	user, err := whoami(t, rest.Config{TLSClientConfig: rest.TLSClientConfig{CertData: certPEM, KeyData: keyPEM}})
	require.NoError(t, err)
	assert.Equal(t, "system:node:"+name, user.Username)
	assert.ElementsMatch(t, []string{"system:nodes", "system:authenticated"}, user.Groups)
	return cert
}

// markerRegister is the register of qemu-vtpm that carries the cluster-ID marker.
var markerRegister, _ = variant.QEMUVTPM.ClusterIDRegister()
