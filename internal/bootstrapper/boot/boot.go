// Package boot is the node program: it boots the node's OS through its platform, opens the
// node's TPM and state storage, and runs the platform-independent bootstrapper (init server
// and join client on a fresh node; rejoin client and, on control planes, recovery server on a
// rebooted one). What differs between platforms (metadata, TPM and event log, state storage,
// the OS, the volumes' devices) comes from its Platform, the node half of a provider
// (docs/providers.md); the node program is the same on every platform.
//
// The node trusts a join service that runs the same image as itself: the join service's
// evidence must show the node's own image registers (read at boot, after the platform
// measured the image). This needs no reference values baked into the image, which could not
// contain its own measurements. The service's AK must be certified as a control plane's by the
// platform's CA, which the platform wrote into a platform NV index of the node's TPM that the
// node's software cannot rewrite, and the service must be initialized
// (joinservice.ServiceCheck, docs/joinservice.md).
//
// The node's TPM is opened per use, by the bootstrapper as by the in-cluster services of the
// node: nobody holds it between uses (a swtpm serves one connection at a time). Before the
// node offers anything that attests, its TPM must have quoted once (tpmcheck); until it does,
// the node reports tpm-cannot-quote and why.
package boot

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/openconstellation/constellation/internal/bootstrapper"
	"github.com/openconstellation/constellation/internal/bootstrapper/initserver"
	"github.com/openconstellation/constellation/internal/bootstrapper/joinclient"
	"github.com/openconstellation/constellation/internal/bootstrapper/node"
	"github.com/openconstellation/constellation/internal/bootstrapper/nodelock"
	"github.com/openconstellation/constellation/internal/bootstrapper/recoveryserver"
	"github.com/openconstellation/constellation/internal/bootstrapper/tpmcheck"
	"github.com/openconstellation/constellation/internal/csidriver"
	"github.com/openconstellation/constellation/internal/deploy"
	"github.com/openconstellation/constellation/internal/joinservice"
	"github.com/openconstellation/constellation/internal/kube/kubeadm"
	"github.com/openconstellation/constellation/internal/kube/kubeadmconfig"
	"github.com/openconstellation/constellation/internal/kube/kubeletcred"
	"github.com/openconstellation/constellation/internal/kube/kubeupgrade"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/nodeauthz"
	"github.com/openconstellation/constellation/internal/registries"
	"github.com/openconstellation/constellation/internal/statedisk"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/choose"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
)

// Options are the node program's settings that do not depend on its platform.
type Options struct {
	InitAddr string // listen address of the init server (fresh control planes)
	// RecoverAddr is the listen address of the recovery server (rebooted control planes).
	RecoverAddr string
	Log         *slog.Logger
}

// Run boots the node and brings it into its cluster, then keeps supervising the kubelet
// until ctx ends.
func Run(ctx context.Context, p Platform, o Options) error {
	log := o.Log
	meta, err := p.Metadata(ctx)
	if err != nil {
		return fmt.Errorf("the platform's metadata: %w", err)
	}
	self, err := waitSelf(ctx, meta, log)
	if err != nil {
		return err
	}
	log = log.With("node", self.Name)
	report(ctx, meta, log, metadata.PhaseBooting)
	nodeConfig, err := p.NodeConfig()
	if err != nil {
		return err
	}
	start := time.Now()
	osys, err := p.OS(ctx, self)
	if err != nil {
		return fmt.Errorf("booting the node OS: %w", err)
	}
	log.Info("node OS booted", "seconds", time.Since(start).Seconds())
	kubelet := osys.Kubelet()

	authz := &authorizer{ctx: ctx, log: log, node: self.Name}
	in, err := bringIn(ctx, p, o, log, meta, self, nodeConfig, osys, kubelet, authz)
	if err != nil {
		return err
	}
	log.Info("node is in its cluster", "by", in.by)
	volumesFailed, err := serveVolumes(ctx, p, log, meta, self.Name, in)
	if err != nil {
		return fmt.Errorf("node failed: %w", err)
	}
	// A rejoined node restarted its kubelet without kubeadm: its images must be there too.
	if err := osys.WaitImages(ctx); err != nil {
		return fmt.Errorf("node failed: %w", err)
	}
	// A control plane's API server asks the removed-node authorizer about every request of a
	// node identity: from now on it must answer (nodeauthz).
	var authzFailed <-chan error
	if self.Role == metadata.ControlPlane {
		srv, err := authz.start()
		if err != nil {
			return fmt.Errorf("node failed: %w", err)
		}
		authzFailed = srv.Err()
		if err := keepKubernetesVersion(ctx, osys, nodeConfig, log); err != nil {
			return fmt.Errorf("node failed: %w", err)
		}
	}
	// From now on the kubelet is the node's work: if it dies, the node is broken and the
	// bootstrapper exits, so the platform's watchdog reboots the node (the reboot path then
	// brings it back with a rejoin ticket).
	kubelet.ExitIsFatal()
	return supervise(ctx, meta, log, kubelet, authzFailed, volumesFailed)
}

