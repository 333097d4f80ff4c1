package tdx

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"

	"google.golang.org/protobuf/proto"

	"github.com/openconstellation/constellation/pkg/api/attestation/hardwarepb"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/collateral"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/untrusted"
)

// Variant is the variant the Validator and Issuer implement.
var Variant = variant.QEMUTDX

// Registers of qemu-tdx (variant.QEMUTDX's register map): the quote's MRTD and RTMRs as
// measurement registers, so reference sets (pkg/attestation/measurements) check them.
const (
	// RegisterMRTD measures the TD's initial memory: the virtual firmware (TDVF).
	RegisterMRTD uint32 = 0
	// RegisterRTMR0 is the first run-time register: RTMR n is register RegisterRTMR0+n.
	// TDVF extends the firmware configuration into RTMR0, the boot loader and kernel into
	// RTMR1, the kernel command line and initrd into RTMR2.
	RegisterRTMR0 uint32 = 1
	// RegisterClusterID is RTMR3, which neither firmware nor kernel extends: the node
	// extends the cluster ID into it at init/join (ClusterIDMarker).
	RegisterClusterID uint32 = RegisterRTMR0 + 3
)

// ClusterIDMarker is the value of RTMR3 (RegisterClusterID) of a TD that extended the
// cluster ID once into it: an RTMR extend is SHA-384(old || 48-byte digest), and RTMR3
// starts at zero, so the marker is SHA-384(0^48 || SHA-384(clusterID)). It is the TDX
// counterpart of attestation.ClusterIDMarker (SHA-256, for PCR 15).
func ClusterIDMarker(clusterID []byte) []byte {
	return variant.QEMUTDX.ClusterIDMarker(clusterID)
}

// ReportDataFor returns the REPORTDATA a TD quote for purpose over data must carry:
// attestation.ReportData(purpose, data) followed by 32 zero bytes. The zero half is checked
// too, so no second value can ride along in the quote.
func ReportDataFor(purpose attestation.Purpose, data []byte) ([64]byte, error) {
	var out [64]byte
	rd, err := attestation.ReportData(purpose, data)
	if err != nil {
		return out, err
	}
	copy(out[:], rd)
	return out, nil
}

// ValidatorConfig configures a qemu-tdx validator.
type ValidatorConfig struct {
	// The reference sets (or Active), MaxEvidenceSize, Now and Log.
	attestation.ValidatorCommon
	// Reference is the hardware reference the quote's TDX module, attributes, XFAM and TCB
	// must match.
	Reference Reference
	// Collateral is the shared collateral cache (required).
	Collateral *collateral.Cache
}

// Validator checks qemu-tdx evidence: a hardwarepb.TDX message holding a TD quote.
type Validator struct {
	cfg ValidatorConfig
	// root is nil in production (the pinned Intel root); see VerifyOptions.root.
	root *x509.Certificate
}

var _ attestation.Validator = (*Validator)(nil)

