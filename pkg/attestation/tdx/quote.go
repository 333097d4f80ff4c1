package tdx

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/google/go-tdx-guest/abi"
	"github.com/google/go-tdx-guest/pcs"
	pb "github.com/google/go-tdx-guest/proto/tdx"
	"github.com/google/go-tdx-guest/validate"
	"github.com/google/go-tdx-guest/verify"

	"github.com/openconstellation/constellation/pkg/api/attestation/hardwarepb"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/collateral"
	"github.com/openconstellation/constellation/pkg/untrusted"
)

// MaxQuoteSize bounds a TD quote. A version 4 quote with its PCK chain is about 5 KiB; the
// kernel's quote buffer is 16 KiB.
const MaxQuoteSize = 16 << 10

// QuoteVersion is the only TD quote version accepted.
const QuoteVersion = 4

// VerifyOptions configures VerifyQuote.
type VerifyOptions struct {
	// Collateral is the shared collateral cache TCB info, QE identity and CRLs are taken
	// from (required).
	Collateral *collateral.Cache
	// Now is the time certificates and collateral are checked at; nil means the cache's
	// time, so documents are fetched and checked at the same instant.
	Now func() time.Time
	// Revocation says what it means when Intel's collateral (PCK and root CA CRLs, TCB
	// info, QE identity) is not at hand or past its next update; the zero value rejects
	// (attestation.RevocationPolicy), in Quote.Claims. Under RevocationUnknownAccepted such
	// a quote passes with Quote.CollateralUnknown set: its signatures and PCK chain
	// verified, but neither revocation nor the platform's TCB status was checked.
	Revocation attestation.RevocationPolicy

	// root replaces the pinned Intel root in this package's tests only (a fake Intel
	// PKI signs quotes the canned ones cannot be); nothing outside the package can set it.
	root *x509.Certificate
}

// Quote is the body of a TD quote whose signature, QE report and PCK chain to the pinned
// root verified. From VerifyQuote, its collateral verified too; from
// VerifyQuoteHoldingCollateral, the verdict of Intel's collateral is held in it, and Claims
// gives it: the last step of a validator, after its own checks of the body (binding,
// reference), so that a quote those refuse is refused for that, whatever the collateral says
// or whether it is at hand (docs/attestation.md "Verdict order"). It exists only after one
// of them succeeded.
type Quote struct {
	// TeeTcbSvn is the TEE_TCB_SVN (16 bytes): the TDX module's security versions.
	TeeTcbSvn []byte
	// MrSeam measures the TDX module (48 bytes).
	MrSeam []byte
	// MrSignerSeam and SeamAttributes describe the TDX module's signer and attributes (Intel
	// TCB info pins them for Intel's modules; verification checks that).
	MrSignerSeam   []byte
	SeamAttributes []byte
	// TdAttributes are the TD's attributes (8 bytes, little-endian; bit 0 is DEBUG).
	TdAttributes []byte
	// Xfam are the TD's extended CPU features (8 bytes, little-endian).
	Xfam []byte
	// MrTd measures the TD's initial memory (the virtual firmware), 48 bytes.
	MrTd []byte
	// MrConfigID, MrOwner and MrOwnerConfig are set by the host at TD creation (48 bytes
	// each); qemu-tdx does not use them, a variant comparing a TDREPORT with the quote
	// compares them too.
	MrConfigID    []byte
	MrOwner       []byte
	MrOwnerConfig []byte
	// Rtmrs are the run-time measurement registers RTMR0..3, 48 bytes each.
	Rtmrs [4][]byte
	// ReportData is the 64 bytes the TD put into its report.
	ReportData []byte
	// QEVendorID, QESvn and PCESvn come from the quote header.
	QEVendorID []byte
	QESvn      uint16
	PCESvn     uint16
	// FMSPC names the platform's family, model and stepping (from the PCK certificate),
	// for example "50806f000000".
	FMSPC string
	// PCKCertificate is the platform's PCK certificate, which certified the quoting
	// enclave's report.
	PCKCertificate *x509.Certificate
	// CollateralUnknown is nil when Intel's collateral was checked or refuses the quote
	// (Claims says which). Otherwise it says why the collateral was not at hand, and
	// VerifyOptions.Revocation accepted that.
	CollateralUnknown error

	// collateral is the verdict of Intel's collateral that Claims gives: nil, or an
	// attestation.CollateralError (revoked, TCB status not UpToDate, or not at hand when
	// the revocation policy requires it).
	collateral error

	proto *pb.QuoteV4
}

