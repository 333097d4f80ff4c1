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

	"github.com/openconstellation/constellation/api/attestation/hardwarepb"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/collateral"
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

	// roots replaces the pinned Intel root in this package's tests only (a fake Intel
	// PKI signs quotes the canned ones cannot be); nothing outside the package can set it.
	roots *x509.CertPool
}

// Quote is the body of a TD quote whose signature, PCK chain, QE report and collateral
// all verified. It exists only after VerifyQuote succeeded.
type Quote struct {
	// TeeTcbSvn is the TEE_TCB_SVN (16 bytes): the TDX module's security versions.
	TeeTcbSvn []byte
	// MrSeam measures the TDX module (48 bytes).
	MrSeam []byte
	// TdAttributes are the TD's attributes (8 bytes, little-endian; bit 0 is DEBUG).
	TdAttributes []byte
	// Xfam are the TD's extended CPU features (8 bytes, little-endian).
	Xfam []byte
	// MrTd measures the TD's initial memory (the virtual firmware), 48 bytes.
	MrTd []byte
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

// VerifyQuote parses and verifies a TD quote: the quote's ECDSA signature over header and
// body with the attestation key, the QE report binding that key, the QE report's signature
// with the PCK certificate, the PCK chain up to the pinned Intel SGX Root CA, the PCK and
// root CRLs, and the TCB status of the platform and of the quoting enclave against Intel's
// TCB info and QE identity (both signed, both fresh). Collateral comes from opts.Collateral
// (and, for this call only, from carried). It returns the body only when every check passed;
// errors wrap one attestation.Err* reason and name what failed.
func VerifyQuote(ctx context.Context, raw []byte, carried []*hardwarepb.Collateral, opts VerifyOptions) (*Quote, error) {
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
	roots := opts.roots
	if roots == nil {
		roots = trustedRoots()
	}
	getter := &recordingGetter{g: collateral.TDXGetter{S: opts.Collateral.Session(ctx, carried)}}
	vopts := &verify.Options{
		TrustedRoots:     roots,
		GetCollateral:    true,
		CheckRevocations: true,
		Getter:           getter,
		Now:              &verify.TimeSet{PckCertChain: t, TcbInfo: t, QeIdentity: t, PckCrl: t, RootCaCrl: t},
	}
	if err := verify.TdxQuoteContext(ctx, quote, vopts); err != nil {
		return nil, classifyVerifyError(err, getter.err())
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
	for i, r := range body.GetRtmrs() {
		q.Rtmrs[i] = bytes.Clone(r)
	}
	return q, nil
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