// supervise waits until ctx ends or one of the node's lasting parts (the kubelet, the
// removed-node authorizer, the volumes' node plugin) stops, and names which.
func supervise(ctx context.Context, meta metadata.Reporter, log *slog.Logger, kubelet Kubelet, authzFailed, volumesFailed <-chan error) error {
	select {
	case <-ctx.Done():
		return nil
	case err := <-kubelet.Failed():
		report(context.WithoutCancel(ctx), meta, log, metadata.PhaseKubeletFailed)
		return fmt.Errorf("node failed: %w", err)
	case err := <-authzFailed:
		if err == nil { // closed because ctx ended
			return nil
		}
		return fmt.Errorf("node failed: the removed-node authorizer stopped: %w", err)
	case err := <-volumesFailed:
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("node failed: the encrypted volumes' node plugin stopped: %w", err)
	}
}

// Where the kubelet finds the node half of the encrypted volume driver: the kubelet's plugin
// and registration directories (volatile, as the rest of the kubelet's root directory).
const (
	kubeletPluginDir       = "/var/lib/kubelet/plugins"
	kubeletRegistrationDir = "/var/lib/kubelet/plugins_registry"
)

// serveVolumes starts the node half of the encrypted volume driver (internal/csidriver,
// docs/volumes.md): the kubelet finds it by its registration socket, stages a volume attached
// to this node with the key the join service releases to this node alone, and mounts it into
// its pods. It runs for the bootstrapper's lifetime; the channel carries why it stopped.
func serveVolumes(ctx context.Context, p Platform, log *slog.Logger, meta metadata.Provider, name string, in inCluster) (<-chan error, error) {
	keys, err := joinclient.NewVolumeKeys(joinclient.VolumeKeysConfig{Metadata: meta, Dial: in.dial, ClusterID: in.node.ClusterID()})
	if err != nil {
		return nil, err
	}
	devices, unlocker, err := p.Volumes()
	if err != nil {
		return nil, fmt.Errorf("the encrypted volumes' node plugin: %w", err)
	}
	plugin := csidriver.NewNode(csidriver.NodeConfig{
		NodeName: name, KeySource: keys, Devices: devices, Unlocker: unlocker, Logger: log.With("component", "csi-node"),
	})
	failed := make(chan error, 1)
	go func() { failed <- csidriver.ServeNode(ctx, kubeletPluginDir, kubeletRegistrationDir, plugin) }()
	return failed, nil
}

// inCluster is what bringIn leaves: how the node came in, the node, and its attested way to
// its cluster's join service.
type inCluster struct {
	by   string
	node *node.Node
	dial joinclient.Dialer
}

