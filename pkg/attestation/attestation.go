// Package attestation defines how evidence is issued and validated: the Issuer and Validator
// interfaces every attestation variant implements, the verified result a validator returns,
// and the failure reasons callers can branch on (and count in metrics).
//
// Every Validator works in three visibly separate steps, as go-sev-guest does:
//  1. parse: decode the evidence, with size limits, rejecting malformed input;
//  2. verify: check signatures, key trust and the binding to the caller's nonce;
//  3. validate policy: compare the now-authentic measurements with the reference sets.
//
// What collateral says of a hardware report (a revocation, a TCB status, or that it could
// not be learned) is read in step 2 but decided last, after step 3 (CollateralError), so the
// reason of a refusal names what is wrong with the evidence itself first. It returns a
// Verified only after all of it passed.
package attestation

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// DefaultMaxEvidenceSize caps evidence a validator accepts unless configured otherwise. A TPM
// quote document without event log is about 1.5 KiB; 256 KiB leaves room for event logs and
// certificate chains while bounding what an unauthenticated peer can make us parse.
const DefaultMaxEvidenceSize = 256 << 10

// ValidatorCommon is what every variant's validator configuration shares (each embeds it):
// the reference sets evidence is checked against, and how the validator runs.
type ValidatorCommon struct {
	// ReferenceSets are the accepted values of the variant's image registers
	// (measurements.ReferenceSets.Validate for the variant must accept them).
	ReferenceSets measurements.ReferenceSets
	// Active, when set, replaces ReferenceSets: the validator reads the sets from it on every
	// validation, so a watcher can swap them without a restart (measurements.Active).
	Active *measurements.Active
	// MaxEvidenceSize defaults to DefaultMaxEvidenceSize.
	MaxEvidenceSize int
	// Now defaults to time.Now; tests inject a fixed clock for certificate validity.
	Now func() time.Time
	// Log defaults to discarding.
	Log *slog.Logger
	// Revocation says what the hardware check of a variant that has one (SEV-SNP, TDX) does
	// when the revocation status of the evidence's signing chain cannot be learned. The zero
	// value, RevocationRequired, rejects such evidence.
	Revocation RevocationPolicy
}

// RevocationPolicy says what a hardware check does when it cannot learn whether the chain
// that signed a hardware report is revoked: the CRL (SEV-SNP: AMD's CRL of the ASK or ASVK;
// TDX: Intel's PCK and root CA CRLs, with the TCB info and QE identity the same check reads)
// is neither cached, nor carried by the evidence, nor fetchable, or only a copy past its next
// update is at hand. It is applied last (CollateralError): every check that needs no
// collateral (signatures, chains to the pinned roots, bindings, policy) comes first, so
// forged evidence is refused for what is wrong with it whatever this policy says. A CRL that
// is at hand is always used: one that lists the chain, or is not signed by the pinned root,
// rejects.
type RevocationPolicy int

const (
	// RevocationRequired (the default) rejects evidence whose revocation status is unknown,
	// with ErrRevocationUnknown: a verifier that cannot learn of a revocation must not
	// accept.
	RevocationRequired RevocationPolicy = iota
	// RevocationUnknownAccepted accepts evidence whose chain and signature verified when its
	// revocation status is unknown, and says so: Hardware.RevocationChecked is false and
	// Hardware.Warnings names what could not be checked. For an offline verifier (an
	// auditor) that cannot reach AMD or Intel and decides on the rest; never for a service
	// that hands out keys.
	RevocationUnknownAccepted
)

// String returns the policy's name.
func (p RevocationPolicy) String() string {
	switch p {
	case RevocationRequired:
		return "required"
	case RevocationUnknownAccepted:
		return "unknown-accepted"
	}
	return fmt.Sprintf("RevocationPolicy(%d)", int(p))
}

// ParseRevocationPolicy parses a policy's name (String).
func ParseRevocationPolicy(s string) (RevocationPolicy, error) {
	for _, p := range []RevocationPolicy{RevocationRequired, RevocationUnknownAccepted} {
		if s == p.String() {
			return p, nil
		}
	}
	return 0, fmt.Errorf("unknown revocation policy %q (want %q or %q)", s, RevocationRequired, RevocationUnknownAccepted)
}

// Valid reports whether p is one of the defined policies.
func (p RevocationPolicy) Valid() bool {
	return p == RevocationRequired || p == RevocationUnknownAccepted
}

// Nonce sizes a caller may bind evidence to.
const (
	MinNonceSize = 16
	MaxNonceSize = 64
)

