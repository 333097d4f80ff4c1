// Package attestation defines how evidence is issued and validated: the Issuer and Validator
// interfaces every attestation variant implements, the verified result a validator returns,
// and the failure reasons callers can branch on (and count in metrics).
//
// Every Validator works in three visibly separate steps, as go-sev-guest does:
//  1. parse: decode the evidence, with size limits, rejecting malformed input;
//  2. verify: check signatures, key trust and the binding to the caller's nonce;
//  3. validate policy: compare the now-authentic measurements with the reference sets.
//
// It returns a Verified only after all three passed.
package attestation

import (
	"context"
	"errors"

	"github.com/openconstellation/constellation/internal/attestation/variant"
)

// DefaultMaxEvidenceSize caps evidence a validator accepts unless configured otherwise. A TPM
// quote document without event log is about 1.5 KiB; 256 KiB leaves room for event logs and
// certificate chains while bounding what an unauthenticated peer can make us parse.
const DefaultMaxEvidenceSize = 256 << 10

// Nonce sizes a caller may bind evidence to.
const (
	MinNonceSize = 16
	MaxNonceSize = 64
)

// Issuer produces evidence of the platform it runs on, bound to a caller-provided nonce.
type Issuer interface {
	Variant() variant.Variant
	// Issue returns evidence that binds nonce (MinNonceSize..MaxNonceSize bytes).
	Issue(ctx context.Context, nonce []byte) ([]byte, error)
}

// Validator checks evidence of one variant.
type Validator interface {
	Variant() variant.Variant
	// Validate returns the verified claims of evidence that binds nonce, or an error wrapping
	// one of the Err* reasons of this package.
	Validate(ctx context.Context, evidence, nonce []byte) (*Verified, error)
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
	// public area, hex), so logs can tell nodes apart.
	SignerID string
	// SignerCertified reports whether the signing key was checked against a configured root.
	SignerCertified bool
	// SignerName is the subject common name of the signer's certificate when SignerCertified:
	// the platform's name for the node (the local provider certifies each AK for its node
	// name), so services can bind what a node asks for to who the platform says it is.
	SignerName string
}

// Failure reasons. Validators wrap exactly one of them, so callers can tell what went wrong
// (errors.Is) without parsing messages, and metrics can count rejections by reason.
var (
	ErrMalformed         = errors.New("malformed evidence")
	ErrTooLarge          = errors.New("evidence too large")
	ErrWrongVariant      = errors.New("evidence of another variant")
	ErrBadSignature      = errors.New("evidence signature invalid")
	ErrNonceMismatch     = errors.New("evidence not bound to this nonce")
	ErrUntrustedSigner   = errors.New("evidence signer not trusted")
	ErrMeasurementPolicy = errors.New("measurements do not match any reference set")
)

// Reason returns a short stable label for the failure reason of err ("malformed",
// "measurement-mismatch", ...), or "other". Used as a metrics label.
func Reason(err error) string {
	for _, r := range []struct {
		err   error
		label string
	}{
		{ErrMalformed, "malformed"},
		{ErrTooLarge, "too-large"},
		{ErrWrongVariant, "wrong-variant"},
		{ErrBadSignature, "bad-signature"},
		{ErrNonceMismatch, "nonce-mismatch"},
		{ErrUntrustedSigner, "untrusted-signer"},
		{ErrMeasurementPolicy, "measurement-mismatch"},
	} {
		if errors.Is(err, r.err) {
			return r.label
		}
	}
	return "other"
}