// keepKubernetesVersion starts the control plane's Kubernetes version keeper: when this
// node's image runs a newer Kubernetes version than its cluster, its own kubeadm upgrades the
// control plane, and later the add-ons (internal/kube/kubeupgrade).
func keepKubernetesVersion(ctx context.Context, osys OS, nodeConfig NodeConfig, log *slog.Logger) error {
	restCfg, err := clientcmd.BuildConfigFromFlags("", adminKubeconfig)
	if err != nil {
		return fmt.Errorf("the Kubernetes version keeper: %w", err)
	}
	restCfg.Timeout = 30 * time.Second
	kube, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("the Kubernetes version keeper: %w", err)
	}
	config, err := kubeadmconfig.Upgrade(kubeadmconfig.UpgradeParams{KubernetesVersion: nodeConfig.KubernetesVersion, Sandbox: osys.NodeSettings().Sandbox})
	if err != nil {
		return fmt.Errorf("the Kubernetes version keeper: %w", err)
	}
	log = log.With("component", "kubeupgrade")
	k := &kubeupgrade.Keeper{
		Version: nodeConfig.KubernetesVersion, Kube: kube, Config: config, Log: log, Output: kubeadm.LogOutput(log),
		Kubeadm: kubeadm.Runner{Binary: osys.Kubeadm()},
	}
	go k.Run(ctx)
	return nil
}

// adminKubeconfig is where kubeadm writes a control plane's admin kubeconfig.
const adminKubeconfig = "/etc/kubernetes/admin.conf"

// asyncReporter reports phases (and their details) to the platform in order, without
// blocking the caller (the bootstrapper's flow): a phase that finds the queue full is dropped
// and logged.
func asyncReporter(ctx context.Context, meta metadata.Reporter, log *slog.Logger) func(phase, detail string) {
	type phaseReport struct{ phase, detail string }
	queue := make(chan phaseReport, 16)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case r := <-queue:
				reportDetail(ctx, meta, log, r.phase, r.detail)
			}
		}
	}()
	return func(phase, detail string) {
		select {
		case queue <- phaseReport{phase, detail}:
		default:
			log.Warn("phase report dropped: the platform's metadata service is slow", "phase", phase)
		}
	}
}

// report tells the platform the bootstrapper's phase (diagnosis for the operator, shown by
// `constellation status`); failures are logged, never fatal.
func report(ctx context.Context, meta metadata.Reporter, log *slog.Logger, phase string) {
	reportDetail(ctx, meta, log, phase, "")
}

func reportDetail(ctx context.Context, meta metadata.Reporter, log *slog.Logger, phase, detail string) {
	if err := meta.ReportDetail(ctx, phase, detail); err != nil {
		log.Warn("reporting the node's phase to the platform", "phase", phase, "err", err)
	}
}

