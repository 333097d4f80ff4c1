// Package nodeboot is the node half of the local provider: the sandbox node's platform
// (boot.Platform) under the node program (internal/bootstrapper/boot). A sandbox node is a
// set of namespaces on the operator's machine (nodeos): its TPM is the provider's swtpm on a
// socket, its event log the one the provider wrote when it measured the image, its state
// storage a gocryptfs folder in its workspace, and its metadata, phase reports and volumes
// the provider's metadata service (metadataclient, volumeclient).
package nodeboot

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/openconstellation/constellation/internal/bootstrapper/boot"
	"github.com/openconstellation/constellation/internal/csidriver"
	"github.com/openconstellation/constellation/internal/csidriver/unlock"
	"github.com/openconstellation/constellation/internal/deploy"
	"github.com/openconstellation/constellation/internal/kube/kubeadmconfig"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider/local"
	"github.com/openconstellation/constellation/internal/provider/local/metadataclient"
	"github.com/openconstellation/constellation/internal/provider/local/nodeos"
	"github.com/openconstellation/constellation/internal/provider/local/volumeclient"
	"github.com/openconstellation/constellation/internal/statedisk"
	"github.com/openconstellation/constellation/pkg/attestation/choose"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
)

// Name is the local provider's name, as a node platform and in the provider catalog.
const Name = "local"

// volumeWorkDir holds the volume unlocker's private mounts, on the node's tmpfs.
const volumeWorkDir = nodeos.RunDir + "/volumes"

// Platform is a sandbox node's platform.
type Platform struct {
	cfg  boot.PlatformConfig
	meta *metadataclient.Client
}

// New returns the platform of the sandbox node cfg describes (the bootstrapper's flags).
func New(cfg boot.PlatformConfig) (boot.Platform, error) {
	if cfg.NodeDir == "" || cfg.ImageDir == "" {
		return nil, fmt.Errorf("the %s platform needs --node-dir and --image-dir", Name)
	}
	if cfg.MetadataURL == "" {
		cfg.MetadataURL = metadataclient.DefaultURL
	}
	meta, err := metadataclient.New(cfg.MetadataURL, nil)
	if err != nil {
		return nil, err
	}
	return &Platform{cfg: cfg, meta: meta}, nil
}

// Name implements boot.Platform.
func (p *Platform) Name() string { return Name }

// Metadata implements boot.Platform: the provider's metadata service.
func (p *Platform) Metadata(context.Context) (boot.Metadata, error) { return p.meta, nil }

// Attestation implements boot.Platform: the provider's swtpm on the node's socket, opened per
// use, the RSA AK the provider certified, and the event log of the provider's measurement.
func (p *Platform) Attestation() (variant.Variant, choose.IssuerEnv) {
	return local.Variant, choose.IssuerEnv{
		TPM: vtpm.OpenAddr("unix:" + nodeos.TPMSocket), AK: vtpm.AKRSA, EventLog: vtpm.ReadEventLog(nodeos.EventLog),
	}
}

// NodeConfig implements boot.Platform: the image's node-config.json.
func (p *Platform) NodeConfig() (boot.NodeConfig, error) { return ReadNodeConfig(p.cfg.ImageDir) }

// ReadNodeConfig reads the node-config.json of the node image directory imageDir (measured
// with the image: by the provider on a sandbox, by dm-verity on a machine's root).
func ReadNodeConfig(imageDir string) (boot.NodeConfig, error) {
	data, err := os.ReadFile(filepath.Join(imageDir, local.NodeConfigFile))
	if err != nil {
		return boot.NodeConfig{}, fmt.Errorf("reading the image's node configuration: %w", err)
	}
	c, err := local.ParseNodeConfig(data)
	if err != nil {
		return boot.NodeConfig{}, fmt.Errorf("the image's %s: %w", local.NodeConfigFile, err)
	}
	return boot.NodeConfig{KubernetesVersion: c.KubernetesVersion, ServicesImage: c.ServicesImage, JoinServiceSets: c.JoinServiceSets}, nil
}

// Storage implements boot.Platform: a gocryptfs folder in the node's workspace, mounted where
// the node keeps its state once unlocked.
func (p *Platform) Storage() (statedisk.Storage, error) {
	return &statedisk.Gocryptfs{Dir: filepath.Join(p.cfg.NodeDir, "state"), MountPoint: nodeos.StateMount}, nil
}

