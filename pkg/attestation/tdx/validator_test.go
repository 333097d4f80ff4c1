package tdx

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"testing"

	pb "github.com/google/go-tdx-guest/proto/tdx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/openconstellation/constellation/pkg/api/attestation/hardwarepb"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
)

var testNonce = bytes.Repeat([]byte{0x42}, 32)

// newTestValidator returns the production validator (NewValidator) whose only difference
// is that it trusts the fake Intel root instead of the pinned one.
func newTestValidator(t testing.TB, intel *fakeIntel, ref Reference) *Validator {
	t.Helper()
	v, err := NewValidator(ValidatorConfig{
		ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: cannedSets(t)},
		Reference:       ref,
		Collateral:      newCache(&fixedClock{t: cannedNow}, intel.pcs()),
	})
	require.NoError(t, err)
	v.root = intel.root
	return v
}

func evidence(t testing.TB, quote []byte) []byte {
	t.Helper()
	b, err := proto.Marshal(&hardwarepb.TDX{Variant: Variant.String(), Quote: quote})
	require.NoError(t, err)
	return b
}

func boundReportData(t testing.TB, purpose attestation.Purpose, nonce []byte) []byte {
	t.Helper()
	rd, err := ReportDataFor(purpose, nonce)
	require.NoError(t, err)
	return rd[:]
}

func TestValidatorAccepts(t *testing.T) {
	intel := newFakeIntel(t)
	v := newTestValidator(t, intel, cannedReference(t))
	marker := ClusterIDMarker([]byte("cluster"))
	quote := intel.quote(t, boundReportData(t, attestation.PurposeVerify, testNonce), func(b *pb.TDQuoteBody) {
		b.Rtmrs[3] = marker
	})

	got, err := v.Validate(context.Background(), evidence(t, quote), attestation.PurposeVerify, testNonce)
	require.NoError(t, err)
	assert.Equal(t, Variant.String(), got.Variant.String())
	assert.Equal(t, "canned", got.ReferenceSet)
	assert.Equal(t, mustHex(t, cannedMrTd), got.Registers[RegisterMRTD])
	assert.Equal(t, mustHex(t, cannedRtmr0), got.Registers[RegisterRTMR0])
	assert.Equal(t, mustHex(t, cannedRtmr2), got.Registers[RegisterRTMR0+2])
	assert.Equal(t, marker, got.Registers[RegisterClusterID])
	assert.Len(t, got.Registers, 5)
	assert.False(t, got.SignerCertified, "Intel certifies the CPU, not the node")
	assert.Empty(t, got.SignerName)
	assert.NotEmpty(t, got.SignerID)
	require.NotNil(t, got.Hardware)
	assert.Equal(t, "TDX", got.Hardware.Technology)
	assert.Equal(t, "PCK", got.Hardware.Signer)
	assert.Equal(t, "fmspc 50806f000000", got.Hardware.Product)
	assert.Equal(t, "spr-e4", got.Hardware.Reference)
	assert.Equal(t, mustHex(t, cannedMrTd), got.Hardware.Measurements["MRTD"])
	assert.Equal(t, marker, got.Hardware.Measurements["RTMR3"])
}