// bringIn brings the node into its cluster, in order:
//
//  1. attestation: the node's issuer, once its TPM quotes, and its check of the join service;
//  2. the node: its lock and its state storage, opened;
//  3. the join client;
//  4. on a control plane, the recovery server (rebooted) or the init server (fresh);
//  5. the bootstrapper, which picks init, join, rejoin or recovery.
func bringIn(ctx context.Context, p Platform, o Options, log *slog.Logger, meta Metadata, inst metadata.Instance, nodeConfig NodeConfig, osys OS, kubelet Kubelet, authz *authorizer) (inCluster, error) {
	v, env := p.Attestation()
	tpm := vtpm.PerUseTPM{Open: env.TPM}
	progress := asyncReporter(ctx, meta, log)
	issuer, serviceValidator, err := nodeAttestation(ctx, v, env, tpm, nodeConfig, progress, log)
	if err != nil {
		return inCluster{}, err
	}
	n, err := openNodeOnceAccepted(ctx, p, v, tpm, osys, progress, log)
	if err != nil {
		return inCluster{}, err
	}
	log.Info("node opened", "state", n.State().String())
	settings := osys.NodeSettings()
	runner := &kubeletFirst{Runner: kubeadm.Runner{Binary: osys.Kubeadm()}, kubelet: kubelet, images: osys.WaitImages, ctx: ctx}
	dial, err := joinclient.AttestedDialer(issuer, serviceValidator)
	if err != nil {
		return inCluster{}, err
	}
	jc, err := joinclient.New(joinclient.Config{
		Node: n, Metadata: meta, Dial: dial, Kubeadm: runner, KubeadmConfig: joinclient.KubeadmConfig(settings),
		Kubelet: lifetimeKubelet{kubelet, ctx}, PKIDir: kubeadmconfig.CertificatesDir, KubeletPKIDir: kubeletcred.CertDir,
		DiscoveryFile: "/etc/kubernetes/constellation-join.conf", APIServerConfigDir: nodeauthz.ConfigDir, RegistryHostsDir: registries.HostsDir, Log: log,
	})
	if err != nil {
		return inCluster{}, err
	}
	cfg := bootstrapper.Config{Node: n, JoinClient: jc, Log: log, Progress: func(phase string) { progress(phase, "") }}
	if inst.Role == metadata.ControlPlane && n.State() == node.Rebooted {
		if cfg.RecoveryServer, cfg.RecoveryListener, err = recoveryServer(ctx, o, n, issuer, inst, kubelet, log); err != nil {
			return inCluster{}, err
		}
		defer cfg.RecoveryListener.Close()
	}
	if inst.Role == metadata.ControlPlane && n.State() == node.Fresh {
		is, err := initserver.New(initserver.Config{
			Node: n, Metadata: meta, Issuer: issuer, Kubeadm: runner,
			KubeadmConfig: initserver.KubeadmConfig(settings), KubernetesVersion: nodeConfig.KubernetesVersion,
			AdminKubeconfig: adminKubeconfig, KubeletKubeconfig: kubeletcred.KubeconfigFile, APIServerConfigDir: nodeauthz.ConfigDir, RegistryHostsDir: registries.HostsDir,
			PKIDir: kubeadmconfig.CertificatesDir, KubeletPKIDir: kubeletcred.CertDir, NodeLogs: osys.Logs, Log: log,
			Deploy: deployServices(nodeConfig.ServicesImage, p.Services(), authz),
		})
		if err != nil {
			return inCluster{}, err
		}
		l, err := net.Listen("tcp", o.InitAddr)
		if err != nil {
			return inCluster{}, fmt.Errorf("listening for init: %w", err)
		}
		defer l.Close()
		cfg.InitServer, cfg.InitListener = is, l
	}
	by, err := bootstrapper.Run(ctx, cfg)
	return inCluster{by: by, node: n, dial: dial}, err
}

