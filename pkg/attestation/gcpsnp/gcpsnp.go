// Package gcpsnp implements the gcp-sev-snp attestation variant: a TPM 2.0 quote by the vTPM
// of a Google Compute Engine confidential VM on AMD SEV-SNP, plus an SEV-SNP report that binds
// both the quote's nonce and the quote's attestation key.
//
// # Trust
//
// The vTPM's AK must carry a certificate that chains to Google's EK/AK CA (pinned in
// pkg/attestation/gce, or configured): on GCE the vTPM is Google's software, so only Google
// can say that a key is a vTPM's AK. The SNP report, signed by the chip's VCEK (chain to the pinned AMD root),
// says which confidential VM the report comes from and what it launched.
//
// # Binding
//
// The report is fetched per evidence, and its REPORT_DATA is
//
//	SHA-512("constellation-gcp-sev-snp" || 0x00 || nonce || TPMT_PUBLIC(AK))
//
// where nonce is the quote's 32-byte qualifying data (attestation.ReportData of the purpose and
// the caller's data) and TPMT_PUBLIC the AK's public area as the evidence carries it. The nonce
// has a fixed length, so the encoding is unambiguous.
//
// The archived upstream bound only the nonce. Then an SNP report proves nothing about the TPM
// quote next to it: an attacker who controls a VM that is not confidential (or runs another
// image) asks any confidential VM that serves evidence for the caller's nonce, relays its SNP
// report, and adds a quote of its own TPM over the same nonce; the validator sees a good
// report for the nonce and a good quote for the nonce and admits PCR values that no
// confidential VM measured. Binding the AK ties the report to the one TPM key that signed
// the quote (TestRelayedReportAttack). Binding the nonce as well keeps every report fresh:
// a report from an earlier exchange never passes again.
package gcpsnp

import (
	"context"
	"crypto"
	"crypto/sha512"
	"crypto/x509"
	"errors"
	"fmt"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/client"

	"github.com/openconstellation/constellation/pkg/api/attestation/hardwarepb"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/collateral"
	"github.com/openconstellation/constellation/pkg/attestation/gce"
	"github.com/openconstellation/constellation/pkg/attestation/snp"
	"github.com/openconstellation/constellation/pkg/attestation/snpissuer"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
)

// Variant is the variant this package implements.
var Variant = variant.GCPSEVSNP

// bindingLabel separates this binding from every other use of SHA-512 over a nonce and a key.
const bindingLabel = "constellation-gcp-sev-snp"

// ReportData returns the REPORT_DATA of a gcp-sev-snp report for the quote's nonce
// (attestation.ReportDataSize bytes) and the AK's TPMT_PUBLIC.
func ReportData(nonce, akPublic []byte) ([abi.ReportDataSize]byte, error) {
	if len(nonce) != attestation.ReportDataSize {
		return [abi.ReportDataSize]byte{}, fmt.Errorf("gcp-sev-snp binding: nonce of %d bytes, want %d", len(nonce), attestation.ReportDataSize)
	}
	if len(akPublic) == 0 {
		return [abi.ReportDataSize]byte{}, errors.New("gcp-sev-snp binding: no AK")
	}
	h := sha512.New()
	h.Write([]byte(bindingLabel))
	h.Write([]byte{0})
	h.Write(nonce)
	h.Write(akPublic)
	var out [abi.ReportDataSize]byte
	copy(out[:], h.Sum(nil))
	return out, nil
}

// reportChecker is what the hardware check needs of snp.Validator.
type reportChecker interface {
	Check(ctx context.Context, report []byte, certs [][]byte, carried []*hardwarepb.Collateral, reportData []byte) (*attestation.Hardware, error)
	CollateralURLs(report []byte, certs [][]byte) ([]string, error)
}

// HardwareCheck is the vtpm.HardwareCheck of gcp-sev-snp: the SEV-SNP report must verify and
// match the hardware reference, and bind the quote's nonce and AK.
type HardwareCheck struct {
	snp reportChecker
}

// CollateralURLs implements vtpm.CollateralLister: what checking hw's SEV-SNP report reads.
func (c *HardwareCheck) CollateralURLs(hw *hardwarepb.Hardware) ([]string, error) {
	return c.snp.CollateralURLs(hw.GetSnpReport(), hw.GetSnpCertificates())
}

