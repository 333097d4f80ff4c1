package vtpm

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/asn1"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	pb "github.com/google/go-tpm-tools/proto/tpm"
	"github.com/google/go-tpm-tools/quote"
	"github.com/google/go-tpm/legacy/tpm2"
	"google.golang.org/protobuf/proto"

	"github.com/openconstellation/constellation/pkg/api/attestation/hardwarepb"
	"github.com/openconstellation/constellation/pkg/api/attestation/vtpmpb"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/eventlog"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/untrusted"
)

// ValidatorConfig configures a TPM-quote validator.
type ValidatorConfig struct {
	Variant variant.Variant
	// The reference sets (or Active), MaxEvidenceSize, Now and Log.
	attestation.ValidatorCommon
	// AKRoots, when set, must have issued the certificate the evidence carries for its AK.
	// Without roots, something else must vouch for the AK (Hardware, whose report names the
	// key), or the caller must accept that nothing does (AcceptUnauthenticatedAK).
	AKRoots *x509.CertPool
	// AKIntermediates are certificates that may link an AK certificate to AKRoots (a cloud's
	// intermediate CAs). They are not trusted themselves.
	AKIntermediates *x509.CertPool
	// EventLog says what to do with the evidence's measurement event log; the zero value
	// replays a log that is present and accepts evidence without one.
	EventLog EventLogPolicy
	// EventLogCheck, when set, examines the replayed event log after every other check of the
	// quote passed: variants whose only evidence of a property is a firmware event (GCE's
	// confidential technology) require it here. It needs EventLog to be EventLogRequired, and
	// its errors wrap one of attestation's Err* reasons. The log is shared with later
	// validations of the same log (replays are remembered): read it, never modify it.
	EventLogCheck func(*eventlog.Log) error
	// Hardware, when set, checks the confidential-VM part of the evidence (Evidence.hardware):
	// the variants on SEV-SNP and TDX set it, and their evidence is refused without it. It
	// runs after the quote verified, with the quote's AK, so it can require that the
	// hardware report binds that key (or the nonce).
	Hardware HardwareCheck
	// AcceptUnauthenticatedAK accepts an AK that neither AKRoots nor Hardware vouches for:
	// the AK is then trusted because the evidence says so, and the quote proves only that
	// some holder of that key signed these PCR values. Any software key can (the attributes
	// of a TPMT_PUBLIC are claims, not proof): anyone who extends a TPM, or computes PCR
	// values, with the published measurements produces evidence that passes. NewValidator
	// refuses a configuration without AKRoots or Hardware unless this is set, and refuses it
	// together with AKRoots (it would be ignored); every result then has SignerCertified false
	// and carries UnauthenticatedAKWarning.
	AcceptUnauthenticatedAK bool
}

// EventLogPolicy says what a validator does with the measurement event log of evidence.
type EventLogPolicy int

const (
	// EventLogReplayIfPresent: a log that is present must replay to the quoted PCRs, or the
	// evidence is rejected; evidence without a log passes (its PCRs are still checked
	// against the reference sets). For platforms that may or may not keep a log.
	EventLogReplayIfPresent EventLogPolicy = iota
	// EventLogRequired: evidence must carry a log, and it must replay to the quoted PCRs.
	// The cloud variants, whose firmware always keeps one.
	EventLogRequired
	// EventLogIgnore: the log is neither read nor checked. Its content must then never be
	// used: nothing binds it to the quote.
	EventLogIgnore
)

func (p EventLogPolicy) String() string {
	switch p {
	case EventLogReplayIfPresent:
		return "replay-if-present"
	case EventLogRequired:
		return "required"
	case EventLogIgnore:
		return "ignore"
	}
	return fmt.Sprintf("EventLogPolicy(%d)", int(p))
}