// NewValidator checks cfg and returns a validator.
func NewValidator(cfg ValidatorConfig) (*Validator, error) {
	if cfg.Collateral == nil {
		return nil, fmt.Errorf("validator %s: no collateral cache", Variant)
	}
	if err := cfg.Reference.Validate(); err != nil {
		return nil, fmt.Errorf("validator %s: %w", Variant, err)
	}
	if cfg.Active == nil {
		active, err := measurements.NewActive(Variant, cfg.ReferenceSets)
		if err != nil {
			return nil, fmt.Errorf("validator %s: %w", Variant, err)
		}
		cfg.Active = active
	} else if len(cfg.ReferenceSets) > 0 {
		return nil, fmt.Errorf("validator %s: both static and active reference sets configured", Variant)
	}
	if cfg.Active.Variant().String() != Variant.String() {
		return nil, fmt.Errorf("validator %s: reference sets are for %s", Variant, cfg.Active.Variant())
	}
	if cfg.MaxEvidenceSize <= 0 {
		cfg.MaxEvidenceSize = attestation.DefaultMaxEvidenceSize
	}
	if cfg.Now == nil {
		cfg.Now = cfg.Collateral.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Validator{cfg: cfg}, nil
}

// Variant implements attestation.Validator.
func (v *Validator) Variant() variant.Variant { return Variant }

// Validate implements attestation.Validator.
func (v *Validator) Validate(ctx context.Context, evidence []byte, purpose attestation.Purpose, data []byte) (*attestation.Verified, error) {
	// The expected binding first: a caller error is no fault of the evidence.
	want, err := ReportDataFor(purpose, data)
	if err != nil {
		return nil, fmt.Errorf("report data: %w", err)
	}
	return v.validateLogged(ctx, evidence, want)
}

// ValidateReportData implements attestation.ReportDataValidator: the quote's REPORTDATA must
// be reportData (1..64 bytes) zero-padded to 64 bytes.
func (v *Validator) ValidateReportData(ctx context.Context, evidence, reportData []byte) (*attestation.Verified, error) {
	if err := attestation.CheckReportDataSize(reportData); err != nil {
		return nil, err
	}
	var want [64]byte
	copy(want[:], reportData)
	return v.validateLogged(ctx, evidence, want)
}

func (v *Validator) validateLogged(ctx context.Context, evidence []byte, want [64]byte) (*attestation.Verified, error) {
	verified, err := v.validate(ctx, evidence, want)
	if err != nil {
		v.cfg.Log.Debug("TDX evidence rejected", "reason", attestation.Reason(err), "error", err)
		return nil, fmt.Errorf("%s evidence: %w", Variant, err)
	}
	return verified, nil
}

// CollateralURLs implements attestation.CollateralLister: the Intel collateral verifying the
// evidence's quote reads (tdx.CollateralURLs).
func (v *Validator) CollateralURLs(evidence []byte) ([]string, error) {
	ev, err := v.parse(evidence)
	if err != nil {
		return nil, err
	}
	return rawCollateralURLs(ev.GetQuote(), v.root)
}

// parse decodes evidence (size-bounded) and checks it names this variant.
func (v *Validator) parse(evidence []byte) (*hardwarepb.TDX, error) {
	if len(evidence) > v.cfg.MaxEvidenceSize {
		return nil, fmt.Errorf("%d bytes, limit %d: %w", len(evidence), v.cfg.MaxEvidenceSize, attestation.ErrTooLarge)
	}
	// Nothing (an empty file or body) decodes as a message with every field unset: it is no
	// evidence, not evidence of another variant.
	if len(evidence) == 0 {
		return nil, fmt.Errorf("no evidence (0 bytes): %w", attestation.ErrMalformed)
	}
	var ev hardwarepb.TDX
	if err := proto.Unmarshal(evidence, &ev); err != nil {
		return nil, fmt.Errorf("decoding: %v: %w", err, attestation.ErrMalformed)
	}
	if ev.GetVariant() == "" {
		return nil, fmt.Errorf("evidence names no variant: %w", attestation.ErrMalformed)
	}
	if ev.GetVariant() != Variant.String() {
		return nil, fmt.Errorf("evidence names variant %s: %w", untrusted.Quote(ev.GetVariant()), attestation.ErrWrongVariant)
	}
	return &ev, nil
}

func (v *Validator) validate(ctx context.Context, evidence []byte, want [64]byte) (*attestation.Verified, error) {
	// 1. Parse.
	ev, err := v.parse(evidence)
	if err != nil {
		return nil, err
	}

	// 2. Verify: the quote's signatures and PCK chain (it parses the quote itself, and holds
	// the verdict of Intel's collateral for step 4), then the binding to this purpose and
	// data.
	q, err := VerifyQuoteHoldingCollateral(ctx, ev.GetQuote(), ev.GetCollateral(), VerifyOptions{Collateral: v.cfg.Collateral, Now: v.cfg.Now, Revocation: v.cfg.Revocation, root: v.root})
	if err != nil {
		return nil, err
	}
	if subtle.ConstantTimeCompare(q.ReportData, want[:]) != 1 {
		return nil, fmt.Errorf("TD quote REPORTDATA %x is not the expected %x: %w", q.ReportData, want, attestation.ErrNonceMismatch)
	}

	// 3. Validate policy: the hardware reference, then the measurement registers.
	if err := q.Validate(v.cfg.Reference); err != nil {
		return nil, err
	}
	registers := map[uint32][]byte{RegisterMRTD: q.MrTd}
	for i, r := range q.Rtmrs {
		registers[RegisterRTMR0+uint32(i)] = r
	}
	match, err := v.cfg.Active.Load().Match(Variant, registers)
	if err != nil {
		return nil, errors.Join(err, attestation.ErrMeasurementPolicy)
	}
	warnings := make([]string, 0, len(match.Warnings))
	for _, w := range match.Warnings {
		warnings = append(warnings, w.Describe(Variant))
	}

	// 4. The verdict of Intel's collateral, last: a quote refused above is refused for that,
	// whether the collateral is at hand or not.
	hw, err := q.Claims(v.cfg.Reference.Name)
	if err != nil {
		return nil, err
	}
	pck := sha256.Sum256(q.PCKCertificate.Raw)
	return &attestation.Verified{
		Variant:      Variant,
		Registers:    registers,
		ReferenceSet: match.Set,
		Warnings:     warnings,
		// The signer is the platform's PCK key: Intel certifies the CPU, not the node, so
		// there is no node name or role to report (SignerCertified stays false, and
		// services must not take a name from it).
		SignerID: hex.EncodeToString(pck[:]),
		Hardware: hw,
	}, nil
}
