package measuredboot

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"

	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/strictjson"
)

// FirmwareBuild identifies a firmware by its bytes: the code and the pristine variable
// store a VM starts from, and the Debian package that shipped them (for people; the hashes
// decide).
type FirmwareBuild struct {
	// Package and Version name the Debian package, e.g. "ovmf", "2022.11-6+deb12u2".
	Package string `json:"package"`
	Version string `json:"version"`
	// CodeSHA256 and VarsSHA256 are the SHA-256 of OVMF_CODE_4M.fd and of the
	// OVMF_VARS_4M.fd template each VM's variable store is copied from, in hex.
	CodeSHA256 string `json:"codeSHA256"`
	VarsSHA256 string `json:"varsSHA256"`
}

// HashFirmware identifies the firmware files a VM boots with.
func HashFirmware(pkg, version, codePath, varsPath string) (FirmwareBuild, error) {
	b := FirmwareBuild{Package: pkg, Version: version}
	for _, f := range []struct {
		path string
		out  *string
	}{{codePath, &b.CodeSHA256}, {varsPath, &b.VarsSHA256}} {
		data, err := os.ReadFile(f.path)
		if err != nil {
			return FirmwareBuild{}, fmt.Errorf("hashing the firmware: %w", err)
		}
		sum := sha256.Sum256(data)
		*f.out = hex.EncodeToString(sum[:])
	}
	return b, nil
}

// VMShape is what of a VM the firmware measures besides itself: the machine type and its
// devices (PCR 0..3: ACPI tables, SMBIOS with CPU count and memory size, option ROMs),
// and the boot devices (PCR 1: boot variables). Two VMs of one shape and one firmware
// build show the same firmware registers.
type VMShape struct {
	// Machine is QEMU's -machine value, e.g. "q35,smm=on".
	Machine string `json:"machine"`
	// CPU is QEMU's -cpu model, e.g. "max".
	CPU       string `json:"cpu"`
	CPUs      int    `json:"cpus"`
	MemoryMiB int    `json:"memoryMiB"`
	// Devices lists the devices in command-line order, as the launcher writes them, e.g.
	// "tpm-crb", "virtio-blk bootindex=1", "virtio-blk", "virtio-net romfile=".
	Devices []string `json:"devices"`
}

// Equal reports whether s and o are the same shape.
func (s VMShape) Equal(o VMShape) bool {
	return s.Machine == o.Machine && s.CPU == o.CPU && s.CPUs == o.CPUs && s.MemoryMiB == o.MemoryMiB && slices.Equal(s.Devices, o.Devices)
}

// FirmwareRecord is the firmware registers observed in one boot of a VM of one shape with
// one firmware build. A record is written once per firmware build (and shape), from a
// boot's verified quote, and kept in the repository (firmware/*.json next to this file).
type FirmwareRecord struct {
	Firmware FirmwareBuild `json:"firmware"`
	Shape    VMShape       `json:"vmShape"`
	// Observed holds exactly the FirmwareRegisters, enforced.
	Observed measurements.M `json:"observed"`
	// Source says how and when the values were observed (boot, date, quote check).
	Source string `json:"source"`
}

// ParseFirmwareRecord decodes and checks a record (JSON, strict: unknown or repeated fields
// are errors).
func ParseFirmwareRecord(raw []byte) (FirmwareRecord, error) {
	var r FirmwareRecord
	if err := strictjson.Unmarshal(raw, &r); err != nil {
		return FirmwareRecord{}, fmt.Errorf("firmware record: %w", err)
	}
	if err := r.Validate(); err != nil {
		return FirmwareRecord{}, err
	}
	return r, nil
}

// Validate checks that the record names its firmware by hash and holds an enforced
// SHA-256 value for each firmware register and for no other.
func (r FirmwareRecord) Validate() error {
	var errs []error
	for name, h := range map[string]string{"codeSHA256": r.Firmware.CodeSHA256, "varsSHA256": r.Firmware.VarsSHA256} {
		if b, err := hex.DecodeString(h); err != nil || len(b) != sha256.Size {
			errs = append(errs, fmt.Errorf("firmware.%s %q is not a SHA-256 in hex", name, h))
		}
	}
	if r.Firmware.Package == "" || r.Firmware.Version == "" {
		errs = append(errs, errors.New("firmware.package and firmware.version must name the package"))
	}
	if r.Shape.Machine == "" || r.Shape.CPUs <= 0 || r.Shape.MemoryMiB <= 0 {
		errs = append(errs, errors.New("vmShape needs machine, cpus and memoryMiB"))
	}
	if r.Source == "" {
		errs = append(errs, errors.New("source must say how the values were observed"))
	}
	if err := ValidateObserved(r.Observed); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("firmware record: %w", errors.Join(errs...))
	}
	return nil
}

