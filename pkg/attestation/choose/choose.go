// Package choose is the registry of attestation implementations: given a variant, it builds
// the Validator (from a Reference) or the Issuer (from a node's devices). Nothing else names a
// variant to pick code: the configuration, the init request, the join service, a node's check
// of the join service and `constellation verify` all come here with the variant they were
// given.
//
// A third party verifies a node with this package and pkg/verify:
//
//	ref := choose.Reference{Variant: variant.AzureSEVSNP, Measurements: sets, SNP: &snpRef}
//	v, err := choose.NewValidator(ref, choose.Options{})
//	res, err := verify.Verify(ctx, "node-0", "10.0.0.5:30081", v, clusterID)
//
// See the package example.
package choose

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	snpclient "github.com/google/go-sev-guest/client"

	"github.com/openconstellation/constellation/internal/pki"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/awssnp"
	"github.com/openconstellation/constellation/pkg/attestation/azuresnp"
	"github.com/openconstellation/constellation/pkg/attestation/azuretdx"
	"github.com/openconstellation/constellation/pkg/attestation/collateral"
	"github.com/openconstellation/constellation/pkg/attestation/gcpes"
	"github.com/openconstellation/constellation/pkg/attestation/gcpsnp"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/nitrotpm"
	"github.com/openconstellation/constellation/pkg/attestation/qemu"
	"github.com/openconstellation/constellation/pkg/attestation/snp"
	"github.com/openconstellation/constellation/pkg/attestation/tdx"
	"github.com/openconstellation/constellation/pkg/attestation/trustedlaunch"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
)

// Reference is everything evidence of one variant is checked against: what a cluster records
// (kube-system/constellation-attestation), what the configuration file holds, and what a
// verifier outside the cluster needs. The JSON form is the one in the cluster record.
type Reference struct {
	Variant variant.Variant `json:"variant"`
	Values
}

// Values are the reference values of one variant: the configuration file's block for the
// variant (attestation.<variant> in constellation-conf.yaml). Which fields a variant uses is
// the variant's business: Reference.Validate refuses fields it would ignore.
type Values struct {
	// Measurements are the accepted reference-value sets of the variant's registers.
	Measurements measurements.ReferenceSets `json:"measurements"`
	// AKRoots are PEM certificates of the CAs that certify nodes' attestation keys (the
	// platform's AK CA). gcp-sev-snp defaults to Google's pinned roots; qemu-vtpm's local
	// provider adds its own CA.
	AKRoots string `json:"akRoots,omitempty"`
	// HardwareValues (inline: snp, tdx, acceptUnauthenticatedAK) are the variant's hardware
	// block.
	HardwareValues
}

// HardwareValues are the part of Values that is neither measurements nor AK roots: what a
// variant requires of the hardware report beside the registers, or its explicit opt-in. The
// cluster records them as their own document (hardware.json).
type HardwareValues struct {
	// SNP is the SEV-SNP hardware reference (product lines, minimum TCB, guest policy,
	// VMPL, measurement, ID-key digests): required by azure-sev-snp, aws-sev-snp and
	// gcp-sev-snp, refused by the others.
	SNP *snp.Reference `json:"snp,omitempty"`
	// TDX is the TDX hardware reference (MRSEAM, TD attributes, XFAM, minimum TEE TCB SVN):
	// required by qemu-tdx and azure-tdx, refused by the others.
	TDX *tdx.Reference `json:"tdx,omitempty"`
	// AcceptUnauthenticatedAK accepts attestation keys nothing certifies: anyone who can run
	// a TPM, or sign with a software key, can then produce evidence that passes, and every
	// result carries a warning saying so. Required by aws-nitro-tpm (AWS certifies no
	// NitroTPM key); for qemu-vtpm the alternative to AK roots (tests, experiments: a
	// cluster's record always has roots), refused together with them; refused by the other
	// variants.
	AcceptUnauthenticatedAK bool `json:"acceptUnauthenticatedAK,omitempty"`
}

// Options are how validators run (not what they accept).
type Options struct {
	// Active, when set, replaces Reference.Measurements with hot-reloaded sets (the join
	// service's watcher).
	Active *measurements.Active
	// Collateral is the cache of hardware collateral (VCEKs, CRLs, TCB info). Nil: a cache
	// that fetches over HTTPS. Tests and offline verifiers pass one without a fetcher.
	Collateral *collateral.Cache
	// Now defaults to time.Now.
	Now func() time.Time
	Log *slog.Logger
	// MaxEvidenceSize defaults to attestation.DefaultMaxEvidenceSize.
	MaxEvidenceSize int
}

