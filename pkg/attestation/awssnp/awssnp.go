// Package awssnp implements the aws-sev-snp attestation variant: a TPM 2.0 quote by the
// NitroTPM of an AWS EC2 instance on AMD SEV-SNP, plus an SEV-SNP report that binds the
// quote's attestation key.
//
// # Binding
//
// The report's REPORT_DATA is
//
//	SHA-512(PKIX DER of the AK's public key)
//
// which is what AWS's own samples bind (a report made inside the confidential VM at boot over
// its vTPM's AK; the real sample in testdata/ carries exactly this value for its AK). The
// report binds the key, the TPM quote binds the caller's nonce: a verifier learns that the
// key that signed this fresh quote is the one the confidential VM vouched for. Because the
// binding does not depend on the nonce, a report is as good as the AK it names; the issuer
// still fetches one per evidence, so the reported TCB is always current.
//
// # Trust
//
// AWS signs SEV-SNP reports with a VLEK (a key AMD issues to the cloud provider, chained to
// AMD's ASVK), never a VCEK, and AMD serves VLEK certificates only to AWS: the evidence must
// carry the VLEK certificate, and a report signed any other way is refused. NitroTPM AKs have
// no certificate: the AK is trusted because the hardware-signed report names it.
//
// # Limits
//
// The NitroTPM is AWS's, not part of the confidential VM: the report proves that a VM with
// the reference's launch MEASUREMENT (its firmware) asked for a report naming this AK, and
// the quote proves the AK's TPM saw these PCRs. That the TPM reports honestly rests on the
// Nitro hypervisor, as it does for every vTPM outside the guest's trust boundary; the launch
// MEASUREMENT is what the hardware itself vouches for, so a reference should pin it.
package awssnp

import (
	"context"
	"crypto"
	"crypto/sha512"
	"crypto/x509"
	"fmt"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/client"
	"github.com/google/go-tpm/legacy/tpm2"

	"github.com/openconstellation/constellation/pkg/api/attestation/hardwarepb"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/collateral"
	"github.com/openconstellation/constellation/pkg/attestation/snp"
	"github.com/openconstellation/constellation/pkg/attestation/snpissuer"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
)

// Variant is the variant this package implements.
var Variant = variant.AWSSEVSNP

// ReportData returns the REPORT_DATA of an aws-sev-snp report for the AK: SHA-512 of its PKIX
// DER encoding.
func ReportData(ak crypto.PublicKey) ([abi.ReportDataSize]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(ak)
	if err != nil {
		return [abi.ReportDataSize]byte{}, fmt.Errorf("aws-sev-snp binding: encoding AK: %w", err)
	}
	return sha512.Sum512(der), nil
}

// reportDataOfTPMT is ReportData for the AK's TPMT_PUBLIC, as the issuer has it.
func reportDataOfTPMT(akPublic, _ []byte) ([abi.ReportDataSize]byte, error) {
	pub, err := tpm2.DecodePublic(akPublic)
	if err != nil {
		return [abi.ReportDataSize]byte{}, fmt.Errorf("aws-sev-snp binding: decoding AK: %w", err)
	}
	key, err := pub.Key()
	if err != nil {
		return [abi.ReportDataSize]byte{}, fmt.Errorf("aws-sev-snp binding: AK: %w", err)
	}
	return ReportData(key)
}

// IssuerConfig configures an aws-sev-snp issuer.
type IssuerConfig struct {
	// EventLog, if set, returns the measurement event log.
	EventLog func() ([]byte, error)
	// QuoteProvider gets SEV-SNP reports; nil uses the guest device.
	QuoteProvider client.QuoteProvider
	// Collateral, if set, makes the evidence carry the VLEK CRL (snpissuer.Config).
	Collateral *collateral.Cache
}

// NewIssuer returns an aws-sev-snp issuer on tpm.
func NewIssuer(tpm *vtpm.TPM, cfg IssuerConfig) (*vtpm.Issuer, error) {
	src, err := snpissuer.New(snpissuer.Config{QuoteProvider: cfg.QuoteProvider, ReportData: reportDataOfTPMT, Collateral: cfg.Collateral})
	if err != nil {
		return nil, err
	}
	return vtpm.NewIssuer(tpm, vtpm.IssuerConfig{Variant: Variant, EventLog: cfg.EventLog, Hardware: src})
}

// reportChecker is what the hardware check needs of snp.Validator.
type reportChecker interface {
	Check(ctx context.Context, report []byte, certs [][]byte, carried []*hardwarepb.Collateral, reportData []byte) (*attestation.Hardware, error)
	CollateralURLs(report []byte, certs [][]byte) ([]string, error)
}

