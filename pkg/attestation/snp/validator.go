// Package snp checks AMD SEV-SNP attestation reports: the hardware core every SEV-SNP
// attestation variant (AWS, GCP, Azure's HCL report) builds on. See Validator for what it
// checks and why.
package snp

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/kds"
	spb "github.com/google/go-sev-guest/proto/sevsnp"
	"github.com/google/go-sev-guest/validate"
	"github.com/google/go-sev-guest/verify"
	"github.com/google/go-sev-guest/verify/trust"

	"github.com/openconstellation/constellation/pkg/api/attestation/hardwarepb"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/collateral"
	"github.com/openconstellation/constellation/pkg/attestation/internal/memo"
)

// Technology is the attestation.Hardware technology of SEV-SNP results.
const Technology = "SEV-SNP"

// Limits on the certificates that come with a report.
const (
	// MaxCertificates bounds the certificates a report may come with (VCEK or VLEK, and the
	// chain the host sends along, which is ignored).
	MaxCertificates = 8
	// MaxCertificatesSize bounds one entry of the certificates (AMD's certificates are below
	// 2 KiB each; an entry may be a PEM bundle).
	MaxCertificatesSize = 32 << 10
)

// Config configures a Validator.
type Config struct {
	// Reference is what reports must show; it must pass Reference.Validate.
	Reference Reference
	// Collateral is the cache VCEK certificates and AMD's CRLs are taken from (and fetched
	// through, if it has a fetcher). Required.
	Collateral *collateral.Cache
	// Now is the time certificates and CRLs are checked at; default time.Now.
	Now func() time.Time
	// Log receives warnings (warn-only mismatches); default discards.
	Log *slog.Logger
	// Roots are the trusted AMD chains; nil means PinnedRoots (what every verifier uses).
	Roots *Roots
	// Revocation says what an unknown revocation status means (no current CRL at hand);
	// the zero value rejects (attestation.RevocationPolicy).
	Revocation attestation.RevocationPolicy
}

// Validator checks SEV-SNP attestation reports against one Reference. It is safe for
// concurrent use and holds no lock while it checks.
//
// Threat model: the host, the hypervisor and the cloud provider's software are the attacker.
// They choose every byte of the evidence (report, certificates, carried collateral) and
// can replay old evidence; they cannot forge the signature of a VCEK or VLEK of firmware
// that is not vulnerable, and cannot read or change the guest's memory while debugging and
// migration are off. Each check defends against one of their moves:
//
//   - Exact report size and a strict parse (abi.ReportToProto: reserved bits zero, known
//     version): no trailing or shifted data is ever interpreted.
//   - Pinned roots (PinnedRoots, embedded and checked against SHA-256 fingerprints at init):
//     the ARK, ASK and ASVK sent with the evidence are ignored, so a host cannot bring its own
//     root. Only the product lines the Reference accepts are trusted.
//   - Product line from the report's CPUID (version 3) and from the VCEK/VLEK's product
//     extension, which must agree: a key of one product line cannot vouch for a report that
//     claims another, and nothing is assumed to be Milan.
//   - VCEK taken from the evidence or fetched from AMD's KDS by chip ID and reported TCB
//     (through the collateral cache); VLEK only from the evidence (AMD does not publish
//     them). Either must chain to the pinned ASK or ASVK at Now: an expired or foreign key is
//     refused.
//   - Report signature (ECDSA P-384 over the report) with that key: a forged report is
//     refused as forged (attestation.ErrBadSignature) whether a CRL is at hand or not.
//   - Revocation: AMD's CRL for the ASK (VCEK) or ASVK (VLEK), through the same cache, must
//     be signed by the pinned ARK, current at Now (a CRL past its next update is never used
//     "for now") and must not list the intermediate or the key. No current CRL at hand is an
//     unknown status (attestation.ErrRevocationUnknown), which fails closed unless
//     Config.Revocation accepts it; a CRL that is not AMD's, or lists the chain, always
//     rejects. The CRL is read with the chain, but its verdict is the last one Check gives
//     (an attestation.CollateralError), after REPORT_DATA and every policy below: a report
//     that is replayed or outside the Reference is refused for that, offline as online.
//   - REPORT_DATA equal to the caller's data: binds the report to the caller's nonce or
//     key, so a recorded report cannot be replayed.
//   - Guest policy: debug never (the host could read the guest), migration agent only if
//     allowed, minimum ABI, SMT if forbidden. VMPL equal to the Reference's: a report from a
//     less privileged level could come from software the launch measurement does not cover.
//   - Minimum TCB on COMMITTED_TCB (no rollback below it), LAUNCH_TCB (not launched on old
//     firmware) and REPORTED_TCB (the signing key is not one that vulnerable firmware could
//     derive); minimum firmware API version on the committed version. Provisional firmware
//     (CURRENT_TCB above COMMITTED_TCB) is accepted.
//   - MEASUREMENT among the accepted values: the launched firmware and kernel are the
//     expected ones. ID key (or author key) digest among the accepted ones, enforced or
//     warn-only: the launch was signed by the expected party.
//   - Platform info (TSME required, SMT forbidden) when the Reference asks.
//   - go-sev-guest's own validation afterwards (reported TCB equal to the key's TCB, CHIP_ID
//     equal to the VCEK's HWID, committed not above current), as a second opinion.
//
// Claims (attestation.Hardware) are returned only after all of these passed.
//
// A key certificate go-sev-guest once accepted is remembered (by the SHA-256 of its DER,
// with its chain's validity window): later checks of reports it signed repeat the validity
// window, the CRL and the report signature, but not the chain's RSA signatures, which cannot
// change for the same bytes under the same roots. That keeps a warm check near the cost of
// the report's ECDSA signature.
type Validator struct {
	ref   Reference
	roots *Roots
	cache *collateral.Cache
	now   func() time.Time
	log   *slog.Logger
	// revocation says what an unknown revocation status means.
	revocation attestation.RevocationPolicy

	// crls memoizes CRLs whose signature by a pinned ARK was checked, by product line and
	// SHA-256 of their DER: an RSA-4096 check per validation is most of a check's time, and
	// a CRL is reused for days. Only AMD-signed CRLs get in, so it stays small.
	crls *memo.Memo[crlKey, *x509.RevocationList]

	// keys memoizes VCEK and VLEK certificates go-sev-guest accepted (keyMemoKey), with their
	// chain's validity, so a warm check does not repeat the chain's RSA-4096 signatures.
	keys *memo.Memo[keyMemoKey, validity]

	// signed memoizes reports whose signature verified, by the SHA-256 of the report and
	// the key's memo entry. Reports made at boot (azure-sev-snp, aws-sev-snp) come back with
	// every evidence of a node: their ECDSA P-384 check, most of a warm check's time, is done
	// once. Nothing else is skipped: validity window, CRL and policy are checked every time.
	signed *memo.Memo[signedKey, struct{}]
}