// Purpose says what evidence is for. A node's attestation key signs evidence for several
// interfaces (the attested channel in either role, the verification service); evidence made
// for one must never be valid for another, or a caller of the interface that signs
// caller-chosen data (the verification service) could have the node sign the binding of
// the caller's own attested connection and present it as the node (a confused deputy).
//
// So issuers never sign caller data as it is: they sign ReportData(purpose, data), and
// validators recompute it for the purpose they expect. Purpose has no exported constructor:
// the values below are the only ones, so no code can issue evidence outside them, and two
// purposes never share a report data value (short of a SHA-256 collision). See
// docs/attestation.md, "One key, one meaning".
type Purpose struct{ label string }

// The purposes of evidence. A new interface that attests gets a purpose of its own.
var (
	// PurposeATLSServer: evidence of the TLS server of an attested channel; data is the
	// connection's TLS exporter value.
	PurposeATLSServer = Purpose{"atls-server"}
	// PurposeATLSClient: evidence of the TLS client of an attested channel; data is the
	// connection's TLS exporter value.
	PurposeATLSClient = Purpose{"atls-client"}
	// PurposeVerify: the verification service's answer to a caller's nonce.
	PurposeVerify = Purpose{"verify"}
	// PurposeSelfCheck: evidence a node makes for itself, to learn whether its TPM quotes
	// before it offers any interface that attests (vtpm.CheckQuote). It is discarded, and no
	// validator expects it.
	PurposeSelfCheck = Purpose{"self-check"}
)

// String returns the purpose's label.
func (p Purpose) String() string {
	if p.label == "" {
		return "no purpose"
	}
	return p.label
}

// reportDataLabel prefixes every report data value, naming this encoding's version.
const reportDataLabel = "constellation-evidence-v1"

// ReportDataSize is the size of ReportData's result: what a TPM quote carries as qualifying
// data (and what hardware reports carry in their report data field).
const ReportDataSize = sha256.Size

// ReportData returns the value evidence for purpose over data must carry in its nonce field
// (a TPM quote's qualifying data, a hardware report's report data):
//
//	SHA-256("constellation-evidence-v1" || 0x00 || purpose || 0x00 || data)
//
// Labels contain no zero byte, so the encoding is unambiguous. data must be
// MinNonceSize..MaxNonceSize bytes: enough to be unpredictable, bounded so a caller cannot make
// the issuer hash much.
func ReportData(p Purpose, data []byte) ([]byte, error) {
	if p.label == "" {
		return nil, errors.New("evidence without a purpose")
	}
	if len(data) < MinNonceSize || len(data) > MaxNonceSize {
		return nil, fmt.Errorf("%s data of %d bytes: want %d..%d", p, len(data), MinNonceSize, MaxNonceSize)
	}
	h := sha256.New()
	h.Write([]byte(reportDataLabel))
	h.Write([]byte{0})
	h.Write([]byte(p.label))
	h.Write([]byte{0})
	h.Write(data)
	return h.Sum(nil), nil
}

// Role is a node's role in the cluster, as the platform certifies it with the node's signing
// key (Verified.SignerRole).
type Role string

// Roles.
const (
	RoleControlPlane Role = "control-plane"
	RoleWorker       Role = "worker"
)

// Valid reports whether r is a known role.
func (r Role) Valid() bool { return r == RoleControlPlane || r == RoleWorker }

// ClusterIDMarker is the value of a SHA-256 cluster-ID register (PCR 15 of a TPM variant) of
// a node that extended the cluster ID once into the reset register:
// SHA256(0^32 || SHA256(clusterID)). A verifier compares it with the register to learn
// whether a node belongs to a given cluster (docs/attestation.md); the marker of any
// variant's register is variant.Variant.ClusterIDMarker.
func ClusterIDMarker(clusterID []byte) []byte {
	return variant.ClusterIDMarkerOf(sha256.Size, clusterID)
}

// Issuer produces evidence of the platform it runs on, bound to a purpose and caller data.
type Issuer interface {
	Variant() variant.Variant
	// Issue returns evidence that binds ReportData(purpose, data): an issuer never binds data
	// as it is.
	Issue(ctx context.Context, purpose Purpose, data []byte) ([]byte, error)
}

// Validator checks evidence of one variant.
type Validator interface {
	Variant() variant.Variant
	// Validate returns the verified claims of evidence that binds ReportData(purpose, data),
	// or an error wrapping one of the Err* reasons of this package. Evidence made for another
	// purpose fails with ErrNonceMismatch.
	Validate(ctx context.Context, evidence []byte, purpose Purpose, data []byte) (*Verified, error)
}

