// Package azurenode is the node half of the Azure provider: the platform (boot.Platform) of a
// confidential VM (SEV-SNP or TDX, with Azure's vTPM) that booted the node OS image
// (docs/vm-image.md) under the node program (internal/bootstrapper/boot).
//
// The node's variant is what its hardware says, not its metadata: the HCL report Azure's
// paravisor leaves in the vTPM names SEV-SNP or TDX. Its state disk is the data disk at LUN 0,
// LUKS2 with dm-integrity; its metadata is IMDS and Resource Manager (azuremeta). The OS
// side is the node OS of the QEMU machines (the same image): docs/azure.md "Status" says what
// of this ran (none of it, on Azure).
package azurenode

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/openconstellation/constellation/internal/bootstrapper/boot"
	"github.com/openconstellation/constellation/internal/csidriver"
	"github.com/openconstellation/constellation/internal/csidriver/unlock"
	"github.com/openconstellation/constellation/internal/deploy"
	"github.com/openconstellation/constellation/internal/dmi"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider/azure/azuremeta"
	"github.com/openconstellation/constellation/internal/provider/local/nodeboot"
	"github.com/openconstellation/constellation/internal/provider/local/nodeos"
	"github.com/openconstellation/constellation/internal/provider/qemu/vmnode"
	"github.com/openconstellation/constellation/internal/statedisk"
	"github.com/openconstellation/constellation/internal/tpmsocket"
	"github.com/openconstellation/constellation/pkg/attestation/azure"
	"github.com/openconstellation/constellation/pkg/attestation/azuresnp"
	"github.com/openconstellation/constellation/pkg/attestation/azuretdx"
	"github.com/openconstellation/constellation/pkg/attestation/choose"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
)

// Name is the Azure provider's name, as a node platform and in the provider catalog.
const Name = "azure"

// Paths on an Azure VM of the node OS image, besides the image's own (vmnode).
const (
	sysBlock = "/sys/block"
	// console is the VM's serial console, which boot diagnostics keep.
	console = "/dev/ttyS0"
	// diskWait bounds how long the state disk may take to appear.
	diskWait = 2 * time.Minute
	// stateMapping is the device-mapper name of the opened state disk.
	stateMapping = "state"
)

// azureAssetTag is the chassis asset tag of every Azure VM (Hyper-V elsewhere has none): the
// tag cloud-init's and Talos' platform detection go by too.
const azureAssetTag = "7783-7084-3265-9085-8269-3286-77"

// Detect tells whether the machine whose firmware identity info is, is an Azure VM. It says
// nothing of whether it is a confidential one: New reads that from the vTPM.
func Detect(info dmi.Info) bool { return info.ChassisAssetTag == azureAssetTag }

// Platform is an Azure confidential VM's platform.
type Platform struct {
	cfg     boot.PlatformConfig
	variant variant.Variant
	meta    *nodeMetadata
}

// New returns the platform of a VM booted from the node OS image on Azure. It reads the
// vTPM's HCL report first: a VM without one is no confidential VM of Azure.
func New(cfg boot.PlatformConfig) (boot.Platform, error) {
	if cfg.NodeDir == "" {
		cfg.NodeDir = vmnode.NodeDir
	}
	if cfg.ImageDir == "" {
		cfg.ImageDir = vmnode.ImageDir
	}
	if len(cfg.ImageStores) == 0 && len(cfg.Images) == 0 {
		cfg.ImageStores = []string{vmnode.ImagesDir}
	}
	if cfg.MetadataURL == "" {
		cfg.MetadataURL = azuremeta.IMDSURL
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v, err := Variant(ctx, vtpm.OpenAddr(vmnode.TPMDevice))
	if err != nil {
		return nil, err
	}
	out, err := os.OpenFile(console, os.O_WRONLY, 0)
	if err != nil {
		out = os.Stderr // the journal, then
	}
	return newPlatform(cfg, v, out, bootTime(procStat)), nil
}

func newPlatform(cfg boot.PlatformConfig, v variant.Variant, console io.Writer, booted time.Time) *Platform {
	return &Platform{cfg: cfg, variant: v, meta: &nodeMetadata{
		imds: azuremeta.IMDS{BaseURL: cfg.MetadataURL}, lister: azuremeta.NewClusterLister(cfg.MetadataURL), console: console, boot: booted, again: reportAgain,
	}}
}

// procStat is the kernel's statistics file, whose btime line is when the machine booted.
const procStat = "/proc/stat"

// bootTime is when the machine booted, from the kernel (stat's btime); if that cannot be
// read, now: the node program's start, a little after the boot.
func bootTime(stat string) time.Time {
	data, err := os.ReadFile(stat)
	if err != nil {
		return time.Now()
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			if secs, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
				return time.Unix(secs, 0)
			}
		}
	}
	return time.Now()
}

