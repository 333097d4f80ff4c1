// Package qemu implements the qemu-vtpm attestation variant: a TPM 2.0 quote over the
// SHA-256 PCR bank of a QEMU (or local sandbox) node's vTPM. The trust anchor is the node's
// attestation key, optionally certified by the platform's AK CA (the local provider certifies
// every node's AK when it creates the node).
package qemu

import (
	"crypto/x509"
	"log/slog"
	"time"

	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
)

// Variant is the variant this package implements.
var Variant = variant.QEMUVTPM

// NewIssuer returns an issuer on tpm. akCert may be nil: the issuer then uses the certificate
// the platform stored in the TPM's NV (vtpm.AKCertNVIndex), if any.
func NewIssuer(tpm *vtpm.TPM, akCert []byte, eventLog func() ([]byte, error)) (*vtpm.Issuer, error) {
	return vtpm.NewIssuer(tpm, vtpm.IssuerConfig{Variant: Variant, AKCert: akCert, EventLog: eventLog})
}

// ValidatorConfig configures a qemu-vtpm validator.
type ValidatorConfig struct {
	ReferenceSets measurements.ReferenceSets
	// Active: see vtpm.ValidatorConfig (hot-reloaded reference sets).
	Active *measurements.Active
	// AKRoots: see vtpm.ValidatorConfig. The local provider's AK CA.
	AKRoots         *x509.CertPool
	MaxEvidenceSize int
	Now             func() time.Time
	Log             *slog.Logger
}

// NewValidator returns a validator for qemu-vtpm evidence.
func NewValidator(cfg ValidatorConfig) (*vtpm.Validator, error) {
	return vtpm.NewValidator(vtpm.ValidatorConfig{
		Variant:         Variant,
		ReferenceSets:   cfg.ReferenceSets,
		Active:          cfg.Active,
		AKRoots:         cfg.AKRoots,
		MaxEvidenceSize: cfg.MaxEvidenceSize,
		Now:             cfg.Now,
		Log:             cfg.Log,
	})
}