// HardwareCheck checks the hardware evidence of a vTPM variant on a confidential VM. It must
// parse, verify (signatures to pinned roots, collateral) and validate (policy, and that the
// report binds ak, and the nonce if it is to be fresh) the hardware part, and return claims
// only when all passed; its errors wrap one of attestation's Err* reasons. A refusal that
// rests on collateral is an attestation.CollateralError, returned only when every other
// check of the hardware part passed; the validator holds it until its own checks passed too.
// Binding ak is what makes the AK trusted when no AK roots are configured: a validator with a
// HardwareCheck needs no AKRoots.
type HardwareCheck interface {
	Check(ctx context.Context, hw *hardwarepb.Hardware, ak crypto.PublicKey, akPublic []byte, nonce []byte) (*attestation.Hardware, error)
}

// UnauthenticatedAKWarning is in the warnings of every result of a validator that accepts
// unauthenticated AKs (ValidatorConfig.AcceptUnauthenticatedAK).
const UnauthenticatedAKWarning = "AK not authenticated: anyone who can run a TPM can produce this evidence"

// Validator checks TPM-quote evidence.
type Validator struct {
	cfg     ValidatorConfig
	akCerts *certCache
	replays *replayCache
}

// NewValidator checks cfg and returns a validator.
func NewValidator(cfg ValidatorConfig) (*Validator, error) {
	if cfg.Variant.IsZero() {
		return nil, errors.New("validator: no variant")
	}
	switch {
	case cfg.AcceptUnauthenticatedAK && cfg.AKRoots != nil:
		return nil, fmt.Errorf("validator %s: AK roots and AcceptUnauthenticatedAK exclude each other (with roots, every AK must chain to them)", cfg.Variant)
	case cfg.AKRoots == nil && cfg.Hardware == nil && !cfg.AcceptUnauthenticatedAK:
		return nil, fmt.Errorf("validator %s: no AK roots: nothing would tie the attestation key to a TPM, and a quote signed by any software key would pass; configure the platform's AK roots, or set AcceptUnauthenticatedAK to accept that", cfg.Variant)
	}
	if cfg.Active == nil {
		active, err := measurements.NewActive(cfg.Variant, cfg.ReferenceSets)
		if err != nil {
			return nil, fmt.Errorf("validator %s: %w", cfg.Variant, err)
		}
		cfg.Active = active
	} else if len(cfg.ReferenceSets) > 0 {
		return nil, fmt.Errorf("validator %s: both static and active reference sets configured", cfg.Variant)
	} else if cfg.Active.Variant().String() != cfg.Variant.String() {
		return nil, fmt.Errorf("validator %s: active reference sets are for variant %s", cfg.Variant, cfg.Active.Variant())
	}
	switch cfg.EventLog {
	case EventLogReplayIfPresent, EventLogIgnore:
		if cfg.EventLogCheck != nil {
			return nil, fmt.Errorf("validator %s: an event log check needs the event log policy %s, not %s", cfg.Variant, EventLogRequired, cfg.EventLog)
		}
	case EventLogRequired:
	default:
		return nil, fmt.Errorf("validator %s: unknown event log policy %d", cfg.Variant, int(cfg.EventLog))
	}
	if cfg.MaxEvidenceSize <= 0 {
		cfg.MaxEvidenceSize = attestation.DefaultMaxEvidenceSize
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.AcceptUnauthenticatedAK {
		cfg.Log.Warn("attestation keys are not authenticated: anyone who can run a TPM can produce passing evidence", "variant", cfg.Variant.String())
	}
	return &Validator{cfg: cfg, akCerts: newCertCache(1024), replays: newReplayCache(1024)}, nil
}

// Variant returns the variant this validator accepts.
func (v *Validator) Variant() variant.Variant { return v.cfg.Variant }

// parsed is evidence after step 1: well-formed, nothing checked yet.
type parsed struct {
	ev    *vtpmpb.Evidence
	akPub tpm2.Public
	pcrs  map[uint32][]byte
}

// Validate parses, verifies and evaluates evidence, in that order. The quote must bind
// attestation.ReportData(purpose, data).
func (v *Validator) Validate(ctx context.Context, evidence []byte, purpose attestation.Purpose, data []byte) (*attestation.Verified, error) {
	nonce, err := attestation.ReportData(purpose, data)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", attestation.ErrNonceMismatch, err)
	}
	return v.validate(ctx, evidence, nonce)
}