// NewValidator returns a validator for cfg.
func NewValidator(cfg Config) (*Validator, error) {
	if err := cfg.Reference.Validate(); err != nil {
		return nil, fmt.Errorf("SEV-SNP reference: %w", err)
	}
	if cfg.Collateral == nil {
		return nil, errors.New("SEV-SNP validator: no collateral cache (revocation is always checked)")
	}
	if !cfg.Revocation.Valid() {
		return nil, fmt.Errorf("SEV-SNP validator: %s", cfg.Revocation)
	}
	v := &Validator{
		ref: cfg.Reference.withDefaults(), roots: cfg.Roots, cache: cfg.Collateral, now: cfg.Now, log: cfg.Log, revocation: cfg.Revocation,
		crls:   memo.New[crlKey, *x509.RevocationList](maxCRLs),
		keys:   memo.New[keyMemoKey, validity](maxKeys),
		signed: memo.New[signedKey, struct{}](maxSigned),
	}
	if v.roots == nil {
		v.roots = PinnedRoots()
	}
	if v.now == nil {
		v.now = time.Now
	}
	if v.log == nil {
		v.log = slog.New(slog.DiscardHandler)
	}
	return v, nil
}

// parsed is the result of the parse step.
type parsed struct {
	raw     []byte
	report  *spb.Report
	signer  abi.ReportSigner
	product string
	// key is the VCEK or VLEK certificate from the evidence (nil if a VCEK must be fetched).
	key *x509.Certificate
}

// signerName returns "VCEK" or "VLEK".
func (p *parsed) signerName() string { return p.signer.String() }

// Check verifies an SEV-SNP report (exactly abi.ReportSize bytes) with the certificates that
// came with it (DER or PEM, bundles allowed; only the VCEK or VLEK is used, the chain the
// host sends along is ignored) and the collateral the
// evidence carried, and validates it against the Reference. REPORT_DATA must equal
// reportData, zero-padded to 64 bytes. Errors wrap exactly one attestation.Err* reason; a
// refusal that rests on AMD's CRL is an attestation.CollateralError, returned only when
// every other check passed.
func (v *Validator) Check(ctx context.Context, report []byte, certs [][]byte, carried []*hardwarepb.Collateral, reportData []byte) (*attestation.Hardware, error) {
	// 1. Parse.
	p, err := parseReport(report, certs)
	if err != nil {
		return nil, err
	}
	// 2. Verify: the key's chain and the report's signature; the CRL is read, its verdict
	// kept for step 4.
	revocation, err := v.verify(ctx, p, carried)
	if err != nil {
		return nil, err
	}
	// 3. Validate: REPORT_DATA and the Reference.
	claims, err := v.validate(p, reportData, revocation)
	if err != nil {
		return nil, err
	}
	// 4. The CRL's verdict, last: only a report that passed everything else is refused for
	// what the CRL says, or for want of one.
	if err := v.revocationVerdict(revocation); err != nil {
		return nil, err
	}
	return claims, nil
}

