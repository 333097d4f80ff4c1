// Package choose is the catalog of attestation implementations and the one reference type
// they are built from. BuiltIns lists one Entry per implemented variant (its hardware block,
// how it trusts attestation keys, its constructors); given a variant, the registry builds the
// Validator (from a Reference) or the Issuer (from a node's devices). Nothing else decides by
// variant: the configuration, the init request, the cluster record, the join service, a
// node's check of the join service and `constellation verify` all come here with the
// variant they were given.
//
// A third party verifies a node with this package and pkg/verify: NewValidator from a
// Reference, then verify.Verify (the Example of pkg/verify, compiled and run with the tests).
// Evidence it holds already (bound to its own report data) it checks with
// attestation.ValidateReportData; attestation.CollateralURLs lists what an offline verifier
// must fetch ahead (docs/attestation.md, "Verify from your own code").
package choose

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	snpclient "github.com/google/go-sev-guest/client"

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
	"github.com/openconstellation/constellation/pkg/strictjson"
)

// Reference is everything evidence of one variant is checked against: what a cluster records
// (kube-system/constellation-attestation), what the configuration file holds, and what a
// verifier outside the cluster needs. It keeps this one shape from the configuration file to
// every validator; its JSON form (Encode, DecodeReference) is what the init request carries.
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
// cluster records them under their own key (hardware.json).
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

// MaxEncodedReferenceSize bounds an encoded Reference that DecodeReference accepts (it
// arrives from the network: the init request).
const MaxEncodedReferenceSize = 1 << 20

// Encode returns the canonical encoding of r: its JSON form, the one DecodeReference reads.
// The init request carries a reference in it.
func (r Reference) Encode() ([]byte, error) {
	data, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encoding the attestation reference: %w", err)
	}
	return data, nil
}