// IssuerEnv is what a node offers an issuer: its TPM and the hardware devices of its
// confidential VM.
type IssuerEnv struct {
	// TPM opens the node's TPM for each use.
	TPM vtpm.Opener
	// AK selects the TPM attestation key (vtpm.AKAlgorithm).
	AK vtpm.AKAlgorithm
	// EventLog reads the TPM's measurement event log, if the platform keeps one.
	EventLog func() ([]byte, error)
	// SNP is the SEV-SNP guest device (go-sev-guest's quote provider: configfs-tsm or
	// /dev/sev-guest), for aws-sev-snp and gcp-sev-snp.
	SNP snpclient.QuoteProvider
	// TDX is the TDX guest's quote provider, for qemu-tdx.
	TDX tdx.QuoteProvider
	// AzureCertificates fetches the VCEK of the VM's chip (Azure's THIM), for azure-sev-snp.
	AzureCertificates azuresnp.CertificateSource
	// AzureQuotes turns a TDREPORT into a TD quote (Azure's IMDS), for azure-tdx.
	AzureQuotes azuretdx.QuoteProvider
	// AKCert overrides the AK certificate read from the TPM (gcp-sev-snp: Google's).
	AKCert []byte
	// Collateral, if set, makes issuers carry the collateral their evidence is checked
	// with, so verifiers without network can check it.
	Collateral *collateral.Cache
}

// entry is one implemented variant.
type entry struct {
	// validator builds the variant's validator from a checked ref and its parsed AK roots
	// (nil if none are configured).
	validator func(ref Reference, akRoots *x509.CertPool, opts Options) (attestation.Validator, error)
	issuer    func(ctx context.Context, v variant.Variant, env IssuerEnv) (attestation.Issuer, error)
	hardware  hardwareKind
	// noAKRoots marks variants whose AK no certificate vouches for (the hardware report
	// names it, or nothing does): configured AK roots would be ignored, so they are refused.
	noAKRoots bool
	// optIn marks variants that take acceptUnauthenticatedAK: aws-nitro-tpm, which requires
	// it, and qemu-vtpm, whose validator refuses to run without AK roots unless it is set.
	optIn bool
}

// registry maps each implemented variant to its constructors.
var registry = map[variant.Variant]entry{
	variant.QEMUVTPM: {validator: newQEMUVTPMValidator, hardware: hardwareNone, optIn: true, issuer: func(ctx context.Context, v variant.Variant, env IssuerEnv) (attestation.Issuer, error) {
		return perUseIssuer(ctx, v, env, qemu.VTPMIssuerConfig(qemu.IssuerConfig{AK: env.AK, EventLog: env.EventLog}))
	}},
	variant.QEMUTDX:     {validator: newQEMUTDXValidator, issuer: newQEMUTDXIssuer, hardware: hardwareTDX, noAKRoots: true},
	variant.AWSSEVSNP:   {validator: newAWSSEVSNPValidator, issuer: newAWSSEVSNPIssuer, hardware: hardwareSNP, noAKRoots: true},
	variant.GCPSEVSNP:   {validator: newGCPSEVSNPValidator, issuer: newGCPSEVSNPIssuer, hardware: hardwareSNP},
	variant.AzureSEVSNP: {validator: newAzureSEVSNPValidator, issuer: newAzureSEVSNPIssuer, hardware: hardwareSNP},
	variant.AzureTDX:    {validator: newAzureTDXValidator, issuer: newAzureTDXIssuer, hardware: hardwareTDX},
	variant.AzureTrustedLaunch: {validator: newTrustedLaunchValidator, issuer: func(ctx context.Context, v variant.Variant, env IssuerEnv) (attestation.Issuer, error) {
		return perUseIssuer(ctx, v, env, trustedlaunch.VTPMIssuerConfig(trustedlaunch.IssuerConfig{EventLog: env.EventLog}))
	}},
	variant.GCPSEVES: {validator: newGCPSEVESValidator, issuer: func(ctx context.Context, v variant.Variant, env IssuerEnv) (attestation.Issuer, error) {
		return perUseIssuer(ctx, v, env, gcpes.VTPMIssuerConfig(gcpes.IssuerConfig{EventLog: env.EventLog}))
	}},
	variant.AWSNitroTPM: {validator: newNitroTPMValidator, noAKRoots: true, optIn: true, issuer: func(ctx context.Context, v variant.Variant, env IssuerEnv) (attestation.Issuer, error) {
		return perUseIssuer(ctx, v, env, nitrotpm.VTPMIssuerConfig(nitrotpm.IssuerConfig{EventLog: env.EventLog}))
	}},
}

// hardwareKind is which hardware block a variant requires.
type hardwareKind int