// MaxReportDataSize bounds report data a caller binds evidence to by its own scheme
// (ValidateReportData): the size of an SEV-SNP REPORT_DATA or a TDX REPORTDATA, and within
// what a TPM quote's qualifying data holds.
const MaxReportDataSize = 64

// ReportDataValidator is a Validator that also checks evidence bound to report data of the
// caller's own scheme (a key broker's nonce, a hash of its session key) rather than to
// ReportData(purpose, data): the evidence's binding field (a TPM quote's qualifying data, a
// TDX REPORTDATA zero-padded to 64 bytes) must equal reportData. Every check but the
// derivation of the binding is Validate's. Every validator of this module implements it.
//
// Evidence a Constellation node makes for one of its interfaces binds ReportData(purpose,
// data); a relying party that accepts such evidence under its own scheme must make sure its
// report data can never equal one of those (for example by hashing under a label of its own).
type ReportDataValidator interface {
	Validator
	ValidateReportData(ctx context.Context, evidence, reportData []byte) (*Verified, error)
}

// ValidateReportData checks evidence bound to reportData with v (ReportDataValidator).
func ValidateReportData(ctx context.Context, v Validator, evidence, reportData []byte) (*Verified, error) {
	rv, ok := v.(ReportDataValidator)
	if !ok {
		return nil, fmt.Errorf("validator %s does not check caller-given report data", v.Variant())
	}
	return rv.ValidateReportData(ctx, evidence, reportData)
}

// CheckReportDataSize is the rule every ValidateReportData applies first.
func CheckReportDataSize(reportData []byte) error {
	if len(reportData) == 0 || len(reportData) > MaxReportDataSize {
		return fmt.Errorf("%w: report data of %d bytes, want 1..%d", ErrNonceMismatch, len(reportData), MaxReportDataSize)
	}
	return nil
}

// CollateralLister is implemented by validators whose checks read documents that are not in
// the evidence and change over time or per machine (the SEV-SNP and TDX variants: AMD's CRLs
// and VCEKs, Intel's CRLs, TCB info and QE identity).
type CollateralLister interface {
	// CollateralURLs returns the URLs of the documents checking evidence reads, with the
	// evidence parsed but not verified. An offline verifier fetches them ahead and hands them
	// to its collateral cache (collateral.Cache.Put).
	CollateralURLs(evidence []byte) ([]string, error)
}

// CollateralURLs returns the URLs of the collateral v reads to check evidence (see
// CollateralLister); none for a variant that reads none (TPM-only variants).
func CollateralURLs(v Validator, evidence []byte) ([]string, error) {
	if l, ok := v.(CollateralLister); ok {
		return l.CollateralURLs(evidence)
	}
	return nil, nil
}

// Verified is what a validator returns after every check passed.
type Verified struct {
	Variant variant.Variant
	// Registers holds every measured register the evidence covered, by index.
	Registers map[uint32][]byte
	// ReferenceSet names the reference-value set the registers matched.
	ReferenceSet string
	// Warnings lists mismatches of warn-only registers in the matched set.
	Warnings []string
	// SignerID identifies the key that signed the evidence (for a TPM: SHA-256 of the AK's
	// PKIX public key, hex; for TDX: of the PCK certificate), so logs can tell nodes apart.
	SignerID string
	// SignerCertified reports whether the signing key was checked against a configured root.
	SignerCertified bool
	// SignerName is the subject common name of the signer's certificate when SignerCertified:
	// the platform's name for the node (the local provider certifies each AK for its node
	// name), so services can bind what a node asks for to who the platform says it is.
	SignerName string
	// SignerRole is the node's role as the signer's certificate states it when
	// SignerCertified ("" if it states none): the platform's word, bound to the signing key,
	// so a node can require that the join service it takes keys from runs on a control plane.
	SignerRole Role
	// Hardware is what the confidential-VM hardware report established, for variants that
	// carry one (SEV-SNP, TDX); nil for TPM-only variants.
	Hardware *Hardware
}

