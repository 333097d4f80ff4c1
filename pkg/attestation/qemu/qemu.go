// Package qemu implements the qemu-vtpm attestation variant: a TPM 2.0 quote over the
// SHA-256 PCR bank of a QEMU (or local sandbox) node's vTPM, with the event log of the node's
// measured boot. The trust anchor is the node's attestation key, certified by the platform's
// AK CA (the local provider certifies every node's AK when it creates the node).
//
// This package is the one definition of the variant: pkg/attestation/choose builds its
// validator and issuer here. Its validator is never weaker than what a cluster uses: the event
// log is required and replayed against the quoted PCRs, and without AK roots the caller must
// accept explicitly that nothing vouches for the AK (ValidatorConfig.AcceptUnauthenticatedAK),
// which every result then says.
package qemu

import (
	"crypto/x509"

	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
)

// Variant is the variant this package implements.
var Variant = variant.QEMUVTPM

// IssuerConfig configures a qemu-vtpm issuer.
type IssuerConfig struct {
	// AK selects the TPM attestation key (vtpm.AKAlgorithm; nodes quote with RSA, the join
	// service with ECC).
	AK vtpm.AKAlgorithm
	// AKCert overrides the AK certificate the platform stored in the TPM's NV
	// (vtpm.AKCertNVIndex); nil uses that one, if any.
	AKCert []byte
	// EventLog returns the event log of the node's measured boot, which validators require.
	EventLog func() ([]byte, error)
}

// VTPMIssuerConfig returns the vtpm issuer configuration of this variant, for vtpm.NewIssuer
// or vtpm.NewPerUseIssuer.
func VTPMIssuerConfig(cfg IssuerConfig) vtpm.IssuerConfig {
	return vtpm.IssuerConfig{Variant: Variant, AK: cfg.AK, AKCert: cfg.AKCert, EventLog: cfg.EventLog}
}

// NewIssuer returns an issuer on tpm. akCert may be nil: the issuer then uses the certificate
// the platform stored in the TPM's NV (vtpm.AKCertNVIndex), if any.
func NewIssuer(tpm *vtpm.TPM, akCert []byte, eventLog func() ([]byte, error)) (*vtpm.Issuer, error) {
	return vtpm.NewIssuer(tpm, VTPMIssuerConfig(IssuerConfig{AKCert: akCert, EventLog: eventLog}))
}

// ValidatorConfig configures a qemu-vtpm validator.
type ValidatorConfig struct {
	// The reference sets (or Active), MaxEvidenceSize, Now and Log.
	attestation.ValidatorCommon
	// AKRoots: the platform's AK CA (the local provider's). Every AK must carry a certificate
	// chaining to them. Required unless AcceptUnauthenticatedAK is set.
	AKRoots *x509.CertPool
	// AcceptUnauthenticatedAK accepts evidence without AK roots: a quote signed by any key,
	// a software key without a TPM among them, passes if its PCR values match (see
	// vtpm.ValidatorConfig.AcceptUnauthenticatedAK). Every result then carries
	// vtpm.UnauthenticatedAKWarning. For tests and experiments, never for a cluster.
	AcceptUnauthenticatedAK bool
}

// NewValidator returns a validator for qemu-vtpm evidence. It fails without AK roots unless
// AcceptUnauthenticatedAK is set. Every producer of qemu-vtpm evidence (the nodes, the join
// service, the verification service) sends the event log of the node's measured boot, so the
// log is required and replayed against the quoted PCRs.
func NewValidator(cfg ValidatorConfig) (*vtpm.Validator, error) {
	return vtpm.NewValidator(vtpm.ValidatorConfig{
		ValidatorCommon:         cfg.ValidatorCommon,
		Variant:                 Variant,
		AKRoots:                 cfg.AKRoots,
		AcceptUnauthenticatedAK: cfg.AcceptUnauthenticatedAK,
		EventLog:                vtpm.EventLogRequired,
	})
}