// CollateralURLs returns the URLs of the documents Check reads for report and certs: the
// VCEK at AMD's KDS when certs lack it, and the CRL of the intermediate (ASK or ASVK) of the
// report's product line. The report is parsed, not verified.
func (v *Validator) CollateralURLs(report []byte, certs [][]byte) ([]string, error) {
	p, err := parseReport(report, certs)
	if err != nil {
		return nil, err
	}
	roots, err := v.productRoots(p.product)
	if err != nil {
		return nil, err
	}
	var urls []string
	if p.key == nil {
		url, err := vcekURL(p)
		if err != nil {
			return nil, err
		}
		urls = append(urls, url)
	}
	intermediate, name := signerIntermediate(roots, p.signer)
	crl, err := crlURL(intermediate, name)
	if err != nil {
		return nil, err
	}
	return append(urls, crl), nil
}

// --- Step 1: parse ---------------------------------------------------------------------

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: SEV-SNP %s", attestation.ErrMalformed, fmt.Sprintf(format, args...))
}

func untrusted(format string, args ...any) error {
	return fmt.Errorf("%w: SEV-SNP %s", attestation.ErrUntrustedSigner, fmt.Sprintf(format, args...))
}

func policy(format string, args ...any) error {
	return fmt.Errorf("%w: SEV-SNP %s", attestation.ErrMeasurementPolicy, fmt.Sprintf(format, args...))
}

// parseReport decodes the report and the signer's certificate and determines the product
// line. Nothing here is trusted yet.
func parseReport(report []byte, certs [][]byte) (*parsed, error) {
	r, signer, err := decodeReport(report)
	if err != nil {
		return nil, err
	}
	p := &parsed{raw: report, report: r, signer: signer}
	if p.key, err = signerCertificate(certs, signer); err != nil {
		return nil, err
	}
	if p.product, err = productLine(r, signer, p.key); err != nil {
		return nil, err
	}
	return p, nil
}

// decodeReport parses the report strictly (exact size, known format, ECDSA P-384) and
// returns it with the kind of key that signed it, which must be a VCEK or a VLEK.
func decodeReport(report []byte) (*spb.Report, abi.ReportSigner, error) {
	var none abi.ReportSigner
	if len(report) != abi.ReportSize {
		return nil, none, malformed("report of %d bytes, want %d", len(report), abi.ReportSize)
	}
	if err := abi.ValidateReportFormat(report); err != nil {
		return nil, none, malformed("report: %v", err)
	}
	r, err := abi.ReportToProto(report)
	if err != nil {
		return nil, none, malformed("report: %v", err)
	}
	if r.GetSignatureAlgo() != abi.SignEcdsaP384Sha384 {
		return nil, none, malformed("report SIGNATURE_ALGO %d, want %d (ECDSA P-384 with SHA-384)", r.GetSignatureAlgo(), abi.SignEcdsaP384Sha384)
	}
	info, err := abi.ParseSignerInfo(r.GetSignerInfo())
	if err != nil {
		return nil, none, malformed("report SIGNING_KEY: %v", err)
	}
	switch info.SigningKey {
	case abi.VcekReportSigner, abi.VlekReportSigner:
	default:
		return nil, none, untrusted("report SIGNING_KEY is %v, want VCEK or VLEK", info.SigningKey)
	}
	return r, info.SigningKey, nil
}

// signerCertificate returns the certificate of the signing key (VCEK or VLEK) among the
// certificates that came with the report, or nil if none did (a VCEK is then fetched).
func signerCertificate(certs [][]byte, signer abi.ReportSigner) (*x509.Certificate, error) {
	var all []*x509.Certificate
	for i, c := range certs {
		parsed, err := parseCertificates(c)
		if err != nil {
			return nil, malformed("certificate %d: %v", i, err)
		}
		all = append(all, parsed...)
		if len(all) > MaxCertificates {
			return nil, malformed("more than %d certificates", MaxCertificates)
		}
	}
	var key *x509.Certificate
	wantCN := "SEV-" + signer.String()
	for _, cert := range all {
		if cert.Subject.CommonName != wantCN {
			// The ARK, ASK and ASVK the host sends along are never trusted; a key of the
			// other kind is not the one that signed.
			continue
		}
		if key != nil {
			return nil, malformed("two %s certificates", signer)
		}
		key = cert
	}
	return key, nil
}

// productLine determines the product line from the report's CPUID (version 3 and later)
// and from the key's certificate (if it came with the report); if both are there they must
// agree.
func productLine(r *spb.Report, signer abi.ReportSigner, key *x509.Certificate) (string, error) {
	var fromReport, fromKey string
	if fms := r.GetCpuid1EaxFms(); fms != 0 {
		fromReport = kds.ProductLineFromFms(fms)
		if !slices.Contains(ProductLines, fromReport) {
			return "", untrusted("report CPUID family/model 0x%08x is no known SEV-SNP product line", fms)
		}
	}
	if key != nil {
		exts, err := kds.CertificateExtensions(key, signer)
		if err != nil {
			return "", malformed("%s certificate extensions: %v", signer, err)
		}
		// VCEKs name "Milan-B0"; Genoa VCEKs and VLEKs name only the line.
		fromKey = kds.ProductLineOfProductName(exts.ProductName)
		if !slices.Contains(ProductLines, fromKey) {
			return "", untrusted("%s certificate product name %q is no known SEV-SNP product line", signer, exts.ProductName)
		}
	}
	switch {
	case fromReport != "" && fromKey != "" && fromReport != fromKey:
		return "", untrusted("product line: report CPUID says %s, %s certificate says %s", fromReport, signer, fromKey)
	case fromReport != "":
		return fromReport, nil
	case fromKey != "":
		return fromKey, nil
	default:
		return "", malformed("product line unknown: a version %d report (no CPUID) without its %s certificate", r.GetVersion(), signer)
	}
}