// ValidateReportData implements attestation.ReportDataValidator: the quote's qualifying data
// must be reportData (1..64 bytes), which hardware checks bind as they bind a nonce.
func (v *Validator) ValidateReportData(ctx context.Context, evidence, reportData []byte) (*attestation.Verified, error) {
	if err := attestation.CheckReportDataSize(reportData); err != nil {
		return nil, err
	}
	return v.validate(ctx, evidence, reportData)
}

// validate parses, verifies and evaluates evidence whose quote must bind nonce.
func (v *Validator) validate(ctx context.Context, evidence, nonce []byte) (*attestation.Verified, error) {
	p, err := v.parse(evidence)
	if err != nil {
		return nil, err
	}
	signer, key, err := v.verify(p, nonce)
	if err != nil {
		return nil, err
	}
	// Still verifying: only now are the PCR values authentic, so only now can the event log
	// be replayed against them.
	log, err := v.replayEventLog(p)
	if err != nil {
		return nil, err
	}
	var hw *attestation.Hardware
	// collateral is the hardware check's verdict that rests on collateral (CRLs, TCB info),
	// held until every check below, which needs none, passed.
	var collateral error
	switch {
	case v.cfg.Hardware != nil:
		if p.ev.Hardware == nil {
			return nil, fmt.Errorf("%w: no hardware evidence, and variant %s requires it", attestation.ErrMalformed, v.cfg.Variant)
		}
		hw, err = v.cfg.Hardware.Check(ctx, p.ev.Hardware, key, p.ev.AkPublic, nonce)
		if collateral, err = attestation.HoldCollateral(err); err != nil {
			return nil, err
		}
	case p.ev.Hardware != nil:
		// Evidence claiming hardware this validator does not check must not pass as if it
		// had been checked.
		return nil, fmt.Errorf("%w: hardware evidence for variant %s, which has none", attestation.ErrMalformed, v.cfg.Variant)
	}
	if v.cfg.EventLogCheck != nil {
		if err := v.cfg.EventLogCheck(log); err != nil {
			return nil, err
		}
	}
	match, err := v.cfg.Active.Load().Match(v.cfg.Variant, p.pcrs)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", attestation.ErrMeasurementPolicy, err)
	}
	// The collateral's verdict, last (docs/attestation.md "Verdict order").
	if collateral != nil {
		return nil, collateral
	}
	signerID, err := AKID(key)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", attestation.ErrMalformed, err)
	}
	out := &attestation.Verified{
		Variant:         v.cfg.Variant,
		Registers:       p.pcrs,
		ReferenceSet:    match.Set,
		SignerID:        signerID,
		SignerCertified: signer != nil,
		Hardware:        hw,
	}
	if signer != nil {
		out.SignerName = signer.Subject.CommonName
		out.SignerRole = AKCertRole(signer)
	}
	for _, w := range match.Warnings {
		out.Warnings = append(out.Warnings, w.Describe(v.cfg.Variant))
	}
	if v.cfg.AcceptUnauthenticatedAK {
		out.Warnings = append(out.Warnings, UnauthenticatedAKWarning)
	}
	return out, nil
}

