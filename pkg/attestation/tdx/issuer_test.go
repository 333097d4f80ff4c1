package tdx

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/openconstellation/constellation/pkg/api/attestation/hardwarepb"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/collateral"
)

// fakeQuoteProvider stands in for configfs-tsm: it records the report data it was asked
// for and answers with a quote from the fake Intel PKI.
type fakeQuoteProvider struct {
	t     testing.TB
	intel *fakeIntel
	// answer, if set, replaces the report data the quote is made over.
	answer  []byte
	padding int
	block   chan struct{}
	err     error

	mu    sync.Mutex
	asked [][64]byte
}

func (p *fakeQuoteProvider) IsSupported() error { return nil }

func (p *fakeQuoteProvider) GetRawQuote(reportData [64]byte) ([]byte, error) {
	p.mu.Lock()
	p.asked = append(p.asked, reportData)
	p.mu.Unlock()
	if p.block != nil {
		<-p.block
	}
	if p.err != nil {
		return nil, p.err
	}
	rd := reportData[:]
	if p.answer != nil {
		rd = p.answer
	}
	return append(p.intel.quote(p.t, rd, nil), make([]byte, p.padding)...), nil
}

func TestIssuerToValidator(t *testing.T) {
	intel := newFakeIntel(t)
	provider := &fakeQuoteProvider{t: t, intel: intel, padding: 3000}
	issuer, err := NewIssuer(provider, nil)
	require.NoError(t, err)
	assert.Equal(t, Variant.String(), issuer.Variant().String())

	ev, err := issuer.Issue(context.Background(), attestation.PurposeATLSClient, testNonce)
	require.NoError(t, err)

	require.Len(t, provider.asked, 1)
	want := boundReportData(t, attestation.PurposeATLSClient, testNonce)
	assert.Equal(t, want, provider.asked[0][:])
	assert.Equal(t, make([]byte, 32), provider.asked[0][32:])

	var msg hardwarepb.TDX
	require.NoError(t, proto.Unmarshal(ev, &msg))
	assert.Equal(t, "qemu-tdx", msg.GetVariant())
	q := mustParse(t, msg.GetQuote())
	assert.Equal(t, signedEnd(q), len(msg.GetQuote()), "padding is not sent")

	v := newTestValidator(t, intel, cannedReference(t))
	got, err := v.Validate(context.Background(), ev, attestation.PurposeATLSClient, testNonce)
	require.NoError(t, err)
	assert.Equal(t, "TDX", got.Hardware.Technology)

	_, err = v.Validate(context.Background(), ev, attestation.PurposeATLSServer, testNonce)
	require.ErrorIs(t, err, attestation.ErrNonceMismatch)
}

func TestIssuerErrors(t *testing.T) {
	intel := newFakeIntel(t)
	t.Run("no provider", func(t *testing.T) {
		_, err := NewIssuer(nil, nil)
		require.Error(t, err)
	})
	t.Run("quote over other report data", func(t *testing.T) {
		issuer, err := NewIssuer(&fakeQuoteProvider{t: t, intel: intel, answer: make([]byte, 64)}, nil)
		require.NoError(t, err)
		_, err = issuer.Issue(context.Background(), attestation.PurposeVerify, testNonce)
		assert.ErrorContains(t, err, "REPORTDATA")
	})
	t.Run("provider fails", func(t *testing.T) {
		issuer, err := NewIssuer(&fakeQuoteProvider{t: t, intel: intel, err: errors.New("no quoting enclave")}, nil)
		require.NoError(t, err)
		_, err = issuer.Issue(context.Background(), attestation.PurposeVerify, testNonce)
		assert.ErrorContains(t, err, "no quoting enclave")
	})
	t.Run("nonce too short", func(t *testing.T) {
		issuer, err := NewIssuer(&fakeQuoteProvider{t: t, intel: intel}, nil)
		require.NoError(t, err)
		_, err = issuer.Issue(context.Background(), attestation.PurposeVerify, []byte("short"))
		assert.Error(t, err)
	})
	t.Run("context ends while the provider blocks", func(t *testing.T) {
		block := make(chan struct{})
		t.Cleanup(func() { close(block) })
		issuer, err := NewIssuer(&fakeQuoteProvider{t: t, intel: intel, block: block}, nil)
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err = issuer.Issue(ctx, attestation.PurposeVerify, testNonce)
		assert.ErrorIs(t, err, context.Canceled)
	})
}

// TestIssuerCarriesCollateral: evidence from an issuer with a collateral cache verifies on
// a verifier that has no network and nothing cached (`constellation verify` offline).
func TestIssuerCarriesCollateral(t *testing.T) {
	intel := newFakeIntel(t)
	pcs := intel.pcs()
	issuer, err := NewIssuer(&fakeQuoteProvider{t: t, intel: intel}, newCache(&fixedClock{t: cannedNow}, pcs))
	require.NoError(t, err)
	issuer.root = intel.root
	ev, err := issuer.Issue(context.Background(), attestation.PurposeVerify, testNonce)
	require.NoError(t, err)

	var msg hardwarepb.TDX
	require.NoError(t, proto.Unmarshal(ev, &msg))
	var urls []string
	for _, c := range msg.GetCollateral() {
		urls = append(urls, c.GetUrl())
	}
	assert.ElementsMatch(t, []string{urlTCBInfo, urlQEIdentity, urlPCKCRL, fakeRootCRLURL}, urls)

	v, err := NewValidator(ValidatorConfig{
		ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: cannedSets(t)},
		Reference:       cannedReference(t),
		Collateral:      collateral.New(collateral.Config{Now: (&fixedClock{t: cannedNow}).Now}),
	})
	require.NoError(t, err)
	v.root = intel.root
	_, err = v.Validate(context.Background(), ev, attestation.PurposeVerify, testNonce)
	require.NoError(t, err)
}
