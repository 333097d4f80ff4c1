// Package nitrotpm implements the aws-nitro-tpm attestation variant: a TPM 2.0 quote by an AK
// of an EC2 instance's NitroTPM, over the SHA-256 PCR bank, with the firmware's event log.
//
// What is checked: the quote's signature by the AK in the evidence and its binding to the
// caller's nonce and purpose; the event log, which is required, replays to the quoted PCRs;
// PCRs 0..14 match a reference set. What is not: the AK. AWS issues no certificate for
// NitroTPM keys, so nothing ties the AK to a NitroTPM, an EC2 instance or AWS at all: anyone
// who can run a TPM (swtpm on a laptop) and extend it with the published image measurements
// can produce evidence that passes. The validator is refused unless the caller opts in
// (ValidatorConfig.AcceptUnauthenticatedAK), and every result says so (SignerCertified false
// and UnauthenticatedAKWarning in Warnings, vtpm.ValidatorConfig.AcceptUnauthenticatedAK).
// Use aws-sev-snp where the evidence must prove anything about where the node runs.
package nitrotpm

import (
	"errors"

	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
)

// Variant is the variant this package implements.
var Variant = variant.AWSNitroTPM

// UnauthenticatedAKWarning is in the warnings of every aws-nitro-tpm result.
const UnauthenticatedAKWarning = vtpm.UnauthenticatedAKWarning

// IssuerConfig configures an aws-nitro-tpm issuer.
type IssuerConfig struct {
	// EventLog returns the firmware event log; nil reads vtpm.DefaultEventLogPath.
	EventLog func() ([]byte, error)
}

// VTPMIssuerConfig returns the vtpm issuer configuration of this variant, for vtpm.NewIssuer
// or vtpm.NewPerUseIssuer: the TPM's RSA AK (created on first use; AWS provisions none) and
// the firmware event log.
func VTPMIssuerConfig(cfg IssuerConfig) vtpm.IssuerConfig {
	if cfg.EventLog == nil {
		cfg.EventLog = vtpm.ReadEventLog(vtpm.DefaultEventLogPath)
	}
	return vtpm.IssuerConfig{Variant: Variant, EventLog: cfg.EventLog}
}

// NewIssuer returns an issuer of this variant on tpm.
func NewIssuer(tpm *vtpm.TPM, cfg IssuerConfig) (*vtpm.Issuer, error) {
	return vtpm.NewIssuer(tpm, VTPMIssuerConfig(cfg))
}

// ValidatorConfig configures an aws-nitro-tpm validator.
type ValidatorConfig struct {
	// The reference sets (or Active), MaxEvidenceSize, Now and Log.
	attestation.ValidatorCommon
	// AcceptUnauthenticatedAK must be set: the caller accepts evidence whose signing key
	// nothing vouches for (see the package documentation).
	AcceptUnauthenticatedAK bool
}

// NewValidator returns a validator for aws-nitro-tpm evidence, only if the caller accepted
// unauthenticated attestation keys.
func NewValidator(cfg ValidatorConfig) (*vtpm.Validator, error) {
	if !cfg.AcceptUnauthenticatedAK {
		return nil, errors.New("aws-nitro-tpm: AWS does not certify NitroTPM attestation keys, so this evidence proves nothing about where a node runs; set AcceptUnauthenticatedAK to use it anyway")
	}
	return vtpm.NewValidator(vtpm.ValidatorConfig{
		ValidatorCommon:         cfg.ValidatorCommon,
		Variant:                 Variant,
		EventLog:                vtpm.EventLogRequired,
		AcceptUnauthenticatedAK: true,
	})
}