// parse decodes the evidence and checks its shape.
func (v *Validator) parse(evidence []byte) (*parsed, error) {
	if len(evidence) > v.cfg.MaxEvidenceSize {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", attestation.ErrTooLarge, len(evidence), v.cfg.MaxEvidenceSize)
	}
	// Nothing (an empty file or body) decodes as a message with every field unset: it is no
	// evidence, not evidence of another variant.
	if len(evidence) == 0 {
		return nil, fmt.Errorf("%w: no evidence (0 bytes)", attestation.ErrMalformed)
	}
	ev := &vtpmpb.Evidence{}
	if err := proto.Unmarshal(evidence, ev); err != nil {
		return nil, fmt.Errorf("%w: %w", attestation.ErrMalformed, err)
	}
	if ev.Variant == "" {
		return nil, fmt.Errorf("%w: evidence names no variant", attestation.ErrMalformed)
	}
	if ev.Variant != v.cfg.Variant.String() {
		return nil, fmt.Errorf("%w: got %s, want %q", attestation.ErrWrongVariant, untrusted.Quote(ev.Variant), v.cfg.Variant)
	}
	for _, f := range []struct {
		name string
		val  []byte
	}{{"AK public key", ev.AkPublic}, {"quote", ev.Quote}, {"signature", ev.Signature}} {
		if len(f.val) == 0 {
			return nil, fmt.Errorf("%w: %s missing", attestation.ErrMalformed, f.name)
		}
	}
	if len(ev.Pcrs) != NumPCRs {
		return nil, fmt.Errorf("%w: %d PCR values, want %d", attestation.ErrMalformed, len(ev.Pcrs), NumPCRs)
	}
	pcrs := make(map[uint32][]byte, NumPCRs)
	for idx, val := range ev.Pcrs {
		if len(val) != sha256.Size {
			return nil, fmt.Errorf("%w: PCR %d value of %d bytes", attestation.ErrMalformed, idx, len(val))
		}
		pcrs[uint32(idx)] = val
	}
	akPub, err := DecodeAKPublic(ev.AkPublic)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", attestation.ErrMalformed, err)
	}
	return &parsed{ev: ev, akPub: akPub, pcrs: pcrs}, nil
}

// EventLogPolicy returns what the validator does with the evidence's event log.
func (v *Validator) EventLogPolicy() EventLogPolicy { return v.cfg.EventLog }

// CollateralLister is implemented by hardware checks that read collateral
// (attestation.CollateralLister).
type CollateralLister interface {
	CollateralURLs(hw *hardwarepb.Hardware) ([]string, error)
}

// CollateralURLs implements attestation.CollateralLister: the collateral the hardware check
// reads for evidence (none without a hardware check, or one that reads none).
func (v *Validator) CollateralURLs(evidence []byte) ([]string, error) {
	p, err := v.parse(evidence)
	if err != nil {
		return nil, err
	}
	l, ok := v.cfg.Hardware.(CollateralLister)
	if !ok || p.ev.Hardware == nil {
		return nil, nil
	}
	return l.CollateralURLs(p.ev.Hardware)
}

// DecodeAKPublic decodes an AK's TPMT_PUBLIC area and insists on its one encoding: no
// trailing bytes, nothing the TPM would encode differently. The area's bytes name the AK (its
// TPM name, what hardware evidence binds), so two encodings of one area must not both pass.
func DecodeAKPublic(raw []byte) (tpm2.Public, error) {
	pub, err := tpm2.DecodePublic(raw)
	if err != nil {
		return tpm2.Public{}, fmt.Errorf("AK public area: %w", err)
	}
	enc, err := pub.Encode()
	if err != nil {
		return tpm2.Public{}, fmt.Errorf("AK public area: %w", err)
	}
	if !bytes.Equal(enc, raw) {
		return tpm2.Public{}, fmt.Errorf("AK public area of %d bytes is not in its canonical %d-byte encoding", len(raw), len(enc))
	}
	return pub, nil
}

