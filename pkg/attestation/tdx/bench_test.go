package tdx

import (
	"context"
	"testing"

	"github.com/openconstellation/constellation/pkg/attestation"
)

// BenchmarkVerifyQuote measures VerifyQuote and Validate of one quote with warm collateral
// (everything cached, nothing fetched): the cost of a join or an attested handshake.
func BenchmarkVerifyQuote(b *testing.B) {
	intel := newFakeIntel(b)
	raw := intel.quote(b, make([]byte, 64), nil)
	opts := VerifyOptions{Collateral: newCache(&fixedClock{t: cannedNow}, intel.pcs()), root: intel.root}
	ref := cannedReference(b)
	ctx := context.Background()
	if _, err := VerifyQuote(ctx, raw, nil, opts); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		q, err := VerifyQuote(ctx, raw, nil, opts)
		if err != nil {
			b.Fatal(err)
		}
		if err := q.Validate(ref); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkValidator measures the whole qemu-tdx Validate (decode, verify, binding,
// reference, reference sets) with warm collateral.
func BenchmarkValidator(b *testing.B) {
	intel := newFakeIntel(b)
	v := newTestValidator(b, intel, cannedReference(b))
	ev := evidence(b, intel.quote(b, boundReportData(b, attestation.PurposeVerify, testNonce), nil))
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := v.Validate(ctx, ev, attestation.PurposeVerify, testNonce); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParseQuote measures parsing alone (what an unauthenticated peer can make the
// verifier do before any signature check).
func BenchmarkParseQuote(b *testing.B) {
	raw := cannedQuote()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseQuote(raw); err != nil {
			b.Fatal(err)
		}
	}
}