const (
	hardwareNone hardwareKind = iota
	hardwareSNP
	hardwareTDX
)

// ErrNotImplemented is wrapped when a variant is known but has no implementation.
var ErrNotImplemented = errors.New("attestation variant not implemented")

// Implemented lists the variants this build can issue and validate, sorted by name.
func Implemented() []variant.Variant {
	var out []variant.Variant
	for _, v := range variant.All() {
		if _, ok := registry[v]; ok {
			out = append(out, v)
		}
	}
	return out
}

func lookup(v variant.Variant) (entry, error) {
	if v.IsZero() {
		return entry{}, errors.New("no attestation variant")
	}
	e, ok := registry[v]
	if !ok {
		names := make([]string, 0, len(registry))
		for _, v := range Implemented() {
			names = append(names, v.String())
		}
		return entry{}, fmt.Errorf("%w: %s (implemented: %v)", ErrNotImplemented, v, names)
	}
	return e, nil
}

// NewValidator returns the validator of ref.Variant, checking evidence against ref. It fails
// if ref does not satisfy what the variant requires (Validate).
func NewValidator(ref Reference, opts Options) (attestation.Validator, error) {
	e, err := lookup(ref.Variant)
	if err != nil {
		return nil, err
	}
	if opts.Active != nil && len(ref.Measurements) > 0 {
		return nil, errors.New("both reference sets and active reference sets given")
	}
	if opts.Active == nil {
		if err := ref.Measurements.Validate(ref.Variant); err != nil {
			return nil, err
		}
	}
	for _, fe := range ValidateValues(ref.Variant, ref.Values) {
		return nil, fe
	}
	roots, err := ParseAKRoots(ref.AKRoots)
	if err != nil {
		return nil, &FieldError{"akRoots", err}
	}
	if opts.Collateral == nil {
		opts.Collateral = defaultCollateral
		if opts.Now != nil {
			// The cache must judge freshness at the validator's time.
			opts.Collateral = collateral.New(collateral.Config{Fetcher: collateral.NewHTTPFetcher(nil), Now: opts.Now})
		}
	}
	return e.validator(ref, roots, opts)
}

// defaultCollateral is shared by validators built without a cache: documents are per URL,
// so sharing them is what makes a warm cache.
var defaultCollateral = collateral.New(collateral.Config{Fetcher: collateral.NewHTTPFetcher(nil)})

// NewIssuer returns the issuer of variant v on the node's devices.
func NewIssuer(ctx context.Context, v variant.Variant, env IssuerEnv) (attestation.Issuer, error) {
	e, err := lookup(v)
	if err != nil {
		return nil, err
	}
	return e.issuer(ctx, v, env)
}

// FieldError is a problem with one field of Values, named by its JSON key path
// ("akRoots", "snp.minimumTCB.microcode").
type FieldError struct {
	Field string
	Err   error
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Err.Error() }
func (e *FieldError) Unwrap() error { return e.Err }

// Validate checks ref for its variant: the variant is implemented, the measurements are
// reference sets of its registers, and every other field is one the variant uses, well
// formed. Problems are *FieldError, joined.
func (r Reference) Validate() error {
	if _, err := lookup(r.Variant); err != nil {
		return err
	}
	var errs []error
	if len(r.Measurements) == 0 {
		errs = append(errs, &FieldError{"measurements", errors.New("at least one reference-value set is required")})
	} else if err := r.Measurements.Validate(r.Variant); err != nil {
		errs = append(errs, &FieldError{"measurements", err})
	}
	for _, fe := range ValidateValues(r.Variant, r.Values) {
		errs = append(errs, fe)
	}
	return errors.Join(errs...)
}