// Measurements returns the quote's launch measurements by name, for output and logs.
func (q *Quote) Measurements() map[string][]byte {
	m := map[string][]byte{"MRTD": q.MrTd, "MRSEAM": q.MrSeam}
	for i, r := range q.Rtmrs {
		m[fmt.Sprintf("RTMR%d", i)] = r
	}
	return m
}

// Claims gives the verdict of Intel's collateral that VerifyQuoteHoldingCollateral held (an
// attestation.CollateralError: the PCK chain revoked, a TCB status other than UpToDate, or
// the collateral not at hand when the revocation policy requires it) and, if it passes, the
// claims of the quote for the hardware reference named reference. Call it last, after every
// check of the quote that needs no collateral: binding, reference, measurement registers.
func (q *Quote) Claims(reference string) (*attestation.Hardware, error) {
	if q.collateral != nil {
		return nil, q.collateral
	}
	claims := &attestation.Hardware{
		Technology:        "TDX",
		Product:           "fmspc " + q.FMSPC,
		Signer:            "PCK",
		TCB:               q.TCB(),
		Reference:         reference,
		Measurements:      q.Measurements(),
		RevocationChecked: q.CollateralUnknown == nil,
	}
	if q.CollateralUnknown != nil {
		claims.Warnings = []string{fmt.Sprintf("revocation and TCB status not checked (policy %s): %v", attestation.RevocationUnknownAccepted, q.CollateralUnknown)}
	}
	return claims, nil
}

// TCB describes the quote's trusted computing base, for humans.
func (q *Quote) TCB() string {
	return fmt.Sprintf("TEE_TCB_SVN %s, QE SVN %d, PCE SVN %d", hex.EncodeToString(q.TeeTcbSvn), q.QESvn, q.PCESvn)
}

// ParseQuote decodes a raw TD quote, version 4 only, with size limits. It checks the
// encoding only: nothing in the result is authentic. Errors wrap attestation.ErrTooLarge or
// attestation.ErrMalformed.
func ParseQuote(raw []byte) (q *pb.QuoteV4, err error) {
	// go-tdx-guest slices the quote by sizes read from it; a bound it misses must not
	// crash the verifier. (The fuzz target calls parseQuote, without this net, so that it
	// finds such bounds rather than hides them.)
	defer func() {
		if r := recover(); r != nil {
			q, err = nil, fmt.Errorf("TD quote: parser panicked: %v: %w", r, attestation.ErrMalformed)
		}
	}()
	return parseQuote(raw)
}

func parseQuote(raw []byte) (*pb.QuoteV4, error) {
	if len(raw) > MaxQuoteSize {
		return nil, fmt.Errorf("TD quote: %d bytes, limit %d: %w", len(raw), MaxQuoteSize, attestation.ErrTooLarge)
	}
	if len(raw) < 2 {
		return nil, fmt.Errorf("TD quote: %d bytes: %w", len(raw), attestation.ErrMalformed)
	}
	if v := binary.LittleEndian.Uint16(raw); v != QuoteVersion {
		return nil, fmt.Errorf("TD quote: version %d, only %d is supported: %w", v, QuoteVersion, attestation.ErrMalformed)
	}
	if err := checkLayout(raw); err != nil {
		return nil, fmt.Errorf("TD quote: %w: %w", err, attestation.ErrMalformed)
	}
	parsed, err := abi.QuoteToProto(raw)
	if err != nil {
		return nil, fmt.Errorf("TD quote: %v: %w", err, attestation.ErrMalformed)
	}
	quote, ok := parsed.(*pb.QuoteV4)
	if !ok {
		return nil, fmt.Errorf("TD quote: decoded as %T: %w", parsed, attestation.ErrMalformed)
	}
	if quote.GetHeader().GetTeeType() != abi.TeeTDX {
		return nil, fmt.Errorf("TD quote: header TEE type 0x%x is not TDX: %w", quote.GetHeader().GetTeeType(), attestation.ErrMalformed)
	}
	// Bytes after the signed data (quote providers pad quotes to their buffer size) are
	// signed by nothing: they are dropped here, so nothing can ever read them.
	quote.ExtraBytes = nil
	return quote, nil
}