// nodeAttestation waits until the node's TPM quotes and returns the node's issuer, and the
// node's check of the join service.
func nodeAttestation(ctx context.Context, v variant.Variant, env choose.IssuerEnv, tpm vtpm.PerUseTPM, nodeConfig NodeConfig, progress func(phase, detail string), log *slog.Logger) (attestation.Issuer, attestation.Validator, error) {
	// Everything the node offers starts with a quote: make sure there is one, and say why
	// not while there is none, instead of failing every handshake silently.
	issuer, err := tpmcheck.Wait(ctx, tpmcheck.Config{
		NewIssuer: func(ctx context.Context) (attestation.Issuer, error) {
			return choose.NewIssuer(ctx, v, env)
		},
		DA: tpm, Report: progress, Log: log,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("loading the node's attestation key: %w", err)
	}
	// Before anything touches the network: the join service must be a certified control
	// plane of this node's image, or of an image its measured node configuration accepts
	// (the releases it upgrades from), initialized; the AK root comes from the node's own TPM
	// (joinservice.ServiceCheck).
	serviceValidator, err := joinservice.ServiceCheck{Variant: v, ReferenceSets: nodeConfig.JoinServiceSets, Log: log}.Validator(tpm)
	if err != nil {
		return nil, nil, err
	}
	return issuer, serviceValidator, nil
}

// openNode opens the node: its lock (its variant's cluster-ID register) and its state
// storage, whose unlock mounts the node's state.
// stateDiskRecheck is how often a node whose state disk it refused looks at the disk again
// (a variable for the tests).
var stateDiskRecheck = metadata.StateDiskRecheck

// openNodeOnceAccepted opens the node; while its state disk is refused
// (statedisk.ErrHeaderRefused) it reports metadata.PhaseStateDiskRefused with the reason and
// looks again every stateDiskRecheck. The node uses nothing of that disk and writes nothing
// to it, and an operator who restores the disk need not restart the machine.
func openNodeOnceAccepted(ctx context.Context, p Platform, v variant.Variant, tpm vtpm.PerUseTPM, osys OS, progress func(phase, detail string), log *slog.Logger) (*node.Node, error) {
	for {
		n, err := openNode(ctx, p, v, tpm, osys)
		if !errors.Is(err, statedisk.ErrHeaderRefused) {
			return n, err
		}
		log.Error("state disk refused; looking again", "err", err, "in", stateDiskRecheck)
		progress(metadata.PhaseStateDiskRefused, err.Error())
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("state disk refused: %w", err)
		case <-time.After(stateDiskRecheck):
		}
	}
}

func openNode(ctx context.Context, p Platform, v variant.Variant, tpm vtpm.PerUseTPM, osys OS) (*node.Node, error) {
	lock, err := nodelock.New(tpm, v)
	if err != nil {
		return nil, err
	}
	storage, err := p.Storage()
	if err != nil {
		return nil, fmt.Errorf("the node's state storage: %w", err)
	}
	return node.Open(ctx, lock, &stateStorage{Storage: storage, mount: osys.MountState})
}

// recoveryServer is the recovery server of a rebooted control plane, with its listener.
func recoveryServer(ctx context.Context, o Options, n *node.Node, issuer attestation.Issuer, inst metadata.Instance, kubelet Kubelet, log *slog.Logger) (*recoveryserver.Server, net.Listener, error) {
	rs, err := recoveryserver.New(recoveryserver.Config{
		Node: n, Issuer: issuer, Kubelet: lifetimeKubelet{kubelet, ctx}, Log: log,
		RenewKubeletCredential: func() error {
			return kubeletcred.RenewWithCA(kubeadmconfig.CertificatesDir, kubeletcred.CertDir, inst.Name, time.Now())
		},
	})
	if err != nil {
		return nil, nil, err
	}
	l, err := net.Listen("tcp", o.RecoverAddr)
	if err != nil {
		return nil, nil, fmt.Errorf("listening for recovery: %w", err)
	}
	return rs, l, nil
}

// deployReportMargin is what init keeps of its budget after the wait for the in-cluster
// services, to report why they are not ready (with the node's logs) before the budget ends.
const deployReportMargin = 30 * time.Second

// deployServices deploys the join, key and verification services from the image the node
// configuration names (measured with the node) and waits until they run: when init returns,
// the cluster can admit workers. The wait has no bound of its own: it lasts as long as the
// init's budget (initserver.Config.InitTimeout) allows, less deployReportMargin. A slow
// machine (a VM under TCG) starts the pods late; an init that failed for that alone would
// leave a node that can only be re-created.
func deployServices(image string, facts deploy.PlatformFacts, authz *authorizer) initserver.DeployFunc {
	return func(ctx context.Context, d initserver.Deployment) error {
		wait := initserver.DefaultInitTimeout
		if deadline, ok := ctx.Deadline(); ok {
			wait = time.Until(deadline) - deployReportMargin
		}
		if wait <= 0 {
			return fmt.Errorf("deploying the in-cluster services: less than %s of the init's budget left", deployReportMargin)
		}
		// Nodes join as soon as the join service serves, before init returns: the API server
		// must find its removed-node authorizer by then.
		if _, err := authz.start(); err != nil {
			return err
		}
		return deploy.Run(ctx, d.Kubeconfig, deploy.Config{
			Image: image, Attestation: d.Attestation, RegistryMirrors: d.RegistryMirrors, Platform: facts, WaitTimeout: wait,
			APIServerEndpoint: d.APIEndpoint,
		}, d.Progress)
	}
}

