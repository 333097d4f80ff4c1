// Package vmnode is the node half of the QEMU provider: the platform (boot.Platform) of a
// machine that booted the node OS image (docs/vm-image.md) under the node program
// (internal/bootstrapper/boot). Unlike a sandbox node, a machine has its own kernel: its TPM
// is the kernel's resource manager on the machine's swtpm, its event log the firmware's (from
// securityfs), its state storage the LUKS2 volume with dm-integrity on its state disk, and its
// root the image's, verified by dm-verity. Its metadata, phase reports and volume lookups are
// the provider's metadata service on the cluster network, as a sandbox node's.
//
// Its operating-system side is the sandbox's node OS (nodeos, run in the bootstrapper's own
// mount namespace: the image's unit starts it under unshare), so containerd, the kubelet's
// supervision and the image import are the same code on both.
package vmnode

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/openconstellation/constellation/internal/bootstrapper/boot"
	"github.com/openconstellation/constellation/internal/csidriver"
	"github.com/openconstellation/constellation/internal/csidriver/unlock"
	"github.com/openconstellation/constellation/internal/deploy"
	"github.com/openconstellation/constellation/internal/dmi"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider/local"
	"github.com/openconstellation/constellation/internal/provider/local/metadataclient"
	"github.com/openconstellation/constellation/internal/provider/local/nodeboot"
	"github.com/openconstellation/constellation/internal/provider/local/nodeos"
	"github.com/openconstellation/constellation/internal/provider/local/volumeclient"
	"github.com/openconstellation/constellation/internal/statedisk"
	"github.com/openconstellation/constellation/internal/tpmsocket"
	"github.com/openconstellation/constellation/pkg/attestation/choose"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
)

// Name is the QEMU provider's name, as a node platform and in the provider catalog.
const Name = "qemu"

// Paths on a machine of the node OS image (docs/vm-image.md).
const (
	// ImageDir is the node image directory in the verified root: bootstrapper, kubelet,
	// kubeadm, containerd.toml, node-config.json.
	ImageDir = "/usr/lib/constellation/image"
	// ImagesDir holds the container image archives the image carries.
	ImagesDir = "/usr/lib/constellation/images"
	// NodeDir is the node's work folder (logs), on the machine's volatile /var.
	NodeDir = "/var/lib/constellation/node"
	// TPMDevice is the kernel's TPM resource manager.
	TPMDevice = "/dev/tpmrm0"
	// EventLogFile is the firmware's TCG event log, as the kernel exports it.
	EventLogFile = "/sys/kernel/security/tpm0/binary_bios_measurements"
	// StateDisk is the machine's state disk: the second virtio disk, whose serial the
	// provider sets to "state" (internal/provider/qemu/vm).
	StateDisk = "/dev/disk/by-id/virtio-state"
	// VolumeWorkDir holds the checked header copies of the volumes' disks (root only).
	VolumeWorkDir = "/run/constellation/volumes"
	// diskWait bounds how long a volume's disk may take to appear once plugged.
	diskWait = time.Minute
	// stateMapping is the device-mapper name of the opened state disk.
	stateMapping = "state"
)

// Detect tells whether the machine whose firmware identity info is, is a QEMU machine: QEMU's
// SMBIOS tables name QEMU as the maker (OVMF passes them on).
func Detect(info dmi.Info) bool { return info.SysVendor == "QEMU" }

// Platform is a machine's platform.
type Platform struct {
	cfg  boot.PlatformConfig
	meta *metadataclient.Client
}

// New returns the platform of a machine booted from the node OS image; cfg's folders default
// to the image's.
func New(cfg boot.PlatformConfig) (boot.Platform, error) {
	if cfg.NodeDir == "" {
		cfg.NodeDir = NodeDir
	}
	if cfg.ImageDir == "" {
		cfg.ImageDir = ImageDir
	}
	if len(cfg.ImageStores) == 0 && len(cfg.Images) == 0 {
		cfg.ImageStores = []string{ImagesDir}
	}
	if cfg.MetadataURL == "" {
		cfg.MetadataURL = metadataclient.DefaultURL
	}
	meta, err := metadataclient.New(cfg.MetadataURL, nil)
	if err != nil {
		return nil, err
	}
	if err := lockPlatformHierarchy(); err != nil {
		return nil, err
	}
	return &Platform{cfg: cfg, meta: meta}, nil
}