// ValidateValues checks the fields of vals other than measurements for variant v (the
// configuration file checks measurements itself, set by set): AK roots parse, and the
// variant's hardware block is present, valid, and the only one.
func ValidateValues(v variant.Variant, vals Values) []*FieldError {
	var errs []*FieldError
	if _, err := ParseAKRoots(vals.AKRoots); err != nil {
		errs = append(errs, &FieldError{"akRoots", err})
	} else if registry[v].noAKRoots && strings.TrimSpace(vals.AKRoots) != "" {
		errs = append(errs, &FieldError{"akRoots", fmt.Errorf("%s does not trust its attestation key through a certificate, so AK roots would be ignored", v)})
	}
	kind := registry[v].hardware
	switch {
	case kind == hardwareSNP && vals.SNP == nil:
		errs = append(errs, &FieldError{"snp", fmt.Errorf("required: %s evidence carries an SEV-SNP report", v)})
	case kind == hardwareSNP:
		if err := vals.SNP.Validate(); err != nil {
			errs = append(errs, &FieldError{"snp", err})
		}
	case vals.SNP != nil:
		errs = append(errs, &FieldError{"snp", fmt.Errorf("%s evidence has no SEV-SNP report", v)})
	}
	switch {
	case kind == hardwareTDX && vals.TDX == nil:
		errs = append(errs, &FieldError{"tdx", fmt.Errorf("required: %s evidence carries a TD quote", v)})
	case kind == hardwareTDX:
		if err := vals.TDX.Validate(); err != nil {
			errs = append(errs, &FieldError{"tdx", err})
		}
	case vals.TDX != nil:
		errs = append(errs, &FieldError{"tdx", fmt.Errorf("%s evidence has no TD quote", v)})
	}
	switch {
	case vals.AcceptUnauthenticatedAK && !registry[v].optIn:
		errs = append(errs, &FieldError{"acceptUnauthenticatedAK", fmt.Errorf("%s authenticates its attestation key; this opt-in is for aws-nitro-tpm and qemu-vtpm only", v)})
	case vals.AcceptUnauthenticatedAK && strings.TrimSpace(vals.AKRoots) != "":
		errs = append(errs, &FieldError{"acceptUnauthenticatedAK", fmt.Errorf("%s with AK roots: every AK must chain to them, so the opt-in would be ignored", v)})
	}
	if !vals.AcceptUnauthenticatedAK && v == variant.AWSNitroTPM {
		errs = append(errs, &FieldError{"acceptUnauthenticatedAK", errors.New("required: nothing authenticates an aws-nitro-tpm attestation key, so anyone who can run a TPM can produce passing evidence; set it to true to accept that")})
	}
	return errs
}

// ParseAKRoots parses PEM CA certificates into a pool: every PEM block a CA certificate,
// nothing else but whitespace. Empty input gives nil (no roots).
func ParseAKRoots(pemData string) (*x509.CertPool, error) {
	if strings.TrimSpace(pemData) == "" {
		return nil, nil
	}
	pool, _, err := pki.ParseCAPool([]byte(pemData))
	if err != nil {
		return nil, err
	}
	return pool, nil
}

// qemu-vtpm is defined by its package (the AK trusted through the platform's AK CA, the
// event log required): the registry only maps the reference onto its configuration.
func newQEMUVTPMValidator(ref Reference, roots *x509.CertPool, opts Options) (attestation.Validator, error) {
	return qemu.NewValidator(qemu.ValidatorConfig{
		ReferenceSets: ref.Measurements, Active: opts.Active, AKRoots: roots, AcceptUnauthenticatedAK: ref.AcceptUnauthenticatedAK,
		MaxEvidenceSize: opts.MaxEvidenceSize, Now: opts.Now, Log: opts.Log,
	})
}

func newQEMUTDXValidator(ref Reference, _ *x509.CertPool, opts Options) (attestation.Validator, error) {
	return tdx.NewValidator(tdx.ValidatorConfig{
		ReferenceSets: ref.Measurements, Active: opts.Active, Reference: *ref.TDX, Collateral: opts.Collateral,
		MaxEvidenceSize: opts.MaxEvidenceSize, Now: opts.Now, Log: opts.Log,
	})
}

func newQEMUTDXIssuer(_ context.Context, v variant.Variant, env IssuerEnv) (attestation.Issuer, error) {
	if env.TDX == nil {
		return nil, fmt.Errorf("issuer %s: no TDX quote provider", v)
	}
	return tdx.NewIssuer(env.TDX, env.Collateral)
}

func newAWSSEVSNPValidator(ref Reference, _ *x509.CertPool, opts Options) (attestation.Validator, error) {
	return awssnp.NewValidator(awssnp.ValidatorConfig{
		ReferenceSets: ref.Measurements, Active: opts.Active, Hardware: *ref.SNP, Collateral: opts.Collateral,
		MaxEvidenceSize: opts.MaxEvidenceSize, Now: opts.Now, Log: opts.Log,
	})
}

func newGCPSEVSNPValidator(ref Reference, roots *x509.CertPool, opts Options) (attestation.Validator, error) {
	return gcpsnp.NewValidator(gcpsnp.ValidatorConfig{
		ReferenceSets: ref.Measurements, Active: opts.Active, AKRoots: roots, Hardware: *ref.SNP, Collateral: opts.Collateral,
		MaxEvidenceSize: opts.MaxEvidenceSize, Now: opts.Now, Log: opts.Log,
	})
}

