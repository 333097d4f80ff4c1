package tdx

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/google/go-tdx-guest/testing/testdata"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/pkg/api/attestation/hardwarepb"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/collateral"
)

func TestPinnedRoot(t *testing.T) {
	assert.Equal(t, "Intel SGX Root CA", intelRoot.Subject.CommonName)
	_, err := parseRoot(intelRootPEM, "00"+intelRootFingerprint[2:])
	assert.ErrorContains(t, err, "fingerprint")
	_, err = parseRoot(append(bytes.Clone(intelRootPEM), intelRootPEM...), intelRootFingerprint)
	assert.ErrorContains(t, err, "more than one")
}

func TestCannedQuoteLayout(t *testing.T) {
	q, err := ParseQuote(cannedQuote())
	require.NoError(t, err)
	raw := cannedQuote()
	body := q.GetTdQuoteBody()
	assert.Equal(t, body.GetTdAttributes(), raw[offTdAttributes:offTdAttributes+8])
	assert.Equal(t, body.GetMrTd(), raw[offMrTd:offMrTd+48])
	assert.Equal(t, body.GetRtmrs()[0], raw[offRtmr0:offRtmr0+48])
	assert.Equal(t, body.GetReportData(), raw[offReportData:offReportData+64])
	assert.Equal(t, q.GetSignedData().GetSignature(), raw[offSignature:offSignature+64])
	assert.Equal(t, q.GetSignedData().GetEcdsaAttestationKey(), raw[offAttestKey:offAttestKey+64])
	assert.Equal(t, q.GetSignedData().GetCertificationData().GetQeReportCertificationData().GetQeReportSignature(), raw[offQEReportSig:offQEReportSig+64])
}

func TestParseQuote(t *testing.T) {
	canned := cannedQuote()
	v3 := cannedQuote()
	binary.LittleEndian.PutUint16(v3, 3)
	notTDX := cannedQuote()
	binary.LittleEndian.PutUint32(notTDX[4:], 0) // TEE type SGX
	tests := map[string]struct {
		raw     []byte
		wantErr error
		msg     string
	}{
		"canned":            {raw: canned},
		"padded real quote": {raw: mustRead(t, "testdata/cos-113-tdx-quote.dat")},
		"empty":             {raw: nil, wantErr: attestation.ErrMalformed},
		"version 3":         {raw: v3, wantErr: attestation.ErrMalformed, msg: "version 3"},
		"not TDX":           {raw: notTDX, wantErr: attestation.ErrMalformed, msg: "TEE type"},
		"truncated header":  {raw: canned[:40], wantErr: attestation.ErrMalformed},
		"truncated":         {raw: canned[:len(canned)-100], wantErr: attestation.ErrMalformed},
		"too large":         {raw: append(cannedQuote(), make([]byte, MaxQuoteSize)...), wantErr: attestation.ErrTooLarge},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			q, err := ParseQuote(tc.raw)
			if tc.wantErr == nil {
				require.NoError(t, err)
				assert.NotNil(t, q)
				return
			}
			require.ErrorIs(t, err, tc.wantErr)
			assert.ErrorContains(t, err, tc.msg)
			assert.Nil(t, q)
		})
	}
}