// Hardware is what a hardware report (an SEV-SNP attestation report, a TDX quote)
// established after its signature chain, collateral, binding and policy checks all passed.
type Hardware struct {
	// Technology is "SEV-SNP" or "TDX".
	Technology string
	// Product is the processor line the report was verified for ("Milan", "Genoa", "Turin"
	// for SEV-SNP; "TDX" platforms name their PCK's FMSPC, "fmspc 00906ED50000").
	Product string
	// Signer names the key that signed the report ("VCEK", "VLEK", "PCK").
	Signer string
	// TCB describes the trusted computing base the report was checked at, for humans.
	TCB string
	// Reference names the hardware reference block the report matched.
	Reference string
	// Measurements are the report's launch measurements by name ("MEASUREMENT", "MRTD",
	// "RTMR0", ...), for output and logs.
	Measurements map[string][]byte
	// Warnings lists policy mismatches the reference made warn-only (ID-key digests, for
	// example), and what RevocationUnknownAccepted let pass unchecked.
	Warnings []string
	// RevocationChecked is true when the signing chain was found not revoked in a current
	// CRL; false only under RevocationUnknownAccepted, when no CRL was at hand.
	RevocationChecked bool
}

// Failure reasons. Validators wrap exactly one of them, so callers can tell what went wrong
// (errors.Is) without parsing messages, and metrics can count rejections by reason.
var (
	ErrMalformed       = errors.New("malformed evidence")
	ErrTooLarge        = errors.New("evidence too large")
	ErrWrongVariant    = errors.New("evidence of another variant")
	ErrBadSignature    = errors.New("evidence signature invalid")
	ErrNonceMismatch   = errors.New("evidence not bound to this nonce")
	ErrUntrustedSigner = errors.New("evidence signer not trusted")
	// ErrRevocationUnknown: the evidence passed every check that needs no collateral, but
	// whether its hardware report's chain is revoked could not be learned (no current CRL at
	// hand) and RevocationRequired applies. It is never the reason of evidence that fails
	// another check (CollateralError).
	ErrRevocationUnknown = errors.New("revocation status of the evidence signer unknown")
	ErrMeasurementPolicy = errors.New("measurements do not match any reference set")
)

// CollateralError is a refusal that rests on collateral (pkg/attestation/collateral: AMD's
// CRLs; Intel's CRLs, TCB info and QE identity) rather than on the evidence alone: the
// revocation status could not be learned and RevocationRequired applies (it wraps
// ErrRevocationUnknown), or collateral at hand refuses the signer (it wraps
// ErrUntrustedSigner: a revoked chain, a CRL not signed by the pinned root, a TCB status
// other than UpToDate).
//
// It is the last verdict of every validator (docs/attestation.md "Verdict order"): a check
// returns it only after every one of its own checks that needs no collateral passed, and a
// validator that runs more such checks after it holds it (HoldCollateral) until they passed
// too. So evidence that is forged, replayed, bound to another key or outside the reference is
// refused for that, offline as online, and ErrRevocationUnknown says of evidence that it
// passed everything that can be checked without collateral: an offline auditor and a metric
// can tell a forgery from a collateral outage.
type CollateralError struct{ Err error }

func (e *CollateralError) Error() string { return e.Err.Error() }

func (e *CollateralError) Unwrap() error { return e.Err }

// HoldCollateral splits err, what a check returned: a refusal that rests on collateral
// (a CollateralError, possibly wrapped) is returned as held, which the caller must return
// once its own remaining checks passed (they fail first); any other error is returned as
// failed, to be returned at once. Both are nil when err is.
func HoldCollateral(err error) (held, failed error) {
	if _, ok := errors.AsType[*CollateralError](err); ok {
		return err, nil
	}
	return nil, err
}

// reasons are the labels Reason returns, by the error they stand for.
var reasons = []struct {
	err   error
	label string
}{
	{ErrMalformed, "malformed"},
	{ErrTooLarge, "too-large"},
	{ErrWrongVariant, "wrong-variant"},
	{ErrBadSignature, "bad-signature"},
	{ErrNonceMismatch, "nonce-mismatch"},
	{ErrUntrustedSigner, "untrusted-signer"},
	{ErrRevocationUnknown, "revocation-unknown"},
	{ErrMeasurementPolicy, "measurement-mismatch"},
}

// reasonOther is Reason's label for every other error.
const reasonOther = "other"

// Reason returns a short stable label for the failure reason of err ("malformed",
// "measurement-mismatch", ...), or "other". Used as a metrics label.
func Reason(err error) string {
	for _, r := range reasons {
		if errors.Is(err, r.err) {
			return r.label
		}
	}
	return reasonOther
}

// IsReason reports whether label is one Reason returns ("other" included): a receiver of a
// peer's label (an aTLS Abort) keeps it only then, so what it logs and publishes is one of a
// closed set.
func IsReason(label string) bool {
	if label == reasonOther {
		return true
	}
	for _, r := range reasons {
		if r.label == label {
			return true
		}
	}
	return false
}