// lockPlatformHierarchy disables the TPM's platform hierarchy for this boot, before anything
// of the node's that is not the measured image runs (the bootstrapper is the image's first
// program after the OS's own services, and no pod exists yet). The provider certified the
// machine's AK into a platform NV index before the boot; a hierarchy left enabled would let
// software on the node rewrite that root of trust, and the node's check of the join service
// refuses to trust it then. OVMF leaves the hierarchy enabled (docs/qemu-provider.md), so the
// image does it, as the sandbox's provider does for its nodes. A second call in one boot (the
// bootstrapper restarted) finds it disabled: a TPM reset is the only way to enable it again.
func lockPlatformHierarchy() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tpm, err := vtpm.Open(ctx, TPMDevice)
	if err != nil {
		return fmt.Errorf("opening the TPM to disable its platform hierarchy: %w", err)
	}
	defer tpm.Close()
	if err := tpm.DisablePlatformHierarchy(); err != nil {
		return fmt.Errorf("disabling the TPM's platform hierarchy: %w", err)
	}
	return nil
}

// Name implements boot.Platform.
func (p *Platform) Name() string { return Name }

// Metadata implements boot.Platform: the provider's metadata service.
func (p *Platform) Metadata(context.Context) (boot.Metadata, error) { return p.meta, nil }

// Attestation implements boot.Platform: the machine's TPM through the kernel's resource
// manager, the RSA AK the provider certified before the boot, and the firmware's event log.
func (p *Platform) Attestation() (variant.Variant, choose.IssuerEnv) {
	return local.Variant, choose.IssuerEnv{
		TPM: vtpm.OpenAddr(TPMDevice), AK: vtpm.AKRSA, EventLog: vtpm.ReadEventLog(EventLogFile),
	}
}

// NodeConfig implements boot.Platform: the image's node-config.json, in the verified root.
func (p *Platform) NodeConfig() (boot.NodeConfig, error) {
	return nodeboot.ReadNodeConfig(p.cfg.ImageDir)
}

// Storage implements boot.Platform: LUKS2 with dm-integrity on the state disk, mounted where
// the node OS keeps its state once unlocked.
func (p *Platform) Storage() (statedisk.Storage, error) {
	return &statedisk.LUKS2{Device: StateDisk, Name: stateMapping, MountPoint: nodeos.StateMount}, nil
}

// OS implements boot.Platform: the node OS on the machine (nodeos in machine mode), with the
// pod range the provider's metadata gives the node; the kubelet's cgroups are the machine's.
func (p *Platform) OS(ctx context.Context, self metadata.Instance) (boot.OS, error) {
	n, err := p.meta.Node(ctx)
	if err != nil {
		return nil, fmt.Errorf("the node's settings: %w", err)
	}
	if err := os.MkdirAll(p.cfg.NodeDir, 0o755); err != nil {
		return nil, err
	}
	osys, err := nodeboot.BootOS(ctx, p.cfg, true, self, n.PodCIDR, "")
	if err != nil {
		return nil, err
	}
	// The node OS's /run is its own (a tmpfs nodeos mounts): the socket goes there, after it.
	l, err := tpmsocket.Listen(nodeos.TPMSocket)
	if err != nil {
		return nil, err
	}
	go func() {
		open := func() (io.ReadWriteCloser, error) { return tpmsocket.OpenDevice(TPMDevice) }
		if err := tpmsocket.Serve(context.Background(), l, open, slog.Default()); err != nil {
			slog.Error("the TPM socket for the in-cluster services stopped", "err", err)
		}
	}()
	return osys, nil
}

// Volumes implements boot.Platform: a volume attached to this node is a disk the provider
// plugs into the machine (found by its serial number, machineDisks), opened as LUKS2 with
// integrity (unlock.LUKS2), the state disk's format.
func (p *Platform) Volumes() (csidriver.Devices, csidriver.Unlocker, error) {
	log := p.cfg.Log
	if log == nil {
		log = slog.Default()
	}
	devices := &machineDisks{provider: volumeclient.New(p.cfg.MetadataURL), sysBlock: "/sys/block", wait: diskWait, log: log}
	return devices, &unlock.LUKS2{WorkDir: VolumeWorkDir}, nil
}

// Services implements boot.Platform: the services reach the machine's TPM through the
// socket OS serves (tpmsocket: their containers get no device access) and read the
// firmware's event log.
func (p *Platform) Services() deploy.PlatformFacts {
	return deploy.PlatformFacts{
		Name: Name, MetadataURL: p.cfg.MetadataURL,
		TPM: nodeos.TPMSocket, TPMKind: deploy.TPMSocket, EventLog: EventLogFile,
	}
}
