// Command joinservice admits attested nodes into the cluster (internal/joinservice). It runs
// on every control-plane node (DaemonSet constellation-join-service, host network).
//
// Inputs, as the DaemonSet mounts them (docs/services.md):
//   - --config-dir: cluster.json (ConfigMap constellation-cluster: measurement salt,
//     Kubernetes version and components) and variant, reference-sets.json, ak-roots.pem,
//     hardware.json (ConfigMap constellation-attestation); reference-sets.json is reloaded
//     when it changes, the others are read at start;
//   - --pki-dir: the node's /etc/kubernetes/pki (cluster CA, control-plane files);
//   - --tpm: the node's TPM, opened per use, quoting with its ECC AK;
//   - --event-log: the node's measured-boot event log, sent with the service's evidence;
//   - --key-service-tls-dir: ca.crt, joinservice.crt/.key (Secret constellation-keyservice-tls)
//     for the key service at --key-service;
//   - the Kubernetes API: in-cluster (service account; KUBERNETES_SERVICE_HOST/PORT set to the
//     node's own API server) or --kubeconfig; the service also writes its recent refusals
//     there, under --node-name (internal/joinservice/refusals);
//   - --platform, --metadata-url: the platform's instance list, naming nodes by their certified
//     AK (internal/provider/catalog/instances).
//
// Every flag can also be set by the environment variable CONSTELLATION_<FLAG> (upper case,
// '-' as '_'); the command line wins.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/openconstellation/constellation/api/join/joinpb"
	"github.com/openconstellation/constellation/internal/clusterrecord"
	"github.com/openconstellation/constellation/internal/cmdutil"
	"github.com/openconstellation/constellation/internal/deploy"
	"github.com/openconstellation/constellation/internal/handshakelimit"
	"github.com/openconstellation/constellation/internal/joinservice"
	"github.com/openconstellation/constellation/internal/joinservice/refusals"
	"github.com/openconstellation/constellation/internal/kms/keyservice"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider/catalog/instances"
	"github.com/openconstellation/constellation/internal/registries"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/choose"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	joinservice.SetGCDefaults(os.Getenv)
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "joinservice:", err)
		os.Exit(1)
	}
}

type flags struct {
	listen, configDir, pkiDir, tpm, eventLog, platform, metadataURL, keyService, keyServiceTLSDir string
	apiServerEndpoint, kubeconfig, metricsAddr, logLevel, nodeName                                string
	// Handshake admission (internal/handshakelimit); 0: the service's defaults.
	rateLimit                               float64
	rateBurst, perPeer, concurrent, waiting int
	// Accept-time bounds (step 0); 0: the service's defaults.
	pendingPerPeer, pending int
	handshakeTimeout        time.Duration
}

// run is the join service, in order:
//
//  1. parse and check the flags (parseFlags);
//  2. read the cluster record and the attestation configuration the DaemonSet mounts
//     (readConfig);
//  3. build how nodes are verified and how the service attests itself (newAttestation);
//  4. connect to what it needs: the key service, the Kubernetes API and the platform's
//     metadata (connect);
//  5. build the service with every admission check wired in (joinservice.New);
//  6. serve it, with the reference-set watcher, the publisher of its refusals and the
//     metrics, until ctx ends (serve).
func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	f, err := parseFlags(args, getenv, stderr)
	if err != nil {
		return err
	}
	log, err := cmdutil.Logger(stderr, f.logLevel)
	if err != nil {
		return err
	}
	cluster, ref, err := readConfig(f.configDir)
	if err != nil {
		return err
	}
	a, err := newAttestation(ctx, f, ref, log)
	if err != nil {
		return err
	}
	deps, err := connect(f)
	if err != nil {
		return err
	}
	defer deps.keys.Close()
	reg := cmdutil.Registry()
	svc, err := joinservice.New(joinservice.Config{
		Issuer: a.issuer, Validator: a.validator, Active: a.active,
		Keys:                    deps.keys,
		MeasurementSalt:         cluster.Salt(),
		Kube:                    deps.kube,
		PKIDir:                  f.pkiDir,
		Platform:                joinservice.CertifiedNames{Directory: joinservice.ListerDirectory{Lister: deps.meta}},
		APIServerEndpoint:       f.apiServerEndpoint,
		KubernetesVersion:       cluster.KubernetesVersion,
		KubernetesComponents:    components(cluster),
		RegistryMirrors:         registryMirrors(f.configDir),
		RateLimit:               rate.Limit(f.rateLimit),
		RateBurst:               f.rateBurst,
		MaxHandshakesPerPeer:    f.perPeer,
		MaxConcurrentHandshakes: f.concurrent,
		MaxWaitingHandshakes:    f.waiting,
		AcceptLimits:            handshakelimit.AcceptLimits{PerPeer: f.pendingPerPeer, Total: f.pending, Timeout: f.handshakeTimeout},
		Log:                     log,
		Registerer:              reg,
	})
	if err != nil {
		return err
	}
	log.Info("join service starting", "cluster", cluster.Name, "clusterID", cluster.ClusterID, "variant", ref.Variant.String(),
		"referenceSets", setNames(ref.Measurements), "apiServer", f.apiServerEndpoint)
	return serve(ctx, f, svc, a.active, deps.kube, reg, log)
}

