package qemu

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/measuredboot"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/provider/local"
	"github.com/openconstellation/constellation/internal/provider/local/cluster"
	localplatform "github.com/openconstellation/constellation/internal/provider/local/platform"
	"github.com/openconstellation/constellation/internal/provider/qemu/vm"
)

// Name is the QEMU provider's name: its configuration block and the state file's provider.
const Name = "qemu"

// Files of a node OS image folder (make vm-image, docs/vm-image.md).
const (
	DiskFile     = "disk.raw"
	UKIFile      = "uki.efi"
	ManifestFile = "manifest.json"
)

// DefaultShape is every machine's hardware (docs/qemu-provider.md): what a control plane
// needs under TCG. kube-apiserver, etcd, controller manager, scheduler, kubelet and
// containerd take about 0.7 GiB; containerd's root is in memory as on a sandbox node (the
// node OS's /run), and the image's container images take about 1.6 GiB there once
// imported (the archives' layers plus their unpacked snapshots).
//
// The state disk is 2 GiB: a fresh disk's first format writes all of it through
// dm-integrity (LUKS2 with integrity, docs/qemu-provider.md), about 13 MB/s under TCG.
var DefaultShape = Shape{
	MemoryMiB: 4096, CPUs: 2, StateDiskBytes: 2 << 30,
	Firmware: vm.DebianOVMF, Accel: vm.TCG,
}

// Debian's OVMF package, whose files DefaultShape boots: its name and version identify the
// firmware in the firmware records (the hashes decide).
const (
	ovmfPackage = "ovmf"
	ovmfVersion = "2022.11-6+deb12u2"
)

func init() {
	cluster.RegisterMachines(Name, func(raw json.RawMessage) (cluster.NewMachines, error) {
		s, err := parseShape(raw)
		if err != nil {
			return nil, err
		}
		return Machines(s), nil
	})
}

// parseShape reads the machines' shape a cluster's spec keeps (cluster.Spec.MachineShape).
func parseShape(raw json.RawMessage) (Shape, error) {
	var s Shape
	if err := json.Unmarshal(raw, &s); err != nil {
		return Shape{}, fmt.Errorf("the QEMU machines' shape: %w", err)
	}
	return s, nil
}

// Platform is the QEMU provider as the CLI meets it. Its clusters live where the local
// provider's do (workspace/mini) and are run by the same provider process, on QEMU machines.
type Platform struct {
	// records are firmware records besides the built-in ones (WithFirmwareRecord).
	records []measuredboot.FirmwareRecord
}

var (
	_ provider.Platform         = Platform{}
	_ provider.FirmwareRecorded = Platform{}
)

// WithFirmwareRecord implements provider.FirmwareRecorded: raw is parsed and validated as
// the built-in records are (measuredboot.ParseFirmwareRecord); it counts only for the
// firmware hashes and machine shape it names.
func (p Platform) WithFirmwareRecord(raw []byte) (provider.Platform, error) {
	rec, err := measuredboot.ParseFirmwareRecord(raw)
	if err != nil {
		return nil, err
	}
	p.records = append(slices.Clone(p.records), rec)
	return p, nil
}

// Name implements provider.Platform.
func (Platform) Name() string { return Name }

// ConfigRules implements provider.Platform: the machines sit on the local provider's
// network, with its addressing and its nodes' variant.
func (Platform) ConfigRules() config.ProviderRules { return local.ConfigRules{} }

// Folder implements provider.Platform.
func (Platform) Folder(workspace string) string { return localplatform.Platform{}.Folder(workspace) }

// Open implements provider.Platform.
func (Platform) Open(workspace string) (provider.Provider, error) {
	return localplatform.Platform{}.Open(workspace)
}

// InitSecret implements provider.Platform.
func (Platform) InitSecret(workspace string) ([]byte, error) {
	return localplatform.Platform{}.InitSecret(workspace)
}

// Remove implements provider.Platform.
func (Platform) Remove(ctx context.Context, workspace string) (int, error) {
	return localplatform.Platform{}.Remove(ctx, workspace)
}

// ReferenceValues implements provider.Platform: image is a node OS image folder; the
// registers its UKI determines are predicted from its bytes, the firmware's are the
// observed record of the firmware and machine shape the provider boots
// (internal/measuredboot).
func (p Platform) ReferenceValues(image string) (provider.ReferenceValues, error) {
	uki, err := os.ReadFile(filepath.Join(image, UKIFile))
	if err != nil {
		return provider.ReferenceValues{}, fmt.Errorf("node OS image: %w", err)
	}
	disk, err := os.Open(filepath.Join(image, DiskFile))
	if err != nil {
		return provider.ReferenceValues{}, fmt.Errorf("node OS image: %w", err)
	}
	defer disk.Close()
	fw, err := firmwareRecord(DefaultShape, p.records)
	if err != nil {
		return provider.ReferenceValues{}, err
	}
	m, prediction, err := measuredboot.ReferenceMeasurements(local.Variant, uki, disk, fw)
	if err != nil {
		return provider.ReferenceValues{}, fmt.Errorf("predicting the measurements of %s: %w", image, err)
	}
	rv := provider.ReferenceValues{Measurements: m, Components: map[uint32][]string{}}
	for _, r := range measuredboot.FirmwareRegisters {
		rv.Components[r] = []string{"firmware " + fw.Firmware.Package + " " + fw.Firmware.Version + " (observed)"}
	}
	for _, r := range prediction.Registers() {
		var names []string
		for _, e := range prediction.Events[r] {
			names = append(names, e.Description)
		}
		if len(names) > 0 {
			rv.Components[r] = names
		}
	}
	return rv, nil
}

