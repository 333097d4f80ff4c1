package tdx

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	tdxtesting "github.com/google/go-tdx-guest/testing"
	"github.com/google/go-tdx-guest/testing/testdata"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/pkg/attestation/collateral"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
)

// The canned quote (go-tdx-guest testing/testdata/tdx_prod_quote_SPR_E4.dat) is a real
// production quote from a Sapphire Rapids platform (FMSPC 50806f000000). Its collateral
// (same folder) was issued 2023-06-18 (TCB info) and must be renewed by 2023-07-08 (QE
// identity, PCK CRL): verification is pinned inside that window.
var cannedNow = time.Date(2023, 7, 1, 0, 0, 0, 0, time.UTC)

// Offsets in the canned quote (version 4 ABI): a 48-byte header, the 584-byte TD quote
// body, then the signed data. Checked against the parsed quote in TestCannedQuoteLayout.
const (
	offTdAttributes = 48 + 120
	offMrTd         = 48 + 136
	offRtmr0        = 48 + 328
	offReportData   = 48 + 520
	offSignature    = 636
	offAttestKey    = 700
	offQEReport     = 770
	offQEReportSig  = 770 + 384
)

// Collateral URLs of the canned quote.
const (
	urlTCBInfo    = "https://api.trustedservices.intel.com/tdx/certification/v4/tcb?fmspc=50806f000000"
	urlQEIdentity = "https://api.trustedservices.intel.com/tdx/certification/v4/qe/identity"
	urlPCKCRL     = "https://api.trustedservices.intel.com/sgx/certification/v4/pckcrl?ca=platform&encoding=der"
	urlRootCRL    = "https://certificates.trustedservices.intel.com/IntelSGXRootCA.der"
)

func cannedQuote() []byte { return bytes.Clone(testdata.RawQuote) }

// fakePCS serves the canned collateral by URL, as Intel's PCS would; responses can be
// replaced per test. It counts fetches.
type fakePCS struct {
	mu        sync.Mutex
	responses map[string]tdxtesting.HTTPResponse
	fetches   map[string]int
}

func newFakePCS() *fakePCS {
	f := &fakePCS{responses: map[string]tdxtesting.HTTPResponse{}, fetches: map[string]int{}}
	for url, r := range tdxtesting.TestGetter.Responses {
		f.responses[url] = tdxtesting.HTTPResponse{Header: r.Header, Body: bytes.Clone(r.Body)}
	}
	return f
}

func (f *fakePCS) Fetch(_ context.Context, url string) (map[string][]string, []byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fetches[url]++
	r, ok := f.responses[url]
	if !ok {
		return nil, nil, fmt.Errorf("404: %s", url)
	}
	return r.Header, bytes.Clone(r.Body), nil
}

func (f *fakePCS) set(url string, body []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r := f.responses[url]
	r.Body = body
	f.responses[url] = r
}

func (f *fakePCS) count(url string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fetches[url]
}

// fixedClock is a clock tests can move.
type fixedClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fixedClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fixedClock) set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

func newCache(clock *fixedClock, fetcher collateral.Fetcher) *collateral.Cache {
	return collateral.New(collateral.Config{Fetcher: fetcher, Now: clock.Now})
}

func mustHex(t testing.TB, s string) []byte {
	t.Helper()
	var h HexBytes
	require.NoError(t, h.UnmarshalText([]byte(s)))
	return h
}

// Values of the canned quote.
const (
	cannedMrSeam       = "2fd279c16164a93dd5bf373d834328d46008c2b693af9ebb865b08b2ced320c9a89b4869a9fab60fbe9d0c5a5363c656"
	cannedTdAttributes = "0000004000000000"
	cannedXfam         = "e71a060000000000"
	cannedTeeTcbSvn    = "03000400000000000000000000000000"
	cannedMrTd         = "6363b8043668a3ad953278e10389574d326c6749fb78aa810ecd9336923db86f22fc00b8dcd404bc10d5e119d7215cbb"
	cannedRtmr0        = "2927da70461cd63266f43230cc1849c03ef25ebe490062a801d8fcc80af42976823adf08f833c1e50b51779c6593f32a"
	cannedRtmr1        = "2c700b8ba9b85783f8be9fb9443647bdc0bb3c50747f06297cc6538c25a5f589c4b56d035c59107c6bc5800db2cacb61"
	cannedRtmr2        = "8652f0caaba7e215ea442dc36a4499d8fec3362f3a0b2ca151cbe4b3e6466fe59c7368b3c2287fc7c3bf5c924eb4424e"
	cannedReportData   = "6c62dec1b8191749a31dab490be532a35944dea47caef1f980863993d9899545eb7406a38d1eed313b987a467dacead6f0c87a6d766c66f6f29f8acb281f1113"
)

// cannedReference is a reference the canned quote matches.
func cannedReference(t testing.TB) Reference {
	return Reference{
		Name:             "spr-e4",
		MrSeam:           []HexBytes{mustHex(t, cannedMrSeam)},
		TdAttributes:     mustHex(t, cannedTdAttributes),
		Xfam:             mustHex(t, cannedXfam),
		MinimumTeeTcbSvn: mustHex(t, cannedTeeTcbSvn),
	}
}

// cannedSets are reference sets the canned quote's MRTD and RTMR0..2 match.
func cannedSets(t testing.TB) measurements.ReferenceSets {
	return measurements.ReferenceSets{{Name: "canned", Measurements: measurements.M{
		RegisterMRTD:      {Expected: mustHex(t, cannedMrTd)},
		RegisterRTMR0:     {Expected: mustHex(t, cannedRtmr0)},
		RegisterRTMR0 + 1: {Expected: mustHex(t, cannedRtmr1)},
		RegisterRTMR0 + 2: {Expected: mustHex(t, cannedRtmr2)},
	}}}
}

func flip(b []byte, off int, mask byte) []byte {
	out := bytes.Clone(b)
	out[off] ^= mask
	return out
}