// TestValidatorRejects attacks the production validator with evidence a platform (or a
// relay) could produce: quotes that verify but were made for something else, of a TD
// that runs other code or in debug mode, on a platform below the minimum.
func TestValidatorRejects(t *testing.T) {
	intel := newFakeIntel(t)
	bound := boundReportData(t, attestation.PurposeVerify, testNonce)
	quote := func(rd []byte, edit func(*pb.TDQuoteBody)) []byte { return evidence(t, intel.quote(t, rd, edit)) }
	tests := map[string]struct {
		evidence []byte
		ref      func(*Reference)
		wantErr  error
		msg      string
	}{
		"other purpose": {
			evidence: quote(boundReportData(t, attestation.PurposeATLSServer, testNonce), nil),
			wantErr:  attestation.ErrNonceMismatch, msg: "REPORTDATA",
		},
		"other nonce": {
			evidence: quote(boundReportData(t, attestation.PurposeVerify, bytes.Repeat([]byte{1}, 32)), nil),
			wantErr:  attestation.ErrNonceMismatch, msg: "REPORTDATA",
		},
		"raw nonce as report data": {
			evidence: quote(append(bytes.Clone(testNonce), make([]byte, 32)...), nil),
			wantErr:  attestation.ErrNonceMismatch, msg: "REPORTDATA",
		},
		"second half of report data not zero": {
			evidence: quote(append(bytes.Clone(bound[:32]), bytes.Repeat([]byte{1}, 32)...), nil),
			wantErr:  attestation.ErrNonceMismatch, msg: "REPORTDATA",
		},
		"other MRTD (firmware)": {
			evidence: quote(bound, func(b *pb.TDQuoteBody) { b.MrTd = bytes.Repeat([]byte{1}, 48) }),
			wantErr:  attestation.ErrMeasurementPolicy, msg: "TDX register 0",
		},
		"other RTMR1 (kernel)": {
			evidence: quote(bound, func(b *pb.TDQuoteBody) { b.Rtmrs[1] = bytes.Repeat([]byte{1}, 48) }),
			wantErr:  attestation.ErrMeasurementPolicy, msg: "TDX register 2",
		},
		"debug TD": {
			evidence: quote(bound, func(b *pb.TDQuoteBody) { b.TdAttributes[0] |= 0x01 }),
			wantErr:  attestation.ErrMeasurementPolicy, msg: "DEBUG",
		},
		"TD attributes": {
			evidence: quote(bound, func(b *pb.TDQuoteBody) { b.TdAttributes[3] |= 0x10 }), // SEPT_VE_DISABLE
			wantErr:  attestation.ErrMeasurementPolicy, msg: "TD_ATTRIBUTES",
		},
		"XFAM": {
			evidence: quote(bound, func(b *pb.TDQuoteBody) { b.Xfam[0] ^= 0x04 }),
			wantErr:  attestation.ErrMeasurementPolicy, msg: "XFAM",
		},
		"TDX module not accepted": {
			evidence: quote(bound, func(b *pb.TDQuoteBody) { b.MrSeam = bytes.Repeat([]byte{2}, 48) }),
			wantErr:  attestation.ErrMeasurementPolicy, msg: "MR_SEAM",
		},
		"TEE TCB SVN below the minimum": {
			evidence: quote(bound, nil),
			ref:      func(r *Reference) { r.MinimumTeeTcbSvn = mustHex(t, "03000600000000000000000000000000") },
			wantErr:  attestation.ErrMeasurementPolicy, msg: "TEE TCB security-version number",
		},
		"QE SVN below the minimum": {
			evidence: quote(bound, nil),
			ref:      func(r *Reference) { r.MinimumQESvn = 1 },
			wantErr:  attestation.ErrMeasurementPolicy, msg: "QE security-version number",
		},
		"other QE vendor": {
			evidence: quote(bound, nil),
			ref:      func(r *Reference) { r.QEVendorID = bytes.Repeat([]byte{1}, 16) },
			wantErr:  attestation.ErrMeasurementPolicy, msg: "QE_VENDOR_ID",
		},
		"TEE TCB SVN below Intel's TCB info": {
			evidence: quote(bound, func(b *pb.TDQuoteBody) { b.TeeTcbSvn[2] = 4 }),
			wantErr:  attestation.ErrUntrustedSigner, msg: "TCB status",
		},
		"real Intel quote, out-of-date TCB": {
			evidence: evidence(t, cannedQuote()),
			wantErr:  attestation.ErrUntrustedSigner, msg: "PCK",
		},
		"other variant": {
			evidence: func() []byte {
				b, err := proto.Marshal(&hardwarepb.TDX{Variant: "azure-tdx", Quote: intel.quote(t, bound, nil)})
				require.NoError(t, err)
				return b
			}(),
			wantErr: attestation.ErrWrongVariant, msg: "azure-tdx",
		},
		"not protobuf": {evidence: []byte{0xff, 0xff, 0xff}, wantErr: attestation.ErrMalformed},
		"no quote":     {evidence: evidence(t, nil), wantErr: attestation.ErrMalformed},
		"too large":    {evidence: make([]byte, attestation.DefaultMaxEvidenceSize+1), wantErr: attestation.ErrTooLarge},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ref := cannedReference(t)
			if tc.ref != nil {
				tc.ref(&ref)
			}
			v := newTestValidator(t, intel, ref)
			got, err := v.Validate(context.Background(), tc.evidence, attestation.PurposeVerify, testNonce)
			require.Error(t, err)
			assert.Nil(t, got)
			assert.ErrorIs(t, err, tc.wantErr)
			assert.ErrorContains(t, err, tc.msg)
			t.Log(err)
		})
	}
}

