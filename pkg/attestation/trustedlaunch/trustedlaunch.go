// Package trustedlaunch implements the azure-trustedlaunch attestation variant: a TPM 2.0
// quote by the AK Azure provisions in a Trusted Launch VM's vTPM, over the SHA-256 PCR bank,
// with the firmware's event log.
//
// What is checked: the AK certificate chains to Microsoft's "Azure Virtual TPM Root
// Certificate Authority 2023" (pinned here, through Azure's intermediate CAs: the known ones
// pinned here plus ValidatorConfig.AKIntermediates), is valid now and is for the quoting AK;
// the quote's signature and its binding to the caller's nonce and purpose; the event log,
// which is required, replays to the quoted PCRs; PCRs 0..14 match a reference set. What is
// not: Trusted Launch is not a confidential VM. Its memory is open to Azure's hypervisor and
// host, and the vTPM is Azure's software, so the certificate proves only that Azure's vTPM
// made the quote, and the measurements are as trustworthy as Azure's host.
package trustedlaunch

import (
	"crypto/x509"
	_ "embed"
	"encoding/pem"
	"fmt"

	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/azure"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
)

// Variant is the variant this package implements.
var Variant = variant.AzureTrustedLaunch

// Where Azure provisions the AK of a Trusted Launch VM's vTPM (the same key its
// confidential VMs' HCL names: azure.AKHandle) and its certificate.
const (
	AKHandle      = azure.AKHandle
	AKCertNVIndex = 0x01C101D0
)

// rootPEM is Microsoft's "Azure Virtual TPM Root Certificate Authority 2023" (valid
// 2023-06-01 to 2048-06-01), SHA-256 fingerprint
// E6:C5:96:B1:7F:8F:FE:FB:A5:C3:00:F7:14:CF:B1:26:0C:60:28:70:4E:CF:7B:EC:C4:AB:50:18:EF:B0:0E:95,
// as Microsoft publishes it in the Trusted Launch FAQ ("certificates").
//
//go:embed azure-virtual-tpm-root-2023.pem
var rootPEM []byte

// intermediatesPEM are Azure's vTPM intermediate CAs known to issue AK certificates without
// an AIA the node could follow: "Global Virtual TPM CA - 03" (2025-04-24 to 2027-04-24),
// issued by the root above. They link certificates to the root; they are not trusted alone.
//
//go:embed global-virtual-tpm-ca-03.pem
var intermediatesPEM []byte

// Root returns the pinned Azure vTPM root.
func Root() *x509.Certificate { return mustParse(rootPEM)[0] }

// Intermediates returns the known Azure vTPM intermediate CAs.
func Intermediates() []*x509.Certificate { return mustParse(intermediatesPEM) }

func mustParse(b []byte) []*x509.Certificate {
	var out []*x509.Certificate
	for {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			return out
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			panic(fmt.Sprintf("pinned Azure certificate: %v", err))
		}
		out = append(out, cert)
	}
}

// IssuerConfig configures an azure-trustedlaunch issuer.
type IssuerConfig struct {
	// EventLog returns the firmware event log; nil reads vtpm.DefaultEventLogPath.
	EventLog func() ([]byte, error)
}

// VTPMIssuerConfig returns the vtpm issuer configuration of this variant, for vtpm.NewIssuer
// or vtpm.NewPerUseIssuer: Azure's AK and its certificate from the platform's NV index, and the
// firmware event log.
func VTPMIssuerConfig(cfg IssuerConfig) vtpm.IssuerConfig {
	if cfg.EventLog == nil {
		cfg.EventLog = vtpm.ReadEventLog(vtpm.DefaultEventLogPath)
	}
	return vtpm.IssuerConfig{
		Variant:       Variant,
		LoadAK:        azure.LoadAK,
		AKCertNVIndex: uint32(AKCertNVIndex),
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
		return nil, fmt.Errorf("%s issuer: no AK certificate at NV index %#x", Variant, AKCertNVIndex)
	}
	return iss, nil
}

// ValidatorConfig configures an azure-trustedlaunch validator.
type ValidatorConfig struct {
	// The reference sets (or Active), MaxEvidenceSize, Now and Log.
	attestation.ValidatorCommon
	// AKRoots replaces the pinned Azure root: for tests, and for a CA that replaces it
	// before this package does. Nil (production) means the pinned root.
	AKRoots *x509.CertPool
	// AKIntermediates are added to the known Azure intermediates.
	AKIntermediates []*x509.Certificate
}

// NewValidator returns a validator for azure-trustedlaunch evidence: the AK must be certified
// by Azure's vTPM root, and the event log must replay.
func NewValidator(cfg ValidatorConfig) (*vtpm.Validator, error) {
	roots := cfg.AKRoots
	if roots == nil {
		roots = x509.NewCertPool()
		roots.AddCert(Root())
	}
	inter := x509.NewCertPool()
	for _, c := range append(Intermediates(), cfg.AKIntermediates...) {
		inter.AddCert(c)
	}
	return vtpm.NewValidator(vtpm.ValidatorConfig{
		ValidatorCommon: cfg.ValidatorCommon,
		Variant:         Variant,
		AKRoots:         roots,
		AKIntermediates: inter,
		EventLog:        vtpm.EventLogRequired,
	})
}
