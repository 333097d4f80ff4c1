// Package gcpes implements the gcp-sev-es attestation variant: a TPM 2.0 quote by the AK
// Google provisions in a GCE Confidential VM's vTPM, over the SHA-256 PCR bank, with the
// firmware's event log.
//
// What is checked: the AK certificate chains to Google's EK/AK roots (pinned in this package,
// with Google's intermediates: pkg/attestation/gce), is valid now and is for the quoting AK; the quote's signature
// and its binding to the caller's nonce and purpose; the event log, which is required,
// replays to the quoted PCRs, and its "GCE NonHostInfo" event (PCR 0, before the separator,
// data bound to its digest) claims AMD SEV-ES; PCRs 0..14 match a reference set. What is
// not: SEV-ES has no attestation report. The only evidence of SEV-ES is that claim, measured
// by Google's firmware into Google's vTPM, so trusting it means trusting Google's host: the
// claim is as good as Google's vTPM and firmware, not AMD-signed. Use gcp-sev-snp where
// hardware evidence matters.
package gcpes

import (
	"crypto/x509"
	"fmt"
	"strings"

	pb "github.com/google/go-eventlog/proto/state"

	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/eventlog"
	"github.com/openconstellation/constellation/pkg/attestation/gce"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
)

// Variant is the variant this package implements.
var Variant = variant.GCPSEVES

// IssuerConfig configures a gcp-sev-es issuer.
type IssuerConfig struct {
	// EventLog returns the firmware event log; nil reads vtpm.DefaultEventLogPath.
	EventLog func() ([]byte, error)
}

// VTPMIssuerConfig returns the vtpm issuer configuration of this variant, for vtpm.NewIssuer
// or vtpm.NewPerUseIssuer: GCE's AK and its certificate from the platform's NV index, and the
// firmware event log.
func VTPMIssuerConfig(cfg IssuerConfig) vtpm.IssuerConfig {
	if cfg.EventLog == nil {
		cfg.EventLog = vtpm.ReadEventLog(vtpm.DefaultEventLogPath)
	}
	return vtpm.IssuerConfig{
		Variant:       Variant,
		LoadAK:        gce.LoadAK,
		AKCertNVIndex: gce.AKCertNVIndex,
		EventLog:      cfg.EventLog,
	}
}

// NewIssuer returns an issuer of this variant on tpm. It fails when the platform stored no
// AK certificate: validators of this variant refuse evidence without one.
func NewIssuer(tpm *vtpm.TPM, cfg IssuerConfig) (*vtpm.Issuer, error) {
	iss, err := vtpm.NewIssuer(tpm, VTPMIssuerConfig(cfg))
	if err != nil {
		return nil, fmt.Errorf("%s issuer: %w", Variant, err)
	}
	if iss.AKCert() == nil {
		iss.Close()
		return nil, fmt.Errorf("%s issuer: no AK certificate at NV index %#x", Variant, gce.AKCertNVIndex)
	}
	return iss, nil
}

// ValidatorConfig configures a gcp-sev-es validator.
type ValidatorConfig struct {
	// The reference sets (or Active), MaxEvidenceSize, Now and Log.
	attestation.ValidatorCommon
	// AKRoots replaces Google's pinned roots: for tests. Nil (production) means the pinned
	// roots.
	AKRoots *x509.CertPool
	// AKIntermediates are added to Google's pinned intermediates.
	AKIntermediates []*x509.Certificate
}

// NewValidator returns a validator for gcp-sev-es evidence.
func NewValidator(cfg ValidatorConfig) (*vtpm.Validator, error) {
	roots := cfg.AKRoots
	if roots == nil {
		roots = gce.RootPool()
	}
	inter := gce.IntermediatePool(cfg.AKIntermediates...)
	return vtpm.NewValidator(vtpm.ValidatorConfig{
		ValidatorCommon: cfg.ValidatorCommon,
		Variant:         Variant,
		AKRoots:         roots,
		AKIntermediates: inter,
		EventLog:        vtpm.EventLogRequired,
		EventLogCheck:   CheckSEVES,
	})
}

// CheckSEVES requires the replayed event log's GCE NonHostInfo claim to be AMD SEV-ES.
func CheckSEVES(log *eventlog.Log) error {
	platform, err := log.Platform()
	if err != nil {
		return err
	}
	if got := platform.GetTechnology(); got != pb.GCEConfidentialTechnology_AMD_SEV_ES {
		return fmt.Errorf("%w: event log's GCE NonHostInfo event (PCR 0) claims confidential technology %s, want %s",
			attestation.ErrMeasurementPolicy, techName(got), techName(pb.GCEConfidentialTechnology_AMD_SEV_ES))
	}
	return nil
}

func techName(t pb.GCEConfidentialTechnology) string {
	if t == pb.GCEConfidentialTechnology_NONE {
		return "NONE (or no NonHostInfo event)"
	}
	return strings.ReplaceAll(t.String(), "_", "-")
}
