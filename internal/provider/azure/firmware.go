package azure

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/openconstellation/constellation/internal/measuredboot"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/provider/qemu"
	"github.com/openconstellation/constellation/pkg/attestation/choose"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/snp"
	"github.com/openconstellation/constellation/pkg/attestation/tdx"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/strictjson"
)

// FirmwareRecord is what a user with an Azure account observed on a node of the image:
// the registers Azure's firmware measures (PCR 0-3, 6, 7), which nobody can predict from
// the image, and the hardware reference its report met. No record ships with this project:
// it never ran a VM on Azure (docs/azure.md "Reference values"). `config generate azure
// --firmware-record FILE` takes one.
type FirmwareRecord struct {
	// Variant is the nodes' variant: azure-sev-snp or azure-tdx.
	Variant string `json:"variant"`
	// Source says where and when the values were observed (VM size, location, date, how).
	Source string `json:"source"`
	// Observed holds exactly the firmware registers, enforced.
	Observed measurements.M `json:"observed"`
	// SNP or TDX is the hardware reference of the variant (attestation.<variant>.snp/tdx).
	SNP *snp.Reference `json:"snp,omitempty"`
	TDX *tdx.Reference `json:"tdx,omitempty"`
}

// ParseFirmwareRecord decodes (strictly) and checks a record.
func ParseFirmwareRecord(raw []byte) (FirmwareRecord, error) {
	var r FirmwareRecord
	if err := strictjson.Unmarshal(raw, &r); err != nil {
		return FirmwareRecord{}, fmt.Errorf("the Azure firmware record: %w", err)
	}
	v, err := r.variant()
	var errs []error
	if err != nil {
		errs = append(errs, err)
	}
	if r.Source == "" {
		errs = append(errs, errors.New("source must say where and how the values were observed"))
	}
	if err := measuredboot.ValidateObserved(r.Observed); err != nil {
		errs = append(errs, err)
	}
	if err == nil {
		for _, fe := range choose.ValidateValues(v, choose.Values{HardwareValues: r.hardware()}) {
			errs = append(errs, fe)
		}
	}
	if len(errs) > 0 {
		return FirmwareRecord{}, fmt.Errorf("the Azure firmware record: %w", errors.Join(errs...))
	}
	return r, nil
}

func (r FirmwareRecord) variant() (variant.Variant, error) {
	v, err := variant.FromString(r.Variant)
	if err != nil || !slices.Contains(ConfigRules{}.Variants(), v) {
		return variant.Variant{}, fmt.Errorf("variant %q: want %s or %s", r.Variant, variant.AzureSEVSNP, variant.AzureTDX)
	}
	return v, nil
}

func (r FirmwareRecord) hardware() choose.HardwareValues {
	return choose.HardwareValues{SNP: r.SNP, TDX: r.TDX}
}

// WithFirmwareRecord implements provider.FirmwareRecorded: the platform that predicts
// reference values with the record's observed firmware registers.
func (p Platform) WithFirmwareRecord(raw []byte) (provider.Platform, error) {
	r, err := ParseFirmwareRecord(raw)
	if err != nil {
		return nil, err
	}
	p.firmware = &r
	return p, nil
}

// ReferenceValues implements provider.Platform: image is a node OS image folder (make
// vm-image); the registers its UKI and disk determine are predicted from their bytes, the
// firmware's come from the firmware record (WithFirmwareRecord), without which there are
// none. The record's variant and hardware reference come with them.
func (p Platform) ReferenceValues(image string) (provider.ReferenceValues, error) {
	if p.firmware == nil {
		return provider.ReferenceValues{}, errors.New("the registers Azure's firmware measures (PCR 0-3, 6, 7) cannot be predicted: " +
			"pass the values observed on a node with --firmware-record (docs/azure.md \"Reference values\")")
	}
	v, _ := p.firmware.variant() // checked by ParseFirmwareRecord
	uki, err := os.ReadFile(filepath.Join(image, qemu.UKIFile))
	if err != nil {
		return provider.ReferenceValues{}, fmt.Errorf("node OS image: %w", err)
	}
	disk, err := os.Open(filepath.Join(image, qemu.DiskFile))
	if err != nil {
		return provider.ReferenceValues{}, fmt.Errorf("node OS image: %w", err)
	}
	defer disk.Close()
	m, prediction, err := measuredboot.ReferenceFromObserved(v, uki, disk, p.firmware.Observed)
	if err != nil {
		return provider.ReferenceValues{}, fmt.Errorf("predicting the measurements of %s: %w", image, err)
	}
	rv := provider.ReferenceValues{Measurements: m, Components: map[uint32][]string{}, Variant: v, Hardware: p.firmware.hardware()}
	for _, r := range measuredboot.FirmwareRegisters {
		rv.Components[r] = []string{"Azure's firmware (observed: " + p.firmware.Source + ")"}
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