// Layout of a version 4 quote's signed data (Intel TDX DCAP quote format): the size fields
// go-tdx-guest slices by, checked before it does (it misses some: FuzzParseQuote).
const (
	quoteHeaderSize   = 48
	quoteBodySize     = 584
	signedSizeOffset  = quoteHeaderSize + quoteBodySize
	signedDataOffset  = signedSizeOffset + 4
	sigAndKeySize     = 64 + 64 // quote signature, attestation key
	certHeaderSize    = 2 + 4   // certification data type, size
	qeReportAndSigLen = 384 + 64
	qeAuthSizeLen     = 2
)

// checkLayout checks that every size field of the signed data stays inside the quote.
func checkLayout(raw []byte) error {
	if len(raw) < signedDataOffset {
		return fmt.Errorf("%d bytes, shorter than header and body", len(raw))
	}
	signedSize := uint64(binary.LittleEndian.Uint32(raw[signedSizeOffset:]))
	if signedSize > uint64(len(raw)-signedDataOffset) {
		return fmt.Errorf("signed data size %d exceeds the %d bytes that follow", signedSize, len(raw)-signedDataOffset)
	}
	signed := raw[signedDataOffset : signedDataOffset+int(signedSize)]
	if len(signed) < sigAndKeySize+certHeaderSize {
		return fmt.Errorf("signed data of %d bytes, too short for signature, key and certification data", len(signed))
	}
	certSize := uint64(binary.LittleEndian.Uint32(signed[sigAndKeySize+2:]))
	cert := signed[sigAndKeySize+certHeaderSize:]
	if certSize != uint64(len(cert)) {
		return fmt.Errorf("certification data size %d, but %d bytes follow", certSize, len(cert))
	}
	if len(cert) < qeReportAndSigLen+qeAuthSizeLen {
		return fmt.Errorf("certification data of %d bytes, too short for the QE report", len(cert))
	}
	authSize := int(binary.LittleEndian.Uint16(cert[qeReportAndSigLen:]))
	if rest := len(cert) - qeReportAndSigLen - qeAuthSizeLen; authSize+certHeaderSize > rest {
		return fmt.Errorf("QE auth data size %d leaves no room for the PCK chain in %d bytes", authSize, rest)
	}
	return nil
}

// VerifyQuote parses and verifies a TD quote: the quote's ECDSA signature over header and
// body with the attestation key, the QE report binding that key, the QE report's signature
// with the PCK certificate, the PCK chain up to the pinned Intel SGX Root CA, then, with
// Intel's collateral, the PCK and root CRLs and the TCB status of the platform and of the
// quoting enclave against Intel's TCB info and QE identity (both signed, both fresh), under
// opts.Revocation. Collateral comes from opts.Collateral (and, for this call only, from
// carried). It returns the body only when every check passed; errors wrap one
// attestation.Err* reason and name what failed. A caller that checks the body further (a
// validator: binding, reference) uses VerifyQuoteHoldingCollateral instead, so that its
// checks come before the collateral's verdict.
func VerifyQuote(ctx context.Context, raw []byte, carried []*hardwarepb.Collateral, opts VerifyOptions) (*Quote, error) {
	q, err := VerifyQuoteHoldingCollateral(ctx, raw, carried, opts)
	if err != nil {
		return nil, err
	}
	if q.collateral != nil {
		return nil, q.collateral
	}
	return q, nil
}