// DecodeReference decodes the canonical encoding of a reference (Encode) strictly
// (strictjson.Unmarshal: no unknown field, no field twice or in other letter case, nothing
// after the value). It does not check the reference: the caller does, once,
// by the rules of its trust boundary (Validate, or ValidateForCluster for a cluster's).
func DecodeReference(data []byte) (Reference, error) {
	if len(data) > MaxEncodedReferenceSize {
		return Reference{}, fmt.Errorf("attestation reference of %d bytes, limit %d", len(data), MaxEncodedReferenceSize)
	}
	var r Reference
	if err := strictjson.Unmarshal(data, &r); err != nil {
		return Reference{}, fmt.Errorf("decoding the attestation reference: %w", err)
	}
	return r, nil
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
	// Revocation says what an unknown revocation status of a hardware report's signer means;
	// the zero value rejects (attestation.RevocationPolicy).
	Revocation attestation.RevocationPolicy
	// Cluster makes NewValidator check the reference by a cluster's rules
	// (Reference.ValidateForCluster) rather than Validate's, so that the CLI checks the
	// reference it verifies a cluster's nodes with, and sends with init, once.
	Cluster bool
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

// Entry is one implemented variant: the variant itself (its name, OID and registers, with the
// cluster-ID register and its marker: pkg/attestation/variant) and everything else
// Constellation decides by variant. Code outside this entry asks it, never the variant's name.
type Entry struct {
	Variant variant.Variant
	// Hardware is the hardware block the variant's reference requires (and the only one it
	// accepts).
	Hardware HardwareKind
	// AK is how the variant trusts a node's attestation key, and so which of AK roots and
	// acceptUnauthenticatedAK its reference takes.
	AK AKPolicy
	// NewValidator builds the variant's validator from a checked reference and its parsed AK
	// roots (nil if none are configured).
	NewValidator func(ref Reference, akRoots *x509.CertPool, opts Options) (attestation.Validator, error)
	// NewIssuer builds the variant's issuer on a node's devices.
	NewIssuer func(ctx context.Context, v variant.Variant, env IssuerEnv) (attestation.Issuer, error)
}

// HardwareKind is which hardware block a variant requires.
type HardwareKind int

// Hardware kinds.
const (
	// HardwareNone: the variant's evidence has no hardware report beside its registers.
	HardwareNone HardwareKind = iota
	// HardwareSNP: an SEV-SNP report, checked against Reference.SNP.
	HardwareSNP
	// HardwareTDX: a TD quote, checked against Reference.TDX.
	HardwareTDX
)

// AKPolicy is how a variant trusts the key that signs its evidence.
type AKPolicy int

// AK policies.
const (
	// AKCertified: a certificate chaining to AK roots vouches for the key (or a hardware
	// report binds it); configured roots replace or extend the platform's pinned ones and
	// may be omitted. acceptUnauthenticatedAK is refused.
	AKCertified AKPolicy = iota
	// AKRootsRequired: only the configured AK roots vouch for the key (the platform's own
	// CA, nothing pinned). A cluster's reference must have them; outside a cluster (tests,
	// experiments) acceptUnauthenticatedAK may replace them.
	AKRootsRequired
	// AKBoundByHardware: the hardware report names the key (or there is no key): AK roots
	// would be ignored, so they are refused, and so is acceptUnauthenticatedAK.
	AKBoundByHardware
	// AKUnauthenticated: nothing vouches for the key: acceptUnauthenticatedAK is required
	// and AK roots, which nothing would check, are refused.
	AKUnauthenticated
)

// takesRoots reports whether configured AK roots are used by a variant of policy p.
func (p AKPolicy) takesRoots() bool { return p == AKCertified || p == AKRootsRequired }

// takesOptIn reports whether acceptUnauthenticatedAK is allowed by policy p.
func (p AKPolicy) takesOptIn() bool { return p == AKRootsRequired || p == AKUnauthenticated }

// BuiltIns lists the variants this build implements, one entry each. Adding a variant is
// adding its entry here (and its literal in pkg/attestation/variant): docs/attestation.md,
// "Adding a variant".
func BuiltIns() []Entry {
	return []Entry{
		{Variant: variant.QEMUVTPM, Hardware: HardwareNone, AK: AKRootsRequired, NewValidator: newQEMUVTPMValidator, NewIssuer: newQEMUVTPMIssuer},
		{Variant: variant.QEMUTDX, Hardware: HardwareTDX, AK: AKBoundByHardware, NewValidator: newQEMUTDXValidator, NewIssuer: newQEMUTDXIssuer},
		{Variant: variant.AWSSEVSNP, Hardware: HardwareSNP, AK: AKBoundByHardware, NewValidator: newAWSSEVSNPValidator, NewIssuer: newAWSSEVSNPIssuer},
		{Variant: variant.AWSNitroTPM, Hardware: HardwareNone, AK: AKUnauthenticated, NewValidator: newNitroTPMValidator, NewIssuer: newNitroTPMIssuer},
		{Variant: variant.GCPSEVSNP, Hardware: HardwareSNP, AK: AKCertified, NewValidator: newGCPSEVSNPValidator, NewIssuer: newGCPSEVSNPIssuer},
		{Variant: variant.GCPSEVES, Hardware: HardwareNone, AK: AKCertified, NewValidator: newGCPSEVESValidator, NewIssuer: newGCPSEVESIssuer},
		{Variant: variant.AzureSEVSNP, Hardware: HardwareSNP, AK: AKCertified, NewValidator: newAzureSEVSNPValidator, NewIssuer: newAzureSEVSNPIssuer},
		{Variant: variant.AzureTDX, Hardware: HardwareTDX, AK: AKCertified, NewValidator: newAzureTDXValidator, NewIssuer: newAzureTDXIssuer},
		{Variant: variant.AzureTrustedLaunch, Hardware: HardwareNone, AK: AKCertified, NewValidator: newTrustedLaunchValidator, NewIssuer: newTrustedLaunchIssuer},
	}
}

// registry indexes BuiltIns by variant.
var registry = func() map[variant.Variant]Entry {
	m := map[variant.Variant]Entry{}
	for _, e := range BuiltIns() {
		m[e.Variant] = e
	}
	return m
}()

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

// Lookup returns the entry of variant v, or an error wrapping ErrNotImplemented.
func Lookup(v variant.Variant) (Entry, error) {
	if v.IsZero() {
		return Entry{}, errors.New("no attestation variant")
	}
	e, ok := registry[v]
	if !ok {
		names := make([]string, 0, len(registry))
		for _, v := range Implemented() {
			names = append(names, v.String())
		}
		return Entry{}, fmt.Errorf("%w: %s (implemented: %v)", ErrNotImplemented, v, names)
	}
	return e, nil
}

// NewValidator returns the validator of ref.Variant, checking evidence against ref. It fails
// if ref does not satisfy what the variant requires (Validate).
func NewValidator(ref Reference, opts Options) (attestation.Validator, error) {
	e, err := Lookup(ref.Variant)
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
	if opts.Cluster {
		for _, fe := range clusterRules(ref) {
			return nil, fe
		}
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
	return e.NewValidator(ref, roots, opts)
}

// defaultCollateral is shared by validators built without a cache: documents are per URL,
// so sharing them is what makes a warm cache.
var defaultCollateral = collateral.New(collateral.Config{Fetcher: collateral.NewHTTPFetcher(nil)})

// NewIssuer returns the issuer of variant v on the node's devices.
func NewIssuer(ctx context.Context, v variant.Variant, env IssuerEnv) (attestation.Issuer, error) {
	e, err := Lookup(v)
	if err != nil {
		return nil, err
	}
	return e.NewIssuer(ctx, v, env)
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
	if _, err := Lookup(r.Variant); err != nil {
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
	e := registry[v]
	if _, err := ParseAKRoots(vals.AKRoots); err != nil {
		errs = append(errs, &FieldError{"akRoots", err})
	} else if !e.AK.takesRoots() && strings.TrimSpace(vals.AKRoots) != "" {
		errs = append(errs, &FieldError{"akRoots", fmt.Errorf("%s does not trust its attestation key through a certificate, so AK roots would be ignored", v)})
	}
	switch {
	case e.Hardware == HardwareSNP && vals.SNP == nil:
		errs = append(errs, &FieldError{"snp", fmt.Errorf("required: %s evidence carries an SEV-SNP report", v)})
	case e.Hardware == HardwareSNP:
		if err := vals.SNP.Validate(); err != nil {
			errs = append(errs, &FieldError{"snp", err})
		}
	case vals.SNP != nil:
		errs = append(errs, &FieldError{"snp", fmt.Errorf("%s evidence has no SEV-SNP report", v)})
	}
	switch {
	case e.Hardware == HardwareTDX && vals.TDX == nil:
		errs = append(errs, &FieldError{"tdx", fmt.Errorf("required: %s evidence carries a TD quote", v)})
	case e.Hardware == HardwareTDX:
		if err := vals.TDX.Validate(); err != nil {
			errs = append(errs, &FieldError{"tdx", err})
		}
	case vals.TDX != nil:
		errs = append(errs, &FieldError{"tdx", fmt.Errorf("%s evidence has no TD quote", v)})
	}
	switch {
	case vals.AcceptUnauthenticatedAK && !e.AK.takesOptIn():
		errs = append(errs, &FieldError{"acceptUnauthenticatedAK", fmt.Errorf("%s authenticates its attestation key; this opt-in is for %s only", v, strings.Join(optInVariants(), " and "))})
	case vals.AcceptUnauthenticatedAK && strings.TrimSpace(vals.AKRoots) != "":
		errs = append(errs, &FieldError{"acceptUnauthenticatedAK", fmt.Errorf("%s with AK roots: every AK must chain to them, so the opt-in would be ignored", v)})
	case !vals.AcceptUnauthenticatedAK && e.AK == AKUnauthenticated:
		errs = append(errs, &FieldError{"acceptUnauthenticatedAK", fmt.Errorf("required: nothing authenticates an %s attestation key, so anyone who can run a TPM can produce passing evidence; set it to true to accept that", v)})
	}
	return errs
}

// optInVariants names the variants that take acceptUnauthenticatedAK, for messages.
func optInVariants() []string {
	var names []string
	for _, v := range Implemented() {
		if registry[v].AK.takesOptIn() {
			names = append(names, v.String())
		}
	}
	return names
}

// ValidateForCluster checks ref as Validate does, and what a cluster runs with beyond: a
// variant whose attestation keys only configured roots vouch for (AKRootsRequired) must have
// them, and the opt-in that replaces them outside a cluster is refused. The cluster record,
// the init request and the CLI's reference for a cluster are checked by it.
func (r Reference) ValidateForCluster() error {
	errs := []error{r.Validate()}
	for _, fe := range clusterRules(r) {
		errs = append(errs, fe)
	}
	return errors.Join(errs...)
}

// clusterRules are what ValidateForCluster checks beyond Validate: the AK policy of the
// variant's entry, as a cluster runs with it.
func clusterRules(r Reference) []*FieldError {
	var errs []*FieldError
	if e, ok := registry[r.Variant]; ok && e.AK == AKRootsRequired {
		if strings.TrimSpace(r.AKRoots) == "" {
			errs = append(errs, &FieldError{"akRoots", errors.New("no certificate (the platform's AK CA is required: without it any key could sign evidence)")})
		}
		if r.AcceptUnauthenticatedAK {
			errs = append(errs, &FieldError{"acceptUnauthenticatedAK", fmt.Errorf("a %s cluster trusts its nodes' attestation keys through the platform's AK roots only", r.Variant)})
		}
	}
	return errs
}

// ParseAKRoots parses PEM CA certificates into a pool: every PEM block a CA certificate,
// nothing else but whitespace. Empty input gives nil (no roots).
func ParseAKRoots(pemData string) (*x509.CertPool, error) {
	if strings.TrimSpace(pemData) == "" {
		return nil, nil
	}
	pool, _, err := parseCAPool([]byte(pemData))
	if err != nil {
		return nil, err
	}
	return pool, nil
}

// parseCAPool returns the pool of the PEM certificates in data: every PEM block a CA
// certificate, nothing else but whitespace. n is the number of certificates (possibly zero:
// callers decide whether an empty pool is an error).
func parseCAPool(data []byte) (pool *x509.CertPool, n int, err error) {
	pool = x509.NewCertPool()
	rest := data
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		n++
		if block.Type != "CERTIFICATE" {
			return nil, n, fmt.Errorf("PEM block %d is a %q, want CERTIFICATE", n, block.Type)
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, n, fmt.Errorf("PEM block %d: %w", n, err)
		}
		if !cert.IsCA {
			return nil, n, fmt.Errorf("PEM block %d (%s) is not a CA certificate", n, cert.Subject)
		}
		pool.AddCert(cert)
	}
	if trailing := len(bytes.TrimSpace(rest)); trailing > 0 {
		if n == 0 {
			return nil, 0, fmt.Errorf("no PEM certificate found (%d bytes of other text)", trailing)
		}
		return nil, n, fmt.Errorf("%d bytes that are not PEM after certificate %d", trailing, n)
	}
	return pool, n, nil
}

// common is what every variant's validator configuration takes from a reference and the
// options: the reference sets (or the hot-reloaded ones) and how the validator runs.
func common(ref Reference, opts Options) attestation.ValidatorCommon {
	return attestation.ValidatorCommon{ReferenceSets: ref.Measurements, Active: opts.Active, MaxEvidenceSize: opts.MaxEvidenceSize, Now: opts.Now, Log: opts.Log, Revocation: opts.Revocation}
}

// qemu-vtpm is defined by its package (the AK trusted through the platform's AK CA, the
// event log required): the registry only maps the reference onto its configuration.
func newQEMUVTPMValidator(ref Reference, roots *x509.CertPool, opts Options) (attestation.Validator, error) {
	return qemu.NewValidator(qemu.ValidatorConfig{
		ValidatorCommon:         common(ref, opts),
		AKRoots:                 roots,
		AcceptUnauthenticatedAK: ref.AcceptUnauthenticatedAK,
	})
}

func newQEMUTDXValidator(ref Reference, _ *x509.CertPool, opts Options) (attestation.Validator, error) {
	return tdx.NewValidator(tdx.ValidatorConfig{
		ValidatorCommon: common(ref, opts),
		Reference:       *ref.TDX,
		Collateral:      opts.Collateral,
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
		ValidatorCommon: common(ref, opts),
		Hardware:        *ref.SNP,
		Collateral:      opts.Collateral,
	})
}

func newGCPSEVSNPValidator(ref Reference, roots *x509.CertPool, opts Options) (attestation.Validator, error) {
	return gcpsnp.NewValidator(gcpsnp.ValidatorConfig{
		ValidatorCommon: common(ref, opts),
		AKRoots:         roots,
		Hardware:        *ref.SNP,
		Collateral:      opts.Collateral,
	})
}

func newAzureSEVSNPValidator(ref Reference, roots *x509.CertPool, opts Options) (attestation.Validator, error) {
	return azuresnp.NewValidator(azuresnp.ValidatorConfig{
		ValidatorCommon: common(ref, opts),
		AKRoots:         roots,
		Hardware:        *ref.SNP,
		Collateral:      opts.Collateral,
	})
}

func newAzureTDXValidator(ref Reference, roots *x509.CertPool, opts Options) (attestation.Validator, error) {
	return azuretdx.NewValidator(azuretdx.ValidatorConfig{
		ValidatorCommon: common(ref, opts),
		AKRoots:         roots,
		Hardware:        *ref.TDX,
		Collateral:      opts.Collateral,
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

func newQEMUVTPMIssuer(ctx context.Context, v variant.Variant, env IssuerEnv) (attestation.Issuer, error) {
	return perUseIssuer(ctx, v, env, qemu.VTPMIssuerConfig(qemu.IssuerConfig{AK: env.AK, EventLog: env.EventLog}))
}

func newTrustedLaunchIssuer(ctx context.Context, v variant.Variant, env IssuerEnv) (attestation.Issuer, error) {
	return perUseIssuer(ctx, v, env, trustedlaunch.VTPMIssuerConfig(trustedlaunch.IssuerConfig{EventLog: env.EventLog}))
}

func newGCPSEVESIssuer(ctx context.Context, v variant.Variant, env IssuerEnv) (attestation.Issuer, error) {
	return perUseIssuer(ctx, v, env, gcpes.VTPMIssuerConfig(gcpes.IssuerConfig{EventLog: env.EventLog}))
}

func newNitroTPMIssuer(ctx context.Context, v variant.Variant, env IssuerEnv) (attestation.Issuer, error) {
	return perUseIssuer(ctx, v, env, nitrotpm.VTPMIssuerConfig(nitrotpm.IssuerConfig{EventLog: env.EventLog}))
}

func perUseIssuer(ctx context.Context, v variant.Variant, env IssuerEnv, cfg vtpm.IssuerConfig) (attestation.Issuer, error) {
	if env.TPM == nil {
		return nil, fmt.Errorf("issuer %s: no TPM", v)
	}
	return vtpm.NewPerUseIssuer(ctx, env.TPM, cfg)
}

func newTrustedLaunchValidator(ref Reference, roots *x509.CertPool, opts Options) (attestation.Validator, error) {
	return trustedlaunch.NewValidator(trustedlaunch.ValidatorConfig{
		ValidatorCommon: common(ref, opts),
		AKRoots:         roots,
	})
}

func newGCPSEVESValidator(ref Reference, roots *x509.CertPool, opts Options) (attestation.Validator, error) {
	return gcpes.NewValidator(gcpes.ValidatorConfig{
		ValidatorCommon: common(ref, opts),
		AKRoots:         roots,
	})
}

func newNitroTPMValidator(ref Reference, _ *x509.CertPool, opts Options) (attestation.Validator, error) {
	return nitrotpm.NewValidator(nitrotpm.ValidatorConfig{
		ValidatorCommon:         common(ref, opts),
		AcceptUnauthenticatedAK: ref.AcceptUnauthenticatedAK,
	})
}