// OS implements boot.Platform: it boots the sandbox (nodeos) with the image's containerd
// configuration and images, and sets up the node's pod network; the kubelet runs under the
// node's cgroup. The pod network and the cgroup are the provider's metadata.
func (p *Platform) OS(ctx context.Context, self metadata.Instance) (boot.OS, error) {
	n, err := p.meta.Node(ctx)
	if err != nil {
		return nil, fmt.Errorf("the sandbox's settings: %w", err)
	}
	// A sandbox's pods must stay in the cluster's cgroup: the host's tree is shared.
	if n.CgroupRoot == "" {
		return nil, errors.New("the sandbox's settings name no cgroup root for its pods")
	}
	return BootOS(ctx, p.cfg, false, self, n.PodCIDR, n.CgroupRoot)
}

// BootOS boots nodeos for node self from the node image in cfg.ImageDir (its containerd
// configuration, kubelet and kubeadm) with cfg's container images, sets up its pod network on
// podCIDR, and returns it as the node program drives it, the kubelet's pods under cgroupRoot
// ("" for the kubelet's default). A machine of the QEMU provider runs the same node OS
// (machine: nodeos.Config.Machine).
func BootOS(ctx context.Context, cfg boot.PlatformConfig, machine bool, self metadata.Instance, podCIDR netip.Prefix, cgroupRoot string) (boot.OS, error) {
	containerdConfig, err := os.ReadFile(filepath.Join(cfg.ImageDir, "containerd.toml"))
	if err != nil {
		return nil, fmt.Errorf("reading the image's containerd configuration: %w", err)
	}
	osys, err := nodeos.Boot(ctx, nodeos.Config{
		NodeDir: cfg.NodeDir, ContainerdConfig: containerdConfig, Images: cfg.Images, ImageStores: cfg.ImageStores,
		Kubelet: filepath.Join(cfg.ImageDir, "kubelet"), Log: cfg.Log, Machine: machine,
	}, self.Name)
	if err != nil {
		return nil, err
	}
	if err := nodeos.SetUpPodNetwork(ctx, podCIDR); err != nil {
		return nil, fmt.Errorf("setting up the pod network: %w", err)
	}
	var ip netip.Addr
	if len(self.IPs) > 0 {
		ip = self.IPs[0]
	}
	var kubeletArgs []string
	if cgroupRoot != "" {
		kubeletArgs = append(kubeletArgs, "--cgroup-root="+cgroupRoot)
	}
	o := &sandboxOS{OS: osys, kubelet: osys.Kubelet(kubeletArgs...), name: self.Name, ip: ip, imageDir: cfg.ImageDir}
	if machine {
		o.componentWait = machineComponentWait
	}
	return o, nil
}

// Volumes implements boot.Platform: the provider names the devices it attached through its
// volume API, and a volume's key opens its gocryptfs folder.
func (p *Platform) Volumes() (csidriver.Devices, csidriver.Unlocker, error) {
	if err := os.MkdirAll(volumeWorkDir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("the encrypted volumes' work directory: %w", err)
	}
	return volumeclient.New(p.cfg.MetadataURL), &unlock.Gocryptfs{WorkDir: volumeWorkDir}, nil
}

// Services implements boot.Platform: the services mount the node's swtpm socket and event
// log where nodeos put them.
func (p *Platform) Services() deploy.PlatformFacts {
	return deploy.PlatformFacts{
		Name: Name, MetadataURL: p.cfg.MetadataURL,
		TPM: nodeos.TPMSocket, TPMKind: deploy.TPMSocket, EventLog: nodeos.EventLog,
	}
}

// sandboxOS is nodeos as the node program drives it.
type sandboxOS struct {
	*nodeos.OS
	kubelet  *nodeos.Supervisor
	name     string
	ip       netip.Addr
	imageDir string
	// componentWait is kubeadm's wait for the kubelet and the control plane (0: its
	// default).
	componentWait time.Duration
}

// machineComponentWait is kubeadm's wait on a QEMU machine: under emulation (TCG) the
// control-plane components take minutes to become healthy (kube-apiserver 55 s, the
// controller manager longer, on one machine of these build hosts), beyond kubeadm's 4.
const machineComponentWait = 15 * time.Minute

// NodeSettings are containerd's socket and the sandbox's kubeadm settings (no preflight, no
// pulls: kubeadmconfig's package documentation). A QEMU machine runs the same node OS
// (nodeos: containerd with cgroupfs, images imported, no registry), so the same settings,
// with a longer wait for the components.
func (o *sandboxOS) NodeSettings() kubeadmconfig.NodeSettings {
	return kubeadmconfig.NodeSettings{CRISocket: nodeos.CRISocket, Sandbox: true, ComponentWait: o.componentWait}
}

func (o *sandboxOS) Kubeadm() string       { return filepath.Join(o.imageDir, "kubeadm") }
func (o *sandboxOS) Kubelet() boot.Kubelet { return o.kubelet }

// MountState mounts the node's state overlays on the unlocked storage.
func (o *sandboxOS) MountState() error { return o.OS.MountState(nodeos.StateMount, o.name, o.ip) }