// parseFlags reads the flags (and their CONSTELLATION_ environment variables) and checks
// them.
func parseFlags(args []string, getenv func(string) string, stderr io.Writer) (flags, error) {
	fs := flag.NewFlagSet("joinservice", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f flags
	fs.StringVar(&f.listen, "listen", ":30090", "listen address (mutual aTLS gRPC)")
	fs.StringVar(&f.configDir, "config-dir", "/etc/constellation/config", "directory of cluster.json, variant, reference-sets.json and ak-roots.pem")
	fs.StringVar(&f.pkiDir, "pki-dir", deploy.PKIDir, "the control plane's PKI directory (kubeadm layout)")
	fs.StringVar(&f.tpm, "tpm", "unix:/run/constellation/tpm.sock", "TPM: unix:PATH, tcp:HOST:PORT or a device; opened per use")
	fs.StringVar(&f.eventLog, "event-log", "", "the node's TCG event log, sent with every evidence (empty: none)")
	fs.StringVar(&f.platform, "platform", instances.Default, "the platform the cluster runs on (internal/provider/catalog/instances)")
	fs.StringVar(&f.metadataURL, "metadata-url", "", "the platform's metadata service (empty: the platform's default)")
	fs.StringVar(&f.keyService, "key-service", fmt.Sprintf("127.0.0.1:%d", deploy.KeyServicePort), "key service address")
	fs.StringVar(&f.keyServiceTLSDir, "key-service-tls-dir", "/etc/constellation/keyservice-tls", "directory of ca.crt, joinservice.crt and joinservice.key")
	fs.StringVar(&f.apiServerEndpoint, "api-server-endpoint", "", "host:port of the API server joining nodes use (required)")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file (empty: in-cluster service account)")
	fs.Float64Var(&f.rateLimit, "handshake-rate", 0, fmt.Sprintf("attested handshakes per second per peer address (0: %v)", float64(joinservice.DefaultRateLimit)))
	fs.IntVar(&f.rateBurst, "handshake-burst", 0, fmt.Sprintf("handshakes a peer address may make at once after idling (0: %d)", joinservice.DefaultRateBurst))
	fs.IntVar(&f.perPeer, "max-handshakes-per-peer", 0, fmt.Sprintf("handshakes in progress per peer address (0: %d)", joinservice.DefaultMaxHandshakesPerPeer))
	fs.IntVar(&f.concurrent, "max-concurrent-handshakes", 0, fmt.Sprintf("handshakes quoting and verifying at once (0: %d)", joinservice.DefaultMaxConcurrentHandshakes))
	fs.IntVar(&f.waiting, "max-waiting-handshakes", 0, fmt.Sprintf("handshakes waiting for a turn; more are refused at once (0: %d)", joinservice.DefaultMaxWaitingHandshakes))
	fs.IntVar(&f.pendingPerPeer, "max-pending-per-peer", 0, fmt.Sprintf("connections per peer address whose handshake has not finished; more are refused when accepted (0: %d)", joinservice.DefaultAcceptLimits.PerPeer))
	fs.IntVar(&f.pending, "max-pending", 0, fmt.Sprintf("connections whose handshake has not finished, in all (0: %d)", joinservice.DefaultAcceptLimits.Total))
	fs.DurationVar(&f.handshakeTimeout, "handshake-timeout", 0, fmt.Sprintf("deadline of a connection's handshake (TLS, attestation, HTTP/2 preface) from its accept (0: %v)", joinservice.DefaultAcceptLimits.Timeout))
	fs.StringVar(&f.metricsAddr, "metrics-listen", "", "Prometheus metrics listen address (empty: none)")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&f.nodeName, "node-name", getenv("NODE_NAME"), "the node the service runs on, naming its refusals in the cluster (default: $NODE_NAME, else the host name)")
	if err := cmdutil.ParseFlags(fs, args, "CONSTELLATION_", getenv); err != nil {
		return flags{}, err
	}
	if f.apiServerEndpoint == "" {
		return flags{}, errors.New("--api-server-endpoint is required")
	}
	for name, v := range map[string]float64{"handshake-rate": f.rateLimit, "handshake-burst": float64(f.rateBurst), "max-handshakes-per-peer": float64(f.perPeer), "max-concurrent-handshakes": float64(f.concurrent), "max-waiting-handshakes": float64(f.waiting),
		"max-pending-per-peer": float64(f.pendingPerPeer), "max-pending": float64(f.pending), "handshake-timeout": f.handshakeTimeout.Seconds()} {
		if v < 0 {
			return flags{}, fmt.Errorf("--%s %v: must not be negative (0: the default)", name, v)
		}
	}
	return f, nil
}