func newAzureSEVSNPValidator(ref Reference, roots *x509.CertPool, opts Options) (attestation.Validator, error) {
	return azuresnp.NewValidator(azuresnp.ValidatorConfig{
		ReferenceSets: ref.Measurements, Active: opts.Active, AKRoots: roots, Hardware: *ref.SNP, Collateral: opts.Collateral,
		MaxEvidenceSize: opts.MaxEvidenceSize, Now: opts.Now, Log: opts.Log,
	})
}

func newAzureTDXValidator(ref Reference, roots *x509.CertPool, opts Options) (attestation.Validator, error) {
	return azuretdx.NewValidator(azuretdx.ValidatorConfig{
		ReferenceSets: ref.Measurements, Active: opts.Active, AKRoots: roots, Hardware: *ref.TDX, Collateral: opts.Collateral,
		MaxEvidenceSize: opts.MaxEvidenceSize, Now: opts.Now, Log: opts.Log,
	})
}

// The hardware vTPM issuers open the TPM once and keep it: the SNP and TDX devices are the
// node's own, and these issuers run on cloud VMs whose TPM is a device, not a per-use socket.
func openTPM(ctx context.Context, v variant.Variant, env IssuerEnv) (*vtpm.TPM, error) {
	if env.TPM == nil {
		return nil, fmt.Errorf("issuer %s: no TPM", v)
	}
	tpm, err := env.TPM(ctx)
	if err != nil {
		return nil, fmt.Errorf("issuer %s: opening the TPM: %w", v, err)
	}
	return tpm, nil
}

func newAWSSEVSNPIssuer(ctx context.Context, v variant.Variant, env IssuerEnv) (attestation.Issuer, error) {
	tpm, err := openTPM(ctx, v, env)
	if err != nil {
		return nil, err
	}
	return awssnp.NewIssuer(tpm, awssnp.IssuerConfig{EventLog: env.EventLog, QuoteProvider: env.SNP, Collateral: env.Collateral})
}

func newGCPSEVSNPIssuer(ctx context.Context, v variant.Variant, env IssuerEnv) (attestation.Issuer, error) {
	tpm, err := openTPM(ctx, v, env)
	if err != nil {
		return nil, err
	}
	return gcpsnp.NewIssuer(tpm, gcpsnp.IssuerConfig{AKCert: env.AKCert, EventLog: env.EventLog, QuoteProvider: env.SNP, Collateral: env.Collateral})
}

func newAzureSEVSNPIssuer(ctx context.Context, v variant.Variant, env IssuerEnv) (attestation.Issuer, error) {
	tpm, err := openTPM(ctx, v, env)
	if err != nil {
		return nil, err
	}
	return azuresnp.NewIssuer(tpm, env.AzureCertificates)
}

func newAzureTDXIssuer(ctx context.Context, v variant.Variant, env IssuerEnv) (attestation.Issuer, error) {
	tpm, err := openTPM(ctx, v, env)
	if err != nil {
		return nil, err
	}
	return azuretdx.NewIssuer(tpm, env.AzureQuotes)
}

func perUseIssuer(ctx context.Context, v variant.Variant, env IssuerEnv, cfg vtpm.IssuerConfig) (attestation.Issuer, error) {
	if env.TPM == nil {
		return nil, fmt.Errorf("issuer %s: no TPM", v)
	}
	return vtpm.NewPerUseIssuer(ctx, env.TPM, cfg)
}

func newTrustedLaunchValidator(ref Reference, roots *x509.CertPool, opts Options) (attestation.Validator, error) {
	return trustedlaunch.NewValidator(trustedlaunch.ValidatorConfig{
		ReferenceSets: ref.Measurements, Active: opts.Active, AKRoots: roots,
		MaxEvidenceSize: opts.MaxEvidenceSize, Now: opts.Now, Log: opts.Log,
	})
}

func newGCPSEVESValidator(ref Reference, roots *x509.CertPool, opts Options) (attestation.Validator, error) {
	return gcpes.NewValidator(gcpes.ValidatorConfig{
		ReferenceSets: ref.Measurements, Active: opts.Active, AKRoots: roots,
		MaxEvidenceSize: opts.MaxEvidenceSize, Now: opts.Now, Log: opts.Log,
	})
}

func newNitroTPMValidator(ref Reference, _ *x509.CertPool, opts Options) (attestation.Validator, error) {
	return nitrotpm.NewValidator(nitrotpm.ValidatorConfig{
		ReferenceSets: ref.Measurements, Active: opts.Active, AcceptUnauthenticatedAK: ref.AcceptUnauthenticatedAK,
		MaxEvidenceSize: opts.MaxEvidenceSize, Now: opts.Now, Log: opts.Log,
	})
}