// VerifyQuoteHoldingCollateral is VerifyQuote, but the verdict of Intel's collateral (a
// refusal, or an unknown status that opts.Revocation does not accept) is held in the quote
// rather than returned: the quote is returned once its signatures and PCK chain verified,
// and Quote.Claims gives the verdict, to be called after the caller's own checks of the body
// (docs/attestation.md "Verdict order").
func VerifyQuoteHoldingCollateral(ctx context.Context, raw []byte, carried []*hardwarepb.Collateral, opts VerifyOptions) (*Quote, error) {
	// 1. Parse.
	quote, err := ParseQuote(raw)
	if err != nil {
		return nil, err
	}

	// 2. Verify.
	if opts.Collateral == nil {
		return nil, errors.New("TD quote: no collateral cache configured")
	}
	now := opts.Now
	if now == nil {
		now = opts.Collateral.Now
	}
	t := now()
	status, err := verifyQuoteSignatures(ctx, quote, carried, opts, rootOrPinned(opts.root), t)
	if err != nil {
		return nil, err
	}
	chain, err := verify.ExtractChainFromQuote(quote)
	if err != nil {
		return nil, fmt.Errorf("TD quote: PCK chain: %v: %w", err, attestation.ErrUntrustedSigner)
	}
	exts, err := pcs.PckCertificateExtensions(chain.PCKCertificate)
	if err != nil {
		return nil, fmt.Errorf("TD quote: PCK certificate extensions: %v: %w", err, attestation.ErrUntrustedSigner)
	}

	body := quote.GetTdQuoteBody()
	q := &Quote{
		TeeTcbSvn:      bytes.Clone(body.GetTeeTcbSvn()),
		MrSeam:         bytes.Clone(body.GetMrSeam()),
		MrSignerSeam:   bytes.Clone(body.GetMrSignerSeam()),
		SeamAttributes: bytes.Clone(body.GetSeamAttributes()),
		MrConfigID:     bytes.Clone(body.GetMrConfigId()),
		MrOwner:        bytes.Clone(body.GetMrOwner()),
		MrOwnerConfig:  bytes.Clone(body.GetMrOwnerConfig()),
		TdAttributes:   bytes.Clone(body.GetTdAttributes()),
		Xfam:           bytes.Clone(body.GetXfam()),
		MrTd:           bytes.Clone(body.GetMrTd()),
		ReportData:     bytes.Clone(body.GetReportData()),
		QEVendorID:     bytes.Clone(quote.GetHeader().GetQeVendorId()),
		QESvn:          binary.LittleEndian.Uint16(quote.GetHeader().GetQeSvn()),
		PCESvn:         binary.LittleEndian.Uint16(quote.GetHeader().GetPceSvn()),
		FMSPC:          strings.ToLower(exts.FMSPC),
		PCKCertificate: chain.PCKCertificate,
		proto:          quote,
	}
	switch {
	case status.refused != nil:
		q.collateral = &attestation.CollateralError{Err: status.refused}
	case status.unknown != nil && opts.Revocation != attestation.RevocationUnknownAccepted:
		q.collateral = &attestation.CollateralError{Err: fmt.Errorf("TD quote: Intel's collateral: %w (revocation policy %s; decided last, after every check that needs no collateral passed): %w", status.unknown, opts.Revocation, attestation.ErrRevocationUnknown)}
	case status.unknown != nil:
		q.CollateralUnknown = status.unknown
	}
	for i, r := range body.GetRtmrs() {
		q.Rtmrs[i] = bytes.Clone(r)
	}
	return q, nil
}

// collateralStatus is what Intel's collateral said of a quote whose signatures and PCK chain
// verified. Both nil: every document was at hand and accepts the quote.
type collateralStatus struct {
	// unknown says why a document could not be had (for the revocation policy to decide).
	unknown error
	// refused says why the collateral at hand refuses the quote (whatever the policy).
	refused error
}