// serviceAttestation is how the service verifies nodes and attests itself to them.
type serviceAttestation struct {
	active    *measurements.Active
	validator attestation.Validator
	issuer    attestation.Issuer
}

// newAttestation builds the reference sets in force (hot-reloaded by serve), the validator
// nodes are admitted by, and the issuer of the service's own evidence from the node's TPM.
func newAttestation(ctx context.Context, f flags, ref choose.Reference, log *slog.Logger) (serviceAttestation, error) {
	active, err := measurements.NewActive(ref.Variant, ref.Measurements)
	if err != nil {
		return serviceAttestation{}, err
	}
	validator, err := newValidator(ref, active, log)
	if err != nil {
		return serviceAttestation{}, err
	}
	// The service quotes once per join, on the join's critical path: the ECC AK is the
	// cheaper one to quote with (vtpm.AKAlgorithm).
	env := choose.IssuerEnv{TPM: vtpm.OpenAddr(f.tpm), AK: vtpm.AKECC}
	if f.eventLog != "" {
		env.EventLog = vtpm.ReadEventLog(f.eventLog)
	}
	issuer, err := choose.NewIssuer(ctx, ref.Variant, env)
	if err != nil {
		return serviceAttestation{}, fmt.Errorf("TPM: %w", err)
	}
	return serviceAttestation{active: active, validator: validator, issuer: issuer}, nil
}

// dependencies are the services the join service calls.
type dependencies struct {
	keys *keyservice.Client
	kube kubernetes.Interface
	meta metadata.Lister
}

// connect builds the clients of the key service (mutual TLS), the Kubernetes API and the
// platform's metadata. The caller closes keys.
func connect(f flags) (dependencies, error) {
	cert, serverCAs, err := keyservice.LoadCertAndCA(f.keyServiceTLSDir, clusterrecord.JoinServiceCertKey, clusterrecord.JoinServiceKeyKey, clusterrecord.KeyServiceCAKey)
	if err != nil {
		return dependencies{}, err
	}
	kube, err := kubeClient(f.kubeconfig)
	if err != nil {
		return dependencies{}, err
	}
	meta, err := instances.Open(f.platform, f.metadataURL)
	if err != nil {
		return dependencies{}, err
	}
	keys, err := keyservice.NewClient(f.keyService, deploy.KeyServiceServerName, cert, serverCAs)
	if err != nil {
		return dependencies{}, err
	}
	return dependencies{keys: keys, kube: kube, meta: meta}, nil
}