func TestVerifyQuote(t *testing.T) {
	intel := newFakeIntel(t)
	pcs := intel.pcs()
	cache := newCache(&fixedClock{t: cannedNow}, pcs)
	rd := bytes.Repeat([]byte{0xab}, 64)
	opts := VerifyOptions{Collateral: cache, root: intel.root}
	q, err := VerifyQuote(context.Background(), intel.quote(t, rd, nil), nil, opts)
	require.NoError(t, err)

	// The body fields, as signed (the fake quote keeps the canned quote's body).
	assert.Equal(t, mustHex(t, cannedMrSeam), q.MrSeam)
	assert.Equal(t, mustHex(t, cannedTdAttributes), q.TdAttributes)
	assert.Equal(t, mustHex(t, cannedXfam), q.Xfam)
	assert.Equal(t, mustHex(t, fakeTeeTcbSvn), q.TeeTcbSvn)
	assert.Equal(t, mustHex(t, cannedMrTd), q.MrTd)
	assert.Equal(t, mustHex(t, cannedRtmr0), q.Rtmrs[0])
	assert.Equal(t, mustHex(t, cannedRtmr1), q.Rtmrs[1])
	assert.Equal(t, mustHex(t, cannedRtmr2), q.Rtmrs[2])
	assert.Equal(t, make([]byte, 48), q.Rtmrs[3])
	assert.Equal(t, rd, q.ReportData)
	assert.Equal(t, make([]byte, 48), q.MrSignerSeam)
	assert.Equal(t, make([]byte, 8), q.SeamAttributes)
	assert.Equal(t, make([]byte, 48), q.MrConfigID)
	assert.Equal(t, make([]byte, 48), q.MrOwner)
	assert.Equal(t, make([]byte, 48), q.MrOwnerConfig)
	assert.Equal(t, []byte(IntelQEVendorID), q.QEVendorID)
	assert.Equal(t, "50806f000000", q.FMSPC)
	assert.Equal(t, intel.pck.Raw, q.PCKCertificate.Raw)
	assert.Contains(t, q.TCB(), fakeTeeTcbSvn)
	assert.Len(t, q.Measurements(), 6)

	// The collateral is cached by URL: further verifications fetch nothing.
	for range 3 {
		_, err = VerifyQuote(context.Background(), intel.quote(t, rd, nil), nil, opts)
		require.NoError(t, err)
	}
	for _, url := range []string{urlTCBInfo, urlQEIdentity, urlPCKCRL, fakeRootCRLURL} {
		assert.Equal(t, 1, pcs.count(url), url)
	}
}

// pemOffset returns the offset of the n-th base64 character of the first certificate (the
// PCK leaf) of the quote's PEM chain.
func pemOffset(t *testing.T, raw []byte, n int) int {
	i := bytes.Index(raw, []byte("-----BEGIN CERTIFICATE-----\n"))
	require.Positive(t, i)
	return i + len("-----BEGIN CERTIFICATE-----\n") + n
}

// swapBase64 changes one base64 character, keeping the PEM decodable.
func swapBase64(b []byte, off int) []byte {
	out := bytes.Clone(b)
	if out[off] == 'A' {
		out[off] = 'B'
	} else {
		out[off] = 'A'
	}
	return out
}

// TestVerifyQuoteRejectsTampering attacks VerifyQuote from the side of whoever relays the
// quote: every change to what the hardware and Intel signed must be rejected, with a
// reason naming what failed.
func TestVerifyQuoteRejectsTampering(t *testing.T) {
	canned := cannedQuote()
	tests := map[string]struct {
		raw     []byte
		wantErr error
		msg     string
	}{
		"MRTD bit":                  {raw: flip(canned, offMrTd, 0x01), wantErr: attestation.ErrBadSignature, msg: "quote signature over header and TD quote body"},
		"RTMR0 bit":                 {raw: flip(canned, offRtmr0+47, 0x80), wantErr: attestation.ErrBadSignature, msg: "quote signature"},
		"debug attribute":           {raw: flip(canned, offTdAttributes, 0x01), wantErr: attestation.ErrBadSignature, msg: "quote signature"},
		"report data":               {raw: flip(canned, offReportData, 0x01), wantErr: attestation.ErrBadSignature, msg: "quote signature"},
		"header QE vendor":          {raw: flip(canned, 12, 0x01), wantErr: attestation.ErrBadSignature, msg: "quote signature"},
		"quote signature":           {raw: flip(canned, offSignature+10, 0x01), wantErr: attestation.ErrBadSignature, msg: "quote signature"},
		"attestation key":           {raw: flip(canned, offAttestKey+5, 0x01), wantErr: attestation.ErrBadSignature},
		"QE report":                 {raw: flip(canned, offQEReport+100, 0x01), wantErr: attestation.ErrBadSignature, msg: "QE report"},
		"QE report signature":       {raw: flip(canned, offQEReportSig+3, 0x01), wantErr: attestation.ErrBadSignature, msg: "QE report"},
		"PCK leaf certificate body": {raw: swapBase64(canned, pemOffset(t, canned, 300)), wantErr: attestation.ErrUntrustedSigner, msg: "PCK"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cache := newCache(&fixedClock{t: cannedNow}, newFakePCS())
			q, err := VerifyQuote(context.Background(), tc.raw, nil, VerifyOptions{Collateral: cache})
			require.Error(t, err)
			assert.Nil(t, q)
			assert.ErrorIs(t, err, tc.wantErr)
			assert.ErrorContains(t, err, tc.msg)
			t.Log(err)
		})
	}
}