// ValidateObserved checks firmware registers observed on a platform: an enforced SHA-256
// value for each of FirmwareRegisters and for no other register.
func ValidateObserved(observed measurements.M) error {
	var errs []error
	for _, i := range observed.Indices() {
		if !slices.Contains(FirmwareRegisters, i) {
			errs = append(errs, fmt.Errorf("observed PCR %d is not a firmware register (%v): the image's registers are predicted, not observed", i, FirmwareRegisters))
		}
	}
	for _, i := range FirmwareRegisters {
		switch m, ok := observed[i]; {
		case !ok:
			errs = append(errs, fmt.Errorf("observed PCR %d is missing", i))
		case len(m.Expected) != sha256.Size:
			errs = append(errs, fmt.Errorf("observed PCR %d has %d bytes, want %d", i, len(m.Expected), sha256.Size))
		case m.WarnOnly:
			errs = append(errs, fmt.Errorf("observed PCR %d is warn-only: firmware registers are enforced", i))
		}
	}
	return errors.Join(errs...)
}

// recordsFS holds the recorded firmware observations: firmware/*.json.
//
//go:embed firmware
var recordsFS embed.FS

// FirmwareRecords returns every recorded firmware observation, each validated.
func FirmwareRecords() ([]FirmwareRecord, error) {
	return loadRecords(recordsFS, "firmware")
}

func loadRecords(fsys fs.FS, dir string) ([]FirmwareRecord, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("firmware records: %w", err)
	}
	var out []FirmwareRecord
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		raw, err := fs.ReadFile(fsys, path.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("firmware records: %w", err)
		}
		r, err := ParseFirmwareRecord(raw)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", e.Name(), err)
		}
		out = append(out, r)
	}
	return out, nil
}

// ErrNoFirmwareRecord is wrapped when no record matches a firmware build and VM shape.
var ErrNoFirmwareRecord = errors.New("no firmware record")

// FindFirmware returns the record of build and shape: the firmware hashes and the shape
// must match exactly (the package name and version are for people).
func FindFirmware(records []FirmwareRecord, build FirmwareBuild, shape VMShape) (FirmwareRecord, error) {
	for _, r := range records {
		if strings.EqualFold(r.Firmware.CodeSHA256, build.CodeSHA256) && strings.EqualFold(r.Firmware.VarsSHA256, build.VarsSHA256) && r.Shape.Equal(shape) {
			return r, nil
		}
	}
	return FirmwareRecord{}, fmt.Errorf("%w for firmware %s %s (code %s, vars %s) and VM shape %+v: boot a VM of this shape once and record its firmware registers (docs/measured-boot.md \"Recording the firmware registers\"; config generate qemu --firmware-record takes the record)",
		ErrNoFirmwareRecord, build.Package, build.Version, build.CodeSHA256, build.VarsSHA256, shape)
}

// ReferenceMeasurements builds the reference values of a node image booted as the QEMU
// provider boots it: the registers of v's images (variant.ImageRegisters), all enforced,
// as measurements.M.Validate requires:
//   - 4, 9, 11 predicted from the UKI, 8, 12, 13, 14 zero, and 5 predicted from the boot
//     disk's partition table (PredictImage);
//   - 0..3, 6, 7 from the firmware record;
//   - 10 derived from 0..9 (PredictIMA).
//
// The cluster-ID register is left out: it is zero at boot and set at init/join, checked
// against the cluster ID, never part of a reference set.
func ReferenceMeasurements(v variant.Variant, rawUKI []byte, disk io.ReaderAt, fw FirmwareRecord) (measurements.M, *Prediction, error) {
	if err := fw.Validate(); err != nil {
		return nil, nil, err
	}
	return ReferenceFromObserved(v, rawUKI, disk, fw.Observed)
}

// ReferenceFromObserved is ReferenceMeasurements with the firmware registers observed on a
// platform that has no firmware record of this package's kind (a cloud's firmware, named by
// the platform's own record): observed must pass ValidateObserved.
func ReferenceFromObserved(v variant.Variant, rawUKI []byte, disk io.ReaderAt, observed measurements.M) (measurements.M, *Prediction, error) {
	if err := ValidateObserved(observed); err != nil {
		return nil, nil, err
	}
	p, err := PredictImage(rawUKI, disk)
	if err != nil {
		return nil, nil, err
	}
	values := map[uint32][sha256.Size]byte{}
	for _, r := range p.Registers() {
		values[r] = p.Value(r)
	}
	for _, r := range FirmwareRegisters {
		values[r] = [sha256.Size]byte(observed[r].Expected)
	}
	var first10 [10][sha256.Size]byte
	for i := range first10 {
		val, ok := values[uint32(i)]
		if !ok {
			return nil, nil, fmt.Errorf("PCR %d is neither predicted nor observed", i)
		}
		first10[i] = val
	}
	ima := PredictIMA(first10)
	p.Events[PCRIMA] = []Event{ima}
	values[PCRIMA] = p.Value(PCRIMA)

	clusterID, _ := v.ClusterIDRegister()
	m := measurements.M{}
	for _, r := range v.ImageRegisters() {
		if r == clusterID {
			continue
		}
		val, ok := values[r]
		if !ok {
			return nil, nil, fmt.Errorf("%s: the boot of a UKI sets no value for it", v.RegisterName(r))
		}
		m[r] = measurements.Measurement{Expected: val[:]}
	}
	if err := m.Validate(v); err != nil {
		return nil, nil, fmt.Errorf("reference values for %s: %w", v, err)
	}
	return m, p, nil
}