// TestValidatorPinsIntelRoot: the validator cmd/ builds trusts only Intel's root, so a
// quote signed through any other chain (here the fake Intel) is rejected.
func TestValidatorPinsIntelRoot(t *testing.T) {
	intel := newFakeIntel(t)
	v, err := NewValidator(ValidatorConfig{
		ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: cannedSets(t)},
		Reference:       cannedReference(t),
		Collateral:      newCache(&fixedClock{t: cannedNow}, intel.pcs()),
	})
	require.NoError(t, err)
	ev := evidence(t, intel.quote(t, boundReportData(t, attestation.PurposeVerify, testNonce), nil))
	_, err = v.Validate(context.Background(), ev, attestation.PurposeVerify, testNonce)
	require.ErrorIs(t, err, attestation.ErrUntrustedSigner)
	assert.ErrorContains(t, err, "certificate signed by unknown authority")
}

func TestNewValidatorConfig(t *testing.T) {
	cache := newCache(&fixedClock{t: cannedNow}, newFakePCS())
	withClusterID := cannedSets(t)
	withClusterID[0].Measurements[RegisterClusterID] = measurements.Measurement{Expected: make([]byte, 48)}
	debugRef := cannedReference(t)
	debugRef.TdAttributes = mustHex(t, "0100000000000000")
	tests := map[string]struct {
		cfg ValidatorConfig
		msg string
	}{
		"no collateral":            {cfg: ValidatorConfig{ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: cannedSets(t)}, Reference: cannedReference(t)}, msg: "collateral"},
		"no reference":             {cfg: ValidatorConfig{ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: cannedSets(t)}, Collateral: cache}, msg: "mrSeam"},
		"debug reference":          {cfg: ValidatorConfig{ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: cannedSets(t)}, Reference: debugRef, Collateral: cache}, msg: "DEBUG"},
		"no reference sets":        {cfg: ValidatorConfig{Reference: cannedReference(t), Collateral: cache}, msg: "no reference-value set"},
		"set pins cluster-ID RTMR": {cfg: ValidatorConfig{ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: withClusterID}, Reference: cannedReference(t), Collateral: cache}, msg: "TDX register 4 must not be in a reference set"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := NewValidator(tc.cfg)
			assert.ErrorContains(t, err, tc.msg)
		})
	}
}

func TestClusterIDMarker(t *testing.T) {
	m := ClusterIDMarker([]byte("a"))
	assert.Len(t, m, 48)
	assert.NotEqual(t, m, ClusterIDMarker([]byte("b")))
}

// TestValidatorConcurrent: one validator (and its collateral cache) serves many
// validations at once, as in the join service.
func TestValidatorConcurrent(t *testing.T) {
	intel := newFakeIntel(t)
	v := newTestValidator(t, intel, cannedReference(t))
	good := evidence(t, intel.quote(t, boundReportData(t, attestation.PurposeVerify, testNonce), nil))
	bad := evidence(t, intel.quote(t, boundReportData(t, attestation.PurposeATLSServer, testNonce), nil))
	errs := make(chan error, 16)
	for i := range 16 {
		go func() {
			ev, want := good, error(nil)
			if i%2 == 1 {
				ev, want = bad, attestation.ErrNonceMismatch
			}
			_, err := v.Validate(context.Background(), ev, attestation.PurposeVerify, testNonce)
			if want == nil && err != nil || want != nil && !errors.Is(err, want) {
				errs <- fmt.Errorf("validation %d: %v", i, err)
				return
			}
			errs <- nil
		}()
	}
	for range 16 {
		assert.NoError(t, <-errs)
	}
}

// TestValidateReportData: a relying party with its own binding scheme checks a quote whose
// REPORTDATA it chose; everything else is Validate's.
func TestValidateReportData(t *testing.T) {
	intel := newFakeIntel(t)
	v := newTestValidator(t, intel, cannedReference(t))
	own := sha256.Sum256([]byte("key broker session 7"))
	ev := evidence(t, intel.quote(t, own[:], func(b *pb.TDQuoteBody) { b.Rtmrs[3] = ClusterIDMarker([]byte("cluster")) }))

	got, err := attestation.ValidateReportData(context.Background(), v, ev, own[:])
	require.NoError(t, err)
	assert.Equal(t, Variant, got.Variant)

	other := sha256.Sum256([]byte("key broker session 8"))
	_, err = v.ValidateReportData(context.Background(), ev, other[:])
	assert.ErrorIs(t, err, attestation.ErrNonceMismatch)
	_, err = v.ValidateReportData(context.Background(), ev, make([]byte, 65))
	assert.ErrorIs(t, err, attestation.ErrNonceMismatch)
	_, err = v.Validate(context.Background(), ev, attestation.PurposeVerify, own[:])
	assert.ErrorIs(t, err, attestation.ErrNonceMismatch, "the caller's own binding is not a Constellation purpose's")
}