// verifyQuoteSignatures has go-tdx-guest verify the quote with Intel's collateral
// (revocation, TCB info, QE identity). Every document of collateralURLs is looked up first
// (cached, carried or fetched). When one cannot be had (or the quote names none), the quote's
// signatures, QE report and PCK chain to the pinned root are verified alone; when the
// library refuses the quote with its collateral, they are verified alone to learn whether
// the collateral is what refuses it. Either way a quote whose signatures or chain fail is
// refused for that (the error), and what the collateral says of the others is returned in
// the status, for the caller's verdict after its own checks: an offline verifier tells a
// forged quote (bad signature) from a genuine one whose collateral is missing. With every
// document at hand and the quote accepted, one pass checks everything (the warm path costs
// what it did before the offline verdicts).
func verifyQuoteSignatures(ctx context.Context, quote *pb.QuoteV4, carried []*hardwarepb.Collateral, opts VerifyOptions, root *x509.Certificate, t time.Time) (collateralStatus, error) {
	roots := x509.NewCertPool()
	roots.AddCert(root)
	at := &verify.TimeSet{PckCertChain: t, TcbInfo: t, QeIdentity: t, PckCrl: t, RootCaCrl: t}
	session := opts.Collateral.Session(ctx, carried)
	urls, urlErr := collateralURLs(quote, root)
	var missing error
	for _, url := range urls {
		if _, err := session.Get(url); err != nil {
			missing = err
			break
		}
	}
	withoutCollateral := func() error {
		if err := verify.TdxQuoteContext(ctx, quote, &verify.Options{TrustedRoots: roots, Now: at}); err != nil {
			return classifyVerifyError(err, nil)
		}
		return nil
	}
	if urlErr != nil || missing != nil {
		if err := withoutCollateral(); err != nil {
			return collateralStatus{}, err
		}
		if urlErr != nil {
			return collateralStatus{}, fmt.Errorf("TD quote: %v: %w", urlErr, attestation.ErrUntrustedSigner)
		}
		return collateralStatus{unknown: fmt.Errorf("collateral of Intel: %w", missing)}, nil
	}
	getter := &recordingGetter{g: collateral.TDXGetter{S: session}}
	if err := verify.TdxQuoteContext(ctx, quote, &verify.Options{TrustedRoots: roots, GetCollateral: true, CheckRevocations: true, Getter: getter, Now: at}); err != nil {
		// go-tdx-guest checks the collateral before the quote's signature: learn whether
		// the quote itself fails.
		if sigErr := withoutCollateral(); sigErr != nil {
			return collateralStatus{}, sigErr
		}
		return collateralStatus{refused: collateralRefusal(err, getter.err())}, nil
	}
	return collateralStatus{}, nil
}

// collateralRefusal names why go-tdx-guest refused, with Intel's collateral, a quote whose
// signatures and PCK chain verified without it: the collateral (a revocation, a TCB status,
// a document that does not verify) refuses its signer. A collateral lookup failure is wrapped
// as well (collateral.ErrStale, collateral.ErrOffline).
func collateralRefusal(err, getterErr error) error {
	if getterErr != nil {
		return fmt.Errorf("TD quote: Intel's collateral refuses it: %v (collateral: %w): %w", err, getterErr, attestation.ErrUntrustedSigner)
	}
	return fmt.Errorf("TD quote: Intel's collateral refuses it: %v: %w", err, attestation.ErrUntrustedSigner)
}

// CollateralURLs returns the URLs of the Intel collateral VerifyQuote reads for a TD quote:
// the TCB info of its platform's FMSPC, the TDX QE identity, the CRL of the CA that issued
// its PCK certificate, and the Intel SGX Root CA's CRL. An offline verifier fetches them
// ahead (over HTTPS from Intel's PCS) and hands them to the collateral cache
// (collateral.Cache.Put) or carries them with the evidence. The quote is parsed, not verified.
func CollateralURLs(raw []byte) ([]string, error) { return rawCollateralURLs(raw, nil) }

// rawCollateralURLs is CollateralURLs for a quote chaining to root (nil: the pinned root).
func rawCollateralURLs(raw []byte, root *x509.Certificate) ([]string, error) {
	quote, err := ParseQuote(raw)
	if err != nil {
		return nil, err
	}
	urls, err := collateralURLs(quote, rootOrPinned(root))
	if err != nil {
		return nil, fmt.Errorf("TD quote: %v: %w", err, attestation.ErrMalformed)
	}
	return urls, nil
}

// pckCAs are the CAs that issue PCK certificates, by subject common name, with the name
// Intel's PCS knows them by.
var pckCAs = map[string]string{
	"Intel SGX PCK Processor CA": "processor",
	"Intel SGX PCK Platform CA":  "platform",
}

func collateralURLs(quote *pb.QuoteV4, root *x509.Certificate) ([]string, error) {
	chain, err := verify.ExtractChainFromQuote(quote)
	if err != nil {
		return nil, fmt.Errorf("PCK chain: %v", err)
	}
	exts, err := pcs.PckCertificateExtensions(chain.PCKCertificate)
	if err != nil {
		return nil, fmt.Errorf("PCK certificate extensions: %v", err)
	}
	ca, ok := pckCAs[chain.PCKCertificate.Issuer.CommonName]
	if !ok {
		return nil, fmt.Errorf("PCK certificate issued by %s, not a PCK CA", untrusted.Quote(chain.PCKCertificate.Issuer.CommonName))
	}
	if len(root.CRLDistributionPoints) != 1 {
		return nil, fmt.Errorf("the Intel root has %d CRL distribution points, want 1", len(root.CRLDistributionPoints))
	}
	return []string{pcs.TcbInfoURL(exts.FMSPC), pcs.QeIdentityURL(), pcs.PckCrlURL(ca), root.CRLDistributionPoints[0]}, nil
}