// Variant is the variant of the VM whose vTPM open opens: its HCL report's hardware report
// is SEV-SNP (azure-sev-snp) or TDX (azure-tdx).
func Variant(ctx context.Context, open vtpm.Opener) (variant.Variant, error) {
	tpm, err := open(ctx)
	if err != nil {
		return variant.Variant{}, fmt.Errorf("opening the vTPM: %w", err)
	}
	defer tpm.Close()
	raw, err := tpm.ReadNV(azure.HCLReportNVIndex)
	if err != nil {
		return variant.Variant{}, fmt.Errorf("reading the HCL report (NV index %#x): not an Azure confidential VM? %w", azure.HCLReportNVIndex, err)
	}
	r, err := azure.ParseHCLReport(raw)
	if err != nil {
		return variant.Variant{}, err
	}
	switch r.Type {
	case azure.ReportTypeSNP:
		return variant.AzureSEVSNP, nil
	case azure.ReportTypeTDX:
		return variant.AzureTDX, nil
	}
	return variant.Variant{}, fmt.Errorf("the HCL report holds a %s report, neither SEV-SNP nor TDX", r.Type)
}

// Name implements boot.Platform.
func (p *Platform) Name() string { return Name }

// Metadata implements boot.Platform.
func (p *Platform) Metadata(context.Context) (boot.Metadata, error) { return p.meta, nil }

// Attestation implements boot.Platform: the vTPM through the kernel's resource manager with
// the HCL's AK, the firmware's event log, and Azure's endpoints that complete the hardware
// evidence (the VCEK from THIM; the TD quote from IMDS).
func (p *Platform) Attestation() (variant.Variant, choose.IssuerEnv) {
	return p.variant, choose.IssuerEnv{
		TPM: vtpm.OpenAddr(vmnode.TPMDevice), AK: vtpm.AKRSA, EventLog: vtpm.ReadEventLog(vmnode.EventLogFile),
		AzureCertificates: &azuresnp.THIM{}, AzureQuotes: &azuretdx.IMDS{},
	}
}

// NodeConfig implements boot.Platform: the image's node-config.json, in the verified root.
func (p *Platform) NodeConfig() (boot.NodeConfig, error) {
	return nodeboot.ReadNodeConfig(p.cfg.ImageDir)
}

// Storage implements boot.Platform: LUKS2 with dm-integrity on the data disk at LUN 0.
func (p *Platform) Storage() (statedisk.Storage, error) {
	ctx, cancel := context.WithTimeout(context.Background(), diskWait+time.Second)
	defer cancel()
	dev, err := waitLUN(ctx, sysBlock, azuremeta.StateLUN, diskWait)
	if err != nil {
		return nil, fmt.Errorf("the state disk: %w", err)
	}
	return &statedisk.LUKS2{Device: dev, Name: stateMapping, MountPoint: nodeos.StateMount}, nil
}

// OS implements boot.Platform: the node OS in machine mode, with the pod network its VM's
// tag gives (routed to it by the cluster's route table).
func (p *Platform) OS(ctx context.Context, self metadata.Instance) (boot.OS, error) {
	inst, err := p.meta.instance(ctx)
	if err != nil {
		return nil, err
	}
	pods, err := netip.ParsePrefix(inst.Tags[azuremeta.TagPodNetwork])
	if err != nil {
		return nil, fmt.Errorf("the VM's %s tag: %w", azuremeta.TagPodNetwork, err)
	}
	if err := os.MkdirAll(p.cfg.NodeDir, 0o755); err != nil {
		return nil, err
	}
	osys, err := nodeboot.BootOS(ctx, p.cfg, true, self, pods, "")
	if err != nil {
		return nil, err
	}
	l, err := tpmsocket.Listen(nodeos.TPMSocket)
	if err != nil {
		return nil, err
	}
	go func() {
		open := func() (io.ReadWriteCloser, error) { return tpmsocket.OpenDevice(vmnode.TPMDevice) }
		if err := tpmsocket.Serve(context.Background(), l, open, slog.Default()); err != nil {
			slog.Error("the TPM socket for the in-cluster services stopped", "err", err)
		}
	}()
	return osys, nil
}

// Volumes implements boot.Platform: a volume is the managed disk the controller attached at
// the LUN IMDS lists under the volume's id (lunDisks), opened as LUKS2 with dm-integrity by
// the machines' unlocker.
func (p *Platform) Volumes() (csidriver.Devices, csidriver.Unlocker, error) {
	log := p.cfg.Log
	if log == nil {
		log = slog.Default()
	}
	devices := &lunDisks{imds: p.meta.imds, sysBlock: sysBlock, wait: diskWait, log: log}
	return devices, &unlock.LUKS2{WorkDir: vmnode.VolumeWorkDir}, nil
}

// Services implements boot.Platform.
func (p *Platform) Services() deploy.PlatformFacts {
	return deploy.PlatformFacts{
		Name: Name, MetadataURL: p.cfg.MetadataURL,
		TPM: nodeos.TPMSocket, TPMKind: deploy.TPMSocket, EventLog: vmnode.EventLogFile,
	}
}