// firmwareRecord returns the observed firmware registers of the firmware and shape, from the
// built-in records and extra.
func firmwareRecord(shape Shape, extra []measuredboot.FirmwareRecord) (measuredboot.FirmwareRecord, error) {
	build, err := measuredboot.HashFirmware(ovmfPackage, ovmfVersion, shape.Firmware.Code, shape.Firmware.VarsTemplate)
	if err != nil {
		return measuredboot.FirmwareRecord{}, err
	}
	records, err := measuredboot.FirmwareRecords()
	if err != nil {
		return measuredboot.FirmwareRecord{}, err
	}
	return measuredboot.FindFirmware(append(records, extra...), build, shape.measured())
}

// measured is the shape as the firmware measures it: the machine and devices of vm.Spec.
func (s Shape) measured() measuredboot.VMShape {
	return vm.Spec{MemoryMiB: s.MemoryMiB, CPUs: s.CPUs, Accel: s.Accel, NIC: &vm.NIC{}}.MeasuredShape()
}

// tcgTimeoutFactor is how much longer than on a sandbox the commands wait for machines under
// TCG: apply of a 1+1 cluster took 9 minutes where a sandbox cluster takes 2
// (docs/benchmarks.md).
const tcgTimeoutFactor = 4

// TimeoutFactor implements provider.Paced: machines under TCG get tcgTimeoutFactor times the
// commands' default timeouts; under KVM, the defaults.
func (Platform) TimeoutFactor(workspace string) int {
	spec, err := cluster.ReadSpec(localplatform.Platform{}.Folder(workspace))
	if err != nil {
		return 1
	}
	if shape, err := parseShape(spec.MachineShape); err != nil || shape.Accel != vm.TCG {
		return 1
	}
	return tcgTimeoutFactor
}

// Create implements provider.Platform: the local provider's cluster, on QEMU machines, after
// checking that the host can run them.
func (Platform) Create(ctx context.Context, req provider.CreateRequest) (provider.Provider, error) {
	if req.UnexpectedWorkerBootstrapper != "" {
		return nil, errors.New("the QEMU provider boots node OS images only: a node with another bootstrapper is another image (build one with make vm-image)")
	}
	shape := DefaultShape
	shape.Accel, _ = vm.DetectAccel()
	if err := checkHost(shape, len(req.Nodes)); err != nil {
		return nil, err
	}
	return localplatform.CreateOn(ctx, req, localplatform.Machines{
		Provider: Name, Kind: Name, Shape: shape,
		Images: func(req provider.CreateRequest) (string, error) { return "", checkImages(req) },
	})
}

// Manifest is what Create reads of a node OS image's manifest.json.
type Manifest struct {
	KubernetesVersion string `json:"kubernetesVersion"`
	RootHash          string `json:"roothash"`
}

// checkImages checks every node's image folder: a disk, a UKI, and a manifest naming the
// configuration's Kubernetes version.
func checkImages(req provider.CreateRequest) error {
	for _, n := range req.Nodes {
		for _, f := range []string{DiskFile, UKIFile} {
			if _, err := os.Stat(filepath.Join(n.Image, f)); err != nil {
				return fmt.Errorf("node OS image of %s (make vm-image): %w", n.Name, err)
			}
		}
		data, err := os.ReadFile(filepath.Join(n.Image, ManifestFile))
		if err != nil {
			return fmt.Errorf("node OS image of %s: %w", n.Name, err)
		}
		// encoding/json: the manifest is the image build's own output, read for a check
		// before create; what the nodes are trusted for is their measured boot.
		var m Manifest
		if err := json.Unmarshal(data, &m); err != nil {
			return fmt.Errorf("node OS image %s: %s: %w", n.Image, ManifestFile, err)
		}
		if want := req.Config.KubernetesVersion; m.KubernetesVersion != want {
			return fmt.Errorf("node OS image %s runs Kubernetes %s, but %s says kubernetesVersion %s", n.Image, m.KubernetesVersion, config.FileName, want)
		}
	}
	return nil
}

// checkHost checks, before anything is created, that the host has what nodes machines of
// shape need: QEMU, the firmware, and the memory.
func checkHost(shape Shape, nodes int) error {
	var problems []error
	for _, f := range []string{shape.Firmware.Code, shape.Firmware.VarsTemplate} {
		if _, err := os.Stat(f); err != nil {
			problems = append(problems, fmt.Errorf("firmware: %w (install Debian's ovmf)", err))
		}
	}
	for _, bin := range []string{"qemu-system-x86_64", "swtpm", "dnsmasq"} {
		if _, err := exec.LookPath(bin); err != nil {
			problems = append(problems, fmt.Errorf("%s is not installed (make deps installs qemu-system-x86, swtpm and dnsmasq-base)", bin))
		}
	}
	if avail, err := memAvailableMiB(); err == nil {
		if need := nodes * shape.MemoryMiB; need > avail {
			problems = append(problems, fmt.Errorf("%d machines of %d MiB need %d MiB of memory; the host has %d MiB available", nodes, shape.MemoryMiB, need, avail))
		}
	}
	return errors.Join(problems...)
}

func memAvailableMiB() (int, error) {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "MemAvailable:" {
			kib, err := strconv.Atoi(fields[1])
			if err != nil {
				return 0, err
			}
			return kib / 1024, nil
		}
	}
	return 0, errors.New("no MemAvailable in /proc/meminfo")
}
