package azuretdx

import (
	"context"
	"crypto"
	"crypto/x509"
	"fmt"

	tdxpb "github.com/google/go-tdx-guest/proto/tdx"

	"github.com/openconstellation/constellation/pkg/api/attestation/hardwarepb"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/azure"
	"github.com/openconstellation/constellation/pkg/attestation/collateral"
	"github.com/openconstellation/constellation/pkg/attestation/tdx"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
)

// Variant is the variant this package implements.
var Variant = variant.AzureTDX

// ValidatorConfig configures an azure-tdx validator.
type ValidatorConfig struct {
	// The reference sets (or Active), MaxEvidenceSize, Now and Log.
	attestation.ValidatorCommon
	// AKRoots: see vtpm.ValidatorConfig.
	AKRoots *x509.CertPool
	// Hardware is what the TD quote must show (tdx.Reference.Validate must accept it).
	Hardware tdx.Reference
	// Collateral is the cache Intel's TCB info, QE identity and CRLs come from. Required.
	Collateral *collateral.Cache
}

// NewValidator returns a validator for azure-tdx evidence.
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

// HardwareCheck checks the hardware part of azure-tdx evidence (a vtpm.HardwareCheck).
type HardwareCheck struct {
	ref tdx.Reference
	// verifyQuote, validateQuote and claims are tdx.VerifyQuoteHoldingCollateral,
	// (*tdx.Quote).Validate and (*tdx.Quote).Claims. Only this package's tests replace them: a
	// TD quote that verifies must be signed by Intel's hardware, which no test can make, and
	// only tdx gives a quote the verdict of Intel's collateral.
	verifyQuote   func(ctx context.Context, raw []byte, carried []*hardwarepb.Collateral) (*tdx.Quote, error)
	validateQuote func(q *tdx.Quote) error
	claims        func(q *tdx.Quote) (*attestation.Hardware, error)
}

// NewHardwareCheck returns the check NewValidator installs (from cfg's Hardware, Collateral,
// Now and Revocation).
func NewHardwareCheck(cfg ValidatorConfig) (*HardwareCheck, error) {
	ref, cache := cfg.Hardware, cfg.Collateral
	if cache == nil {
		return nil, fmt.Errorf("%s validator: no collateral cache", Variant)
	}
	if err := ref.Validate(); err != nil {
		return nil, fmt.Errorf("%s validator: %w", Variant, err)
	}
	opts := tdx.VerifyOptions{Collateral: cache, Now: cfg.Now, Revocation: cfg.Revocation}
	return &HardwareCheck{
		ref: ref,
		verifyQuote: func(ctx context.Context, raw []byte, carried []*hardwarepb.Collateral) (*tdx.Quote, error) {
			return tdx.VerifyQuoteHoldingCollateral(ctx, raw, carried, opts)
		},
		validateQuote: func(q *tdx.Quote) error { return q.Validate(ref) },
		claims:        func(q *tdx.Quote) (*attestation.Hardware, error) { return q.Claims(ref.Name) },
	}, nil
}

// CollateralURLs implements vtpm.CollateralLister: what verifying hw's TD quote reads.
func (c *HardwareCheck) CollateralURLs(hw *hardwarepb.Hardware) ([]string, error) {
	return tdx.CollateralURLs(hw.GetTdQuote())
}

// Check parses the HCL report and its TDREPORT, verifies the TD quote, requires the quote's
// body to repeat the TDREPORT, the quote's REPORTDATA to bind the runtime data and the
// runtime data's AK to be ak, validates the quote against the reference, and then gives the
// verdict of Intel's collateral. nonce is not used: the TDREPORT is made at boot and binds
// the AK, and the TPM quote binds the nonce.
func (c *HardwareCheck) Check(ctx context.Context, hw *hardwarepb.Hardware, ak crypto.PublicKey, _ []byte, _ []byte) (*attestation.Hardware, error) {
	// 1. Parse.
	if len(hw.GetSnpReport()) != 0 || len(hw.GetSnpCertificates()) != 0 {
		return nil, fmt.Errorf("%w: %s evidence carries SEV-SNP evidence", attestation.ErrMalformed, Variant)
	}
	if len(hw.GetTdQuote()) == 0 {
		return nil, fmt.Errorf("%w: %s evidence without a TD quote: a TDREPORT alone cannot be verified", attestation.ErrMalformed, Variant)
	}
	hcl, err := azure.ParseHCLReport(hw.GetHclReport())
	if err != nil {
		return nil, err
	}
	if hcl.Type != azure.ReportTypeTDX {
		return nil, fmt.Errorf("%w: the HCL report holds a %s report, %s needs TDX", attestation.ErrMalformed, hcl.Type, Variant)
	}
	report, err := ParseTDReport(hcl.HardwareReport)
	if err != nil {
		return nil, err
	}
	runtime, err := azure.ParseRuntimeData(hcl.RuntimeData)
	if err != nil {
		return nil, err
	}

	// 2. Verify: the quote is Intel-signed (the verdict of Intel's collateral is kept for
	// step 4), it is of this TDREPORT, and the TDREPORT (its REPORTDATA now authentic) binds
	// the runtime data, whose AK signed the TPM quote.
	quote, err := c.verifyQuote(ctx, hw.GetTdQuote(), hw.GetCollateral())
	if err != nil {
		return nil, err
	}
	if err := checkQuote(report, quote); err != nil {
		return nil, err
	}
	if err := azure.CheckBinding(quote.ReportData, hcl.RuntimeData); err != nil {
		return nil, err
	}
	if err := runtime.CheckAK(ak); err != nil {
		return nil, err
	}

	// 3. Validate against the reference.
	if err := c.validateQuote(quote); err != nil {
		return nil, err
	}
	// 4. The verdict of Intel's collateral, last (an attestation.CollateralError, which the
	// vTPM validator holds until its own checks passed).
	return c.claims(quote)
}

// checkQuote compares the TDREPORT with the fields of the verified quote that tdx.Quote
// exposes.
func checkQuote(report *tdxpb.TDQuoteBody, q *tdx.Quote) error {
	quoted := &tdxpb.TDQuoteBody{
		TeeTcbSvn:    q.TeeTcbSvn,
		MrSeam:       q.MrSeam,
		TdAttributes: q.TdAttributes,
		Xfam:         q.Xfam,
		MrTd:         q.MrTd,
		Rtmrs:        q.Rtmrs[:],
		ReportData:   q.ReportData,
	}
	return compareFields(report, quoted, exposedFields)
}