// TestVerifyQuoteCollateral attacks the collateral: tampered, stale, missing, or checked
// outside the validity of the certificates. VerifyQuote refuses the quote. For a validator,
// VerifyQuoteHoldingCollateral returns a quote whose signatures and PCK chain verify, and
// what its collateral says is the verdict Claims gives (last, after the validator's own
// checks); one whose chain does not verify is refused at once.
func TestVerifyQuoteCollateral(t *testing.T) {
	tcbInfo := bytes.Replace(testdata.TcbInfoBody, []byte(`"tcbEvaluationDataNumber":15`), []byte(`"tcbEvaluationDataNumber":16`), 1)
	// QE identity with a later nextUpdate (its signature no longer verifies): lets the
	// library go on to fetch the PCK CRL, whose staleness is what the test is about.
	qeIdentityLater := bytes.Replace(testdata.QeIdentityBody, []byte(`"nextUpdate":"2023-07-08T07:24:59Z"`), []byte(`"nextUpdate":"2023-08-08T07:24:59Z"`), 1)
	require.NotEqual(t, tcbInfo, testdata.TcbInfoBody)
	require.NotEqual(t, qeIdentityLater, testdata.QeIdentityBody)

	tests := map[string]struct {
		now       time.Time
		verifyNow time.Time // if set, the verifier's time differs from the cache's
		change    func(*fakePCS)
		wantErr   []error
		msg       string
		// atOnce: the quote fails without collateral (VerifyQuote refuses it).
		atOnce bool
	}{
		"tampered TCB info": {
			now:     cannedNow,
			change:  func(p *fakePCS) { p.set(urlTCBInfo, tcbInfo) },
			wantErr: []error{attestation.ErrUntrustedSigner},
			msg:     "tcbInfo",
		},
		"TCB info past its next update": {
			now:     time.Date(2023, 7, 19, 0, 0, 0, 0, time.UTC),
			wantErr: []error{attestation.ErrRevocationUnknown, collateral.ErrStale},
			msg:     "tcb?fmspc=50806f000000",
		},
		"QE identity past its next update": {
			now:     time.Date(2023, 7, 9, 0, 0, 0, 0, time.UTC),
			wantErr: []error{attestation.ErrRevocationUnknown, collateral.ErrStale},
			msg:     "qe/identity",
		},
		"PCK CRL past its next update": {
			now:     time.Date(2023, 7, 9, 0, 0, 0, 0, time.UTC),
			change:  func(p *fakePCS) { p.set(urlQEIdentity, qeIdentityLater) },
			wantErr: []error{attestation.ErrRevocationUnknown, collateral.ErrStale},
			msg:     "pckcrl",
		},
		"cached collateral checked after its next update": {
			now:       cannedNow,
			verifyNow: time.Date(2023, 7, 9, 0, 0, 0, 0, time.UTC),
			wantErr:   []error{attestation.ErrUntrustedSigner},
			msg:       "QeIdentity has expired",
		},
		"before the PCK certificate was issued": {
			now:       cannedNow,
			verifyNow: time.Date(2022, 9, 1, 0, 0, 0, 0, time.UTC),
			wantErr:   []error{attestation.ErrUntrustedSigner},
			msg:       "PCK",
			atOnce:    true,
		},
		"after everything expired (the PCK chain first)": {
			now:     time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC),
			wantErr: []error{attestation.ErrUntrustedSigner},
			msg:     "PCK",
			atOnce:  true,
		},
		"PCS does not have the TCB info": {
			now:     cannedNow,
			change:  func(p *fakePCS) { delete(p.responses, urlTCBInfo) },
			wantErr: []error{attestation.ErrRevocationUnknown},
			msg:     "404",
		},
		"no root CRL": {
			now:     cannedNow,
			change:  func(p *fakePCS) { delete(p.responses, urlRootCRL) },
			wantErr: []error{attestation.ErrRevocationUnknown},
			msg:     urlRootCRL,
		},
		"PCK CRL is the root CRL": {
			now:     cannedNow,
			change:  func(p *fakePCS) { p.set(urlPCKCRL, testdata.RootCrlBody) },
			wantErr: []error{attestation.ErrUntrustedSigner},
			msg:     "PCK CRL",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			pcs := newFakePCS()
			if tc.change != nil {
				tc.change(pcs)
			}
			cache := newCache(&fixedClock{t: tc.now}, pcs)
			opts := VerifyOptions{Collateral: cache}
			if !tc.verifyNow.IsZero() {
				// Warm the cache at tc.now, then verify at tc.verifyNow.
				// (The canned quote itself fails at its TCB status, after the fetches.)
				_, _ = VerifyQuote(context.Background(), cannedQuote(), nil, opts)
				opts.Now = func() time.Time { return tc.verifyNow }
			}
			q, err := VerifyQuote(context.Background(), cannedQuote(), nil, opts)
			require.Error(t, err)
			assert.Nil(t, q)
			for _, want := range tc.wantErr {
				assert.ErrorIs(t, err, want)
			}
			assert.ErrorContains(t, err, tc.msg)
			t.Log(err)

			q, err = VerifyQuoteHoldingCollateral(context.Background(), cannedQuote(), nil, opts)
			if tc.atOnce {
				require.Error(t, err)
				assert.Nil(t, q)
			} else {
				require.NoError(t, err, "the collateral's verdict is held for last")
				_, err = q.Claims("test")
				require.Error(t, err)
				_, isCollateral := errors.AsType[*attestation.CollateralError](err)
				assert.True(t, isCollateral, "a verdict of the collateral is marked as one")
			}
			for _, want := range tc.wantErr {
				assert.ErrorIs(t, err, want)
			}
			assert.ErrorContains(t, err, tc.msg)
		})
	}
}