// parseCertificates parses one DER certificate or PEM certificates (a bundle, as cloud
// services hand out a VCEK with its chain).
func parseCertificates(b []byte) ([]*x509.Certificate, error) {
	if len(b) > MaxCertificatesSize {
		return nil, fmt.Errorf("%d bytes, limit %d", len(b), MaxCertificatesSize)
	}
	if !bytes.HasPrefix(bytes.TrimSpace(b), []byte("-----BEGIN")) {
		c, err := x509.ParseCertificate(b)
		if err != nil {
			return nil, err
		}
		return []*x509.Certificate{c}, nil
	}
	var out []*x509.Certificate
	rest := b
	for len(bytes.TrimSpace(rest)) > 0 {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil || block.Type != "CERTIFICATE" {
			return nil, errors.New("want PEM CERTIFICATE blocks only")
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// --- Step 2: verify --------------------------------------------------------------------

// verify establishes that the report was signed by a VCEK or VLEK that chains to the pinned
// roots of its product line. In order: the product line is accepted and has pinned roots,
// the signing key's certificate is at hand (fetched for a VCEK the evidence lacks), the key's
// chain and the report's signature verify (once per key and report: remembered after), and
// then the CRL is read. It returns what the CRL says (revocationStatus, whose verdict
// revocationVerdict gives last), an error if the report must be refused without it.
func (v *Validator) verify(ctx context.Context, p *parsed, carried []*hardwarepb.Collateral) (revocationStatus, error) {
	roots, err := v.productRoots(p.product)
	if err != nil {
		return revocationStatus{}, err
	}
	now := v.now()
	getter := collateral.SNPGetter{S: v.cache.Session(ctx, carried)}
	if p.key == nil {
		if p.key, err = fetchVCEK(ctx, getter, p); err != nil {
			return revocationStatus{}, err
		}
	}
	intermediate, intermediateName := signerIntermediate(roots, p.signer)
	if err := v.verifyKeyAndSignature(ctx, p, roots, intermediate, now); err != nil {
		return revocationStatus{}, err
	}
	return v.checkRevocation(ctx, getter, roots, intermediate, intermediateName, p, now)
}

// revocationVerdict is the verdict of what checkRevocation learned, under the revocation
// policy: a CollateralError when the CRL refuses the chain, or when no current CRL was at hand
// and the policy requires one. Check gives it last, after every check that needs no CRL.
func (v *Validator) revocationVerdict(status revocationStatus) error {
	switch {
	case status.refused != nil:
		return &attestation.CollateralError{Err: status.refused}
	case status.unknown != nil && v.revocation != attestation.RevocationUnknownAccepted:
		return &attestation.CollateralError{Err: fmt.Errorf("%w: SEV-SNP %w (revocation policy %s; decided last, after every check that needs no collateral passed)", attestation.ErrRevocationUnknown, status.unknown, v.revocation)}
	}
	return nil
}

// verifyKeyAndSignature checks the key's chain to the pinned roots at now and the report's
// signature with the key, through the memo of accepted keys when the key was seen before.
func (v *Validator) verifyKeyAndSignature(ctx context.Context, p *parsed, roots ProductRoots, intermediate *x509.Certificate, now time.Time) error {
	keyID := keyMemoKey{product: p.product, signer: p.signer, digest: sha256.Sum256(p.key.Raw)}
	if w, ok := v.keys.Get(keyID); ok {
		return v.verifyRememberedKey(p, keyID, w, now)
	}
	if err := v.verifyChainAndSignature(ctx, p, roots, intermediate, now); err != nil {
		return err
	}
	// What go-sev-guest checked depends only on the certificate's bytes, the product line and
	// the roots (fixed per validator), except the time, which is kept as the chain's validity.
	var w validity
	w.notBefore, w.notAfter = memo.ValidityOf([]*x509.Certificate{p.key, intermediate, roots.ARK})
	v.keys.Put(keyID, w)
	return nil
}

// productRoots returns the pinned roots of product, which the Reference must accept.
func (v *Validator) productRoots(product string) (ProductRoots, error) {
	if !slices.Contains(v.ref.Products, product) {
		return ProductRoots{}, untrusted("product line %s is not accepted by reference %q (products %s)", product, v.ref.Name, strings.Join(v.ref.Products, ", "))
	}
	roots, ok := v.roots.Product(product)
	if !ok {
		return ProductRoots{}, untrusted("no pinned roots for product line %s", product)
	}
	return roots, nil
}

// fetchVCEK fetches the VCEK of the report's chip and reported TCB from AMD's KDS (through
// the collateral session); its product line must be the report's. A VLEK cannot be fetched.
func fetchVCEK(ctx context.Context, getter collateral.SNPGetter, p *parsed) (*x509.Certificate, error) {
	url, err := vcekURL(p)
	if err != nil {
		return nil, err
	}
	der, err := getter.GetContext(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("%w: SEV-SNP VCEK: %w", attestation.ErrUntrustedSigner, err)
	}
	fetched, err := parseCertificates(der)
	if err != nil || len(fetched) != 1 {
		return nil, untrusted("VCEK from %s: not one certificate (%v)", url, err)
	}
	exts, err := kds.CertificateExtensions(fetched[0], p.signer)
	if err != nil {
		return nil, untrusted("VCEK from %s: extensions: %v", url, err)
	}
	if got := kds.ProductLineOfProductName(exts.ProductName); got != p.product {
		return nil, untrusted("product line: report says %s, VCEK certificate says %s", p.product, got)
	}
	return fetched[0], nil
}

// vcekURL is where AMD's KDS serves the VCEK of the report's chip and reported TCB; a VLEK,
// or a VCEK of a masked CHIP_ID, cannot be fetched.
func vcekURL(p *parsed) (string, error) {
	if p.signer == abi.VlekReportSigner {
		return "", untrusted("VLEK-signed report without its VLEK certificate (AMD does not publish VLEKs)")
	}
	if isZero(p.report.GetChipId()) {
		return "", untrusted("VCEK missing, and the report's CHIP_ID is masked: the VCEK cannot be fetched")
	}
	return kds.VCEKCertURL(p.product, p.report.GetChipId(), kds.TCBVersion(p.report.GetReportedTcb())), nil
}

// signerIntermediate returns the intermediate that certifies the signer: the ASK for a
// VCEK, the ASVK for a VLEK.
func signerIntermediate(roots ProductRoots, signer abi.ReportSigner) (*x509.Certificate, string) {
	if signer == abi.VlekReportSigner {
		return roots.ASVK, "ASVK"
	}
	return roots.ASK, "ASK"
}

// verifyRememberedKey checks a report signed by a key whose certificate go-sev-guest already
// accepted: only the chain's validity at now and the report signature (the CRL is checked
// after, every time), the signature once per report.
func (v *Validator) verifyRememberedKey(p *parsed, keyID keyMemoKey, w validity, now time.Time) error {
	if now.Before(w.notBefore) || now.After(w.notAfter) {
		return untrusted("%s certificate: chain not valid at %s (valid %s to %s): expired or not yet valid", p.signerName(),
			now.UTC().Format(time.RFC3339), w.notBefore.UTC().Format(time.RFC3339), w.notAfter.UTC().Format(time.RFC3339))
	}
	sk := signedKey{key: keyID, report: sha256.Sum256(p.raw)}
	if _, ok := v.signed.Get(sk); ok {
		return nil
	}
	if err := verify.SnpReportSignature(p.raw, p.key); err != nil {
		return fmt.Errorf("%w: SEV-SNP report signature does not verify with the %s: %v", attestation.ErrBadSignature, p.signerName(), err)
	}
	v.signed.Put(sk, struct{}{})
	return nil
}

// verifyChainAndSignature has go-sev-guest check the key's certificate (fields AMD's KDS
// sets, chain to our roots at now) and the report signature. Revocation is left to
// checkRevocation, after it (go-sev-guest would fetch the CRL first and does not check its
// next update). A fresh AMDRootCerts per check: the library keeps state inside it, which may
// not outlive one check. For a VLEK the intermediate is the ASVK, so it goes into
// ProductCerts.Ask.
func (v *Validator) verifyChainAndSignature(ctx context.Context, p *parsed, roots ProductRoots, intermediate *x509.Certificate, now time.Time) error {
	chain := &spb.CertificateChain{AskCert: roots.ASK.Raw, ArkCert: roots.ARK.Raw, Extras: map[string][]byte{}}
	if p.signer == abi.VcekReportSigner {
		chain.VcekCert = p.key.Raw
	} else {
		chain.VlekCert = p.key.Raw
		chain.AskCert = roots.ASVK.Raw
	}
	product, err := kds.ParseProductLine(p.product)
	if err != nil {
		return untrusted("product line: %v", err)
	}
	opts := &verify.Options{
		CheckRevocations:    false,
		DisableCertFetching: true,
		Now:                 now,
		Product:             product,
		TrustedRoots: map[string][]*trust.AMDRootCerts{p.product: {{
			ProductLine:  p.product,
			ProductCerts: &trust.ProductCerts{Ark: roots.ARK, Ask: intermediate, Asvk: roots.ASVK},
		}}},
	}
	att := &spb.Attestation{Report: p.report, CertificateChain: chain}
	if err := verify.SnpAttestationContext(ctx, att, opts); err != nil {
		// Tell a bad signature from an untrusted signer: if the key's signature over the
		// report does not verify, that is the reason, whatever else is wrong.
		if sigErr := verify.SnpReportSignature(p.raw, p.key); sigErr != nil {
			return fmt.Errorf("%w: SEV-SNP report signature does not verify with the %s: %v", attestation.ErrBadSignature, p.signerName(), sigErr)
		}
		return untrusted("%s certificate: %v", p.signerName(), err)
	}
	return nil
}

// keyMemoKey names a VCEK or VLEK certificate (by the SHA-256 of its DER) of a product line.
type keyMemoKey struct {
	product string
	signer  abi.ReportSigner
	digest  [sha256.Size]byte
}

// validity is when every certificate of a key's chain is valid.
type validity struct{ notBefore, notAfter time.Time }

// maxKeys bounds the memo of accepted keys (one per chip and TCB, or per VLEK).
const maxKeys = 4096

// signedKey names a report (the SHA-256 of its signed bytes and signature) signed by a key.
type signedKey struct {
	key    keyMemoKey
	report [sha256.Size]byte
}

// maxSigned bounds the memo of verified report signatures (one per node boot).
const maxSigned = 8192

// revocationStatus is what checkRevocation learned. Both nil: a current CRL of AMD's lists
// neither the intermediate nor the key.
type revocationStatus struct {
	// unknown says why the status could not be learned (for the policy to decide).
	unknown error
	// refused says why the CRL at hand refuses the chain (whatever the policy).
	refused error
}

// checkRevocation fetches the CRL of the intermediate through the collateral session and
// checks it is AMD's (signed by the pinned ARK), current at now, and revokes neither the
// intermediate nor the signer's key. No CRL at hand, or none current, is an unknown status;
// a CRL that is not AMD's or revokes the chain is a refusal: both are returned in the status,
// for revocationVerdict to give last. A revocation listed in an AMD CRL counts even when the
// CRL is past its next update. Only an intermediate without its one CRL distribution point
// (a pinned root, nothing the evidence chooses) is an error.
func (v *Validator) checkRevocation(ctx context.Context, getter collateral.SNPGetter, roots ProductRoots, intermediate *x509.Certificate, name string, p *parsed, now time.Time) (revocationStatus, error) {
	url, err := crlURL(intermediate, name)
	if err != nil {
		return revocationStatus{}, err
	}
	body, err := getter.GetContext(ctx, url)
	if err != nil {
		return revocationStatus{unknown: fmt.Errorf("CRL of the %s: %w", name, err)}, nil
	}
	if block, _ := pem.Decode(body); block != nil && block.Type == "X509 CRL" {
		body = block.Bytes
	}
	crl, err := v.verifiedCRL(roots, body)
	if err != nil {
		return revocationStatus{refused: untrusted("CRL of the %s from %s: %v", name, url, err)}, nil
	}
	for _, e := range crl.RevokedCertificateEntries {
		switch {
		case e.SerialNumber.Cmp(intermediate.SerialNumber) == 0:
			return revocationStatus{refused: untrusted("%s of %s revoked at %s", name, roots.Product, e.RevocationTime.UTC().Format(time.RFC3339))}, nil
		case p.key != nil && e.SerialNumber.Cmp(p.key.SerialNumber) == 0 && bytes.Equal(p.key.RawIssuer, intermediate.RawSubject):
			return revocationStatus{refused: untrusted("%s revoked at %s", p.signerName(), e.RevocationTime.UTC().Format(time.RFC3339))}, nil
		}
	}
	if crl.NextUpdate.IsZero() || !now.Before(crl.NextUpdate) {
		return revocationStatus{unknown: fmt.Errorf("CRL of the %s is stale: next update %s, now %s", name, crl.NextUpdate.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))}, nil
	}
	if now.Before(crl.ThisUpdate) {
		return revocationStatus{unknown: fmt.Errorf("CRL of the %s is not yet valid: this update %s, now %s", name, crl.ThisUpdate.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))}, nil
	}
	return revocationStatus{}, nil
}

// crlURL returns the one CRL distribution point of a pinned intermediate.
func crlURL(intermediate *x509.Certificate, name string) (string, error) {
	if len(intermediate.CRLDistributionPoints) != 1 {
		return "", untrusted("%s has %d CRL distribution points, want 1", name, len(intermediate.CRLDistributionPoints))
	}
	return intermediate.CRLDistributionPoints[0], nil
}

type crlKey struct {
	product string
	digest  [sha256.Size]byte
}

// maxCRLs bounds the memo of checked CRLs (AMD publishes two per product line).
const maxCRLs = 64

// verifiedCRL parses a CRL and checks it is signed by the ARK of roots.
func (v *Validator) verifiedCRL(roots ProductRoots, der []byte) (*x509.RevocationList, error) {
	key := crlKey{product: roots.Product, digest: sha256.Sum256(der)}
	if crl, ok := v.crls.Get(key); ok {
		return crl, nil
	}
	crl, err := x509.ParseRevocationList(der)
	if err != nil {
		return nil, err
	}
	if err := crl.CheckSignatureFrom(roots.ARK); err != nil {
		return nil, fmt.Errorf("not signed by the ARK of %s: %w", roots.Product, err)
	}
	v.crls.Put(key, crl)
	return crl, nil
}

func isZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

// --- Step 3: validate ------------------------------------------------------------------

// validate compares the authentic report with the caller's data and the Reference, one
// policy at a time, and returns the claims only after every one passed (Check then gives the
// CRL's verdict).
func (v *Validator) validate(p *parsed, reportData []byte, revocation revocationStatus) (*attestation.Hardware, error) {
	wantData, err := checkReportData(p.report, reportData)
	if err != nil {
		return nil, err
	}
	if err := v.checkGuestPolicy(p.report); err != nil {
		return nil, err
	}
	tcbs, err := v.checkFirmware(p)
	if err != nil {
		return nil, err
	}
	if err := v.checkPlatform(p.report); err != nil {
		return nil, err
	}
	warnings, err := v.checkLaunch(p.report)
	if err != nil {
		return nil, err
	}
	if err := v.secondOpinion(p, wantData); err != nil {
		return nil, err
	}
	return v.claims(p, tcbs, warnings, revocation), nil
}

// checkReportData checks that REPORT_DATA binds the report to the caller's nonce or key,
// and returns the expected 64 bytes.
func checkReportData(r *spb.Report, reportData []byte) ([]byte, error) {
	if len(reportData) == 0 || len(reportData) > abi.ReportDataSize {
		return nil, fmt.Errorf("%w: SEV-SNP expected report data of %d bytes, want 1..%d", attestation.ErrNonceMismatch, len(reportData), abi.ReportDataSize)
	}
	wantData := make([]byte, abi.ReportDataSize)
	copy(wantData, reportData)
	if !bytes.Equal(r.GetReportData(), wantData) {
		return nil, fmt.Errorf("%w: SEV-SNP REPORT_DATA %s, want %s", attestation.ErrNonceMismatch, hex.EncodeToString(r.GetReportData()), hex.EncodeToString(wantData))
	}
	return wantData, nil
}

// checkGuestPolicy checks the guest policy (no debugging, migration agent and SMT as the
// Reference allows, minimum ABI) and the VMPL.
func (v *Validator) checkGuestPolicy(r *spb.Report) error {
	ref := v.ref
	pol, err := abi.ParseSnpPolicy(r.GetPolicy())
	if err != nil {
		return malformed("POLICY: %v", err)
	}
	if pol.Debug {
		return policy("POLICY allows debugging (the host can read and write guest memory)")
	}
	if pol.MigrateMA && !ref.GuestPolicy.AllowMigrationAgent {
		return policy("POLICY allows a migration agent, reference %q does not", ref.Name)
	}
	if pol.SMT && ref.GuestPolicy.ForbidSMT {
		return policy("POLICY allows SMT, reference %q forbids it", ref.Name)
	}
	if got, want := uint16(pol.ABIMajor)<<8|uint16(pol.ABIMinor), uint16(ref.GuestPolicy.MinimumABIMajor)<<8|uint16(ref.GuestPolicy.MinimumABIMinor); got < want {
		return policy("POLICY ABI %d.%d below minimum %d.%d", pol.ABIMajor, pol.ABIMinor, ref.GuestPolicy.MinimumABIMajor, ref.GuestPolicy.MinimumABIMinor)
	}
	if r.GetVmpl() != ref.VMPL {
		return policy("VMPL %d, want %d", r.GetVmpl(), ref.VMPL)
	}
	return nil
}

// reportTCBs are the committed, launch and reported TCBs of a report, in that order.
type reportTCBs [3]TCB

// checkFirmware checks the committed, launch and reported TCBs against the minimum of the
// product line, and the committed firmware API version; it returns the TCBs for the claims.
func (v *Validator) checkFirmware(p *parsed) (reportTCBs, error) {
	r := p.report
	tcbs := reportTCBs{
		TCBFromVersion(p.product, r.GetCommittedTcb()),
		TCBFromVersion(p.product, r.GetLaunchTcb()),
		TCBFromVersion(p.product, r.GetReportedTcb()),
	}
	minimum := v.ref.MinimumTCB[p.product]
	for i, name := range []string{"committed", "launch", "reported"} {
		if c, got, want := tcbs[i].below(minimum); c != "" {
			return tcbs, policy("%s TCB %s %d below minimum %d", name, c, got, want)
		}
	}
	if m := v.ref.MinimumFirmware; m != nil {
		got := FirmwareVersion{Major: uint8(r.GetCommittedMajor()), Minor: uint8(r.GetCommittedMinor())}
		if uint16(got.Major)<<8|uint16(got.Minor) < uint16(m.Major)<<8|uint16(m.Minor) {
			return tcbs, policy("committed firmware API version %s below minimum %s", got, m)
		}
	}
	return tcbs, nil
}

// checkPlatform checks PLATFORM_INFO where the Reference asks (TSME required, SMT
// forbidden).
func (v *Validator) checkPlatform(r *spb.Report) error {
	info, _ := abi.ParseSnpPlatformInfo(r.GetPlatformInfo()) // unknown bits are new features, not failures
	if v.ref.PlatformInfo.RequireTSME && !info.TSMEEnabled {
		return policy("PLATFORM_INFO: TSME not enabled, reference %q requires it", v.ref.Name)
	}
	if v.ref.PlatformInfo.ForbidSMT && info.SMTEnabled {
		return policy("PLATFORM_INFO: SMT enabled, reference %q forbids it", v.ref.Name)
	}
	return nil
}

// checkLaunch checks the launch: MEASUREMENT among the accepted values, the ID key (or
// author key) digest among the accepted ones, enforced or warn-only (a warning then).
func (v *Validator) checkLaunch(r *spb.Report) (warnings []string, err error) {
	ref := v.ref
	if len(ref.Measurements) > 0 && !ref.Measurements.contains(r.GetMeasurement()) {
		return nil, policy("MEASUREMENT %s is not accepted by reference %q", hex.EncodeToString(r.GetMeasurement()), ref.Name)
	}
	if len(ref.IDKeyDigests) == 0 {
		return nil, nil
	}
	signer, _ := abi.ParseSignerInfo(r.GetSignerInfo())
	if ref.IDKeyDigests.contains(r.GetIdKeyDigest()) || (signer.AuthorKeyEn && ref.IDKeyDigests.contains(r.GetAuthorKeyDigest())) {
		return nil, nil
	}
	msg := fmt.Sprintf("ID_KEY_DIGEST %s (AUTHOR_KEY_DIGEST %s) is not accepted by reference %q",
		hex.EncodeToString(r.GetIdKeyDigest()), hex.EncodeToString(r.GetAuthorKeyDigest()), ref.Name)
	if ref.IDKeyEnforcement != EnforceWarnOnly {
		return nil, policy("%s", msg)
	}
	v.log.Warn("SEV-SNP ID key not accepted (warn-only)", "reference", ref.Name, "idKeyDigest", hex.EncodeToString(r.GetIdKeyDigest()))
	return []string{msg}, nil
}

// secondOpinion has go-sev-guest validate the report with the same requirements where it has
// them (reported TCB equal to the key's, CHIP_ID equal to the VCEK's HWID, committed not
// above current).
func (v *Validator) secondOpinion(p *parsed, wantData []byte) error {
	ref := v.ref
	minimum := ref.MinimumTCB[p.product]
	vmpl := int(ref.VMPL)
	opts := &validate.Options{
		GuestPolicy: abi.SnpPolicy{
			ABIMajor:  ref.GuestPolicy.MinimumABIMajor,
			ABIMinor:  ref.GuestPolicy.MinimumABIMinor,
			SMT:       !ref.GuestPolicy.ForbidSMT,
			MigrateMA: ref.GuestPolicy.AllowMigrationAgent,
		},
		ReportData:                wantData,
		VMPL:                      &vmpl,
		MinimumTCB:                kds.DecomposeTCBVersion(kds.TCBVersion(minimum.Version(p.product))),
		MinimumLaunchTCB:          kds.DecomposeTCBVersion(kds.TCBVersion(minimum.Version(p.product))),
		PermitProvisionalFirmware: true,
	}
	if len(ref.IDKeyDigests) > 0 && ref.IDKeyEnforcement == EnforceEqual {
		opts.RequireIDBlock = true
		opts.TrustedIDKeyHashes = ref.IDKeyDigests
		opts.TrustedAuthorKeyHashes = ref.IDKeyDigests
	}
	chain := &spb.CertificateChain{}
	if p.signer == abi.VcekReportSigner {
		chain.VcekCert = p.key.Raw
	} else {
		chain.VlekCert = p.key.Raw
	}
	if err := validate.SnpAttestation(&spb.Attestation{Report: p.report, CertificateChain: chain}, opts); err != nil {
		return policy("report: %v", err)
	}
	return nil
}

// claims are what a report that passed every check shows.
func (v *Validator) claims(p *parsed, tcbs reportTCBs, warnings []string, revocation revocationStatus) *attestation.Hardware {
	r := p.report
	if revocation.unknown != nil {
		warnings = append(warnings, fmt.Sprintf("revocation not checked (policy %s): %v", v.revocation, revocation.unknown))
	}
	return &attestation.Hardware{
		RevocationChecked: revocation.unknown == nil,
		Technology:        Technology,
		Product:           p.product,
		Signer:            p.signerName(),
		TCB: fmt.Sprintf("committed %s; launch %s; reported %s; firmware %d.%d build %d",
			tcbs[0], tcbs[1], tcbs[2], r.GetCommittedMajor(), r.GetCommittedMinor(), r.GetCommittedBuild()),
		Reference: v.ref.Name,
		Measurements: map[string][]byte{
			"MEASUREMENT":       r.GetMeasurement(),
			"HOST_DATA":         r.GetHostData(),
			"ID_KEY_DIGEST":     r.GetIdKeyDigest(),
			"AUTHOR_KEY_DIGEST": r.GetAuthorKeyDigest(),
			"FAMILY_ID":         r.GetFamilyId(),
			"IMAGE_ID":          r.GetImageId(),
			"REPORT_ID":         r.GetReportId(),
		},
		Warnings: warnings,
	}
}