// CheckAKAttributes checks that pub describes an acceptable attestation key: a TPM-resident
// restricted signing key (only such a key cannot sign a TPMS_ATTEST the TPM did not produce),
// RSA of at least 2048 bits or ECC P-256/P-384, with parameters a TPM could have made it with
// (a known name and scheme hash, no symmetric or KDF scheme, the key size it states). It
// returns the decoded public key.
func CheckAKAttributes(pub tpm2.Public) (crypto.PublicKey, error) {
	if pub.Attributes&requiredAKAttributes != requiredAKAttributes {
		return nil, fmt.Errorf("AK is not a TPM-resident restricted signing key (attributes %#x)", uint32(pub.Attributes))
	}
	if !knownHash(pub.NameAlg) {
		return nil, fmt.Errorf("AK name algorithm %#x", uint16(pub.NameAlg))
	}
	key, err := pub.Key()
	if err != nil {
		return nil, fmt.Errorf("AK public key: %w", err)
	}
	switch k := key.(type) {
	case *rsa.PublicKey:
		if k.N.BitLen() < 2048 {
			return nil, fmt.Errorf("RSA AK of %d bits", k.N.BitLen())
		}
		p := pub.RSAParameters
		if int(p.KeyBits) != k.N.BitLen() {
			return nil, fmt.Errorf("RSA AK states %d bits, its modulus has %d", p.KeyBits, k.N.BitLen())
		}
		if err := checkAKSchemes(p.Symmetric, p.Sign, tpm2.AlgRSASSA, tpm2.AlgRSAPSS); err != nil {
			return nil, err
		}
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() && k.Curve != elliptic.P384() {
			return nil, fmt.Errorf("ECC AK on curve %s", k.Curve.Params().Name)
		}
		p := pub.ECCParameters
		if p.KDF != nil && !p.KDF.Alg.IsNull() {
			return nil, fmt.Errorf("ECC AK with KDF scheme %#x", uint16(p.KDF.Alg))
		}
		if err := checkAKSchemes(p.Symmetric, p.Sign, tpm2.AlgECDSA); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("AK of type %T", k)
	}
	return key, nil
}

// checkAKSchemes checks a signing key's schemes: no symmetric scheme (a TPM refuses one for a
// signing key) and either no signing scheme or one of sigAlgs over a known hash.
func checkAKSchemes(sym *tpm2.SymScheme, sig *tpm2.SigScheme, sigAlgs ...tpm2.Algorithm) error {
	if sym != nil && !sym.Alg.IsNull() {
		return fmt.Errorf("AK with symmetric scheme %#x", uint16(sym.Alg))
	}
	if sig == nil || sig.Alg.IsNull() {
		return nil
	}
	if !slices.Contains(sigAlgs, sig.Alg) || !knownHash(sig.Hash) {
		return fmt.Errorf("AK signing scheme %#x with hash %#x", uint16(sig.Alg), uint16(sig.Hash))
	}
	return nil
}

func knownHash(alg tpm2.Algorithm) bool {
	return alg == tpm2.AlgSHA256 || alg == tpm2.AlgSHA384 || alg == tpm2.AlgSHA512 || alg == tpm2.AlgSHA1
}

// AKID identifies an AK by its key (SHA-256 of its PKIX encoding, hex): unlike a hash of the
// public area, an attacker cannot vary it by restating the key's attributes or parameters.
func AKID(key crypto.PublicKey) (string, error) {
	der, err := x509.MarshalPKIXPublicKey(key)
	if err != nil {
		return "", fmt.Errorf("AK public key: %w", err)
	}
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:]), nil
}

// requiredAKAttributes make a key a TPM-resident restricted signing key: only such a key
// cannot sign a TPMS_ATTEST structure that the TPM did not produce itself.
const requiredAKAttributes = tpm2.FlagFixedTPM | tpm2.FlagFixedParent | tpm2.FlagSensitiveDataOrigin | tpm2.FlagRestricted | tpm2.FlagSign

// verify establishes trust in the AK (when roots are configured) and checks the quote: its
// signature by the AK, its binding to nonce, and that the PCR values are the quoted ones. It
// returns the verified AK certificate (nil when no roots are configured) and the AK.
func (v *Validator) verify(p *parsed, nonce []byte) (*x509.Certificate, crypto.PublicKey, error) {
	key, err := CheckAKAttributes(p.akPub)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", attestation.ErrUntrustedSigner, err)
	}
	var cert *x509.Certificate
	if v.cfg.AKRoots != nil {
		if cert, err = v.verifyAKCert(p, key); err != nil {
			return nil, nil, err
		}
	}

	q := &pb.Quote{Quote: p.ev.Quote, RawSig: p.ev.Signature, Pcrs: &pb.PCRs{Hash: pb.HashAlgo_SHA256, Pcrs: p.pcrs}}
	if err := quote.Verify(q, key, nonce); err != nil {
		return nil, nil, classifyQuoteError(q, key, nonce, err)
	}
	return cert, key, nil
}