func TestVerifyQuoteCarriedCollateral(t *testing.T) {
	intel := newFakeIntel(t)
	raw := intel.quote(t, make([]byte, 64), nil)
	var carried []*hardwarepb.Collateral
	for url, r := range intel.responses {
		headers := map[string]string{}
		for k, v := range r.Header {
			headers[k] = v[0]
		}
		carried = append(carried, &hardwarepb.Collateral{Url: url, Body: bytes.Clone(r.Body), Headers: headers})
	}
	offline := collateral.New(collateral.Config{Now: (&fixedClock{t: cannedNow}).Now})
	opts := VerifyOptions{Collateral: offline, root: intel.root}

	_, err := VerifyQuote(context.Background(), raw, nil, opts)
	require.ErrorIs(t, err, collateral.ErrOffline)
	require.ErrorIs(t, err, attestation.ErrRevocationUnknown)

	q, err := VerifyQuote(context.Background(), raw, carried, opts)
	require.NoError(t, err)
	assert.Equal(t, "50806f000000", q.FMSPC)

	// Carried documents serve one verification only.
	_, err = VerifyQuote(context.Background(), raw, nil, opts)
	require.ErrorIs(t, err, collateral.ErrOffline)

	// A tampered carried document is caught like a fetched one.
	for _, c := range carried {
		if c.Url == urlTCBInfo {
			c.Body = bytes.Replace(c.Body, []byte(`"tcbEvaluationDataNumber":15`), []byte(`"tcbEvaluationDataNumber":16`), 1)
		}
	}
	_, err = VerifyQuote(context.Background(), raw, carried, opts)
	require.ErrorIs(t, err, attestation.ErrUntrustedSigner)
	assert.ErrorContains(t, err, "tcbInfo")
}

func TestVerifyQuoteNeedsCache(t *testing.T) {
	_, err := VerifyQuote(context.Background(), cannedQuote(), nil, VerifyOptions{})
	require.Error(t, err)
	assert.False(t, errors.Is(err, attestation.ErrMalformed))
}

