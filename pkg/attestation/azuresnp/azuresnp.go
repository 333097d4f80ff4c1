// Package azuresnp implements the azure-sev-snp attestation variant: a TPM 2.0 quote of the
// vTPM that Azure's paravisor (the HCL) runs inside an SEV-SNP confidential VM, plus the HCL
// report from the vTPM's NV index 0x1400001, whose SEV-SNP report binds the vTPM's
// attestation key.
//
// What is checked: the TPM quote (signature by the AK, the nonce, the PCRs against the
// reference sets, as for every vTPM variant); the HCL report's layout (every size and
// offset); the SEV-SNP report's signature by the VCEK that comes with the evidence (Azure's
// THIM service provides it), the VCEK's chain to AMD's pinned roots of its product line and
// AMD's CRL, and the report against the SEV-SNP reference (minimum TCB, guest policy without
// debug, VMPL 0, launch measurement or Azure's ID-key digest, platform info); that the
// report's REPORT_DATA is SHA-256 of the runtime data followed by 32 zero bytes; and that the
// runtime data's AK (HCLAkPub) is the key that signed the quote. What is not checked: the
// SEV-SNP report is made when the VM boots, not per quote, so freshness comes from the TPM
// quote's nonce alone; the runtime data's vm-configuration (secure boot, console) is
// reported by the HCL but not enforced (the PCRs measure the boot chain); the EK in the
// runtime data is not used; the AK has no certificate unless AK roots are configured.
package azuresnp

import (
	"context"
	"crypto"
	"crypto/x509"
	"fmt"

	"github.com/openconstellation/constellation/pkg/api/attestation/hardwarepb"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/azure"
	"github.com/openconstellation/constellation/pkg/attestation/collateral"
	"github.com/openconstellation/constellation/pkg/attestation/snp"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
)

// Variant is the variant this package implements.
var Variant = variant.AzureSEVSNP

// ValidatorConfig configures an azure-sev-snp validator.
type ValidatorConfig struct {
	// The reference sets (or Active), MaxEvidenceSize, Now and Log.
	attestation.ValidatorCommon
	// AKRoots: see vtpm.ValidatorConfig.
	AKRoots *x509.CertPool
	// Hardware is what the SEV-SNP report must show (snp.Reference.Validate must accept it).
	Hardware snp.Reference
	// Collateral is the cache AMD's CRLs (and VCEKs the evidence lacks) come from. Required.
	Collateral *collateral.Cache
	// Roots are the trusted AMD chains; nil means snp.PinnedRoots. Only tests set it.
	Roots *snp.Roots
}

// NewValidator returns a validator for azure-sev-snp evidence.
func NewValidator(cfg ValidatorConfig) (*vtpm.Validator, error) {
	check, err := NewHardwareCheck(cfg)
	if err != nil {
		return nil, err
	}
	return vtpm.NewValidator(vtpm.ValidatorConfig{
		ValidatorCommon: cfg.ValidatorCommon,
		Variant:         Variant,
		AKRoots:         cfg.AKRoots,
		Hardware:        check,
	})
}

// HardwareCheck checks the hardware part of azure-sev-snp evidence (a vtpm.HardwareCheck).
type HardwareCheck struct {
	snp *snp.Validator
}

// NewHardwareCheck returns the check NewValidator installs (from cfg's Hardware, Collateral,
// Roots, Now, Log and Revocation).
func NewHardwareCheck(cfg ValidatorConfig) (*HardwareCheck, error) {
	v, err := snp.NewValidator(snp.Config{Reference: cfg.Hardware, Collateral: cfg.Collateral, Roots: cfg.Roots, Now: cfg.Now, Log: cfg.Log, Revocation: cfg.Revocation})
	if err != nil {
		return nil, fmt.Errorf("%s validator: %w", Variant, err)
	}
	return &HardwareCheck{snp: v}, nil
}

// CollateralURLs implements vtpm.CollateralLister: what checking the SEV-SNP report inside
// hw's HCL report reads.
func (c *HardwareCheck) CollateralURLs(hw *hardwarepb.Hardware) ([]string, error) {
	hcl, err := azure.ParseHCLReport(hw.GetHclReport())
	if err != nil {
		return nil, err
	}
	if hcl.Type != azure.ReportTypeSNP {
		return nil, fmt.Errorf("%w: the HCL report holds a %s report, %s needs SEV-SNP", attestation.ErrMalformed, hcl.Type, Variant)
	}
	return c.snp.CollateralURLs(hcl.HardwareReport, hw.GetSnpCertificates())
}

// Check parses the HCL report, verifies and validates its SEV-SNP report with the VCEK that
// came with it, checks that the report binds the runtime data and that the runtime data's
// AK is ak, the key that signed the quote, and then gives the verdict of AMD's CRL. nonce is
// not used: the HCL report is made at boot and binds the AK, and the quote binds the nonce.
func (c *HardwareCheck) Check(ctx context.Context, hw *hardwarepb.Hardware, ak crypto.PublicKey, _ []byte, _ []byte) (*attestation.Hardware, error) {
	// 1. Parse.
	if len(hw.GetSnpReport()) != 0 || len(hw.GetTdQuote()) != 0 {
		return nil, fmt.Errorf("%w: %s evidence carries a bare SNP report or a TD quote: its report is in the HCL report", attestation.ErrMalformed, Variant)
	}
	hcl, err := azure.ParseHCLReport(hw.GetHclReport())
	if err != nil {
		return nil, err
	}
	if hcl.Type != azure.ReportTypeSNP {
		return nil, fmt.Errorf("%w: the HCL report holds a %s report, %s needs SEV-SNP", attestation.ErrMalformed, hcl.Type, Variant)
	}
	runtime, err := azure.ParseRuntimeData(hcl.RuntimeData)
	if err != nil {
		return nil, err
	}
	// Runtime data that is not the one the report binds was edited: name that, rather than
	// let the SNP check report a REPORT_DATA mismatch.
	if err := hcl.CheckBinding(); err != nil {
		return nil, err
	}

	// 2 and 3. Verify the report (VCEK signature, chain to the pinned roots) and validate it
	// against the reference, its REPORT_DATA included: the binding above is then one the
	// hardware signed. The verdict of AMD's CRL is held: the AK check needs no collateral,
	// so it comes first.
	claims, err := c.snp.Check(ctx, hcl.HardwareReport, hw.GetSnpCertificates(), hw.GetCollateral(), azure.BindingReportData(hcl.RuntimeData))
	crl, err := attestation.HoldCollateral(err)
	if err != nil {
		return nil, err
	}
	// The hardware vouches for the runtime data's AK: the quote must be signed by it.
	if err := runtime.CheckAK(ak); err != nil {
		return nil, err
	}
	// 4. The verdict of AMD's CRL, last.
	if crl != nil {
		return nil, crl
	}
	return claims, nil
}