// classifyVerifyError maps go-tdx-guest's verification errors (mostly formatted strings)
// to a reason: a signature that does not verify is ErrBadSignature; everything else (chain,
// revocation, collateral, TCB status) means the signer cannot be trusted. A collateral
// lookup failure is wrapped as well, so callers can tell stale or missing collateral
// (collateral.ErrStale, collateral.ErrOffline) from a bad quote.
func classifyVerifyError(err, getterErr error) error {
	reason := attestation.ErrUntrustedSigner
	msg := err.Error()
	switch {
	case errors.Is(err, verify.ErrHashVerificationFail):
		msg = "quote signature over header and TD quote body does not verify with the attestation key"
		reason = attestation.ErrBadSignature
	case errors.Is(err, verify.ErrSHA56VerificationFail) || strings.Contains(msg, "QE report data"):
		msg = "QE report data does not bind the attestation key: " + msg
		reason = attestation.ErrBadSignature
	case strings.Contains(msg, "QE report's signature"), strings.Contains(msg, "attestation key in the quote is invalid"):
		reason = attestation.ErrBadSignature
	}
	if getterErr != nil {
		return fmt.Errorf("TD quote: %s (collateral: %w): %w", msg, getterErr, reason)
	}
	return fmt.Errorf("TD quote: %s: %w", msg, reason)
}

// recordingGetter keeps the first error the collateral session returned: go-tdx-guest
// formats it into a string, and callers need errors.Is(err, collateral.ErrStale).
type recordingGetter struct {
	g collateral.TDXGetter

	mu    sync.Mutex
	first error
}

func (r *recordingGetter) Get(url string) (map[string][]string, []byte, error) {
	h, b, err := r.g.Get(url)
	if err != nil {
		r.mu.Lock()
		if r.first == nil {
			r.first = err
		}
		r.mu.Unlock()
	}
	return h, b, err
}

func (r *recordingGetter) GetContext(_ context.Context, url string) (map[string][]string, []byte, error) {
	return r.Get(url)
}

func (r *recordingGetter) err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.first
}

// Validate checks a verified quote against a reference: MRSEAM is one of the accepted
// values, TD attributes and XFAM are the required values (and DEBUG is never set, whatever
// the reference says), TEE_TCB_SVN is at least the minimum component-wise, and the QE vendor
// and QE/PCE security versions are as required. Errors wrap attestation.ErrMeasurementPolicy
// and name every field that failed.
func (q *Quote) Validate(ref Reference) error {
	if err := ref.Validate(); err != nil {
		return fmt.Errorf("TD quote: %w: %w", err, attestation.ErrMeasurementPolicy)
	}
	var errs []error
	if binary.LittleEndian.Uint64(q.TdAttributes)&AttributeDebug != 0 {
		errs = append(errs, errors.New("TD_ATTRIBUTES has the DEBUG bit set: the host can read the TD's memory"))
	}
	if !anyEqual(q.MrSeam, ref.MrSeam) {
		errs = append(errs, fmt.Errorf("MR_SEAM %x is none of the %d accepted TDX module measurement(s)", q.MrSeam, len(ref.MrSeam)))
	}
	// go-tdx-guest checks the exact fields, the minimum SVNs and the architectural XFAM
	// and attribute constraints, naming each field.
	if err := validate.TdxQuote(q.proto, &validate.Options{
		HeaderOptions: validate.HeaderOptions{
			QeVendorID:    ref.qeVendorID(),
			MinimumQeSvn:  ref.MinimumQESvn,
			MinimumPceSvn: ref.MinimumPCESvn,
		},
		TdQuoteBodyOptions: validate.TdQuoteBodyOptions{
			TdAttributes:     ref.TdAttributes,
			Xfam:             ref.Xfam,
			MinimumTeeTcbSvn: ref.MinimumTeeTcbSvn,
		},
	}); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("TD quote does not match TDX reference %q: %v: %w", ref.Name, err, attestation.ErrMeasurementPolicy)
	}
	return nil
}

func anyEqual(v []byte, accepted []HexBytes) bool {
	for _, a := range accepted {
		if bytes.Equal(v, a) {
			return true
		}
	}
	return false
}