// authorizer starts a control plane's removed-node authorizer (internal/nodeauthz) once, for
// the bootstrapper's lifetime. The API server asks it about every request of a node identity
// and fails the request while it does not answer (kubeadm join then waits 5 s to try again):
// on the init path it starts as soon as kubeadm init made the API server, before the services
// are deployed and workers join; on the others once the node is in its cluster. It reports its
// readiness under the node's name (nodeauthz.ReportName), which `constellation status` and the
// CLI's waits read.
type authorizer struct {
	ctx  context.Context
	log  *slog.Logger
	node string
	once sync.Once
	srv  *nodeauthz.Server
	err  error
}

func (a *authorizer) start() (*nodeauthz.Server, error) {
	a.once.Do(func() {
		a.srv, a.err = nodeauthz.Start(a.ctx, nodeauthz.Config{PKIDir: kubeadmconfig.CertificatesDir, Kubeconfig: adminKubeconfig, Node: a.node, Log: a.log})
	})
	return a.srv, a.err
}

// stateStorage mounts the node's state overlays right after the storage is unlocked, as a
// node image mounts its state disk: the init server and join client write cluster files
// only after the unlock.
type stateStorage struct {
	statedisk.Storage
	mount func() error
}

func (s *stateStorage) Unlock(ctx context.Context, key []byte) error {
	if err := s.Storage.Unlock(ctx, key); err != nil {
		return err
	}
	if err := s.mount(); err != nil {
		return fmt.Errorf("mounting the node's state: %w", err)
	}
	return nil
}

// lifetimeKubelet restarts the kubelet under the bootstrapper's lifetime: the rejoin and the
// recovery server call Restart with the context of their request, which ends long before the
// kubelet should.
type lifetimeKubelet struct {
	Kubelet
	ctx context.Context
}

func (k lifetimeKubelet) Restart(context.Context) error { return k.Kubelet.Restart(k.ctx) }

// kubeletFirst starts the kubelet supervisor before kubeadm runs: kubeadm writes the
// kubelet's configuration and then waits for it to become healthy, as with systemd. kubeadm
// runs once the node's images are imported: its preflight would pull missing ones.
type kubeletFirst struct {
	kubeadm.Runner
	kubelet Kubelet
	images  func(context.Context) error
	// ctx is the bootstrapper's lifetime: the kubelet outlives the kubeadm call that starts it.
	ctx  context.Context
	once sync.Once
}

func (k *kubeletFirst) start() { k.once.Do(func() { k.kubelet.Start(k.ctx) }) }

func (k *kubeletFirst) Init(ctx context.Context, config []byte, out io.Writer) error {
	if err := k.images(ctx); err != nil {
		return err
	}
	k.start()
	return k.Runner.Init(ctx, config, out)
}

func (k *kubeletFirst) Join(ctx context.Context, config []byte, out io.Writer) error {
	if err := k.images(ctx); err != nil {
		return err
	}
	k.start()
	return k.Runner.Join(ctx, config, out)
}

func waitSelf(ctx context.Context, meta metadata.Provider, log *slog.Logger) (metadata.Instance, error) {
	for {
		n, err := meta.Self(ctx)
		if err == nil {
			return n, nil
		}
		log.Warn("metadata not available yet", "err", err)
		select {
		case <-ctx.Done():
			return n, fmt.Errorf("waiting for metadata: %w", err)
		case <-time.After(500 * time.Millisecond):
		}
	}
}