// replayEventLog replays the evidence's event log against the quoted (verified) PCR values,
// as the event log policy says. It returns the replayed log, or nil when there is none or
// the policy ignores it.
func (v *Validator) replayEventLog(p *parsed) (*eventlog.Log, error) {
	switch {
	case v.cfg.EventLog == EventLogIgnore:
		return nil, nil
	case len(p.ev.EventLog) == 0 && v.cfg.EventLog == EventLogRequired:
		return nil, fmt.Errorf("%w: no event log, and variant %s requires one", attestation.ErrMalformed, v.cfg.Variant)
	case len(p.ev.EventLog) == 0:
		return nil, nil
	}
	return v.replays.replay(p.ev.EventLog, p.pcrs)
}

// classifyQuoteError names why go-tpm-tools rejected a quote. The library's verdict stands;
// this only picks the reason reported to the caller: the first cryptographic failure
// (signature, then the PCR values against the quoted digest) before a nonce that is not
// ours, so that a quote both replayed and tampered with is reported as tampered with.
func classifyQuoteError(q *pb.Quote, key crypto.PublicKey, nonce []byte, err error) error {
	if att, decErr := tpm2.DecodeAttestationData(q.GetQuote()); decErr == nil && !bytes.Equal(att.ExtraData, nonce) {
		// Everything but the nonce: what fails there is reported; if nothing does, the
		// nonce was the problem.
		if cryptoErr := quote.Verify(q, key, att.ExtraData); cryptoErr != nil {
			return fmt.Errorf("%w: %w", attestation.ErrBadSignature, cryptoErr)
		}
		return fmt.Errorf("%w: quote was made for another purpose or nonce (replayed, for another connection, or signed for another interface of the node)", attestation.ErrNonceMismatch)
	}
	return fmt.Errorf("%w: %w", attestation.ErrBadSignature, err)
}

// oidSubjectAltName is the X.509 subject alternative name extension.
var oidSubjectAltName = asn1.ObjectIdentifier{2, 5, 29, 17}

func (v *Validator) verifyAKCert(p *parsed, key crypto.PublicKey) (*x509.Certificate, error) {
	if len(p.ev.AkCert) == 0 {
		return nil, fmt.Errorf("%w: no AK certificate, and AK roots are configured", attestation.ErrUntrustedSigner)
	}
	now := v.cfg.Now()
	cert, err := v.akCerts.verify(p.ev.AkCert, now, func(cert *x509.Certificate) ([][]*x509.Certificate, error) {
		// Clouds (GCE) mark the subject alternative name of AK certificates critical, with
		// name forms Go does not parse, so Go lists it as unhandled and refuses the chain.
		// Nothing here reads the SAN; the chain is what matters (as go-tpm-tools does).
		cert.UnhandledCriticalExtensions = slices.DeleteFunc(cert.UnhandledCriticalExtensions, func(oid asn1.ObjectIdentifier) bool {
			return oid.Equal(oidSubjectAltName)
		})
		return cert.Verify(x509.VerifyOptions{
			Roots:         v.cfg.AKRoots,
			Intermediates: v.cfg.AKIntermediates,
			CurrentTime:   now,
			KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
		})
	})
	if err != nil {
		return nil, fmt.Errorf("%w: AK certificate: %w", attestation.ErrUntrustedSigner, err)
	}
	certKey, ok := cert.PublicKey.(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !certKey.Equal(key) {
		return nil, fmt.Errorf("%w: AK certificate is for another key", attestation.ErrUntrustedSigner)
	}
	return cert, nil
}