// TestVerifyCannedQuoteTCBOutOfDate: the canned Intel quote passes every check up to the
// platform's TCB status, which its own collateral says is not up to date.
func TestVerifyCannedQuoteTCBOutOfDate(t *testing.T) {
	cache := newCache(&fixedClock{t: cannedNow}, newFakePCS())
	_, err := VerifyQuote(context.Background(), cannedQuote(), nil, VerifyOptions{Collateral: cache})
	require.ErrorIs(t, err, attestation.ErrUntrustedSigner)
	assert.ErrorContains(t, err, "TCB status check: no matching TCB level found")
}

func TestVerifyFakeIntelQuote(t *testing.T) {
	intel := newFakeIntel(t)
	rd := mustHex(t, cannedReportData)
	raw := intel.quote(t, rd, nil)
	cache := newCache(&fixedClock{t: cannedNow}, intel.pcs())

	q, err := VerifyQuote(context.Background(), raw, nil, VerifyOptions{Collateral: cache, root: intel.root})
	require.NoError(t, err)
	assert.Equal(t, rd, q.ReportData)
	assert.Equal(t, mustHex(t, cannedMrTd), q.MrTd)

	// The production root does not trust the fake chain.
	_, err = VerifyQuote(context.Background(), raw, nil, VerifyOptions{Collateral: cache})
	require.ErrorIs(t, err, attestation.ErrUntrustedSigner)
	assert.ErrorContains(t, err, "unknown authority")
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b
}

// TestCollateralURLs: CollateralURLs lists the four documents go-tdx-guest reads for the
// canned quote (the real Intel root's CRL among them); an offline verifier that put exactly
// those into its cache verifies a quote fully, and without them tells a forged quote (bad
// signature) from a genuine one (revocation unknown), accepting the genuine one only when
// its policy says so.
func TestCollateralURLs(t *testing.T) {
	urls, err := CollateralURLs(cannedQuote())
	require.NoError(t, err)
	assert.Equal(t, []string{urlTCBInfo, urlQEIdentity, urlPCKCRL, urlRootCRL}, urls)
	_, err = CollateralURLs(cannedQuote()[:100])
	require.ErrorIs(t, err, attestation.ErrMalformed)

	intel := newFakeIntel(t)
	raw := intel.quote(t, make([]byte, 64), nil)
	urls, err = collateralURLs(mustParse(t, raw), intel.root)
	require.NoError(t, err)
	assert.Equal(t, []string{urlTCBInfo, urlQEIdentity, urlPCKCRL, fakeRootCRLURL}, urls)

	clock := &fixedClock{t: cannedNow}
	preloaded := collateral.New(collateral.Config{Now: clock.Now})
	for _, url := range urls {
		r := intel.responses[url]
		require.NoError(t, preloaded.Put(url, r.Header, r.Body))
	}
	q, err := VerifyQuote(context.Background(), raw, nil, VerifyOptions{Collateral: preloaded, root: intel.root})
	require.NoError(t, err)
	assert.NoError(t, q.CollateralUnknown)

	forged := bytes.Clone(raw)
	forged[quoteHeaderSize+100] ^= 1 // a byte of the TD quote body
	for _, policy := range []attestation.RevocationPolicy{attestation.RevocationRequired, attestation.RevocationUnknownAccepted} {
		offline := VerifyOptions{Collateral: collateral.New(collateral.Config{Now: clock.Now}), root: intel.root, Revocation: policy}
		_, err := VerifyQuote(context.Background(), forged, nil, offline)
		require.ErrorIs(t, err, attestation.ErrBadSignature, policy.String())
		q, err := VerifyQuote(context.Background(), raw, nil, offline)
		if policy == attestation.RevocationRequired {
			require.ErrorIs(t, err, attestation.ErrRevocationUnknown)
			assert.ErrorIs(t, err, collateral.ErrOffline)
			continue
		}
		require.NoError(t, err)
		assert.ErrorIs(t, q.CollateralUnknown, collateral.ErrOffline)
	}
}