// serve serves the service (and the metrics, when asked) until ctx ends, while a watcher
// reloads the reference sets when their file changes and a publisher writes the service's
// refusals into the cluster for the CLI (internal/joinservice/refusals).
func serve(ctx context.Context, f flags, svc *joinservice.Service, active *measurements.Active, kube kubernetes.Interface, reg *prometheus.Registry, log *slog.Logger) error {
	node := f.nodeName
	if node == "" {
		var err error
		if node, err = os.Hostname(); err != nil {
			return fmt.Errorf("--node-name is empty and the host name unknown: %w", err)
		}
	}
	watcher := &measurements.Watcher{Path: filepath.Join(f.configDir, clusterrecord.ReferenceSetsKey), Active: active, Log: log}
	publisher := &refusals.Publisher{Client: kube, Node: node, Book: svc.Refusals(), Log: log, ReferenceSets: func() []string {
		var names []string
		for _, set := range active.Load() {
			names = append(names, set.Name)
		}
		return names
	}}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	watchErr, publishErr := make(chan error, 1), make(chan error, 1)
	go func() { watchErr <- watcher.Run(ctx) }()
	go func() { publishErr <- publisher.Run(ctx) }()

	servers := []cmdutil.Server{cmdutil.GRPC("joinservice", f.listen, svc.NewGRPCServer())}
	if f.metricsAddr != "" {
		servers = append(servers, cmdutil.Metrics(f.metricsAddr, reg))
	}
	err := cmdutil.Run(ctx, log, servers...)
	cancel()
	if werr := <-watchErr; werr != nil {
		log.Error("reference-set watcher failed", "error", werr)
		err = errors.Join(err, werr)
	}
	if perr := <-publishErr; perr != nil {
		log.Error("refusals publisher failed", "error", perr)
		err = errors.Join(err, perr)
	}
	return err
}

// newValidator builds the validator nodes are admitted by from the whole reference the
// cluster recorded. Only the reference sets are hot-reloaded (through active, by the
// watcher of reference-sets.json); the variant, the AK roots and the hardware block
// (hardware.json) are read once at start: a change to them restarts the service (an upgrade
// rolls the DaemonSet).
func newValidator(ref choose.Reference, active *measurements.Active, log *slog.Logger) (attestation.Validator, error) {
	ref.Measurements = nil
	validator, err := choose.NewValidator(ref, choose.Options{Active: active, Log: log})
	if err != nil {
		return nil, fmt.Errorf("attestation: %w", err)
	}
	return validator, nil
}

// readConfig reads and checks the mounted cluster record and attestation configuration. A
// missing hardware.json is no hardware block (the record of an older init, whose variant
// had none).
func readConfig(dir string) (clusterrecord.Cluster, choose.Reference, error) {
	read := func(name string) ([]byte, error) {
		p := filepath.Join(dir, name)
		info, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		if info.Size() > clusterrecord.MaxSize {
			return nil, fmt.Errorf("%s: %d bytes, limit %d", p, info.Size(), clusterrecord.MaxSize)
		}
		return os.ReadFile(p)
	}
	var files [5][]byte
	for i, name := range []string{clusterrecord.ClusterKey, clusterrecord.VariantKey, clusterrecord.ReferenceSetsKey, clusterrecord.AKRootsKey, clusterrecord.HardwareKey} {
		data, err := read(name)
		if name == clusterrecord.HardwareKey && errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return clusterrecord.Cluster{}, choose.Reference{}, fmt.Errorf("configuration: %w", err)
		}
		files[i] = data
	}
	cluster, err := clusterrecord.ParseCluster(files[0])
	if err != nil {
		return clusterrecord.Cluster{}, choose.Reference{}, fmt.Errorf("%s: %w", filepath.Join(dir, clusterrecord.ClusterKey), err)
	}
	ref, err := clusterrecord.ParseAttestation(files[1], files[2], files[3], files[4])
	if err != nil {
		return clusterrecord.Cluster{}, choose.Reference{}, fmt.Errorf("attestation configuration in %s: %w", dir, err)
	}
	return cluster, ref, nil
}

// registryMirrors reads the cluster's registry mirrors from the mounted ConfigMap
// constellation-registries at each call (the kubelet updates the file when the ConfigMap
// changes). A missing file is none: a cluster recorded before registry mirrors.
func registryMirrors(dir string) func() (registries.Mirrors, error) {
	return func() (registries.Mirrors, error) {
		p := filepath.Join(dir, clusterrecord.RegistryMirrorsKey)
		data, err := os.ReadFile(p)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		m, err := registries.Parse(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		return m, nil
	}
}

func kubeClient(kubeconfig string) (kubernetes.Interface, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return joinservice.APIClient(cfg)
}

func components(c clusterrecord.Cluster) []*joinpb.KubernetesComponent {
	var out []*joinpb.KubernetesComponent
	for _, comp := range c.KubernetesComponents {
		out = append(out, &joinpb.KubernetesComponent{Name: comp.Name, Url: comp.URL, Hash: comp.Hash, InstallPath: comp.InstallPath})
	}
	return out
}

func setNames(sets measurements.ReferenceSets) []string {
	names := make([]string, len(sets))
	for i, s := range sets {
		names[i] = s.Name
	}
	return names
}