// Check implements vtpm.HardwareCheck. The vTPM validator calls it after the quote verified
// with ak over nonce.
func (c *HardwareCheck) Check(ctx context.Context, hw *hardwarepb.Hardware, _ crypto.PublicKey, akPublic, nonce []byte) (*attestation.Hardware, error) {
	if len(hw.GetSnpReport()) == 0 {
		return nil, fmt.Errorf("%w: gcp-sev-snp evidence without SEV-SNP report", attestation.ErrMalformed)
	}
	want, err := ReportData(nonce, akPublic)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", attestation.ErrMalformed, err)
	}
	out, err := c.snp.Check(ctx, hw.GetSnpReport(), hw.GetSnpCertificates(), hw.GetCollateral(), want[:])
	if err != nil {
		return nil, fmt.Errorf("gcp-sev-snp report (REPORT_DATA must bind this quote's nonce and AK): %w", err)
	}
	return out, nil
}

// IssuerConfig configures a gcp-sev-snp issuer.
type IssuerConfig struct {
	// AKCert is the AK's certificate; nil reads it from the vTPM's NV (Google stores it at
	// vtpm.AKCertNVIndex).
	AKCert []byte
	// EventLog, if set, returns the measurement event log.
	EventLog func() ([]byte, error)
	// QuoteProvider gets SEV-SNP reports; nil uses the guest device.
	QuoteProvider client.QuoteProvider
	// Collateral, if set, makes the evidence carry the CRL and VCEK (snpissuer.Config).
	Collateral *collateral.Cache
}

// NewIssuer returns a gcp-sev-snp issuer on tpm: each evidence gets a fresh SEV-SNP report
// bound to its nonce and the AK. It quotes with GCE's AK (the key of the template GCE stores
// at NV index 0x01c10001, whose certificate it stores at 0x01c10000), the one Google
// certifies; on a vTPM without that template it fails rather than use another key. The key
// is loaded when the issuer is built and held until Close.
func NewIssuer(tpm *vtpm.TPM, cfg IssuerConfig) (*vtpm.Issuer, error) {
	src, err := snpissuer.New(snpissuer.Config{
		QuoteProvider: cfg.QuoteProvider,
		ReportData:    func(akPublic, nonce []byte) ([abi.ReportDataSize]byte, error) { return ReportData(nonce, akPublic) },
		Collateral:    cfg.Collateral,
	})
	if err != nil {
		return nil, err
	}
	return vtpm.NewIssuer(tpm, vtpm.IssuerConfig{
		Variant: Variant, LoadAK: gce.LoadAK, AKCertNVIndex: gce.AKCertNVIndex,
		AKCert: cfg.AKCert, EventLog: cfg.EventLog, Hardware: src,
	})
}

// ValidatorConfig configures a gcp-sev-snp validator.
type ValidatorConfig struct {
	// The reference sets (or Active), MaxEvidenceSize, Now and Log.
	attestation.ValidatorCommon
	// AKRoots must have issued the AK certificate; nil means Google's pinned roots
	// (gce.RootPool). Never optional: without it the quote's key could be anyone's.
	AKRoots *x509.CertPool
	// Hardware is what the SEV-SNP report must show (launch measurement, minimum TCB,
	// policy).
	Hardware snp.Reference
	// Collateral is the cache VCEKs and AMD's CRLs come from (and are fetched through).
	// Required.
	Collateral *collateral.Cache
	// SNPRoots are the trusted AMD chains; nil means snp.PinnedRoots. Tests set fake roots.
	SNPRoots *snp.Roots
}

// NewValidator returns a validator for gcp-sev-snp evidence.
func NewValidator(cfg ValidatorConfig) (*vtpm.Validator, error) {
	check, err := NewHardwareCheck(cfg)
	if err != nil {
		return nil, err
	}
	roots := cfg.AKRoots
	if roots == nil {
		roots = gce.RootPool()
	}
	return vtpm.NewValidator(vtpm.ValidatorConfig{
		ValidatorCommon: cfg.ValidatorCommon,
		Variant:         Variant,
		AKRoots:         roots,
		AKIntermediates: gce.IntermediatePool(),
		Hardware:        check,
	})
}

// NewHardwareCheck returns the SEV-SNP part of the validator alone.
func NewHardwareCheck(cfg ValidatorConfig) (*HardwareCheck, error) {
	v, err := snp.NewValidator(snp.Config{Reference: cfg.Hardware, Collateral: cfg.Collateral, Now: cfg.Now, Log: cfg.Log, Roots: cfg.SNPRoots, Revocation: cfg.Revocation})
	if err != nil {
		return nil, fmt.Errorf("gcp-sev-snp validator: %w", err)
	}
	return &HardwareCheck{snp: v}, nil
}