// HardwareCheck is the vtpm.HardwareCheck of aws-sev-snp: a VLEK-signed SEV-SNP report that
// verifies, matches the hardware reference and binds the quote's AK.
type HardwareCheck struct {
	snp reportChecker
}

// CollateralURLs implements vtpm.CollateralLister: what checking hw's SEV-SNP report reads.
func (c *HardwareCheck) CollateralURLs(hw *hardwarepb.Hardware) ([]string, error) {
	return c.snp.CollateralURLs(hw.GetSnpReport(), hw.GetSnpCertificates())
}

// Check implements vtpm.HardwareCheck. The vTPM validator calls it after the quote verified
// with ak.
func (c *HardwareCheck) Check(ctx context.Context, hw *hardwarepb.Hardware, ak crypto.PublicKey, _, _ []byte) (*attestation.Hardware, error) {
	want, err := ReportData(ak)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", attestation.ErrMalformed, err)
	}
	return c.check(ctx, hw, want[:])
}

// check checks hw against the REPORT_DATA it must carry.
func (c *HardwareCheck) check(ctx context.Context, hw *hardwarepb.Hardware, reportData []byte) (*attestation.Hardware, error) {
	report := hw.GetSnpReport()
	if len(report) == 0 {
		return nil, fmt.Errorf("%w: aws-sev-snp evidence without SEV-SNP report", attestation.ErrMalformed)
	}
	// Refuse early what can never pass here: AWS signs with a VLEK only, and only the
	// evidence can carry its certificate.
	info, err := abi.ReportSignerInfo(report)
	if err != nil {
		return nil, fmt.Errorf("%w: SEV-SNP report: %w", attestation.ErrMalformed, err)
	}
	signer, err := abi.ParseSignerInfo(info)
	if err != nil {
		return nil, fmt.Errorf("%w: SEV-SNP report signer info: %w", attestation.ErrMalformed, err)
	}
	if signer.SigningKey != abi.VlekReportSigner {
		return nil, fmt.Errorf("%w: aws-sev-snp report signed by %s, want VLEK", attestation.ErrUntrustedSigner, signer.SigningKey)
	}
	if len(hw.GetSnpCertificates()) == 0 {
		return nil, fmt.Errorf("%w: aws-sev-snp evidence without VLEK certificate", attestation.ErrUntrustedSigner)
	}
	out, err := c.snp.Check(ctx, report, hw.GetSnpCertificates(), hw.GetCollateral(), reportData)
	if err != nil {
		return nil, fmt.Errorf("aws-sev-snp report (REPORT_DATA must be SHA-512 of the quote's AK): %w", err)
	}
	if out.Signer != "VLEK" {
		return nil, fmt.Errorf("%w: aws-sev-snp report verified with %s, want VLEK", attestation.ErrUntrustedSigner, out.Signer)
	}
	return out, nil
}

// ValidatorConfig configures an aws-sev-snp validator.
type ValidatorConfig struct {
	// The reference sets (or Active), MaxEvidenceSize, Now and Log.
	attestation.ValidatorCommon
	// Hardware is what the SEV-SNP report must show (launch measurement, minimum TCB,
	// policy).
	Hardware snp.Reference
	// Collateral is the cache AMD's CRLs come from (and are fetched through). Required.
	Collateral *collateral.Cache
	// SNPRoots are the trusted AMD chains; nil means snp.PinnedRoots. Tests set fake roots.
	SNPRoots *snp.Roots
}

// NewValidator returns a validator for aws-sev-snp evidence.
func NewValidator(cfg ValidatorConfig) (*vtpm.Validator, error) {
	check, err := NewHardwareCheck(cfg)
	if err != nil {
		return nil, err
	}
	return vtpm.NewValidator(vtpm.ValidatorConfig{
		ValidatorCommon: cfg.ValidatorCommon,
		Variant:         Variant,
		Hardware:        check,
	})
}

// NewHardwareCheck returns the SEV-SNP part of the validator alone.
func NewHardwareCheck(cfg ValidatorConfig) (*HardwareCheck, error) {
	v, err := snp.NewValidator(snp.Config{Reference: cfg.Hardware, Collateral: cfg.Collateral, Now: cfg.Now, Log: cfg.Log, Roots: cfg.SNPRoots, Revocation: cfg.Revocation})
	if err != nil {
		return nil, fmt.Errorf("aws-sev-snp validator: %w", err)
	}
	return &HardwareCheck{snp: v}, nil
}
