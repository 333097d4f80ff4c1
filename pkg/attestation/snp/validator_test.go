package snp_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/kds"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/pkg/api/attestation/hardwarepb"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/collateral"
	"github.com/openconstellation/constellation/pkg/attestation/snp"
	"github.com/openconstellation/constellation/pkg/attestation/snp/snptest"
)

// now is the time of the synthetic tests: inside the fake certificates' validity.
var now = time.Date(2025, 6, 1, 0, 0, 0, 0, time.UTC)

// fakeFetcher serves documents by URL, like AMD's KDS would, and counts fetches.
type fakeFetcher struct {
	mu    sync.Mutex
	docs  map[string][]byte
	calls map[string]int
}

func (f *fakeFetcher) Fetch(_ context.Context, url string) (map[string][]string, []byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[url]++
	body, ok := f.docs[url]
	if !ok {
		return nil, nil, fmt.Errorf("HTTP 404 for %s", url)
	}
	return nil, body, nil
}

// synth is a fake AMD for one product line, its CRLs served by a fake KDS.
type synth struct {
	amd     *snptest.AMD
	fetcher *fakeFetcher
}

func tcbOf(product string) snp.TCB {
	t := snp.TCB{Bootloader: 4, TEE: 1, SNP: 22, Microcode: 210}
	if product == snp.Turin {
		t.FMC = 1
	}
	return t
}

// amds caches one fake AMD per product line: making one signs with RSA-4096 keys, and an
// AMD is never changed by a test.
var amds sync.Map

func newSynth(t testing.TB, product string) *synth {
	cached, ok := amds.Load(product)
	if !ok {
		cached, _ = amds.LoadOrStore(product, snptest.NewAMD(t, product, snptest.Options{TCB: tcbOf(product)}))
	}
	amd := cached.(*snptest.AMD)
	crl := amd.CRL(t, now.Add(-24*time.Hour), now.Add(7*24*time.Hour))
	f := &fakeFetcher{calls: map[string]int{}, docs: map[string][]byte{
		amd.CRLURL("VCEK"): crl,
		amd.CRLURL("VLEK"): crl,
	}}
	return &synth{amd: amd, fetcher: f}
}

func (s *synth) cache(at time.Time) *collateral.Cache {
	return collateral.New(collateral.Config{Fetcher: s.fetcher, Now: func() time.Time { return at }})
}

func (s *synth) reference() snp.Reference {
	ref := snp.DefaultReference("synthetic-" + s.amd.Product)
	ref.Products = []string{s.amd.Product}
	ref.MinimumTCB[s.amd.Product] = s.amd.TCB
	ref.Measurements = snp.Digests{bytes.Repeat([]byte{0x11}, 48)}
	return ref
}

func (s *synth) validator(t testing.TB, ref snp.Reference, at time.Time) *snp.Validator {
	t.Helper()
	v, err := snp.NewValidator(snp.Config{Reference: ref, Collateral: s.cache(at), Now: func() time.Time { return at }, Roots: s.amd.Roots})
	require.NoError(t, err)
	return v
}

func reportData() []byte { return bytes.Repeat([]byte{0x22}, 64) }

// TestCheckSynthetic: a realistic report of every product line and signer kind verifies,
// and the claims say what was checked.
func TestCheckSynthetic(t *testing.T) {
	for _, product := range snp.ProductLines {
		for _, signer := range []string{"VCEK", "VLEK"} {
			for _, version := range []uint32{2, 3} {
				t.Run(fmt.Sprintf("%s/%s/v%d", product, signer, version), func(t *testing.T) {
					s := newSynth(t, product)
					r := snptest.DefaultReport()
					r.Signer, r.Version = signer, version
					r.HostData[0] = 0x33
					hw, err := s.validator(t, s.reference(), now).Check(context.Background(), s.amd.Sign(t, r), s.amd.Certs(signer), nil, reportData())
					require.NoError(t, err)
					assert.Equal(t, snp.Technology, hw.Technology)
					assert.Equal(t, product, hw.Product)
					assert.Equal(t, signer, hw.Signer)
					assert.Equal(t, "synthetic-"+product, hw.Reference)
					assert.Equal(t, bytes.Repeat([]byte{0x11}, 48), hw.Measurements["MEASUREMENT"])
					assert.Equal(t, byte(0x33), hw.Measurements["HOST_DATA"][0])
					assert.Contains(t, hw.TCB, "committed "+tcbOf(product).String())
					assert.Empty(t, hw.Warnings)
					assert.Equal(t, 1, s.fetcher.calls[s.amd.CRLURL(signer)], "the CRL is fetched once, through the collateral cache")
				})
			}
		}
	}
}

// TestCheckRejects attacks the validator from the host's side: every change to the evidence,
// the collateral or the circumstances is refused with a reason that names what failed.
func TestCheckRejects(t *testing.T) {
	type tc struct {
		product    string // default Milan
		report     func(*snptest.Report)
		raw        func([]byte) []byte
		certs      func(*testing.T, *synth, [][]byte) [][]byte
		ref        func(*snp.Reference)
		crl        func(*testing.T, *synth) []byte // replaces the CRL the fake KDS serves
		now        time.Time                       // validator (and cache) time; default now
		data       []byte
		wantReason error
		wantMsg    string
	}
	microcode := func(m uint8) *snp.TCB { t := tcbOf(snp.Milan); t.Microcode = m; return &t }
	cases := map[string]tc{
		"one bit of MEASUREMENT": {
			raw:        func(b []byte) []byte { b[0x90] ^= 1; return b },
			wantReason: attestation.ErrBadSignature, wantMsg: "report signature does not verify with the VCEK",
		},
		"one bit of the signature": {
			raw:        func(b []byte) []byte { b[0x2A0] ^= 1; return b },
			wantReason: attestation.ErrBadSignature, wantMsg: "signature",
		},
		"one bit of the VCEK's signature": {
			certs: func(t *testing.T, s *synth, c [][]byte) [][]byte {
				c[0] = bytes.Clone(c[0])
				c[0][len(c[0])-5] ^= 1
				return c
			},
			wantReason: attestation.ErrUntrustedSigner, wantMsg: "VCEK certificate",
		},
		"VCEK of another chip": {
			certs: func(t *testing.T, s *synth, c [][]byte) [][]byte {
				return newSynthWithKeys(t, snp.Milan).amd.Certs("VCEK")
			},
			wantReason: attestation.ErrBadSignature, wantMsg: "VCEK",
		},
		"no VCEK and none to fetch": {
			certs:      func(t *testing.T, s *synth, c [][]byte) [][]byte { return nil },
			wantReason: attestation.ErrUntrustedSigner, wantMsg: "VCEK",
		},
		"no VCEK, CHIP_ID masked": {
			report:     func(r *snptest.Report) { r.MaskChipID = true },
			certs:      func(t *testing.T, s *synth, c [][]byte) [][]byte { return nil },
			wantReason: attestation.ErrUntrustedSigner, wantMsg: "CHIP_ID is masked",
		},
		"VLEK-signed without VLEK": {
			report:     func(r *snptest.Report) { r.Signer = "VLEK" },
			certs:      func(t *testing.T, s *synth, c [][]byte) [][]byte { return c[1:] },
			wantReason: attestation.ErrUntrustedSigner, wantMsg: "without its VLEK certificate",
		},
		"VCEK-signed report with a VLEK": {
			certs:      func(t *testing.T, s *synth, c [][]byte) [][]byte { return s.amd.Certs("VLEK") },
			wantReason: attestation.ErrUntrustedSigner, wantMsg: "VCEK",
		},
		"report data of another nonce": {
			data:       bytes.Repeat([]byte{0x23}, 64),
			wantReason: attestation.ErrNonceMismatch, wantMsg: "REPORT_DATA 2222",
		},
		"report data prefix only": {
			data:       bytes.Repeat([]byte{0x22}, 32),
			wantReason: attestation.ErrNonceMismatch, wantMsg: "REPORT_DATA",
		},
		"no report data": {
			data:       []byte{},
			wantReason: attestation.ErrNonceMismatch, wantMsg: "report data of 0 bytes",
		},
		"committed TCB below minimum": {
			report:     func(r *snptest.Report) { r.Committed = microcode(209) },
			wantReason: attestation.ErrMeasurementPolicy, wantMsg: "committed TCB microcode 209 below minimum 210",
		},
		"launch TCB below minimum": {
			report:     func(r *snptest.Report) { r.Launch = microcode(200) },
			wantReason: attestation.ErrMeasurementPolicy, wantMsg: "launch TCB microcode 200 below minimum 210",
		},
		"minimum above the VCEK's TCB": {
			ref: func(r *snp.Reference) {
				r.MinimumTCB[snp.Milan] = snp.TCB{Bootloader: 4, TEE: 1, SNP: 23, Microcode: 210}
			},
			report: func(r *snptest.Report) {
				hi := snp.TCB{Bootloader: 4, TEE: 1, SNP: 23, Microcode: 210}
				r.Committed, r.Launch, r.Current = &hi, &hi, &hi
			},
			wantReason: attestation.ErrMeasurementPolicy, wantMsg: "reported TCB snp 22 below minimum 23",
		},
		"reported TCB other than the VCEK's": {
			report:     func(r *snptest.Report) { r.Reported = microcode(211); r.Current = microcode(211) },
			wantReason: attestation.ErrMeasurementPolicy, wantMsg: "REPORTED_TCB",
		},
		"debug policy": {
			report:     func(r *snptest.Report) { r.Policy.Debug = true },
			wantReason: attestation.ErrMeasurementPolicy, wantMsg: "POLICY allows debugging",
		},
		"migration agent": {
			report:     func(r *snptest.Report) { r.Policy.MigrateMA = true },
			wantReason: attestation.ErrMeasurementPolicy, wantMsg: "POLICY allows a migration agent",
		},
		"SMT forbidden by policy requirement": {
			ref:        func(r *snp.Reference) { r.GuestPolicy.ForbidSMT = true },
			wantReason: attestation.ErrMeasurementPolicy, wantMsg: "POLICY allows SMT",
		},
		"ABI below minimum": {
			ref:        func(r *snp.Reference) { r.GuestPolicy.MinimumABIMajor = 1 },
			wantReason: attestation.ErrMeasurementPolicy, wantMsg: "POLICY ABI 0.31 below minimum 1.0",
		},
		"wrong VMPL": {
			report:     func(r *snptest.Report) { r.VMPL = 1 },
			wantReason: attestation.ErrMeasurementPolicy, wantMsg: "VMPL 1, want 0",
		},
		"other measurement": {
			report:     func(r *snptest.Report) { r.Measurement[47] = 0x12 },
			wantReason: attestation.ErrMeasurementPolicy, wantMsg: "MEASUREMENT 1111",
		},
		"ID key not accepted": {
			ref:        func(r *snp.Reference) { r.IDKeyDigests = snp.Digests{bytes.Repeat([]byte{0x44}, 48)} },
			report:     func(r *snptest.Report) { r.IDKeyDigest[0] = 0x45 },
			wantReason: attestation.ErrMeasurementPolicy, wantMsg: "ID_KEY_DIGEST 45",
		},
		"TSME required": {
			ref:        func(r *snp.Reference) { r.PlatformInfo.RequireTSME = true },
			report:     func(r *snptest.Report) { r.PlatformInfo = 0x1 },
			wantReason: attestation.ErrMeasurementPolicy, wantMsg: "PLATFORM_INFO: TSME not enabled",
		},
		"SMT forbidden on the platform": {
			ref:        func(r *snp.Reference) { r.PlatformInfo.ForbidSMT = true },
			wantReason: attestation.ErrMeasurementPolicy, wantMsg: "PLATFORM_INFO: SMT enabled",
		},
		"firmware below minimum": {
			ref:        func(r *snp.Reference) { r.MinimumFirmware = &snp.FirmwareVersion{Major: 1, Minor: 56} },
			wantReason: attestation.ErrMeasurementPolicy, wantMsg: "committed firmware API version 1.55 below minimum 1.56",
		},
		"report says Genoa, VCEK says Milan": {
			report:     func(r *snptest.Report) { r.FMS = snptest.FMS[snp.Genoa] },
			wantReason: attestation.ErrUntrustedSigner, wantMsg: "product line: report CPUID says Genoa, VCEK certificate says Milan",
		},
		"product line not accepted": {
			ref: func(r *snp.Reference) {
				r.Products = []string{snp.Genoa}
				r.MinimumTCB = map[string]snp.TCB{snp.Genoa: {}}
			},
			wantReason: attestation.ErrUntrustedSigner, wantMsg: "product line Milan is not accepted",
		},
		"VCEK expired": {
			now: time.Date(2031, 6, 1, 0, 0, 0, 0, time.UTC),
			crl: func(t *testing.T, s *synth) []byte {
				return s.amd.CRL(t, time.Date(2031, 5, 1, 0, 0, 0, 0, time.UTC), time.Date(2031, 7, 1, 0, 0, 0, 0, time.UTC))
			},
			wantReason: attestation.ErrUntrustedSigner, wantMsg: "expired",
		},
		"CRL stale (fetched again, still stale)": {
			crl: func(t *testing.T, s *synth) []byte {
				return s.amd.CRL(t, now.Add(-30*24*time.Hour), now.Add(-time.Hour))
			},
			wantReason: attestation.ErrRevocationUnknown, wantMsg: "CRL of the ASK",
		},
		"CRL missing": {
			crl:        func(t *testing.T, s *synth) []byte { return nil },
			wantReason: attestation.ErrRevocationUnknown, wantMsg: "CRL of the ASK",
		},
		"CRL missing and one bit of the signature": {
			crl:        func(t *testing.T, s *synth) []byte { return nil },
			raw:        func(b []byte) []byte { b[0x2A0] ^= 1; return b },
			wantReason: attestation.ErrBadSignature, wantMsg: "signature",
		},
		"CRL not AMD's": {
			crl: func(t *testing.T, s *synth) []byte {
				return newSynthWithKeys(t, snp.Milan).amd.CRL(t, now.Add(-time.Hour), now.Add(time.Hour))
			},
			wantReason: attestation.ErrUntrustedSigner, wantMsg: "not signed by the ARK",
		},
		"CRL garbage": {
			crl:        func(t *testing.T, s *synth) []byte { return []byte("not a CRL") },
			wantReason: attestation.ErrUntrustedSigner, wantMsg: "CRL of the ASK",
		},
		"ASK revoked": {
			crl: func(t *testing.T, s *synth) []byte {
				return s.amd.CRL(t, now.Add(-time.Hour), now.Add(time.Hour), s.amd.Signer.Ask.SerialNumber)
			},
			wantReason: attestation.ErrUntrustedSigner, wantMsg: "ASK of Milan revoked",
		},
		"ASVK revoked": {
			report: func(r *snptest.Report) { r.Signer = "VLEK" },
			certs:  func(t *testing.T, s *synth, c [][]byte) [][]byte { return s.amd.Certs("VLEK") },
			crl: func(t *testing.T, s *synth) []byte {
				return s.amd.CRL(t, now.Add(-time.Hour), now.Add(time.Hour), s.amd.Signer.Asvk.SerialNumber)
			},
			wantReason: attestation.ErrUntrustedSigner, wantMsg: "ASVK of Milan revoked",
		},
		"report one byte short": {
			raw:        func(b []byte) []byte { return b[:len(b)-1] },
			wantReason: attestation.ErrMalformed, wantMsg: "report of 1183 bytes, want 1184",
		},
		"report with trailing bytes": {
			raw:        func(b []byte) []byte { return append(b, 0) },
			wantReason: attestation.ErrMalformed, wantMsg: "report of 1185 bytes",
		},
		"reserved bytes set": {
			raw:        func(b []byte) []byte { b[0x1A0-1] = 1; return b },
			wantReason: attestation.ErrMalformed, wantMsg: "report",
		},
		"certificate garbage": {
			certs:      func(t *testing.T, s *synth, c [][]byte) [][]byte { return append(c, []byte("garbage")) },
			wantReason: attestation.ErrMalformed, wantMsg: "certificate 3",
		},
		"too many certificates": {
			certs: func(t *testing.T, s *synth, c [][]byte) [][]byte {
				return append(c, c[1], c[1], c[1], c[1], c[1], c[1])
			},
			wantReason: attestation.ErrMalformed, wantMsg: "more than 8 certificates",
		},
		"two VCEKs": {
			certs:      func(t *testing.T, s *synth, c [][]byte) [][]byte { return append(c, c[0]) },
			wantReason: attestation.ErrMalformed, wantMsg: "two VCEK certificates",
		},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			product := c.product
			if product == "" {
				product = snp.Milan
			}
			s := newSynth(t, product)
			r := snptest.DefaultReport()
			if c.report != nil {
				c.report(&r)
			}
			raw := s.amd.Sign(t, r)
			if c.raw != nil {
				raw = c.raw(raw)
			}
			certs := s.amd.Certs(r.Signer)
			if c.certs != nil {
				certs = c.certs(t, s, certs)
			}
			ref := s.reference()
			if c.ref != nil {
				c.ref(&ref)
			}
			if c.crl != nil {
				body := c.crl(t, s)
				for _, signer := range []string{"VCEK", "VLEK"} {
					if body == nil {
						delete(s.fetcher.docs, s.amd.CRLURL(signer))
					} else {
						s.fetcher.docs[s.amd.CRLURL(signer)] = body
					}
				}
			}
			at := now
			if !c.now.IsZero() {
				at = c.now
			}
			data := reportData()
			if c.data != nil {
				data = c.data
			}
			hw, err := s.validator(t, ref, at).Check(context.Background(), raw, certs, nil, data)
			require.Error(t, err)
			assert.Nil(t, hw, "no claims on failure")
			assertOneReason(t, err, c.wantReason)
			assert.Contains(t, err.Error(), c.wantMsg)
		})
	}
}

// newSynthWithKeys is a fake AMD whose keys differ from every other fake AMD's.
func newSynthWithKeys(t testing.TB, product string) *synth {
	s := newSynth(t, product)
	// The default fake keys are shared; another chip has other keys. Re-sign with fresh ones.
	amd := snptest.NewAMDWithFreshKeys(t, product, snptest.Options{TCB: tcbOf(product)})
	s.amd = amd
	return s
}

var reasons = []error{
	attestation.ErrMalformed, attestation.ErrTooLarge, attestation.ErrWrongVariant, attestation.ErrBadSignature,
	attestation.ErrNonceMismatch, attestation.ErrUntrustedSigner, attestation.ErrMeasurementPolicy,
	attestation.ErrRevocationUnknown,
}

// assertOneReason checks err wraps want and no other attestation reason.
func assertOneReason(t *testing.T, err error, want error) {
	t.Helper()
	assert.ErrorIs(t, err, want)
	for _, r := range reasons {
		if r != want {
			assert.NotErrorIs(t, err, r, "error wraps a second reason")
		}
	}
}

// TestCheckStaleCRLInCache: the cache still holds a CRL it believes fresh, but at the
// validator's time it is past its next update; the validator refuses it itself.
func TestCheckStaleCRLInCache(t *testing.T) {
	s := newSynth(t, snp.Milan)
	crl := s.amd.CRL(t, now.Add(-48*time.Hour), now.Add(-time.Hour))
	s.fetcher.docs[s.amd.CRLURL("VCEK")] = crl
	earlier := now.Add(-2 * time.Hour)
	cache := s.cache(earlier) // the CRL is fresh for the cache
	v, err := snp.NewValidator(snp.Config{Reference: s.reference(), Collateral: cache, Now: func() time.Time { return now }, Roots: s.amd.Roots})
	require.NoError(t, err)
	_, err = v.Check(context.Background(), s.amd.Sign(t, snptest.DefaultReport()), s.amd.Certs("VCEK"), nil, reportData())
	assertOneReason(t, err, attestation.ErrRevocationUnknown)
	assert.Contains(t, err.Error(), "CRL of the ASK is stale")

	// A revocation counts even in a CRL past its next update: revoked is never "unknown".
	s.fetcher.docs[s.amd.CRLURL("VCEK")] = s.amd.CRL(t, now.Add(-48*time.Hour), now.Add(-time.Hour), s.amd.Signer.Ask.SerialNumber)
	v, err = snp.NewValidator(snp.Config{Reference: s.reference(), Collateral: s.cache(earlier), Now: func() time.Time { return now }, Roots: s.amd.Roots, Revocation: attestation.RevocationUnknownAccepted})
	require.NoError(t, err)
	_, err = v.Check(context.Background(), s.amd.Sign(t, snptest.DefaultReport()), s.amd.Certs("VCEK"), nil, reportData())
	assertOneReason(t, err, attestation.ErrUntrustedSigner)
	assert.Contains(t, err.Error(), "ASK of Milan revoked")
}

// TestCheckOfflineVerdicts: a verifier without network and without a CRL tells a forged
// report from a genuine one (bad signature vs. unknown revocation); RevocationUnknownAccepted
// accepts the genuine one with the status in the claims, never the forged one; a CRL at hand
// is used under either policy. The CRL's verdict (unknown, or revoked) comes last: a genuine
// report for another binding, or outside the reference, is refused for that, with or
// without a CRL at hand.
func TestCheckOfflineVerdicts(t *testing.T) {
	s := newSynth(t, snp.Milan)
	genuine := s.amd.Sign(t, snptest.DefaultReport())
	forged := bytes.Clone(genuine)
	forged[0x90] ^= 1 // MEASUREMENT
	crl := []*hardwarepb.Collateral{{Url: s.amd.CRLURL("VCEK"), Body: s.fetcher.docs[s.amd.CRLURL("VCEK")]}}
	revoking := []*hardwarepb.Collateral{{Url: s.amd.CRLURL("VCEK"), Body: s.amd.CRL(t, now.Add(-time.Hour), now.Add(time.Hour), s.amd.Signer.Ask.SerialNumber)}}

	for _, policy := range []attestation.RevocationPolicy{attestation.RevocationRequired, attestation.RevocationUnknownAccepted} {
		t.Run(policy.String(), func(t *testing.T) {
			offline := collateral.New(collateral.Config{Now: func() time.Time { return now }})
			v, err := snp.NewValidator(snp.Config{Reference: s.reference(), Collateral: offline, Now: func() time.Time { return now }, Roots: s.amd.Roots, Revocation: policy})
			require.NoError(t, err)
			check := func(report []byte, carried []*hardwarepb.Collateral) (*attestation.Hardware, error) {
				return v.Check(context.Background(), report, s.amd.Certs("VCEK"), carried, reportData())
			}

			_, err = check(forged, nil)
			assertOneReason(t, err, attestation.ErrBadSignature)

			hw, err := check(genuine, nil)
			if policy == attestation.RevocationRequired {
				assertOneReason(t, err, attestation.ErrRevocationUnknown)
				assert.ErrorIs(t, err, collateral.ErrOffline)
				assert.Contains(t, err.Error(), "decided last, after every check that needs no collateral passed")
				_, isCollateral := errors.AsType[*attestation.CollateralError](err)
				assert.True(t, isCollateral, "a verdict of the collateral is marked as one")
			} else {
				require.NoError(t, err)
				assert.False(t, hw.RevocationChecked)
				assert.Contains(t, hw.Warnings, "revocation not checked (policy unknown-accepted): CRL of the ASK: "+collateral.ErrOffline.Error()+": "+s.amd.CRLURL("VCEK"))
			}

			hw, err = check(genuine, crl)
			require.NoError(t, err)
			assert.True(t, hw.RevocationChecked)
			assert.Empty(t, hw.Warnings)

			_, err = check(genuine, revoking)
			assertOneReason(t, err, attestation.ErrUntrustedSigner)
			assert.Contains(t, err.Error(), "ASK of Milan revoked")
			_, isCollateral := errors.AsType[*attestation.CollateralError](err)
			assert.True(t, isCollateral, "a verdict of the collateral is marked as one")

			// Checks that need no collateral come before its verdict.
			otherRef := s.reference()
			otherRef.Measurements = snp.Digests{bytes.Repeat([]byte{0x33}, 48)}
			otherLaunch, err := snp.NewValidator(snp.Config{Reference: otherRef, Collateral: offline, Now: func() time.Time { return now }, Roots: s.amd.Roots, Revocation: policy})
			require.NoError(t, err)
			for _, carried := range [][]*hardwarepb.Collateral{nil, revoking} {
				_, err = v.Check(context.Background(), genuine, s.amd.Certs("VCEK"), carried, bytes.Repeat([]byte{0x44}, 64))
				assertOneReason(t, err, attestation.ErrNonceMismatch)
				_, err = otherLaunch.Check(context.Background(), genuine, s.amd.Certs("VCEK"), carried, reportData())
				assertOneReason(t, err, attestation.ErrMeasurementPolicy)
				assert.Contains(t, err.Error(), "MEASUREMENT")
			}
		})
	}
	_, err := snp.NewValidator(snp.Config{Reference: s.reference(), Collateral: collateral.New(collateral.Config{}), Revocation: 7})
	assert.ErrorContains(t, err, "RevocationPolicy(7)")
}

// TestCollateralURLs: the URLs CollateralURLs lists are exactly what Check reads; an offline
// verifier that fetched them ahead and put them into its cache checks the report fully.
func TestCollateralURLs(t *testing.T) {
	s := newSynth(t, snp.Milan)
	v := s.validator(t, s.reference(), now)
	withKey := s.amd.Sign(t, snptest.DefaultReport())
	vcekURL := kds.VCEKCertURL(snp.Milan, s.amd.ChipID[:], kds.TCBVersion(s.amd.TCB.Version(snp.Milan)))
	s.fetcher.docs[vcekURL] = s.amd.Signer.Vcek.Raw

	urls, err := v.CollateralURLs(withKey, s.amd.Certs("VCEK"))
	require.NoError(t, err)
	assert.Equal(t, []string{s.amd.CRLURL("VCEK")}, urls)
	urls, err = v.CollateralURLs(withKey, nil)
	require.NoError(t, err)
	assert.Equal(t, []string{vcekURL, s.amd.CRLURL("VCEK")}, urls)

	offline := collateral.New(collateral.Config{Now: func() time.Time { return now }})
	for _, url := range urls {
		require.NoError(t, offline.Put(url, nil, s.fetcher.docs[url]))
	}
	ov, err := snp.NewValidator(snp.Config{Reference: s.reference(), Collateral: offline, Now: func() time.Time { return now }, Roots: s.amd.Roots})
	require.NoError(t, err)
	hw, err := ov.Check(context.Background(), withKey, nil, nil, reportData())
	require.NoError(t, err)
	assert.True(t, hw.RevocationChecked)

	vlek := snptest.DefaultReport()
	vlek.Signer = "VLEK"
	raw := s.amd.Sign(t, vlek)
	urls, err = v.CollateralURLs(raw, s.amd.Certs("VLEK"))
	require.NoError(t, err)
	assert.Equal(t, []string{s.amd.CRLURL("VLEK")}, urls)
	_, err = v.CollateralURLs(raw, nil)
	assertOneReason(t, err, attestation.ErrUntrustedSigner)
	_, err = v.CollateralURLs(withKey[:100], nil)
	assertOneReason(t, err, attestation.ErrMalformed)
}

// TestCheckFetchesVCEK: a report without its VCEK verifies with the VCEK fetched (once) from
// the KDS URL of its chip and TCB; the carried collateral of an offline verifier works too.
func TestCheckFetchesVCEK(t *testing.T) {
	s := newSynth(t, snp.Milan)
	raw := s.amd.Sign(t, snptest.DefaultReport())
	url := kds.VCEKCertURL(snp.Milan, s.amd.ChipID[:], kds.TCBVersion(s.amd.TCB.Version(snp.Milan)))
	s.fetcher.docs[url] = s.amd.Signer.Vcek.Raw
	v := s.validator(t, s.reference(), now)
	for range 3 {
		hw, err := v.Check(context.Background(), raw, nil, nil, reportData())
		require.NoError(t, err)
		assert.Equal(t, "VCEK", hw.Signer)
	}
	assert.Equal(t, 1, s.fetcher.calls[url], "the VCEK is cached by URL")

	// Offline: only what the evidence carries.
	offline := collateral.New(collateral.Config{Now: func() time.Time { return now }})
	v, err := snp.NewValidator(snp.Config{Reference: s.reference(), Collateral: offline, Now: func() time.Time { return now }, Roots: s.amd.Roots})
	require.NoError(t, err)
	_, err = v.Check(context.Background(), raw, nil, nil, reportData())
	assertOneReason(t, err, attestation.ErrUntrustedSigner)
	assert.ErrorIs(t, err, collateral.ErrOffline)
	carried := []*hardwarepb.Collateral{
		{Url: url, Body: s.amd.Signer.Vcek.Raw},
		{Url: s.amd.CRLURL("VCEK"), Body: s.fetcher.docs[s.amd.CRLURL("VCEK")]},
	}
	_, err = v.Check(context.Background(), raw, nil, carried, reportData())
	require.NoError(t, err)
}

// TestCheckIDKeyWarnOnly: a warn-only ID key mismatch passes with a warning; an author key
// in the list is accepted as the ID key's signer.
func TestCheckIDKeyWarnOnly(t *testing.T) {
	s := newSynth(t, snp.Genoa)
	accepted := bytes.Repeat([]byte{0x44}, 48)
	r := snptest.DefaultReport()
	r.IDKeyDigest[0] = 0x45
	raw := s.amd.Sign(t, r)

	ref := s.reference()
	ref.IDKeyDigests = snp.Digests{accepted}
	ref.IDKeyEnforcement = snp.EnforceWarnOnly
	hw, err := s.validator(t, ref, now).Check(context.Background(), raw, s.amd.Certs("VCEK"), nil, reportData())
	require.NoError(t, err)
	require.Len(t, hw.Warnings, 1)
	assert.Contains(t, hw.Warnings[0], "ID_KEY_DIGEST 45")

	copy(r.AuthorKeyDigest[:], accepted)
	ref.IDKeyEnforcement = snp.EnforceEqual
	ref.Measurements = nil // an enforced ID key alone is a reference
	hw, err = s.validator(t, ref, now).Check(context.Background(), s.amd.Sign(t, r), s.amd.Certs("VCEK"), nil, reportData())
	require.NoError(t, err)
	assert.Empty(t, hw.Warnings)
}

// TestCheckOwnRootRefused: a host that brings its own AMD (its own ARK, ASK and VCEK, sent
// with the evidence) is refused by a validator with the pinned roots.
func TestCheckOwnRootRefused(t *testing.T) {
	for _, product := range snp.ProductLines {
		t.Run(product, func(t *testing.T) {
			s := newSynth(t, product)
			ref := s.reference()
			v, err := snp.NewValidator(snp.Config{Reference: ref, Collateral: s.cache(now), Now: func() time.Time { return now }})
			require.NoError(t, err)
			_, err = v.Check(context.Background(), s.amd.Sign(t, snptest.DefaultReport()), s.amd.Certs("VCEK"), nil, reportData())
			// The host's VCEK is the first of its certificates to meet a pinned root (its CRL,
			// served at AMD's URL and signed by its own ARK, is never read).
			assertOneReason(t, err, attestation.ErrUntrustedSigner)
			assert.Contains(t, err.Error(), "VCEK could not be verified by any trusted roots")
		})
	}
}

// TestCheckIgnoresSentChain: the chain that comes with the evidence is never used, so a
// changed (or missing) ASK/ARK in it changes nothing.
func TestCheckIgnoresSentChain(t *testing.T) {
	s := newSynth(t, snp.Turin)
	certs := s.amd.Certs("VCEK")
	certs[1] = bytes.Clone(certs[1])
	certs[1][len(certs[1])-3] ^= 1
	for _, c := range [][][]byte{certs, certs[:1]} {
		_, err := s.validator(t, s.reference(), now).Check(context.Background(), s.amd.Sign(t, snptest.DefaultReport()), c, nil, reportData())
		require.NoError(t, err)
	}
}

// --- AMD's real samples ------------------------------------------------------------------

func readFile(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	require.NoError(t, err)
	return b
}

func mustHex(s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return b
}

type sample struct {
	report, data []byte
	certs        [][]byte
	ref          snp.Reference
	at           time.Time
	signer       string
}

// azureSample is the report of an Azure confidential VM (VCEK-signed Milan, version 2).
func azureSample(t testing.TB) sample {
	raw := readFile(t, "azure-snp-attestation.bin")[:abi.ReportSize] // the file has an HCL trailer
	data := sha256.Sum256(readFile(t, "azure-snp-runtimedata.bin"))
	ref := snp.DefaultReference("azure-sample")
	ref.Products = []string{snp.Milan}
	ref.MinimumTCB = map[string]snp.TCB{snp.Milan: {Bootloader: 2, TEE: 0, SNP: 6, Microcode: 93}}
	ref.Measurements = snp.Digests{mustHex("5677f1de87289e7ad2c7e99c805d0468b1a9ccd83f0d245afa5242d405da4d5725852f8c6550564870e5f3206dfb1841")}
	ref.IDKeyDigests = snp.Digests{mustHex("57e229e0ffe5fa92d0faddff6cae0e61c926fc9ef9afd20a8b8cfcf7129db9338cbe5bf3f6987733a2bf65d06dc38fc1")}
	return sample{
		report: raw, data: data[:], ref: ref, signer: "VCEK",
		certs: [][]byte{readFile(t, "azure-snp-vcek.cert"), readFile(t, "azure-snp-certchain.pem")},
		at:    time.Date(2024, 6, 1, 0, 0, 0, 0, time.UTC), // VCEK valid 2023-08-30 to 2030-08-30
	}
}

// awsSample is the report of an AWS SNP instance (VLEK-signed Milan, version 3, provisional
// firmware: current microcode 220, committed and launch 219, reported 217).
func awsSample(t testing.TB) sample {
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(readFile(t, "aws-snp-vlek-report.b64"))))
	require.NoError(t, err)
	ref := snp.DefaultReference("aws-sample")
	ref.Products = []string{snp.Milan}
	ref.MinimumTCB = map[string]snp.TCB{snp.Milan: {Bootloader: 4, TEE: 0, SNP: 24, Microcode: 217}}
	ref.Measurements = snp.Digests{mustHex("5a5cdbad8f540ce4abca0120faec86f62ef7128a4ac711add34d468b5957c82aa2f24e8f111dadc3689b787b88ed0715")}
	return sample{
		report: raw, ref: ref, signer: "VLEK",
		data:  mustHex("87ab7caf510e1b3520dc3cceb64ee44128e10976fb0d3fc5e274699d8aaf506154af4c1de0a026b49fdf861e9ac75551551b3534d1c61369a3b08f5baed0db2f"),
		certs: [][]byte{readFile(t, "aws-snp-vlek.pem")},
		at:    time.Date(2025, 6, 1, 0, 0, 0, 0, time.UTC), // VLEK valid 2024-12-10 to 2025-12-10
	}
}

func (s sample) validator(t testing.TB) *snp.Validator {
	t.Helper()
	cache := collateral.New(collateral.Config{Now: func() time.Time { return s.at }})
	// No CRL signed by AMD's real ARK is at hand offline (testdata/README.md): the samples
	// are checked as an offline verifier would, accepting an unknown revocation status.
	v, err := snp.NewValidator(snp.Config{Reference: s.ref, Collateral: cache, Now: func() time.Time { return s.at }, Revocation: attestation.RevocationUnknownAccepted})
	require.NoError(t, err)
	return v
}

// TestRealSamples: AMD-signed reports from Azure and AWS verify with the pinned roots, and
// every tampering is refused.
func TestRealSamples(t *testing.T) {
	for name, load := range map[string]func(testing.TB) sample{"azure": azureSample, "aws": awsSample} {
		t.Run(name, func(t *testing.T) {
			s := load(t)
			hw, err := s.validator(t).Check(context.Background(), s.report, s.certs, nil, s.data)
			require.NoError(t, err)
			assert.Equal(t, snp.Milan, hw.Product)
			assert.Equal(t, s.signer, hw.Signer)
			assert.False(t, hw.RevocationChecked)
			require.NotEmpty(t, hw.Warnings)
			assert.Contains(t, hw.Warnings[len(hw.Warnings)-1], "revocation not checked (policy unknown-accepted)")
			assert.Equal(t, s.ref.Measurements[0], hw.Measurements["MEASUREMENT"])

			for tname, tamper := range map[string]struct {
				mutate func(*sample)
				reason error
				msg    string
			}{
				"MEASUREMENT bit": {func(s *sample) { s.report = flip(s.report, 0x90+7) }, attestation.ErrBadSignature, "signature"},
				"HOST_DATA bit":   {func(s *sample) { s.report = flip(s.report, 0xC0) }, attestation.ErrBadSignature, "signature"},
				"signature bit":   {func(s *sample) { s.report = flip(s.report, 0x2A0+40) }, attestation.ErrBadSignature, "signature"},
				"key certificate bit": {func(s *sample) {
					key := s.certs[0]
					if block, _ := pemDecode(key); block != nil {
						key = block
					}
					s.certs = [][]byte{flip(key, len(key)-10)}
				}, attestation.ErrUntrustedSigner, s.signer + " certificate"},
				"report data":            {func(s *sample) { s.data = flip(s.data, 0) }, attestation.ErrNonceMismatch, "REPORT_DATA"},
				"expired":                {func(s *sample) { s.at = s.at.AddDate(7, 0, 0) }, attestation.ErrUntrustedSigner, "expired"},
				"before the key existed": {func(s *sample) { s.at = time.Date(2022, 1, 1, 0, 0, 0, 0, time.UTC) }, attestation.ErrUntrustedSigner, "certificate"},
				"measurement not accepted": {func(s *sample) {
					s.ref.Measurements = snp.Digests{bytes.Repeat([]byte{1}, 48)}
				}, attestation.ErrMeasurementPolicy, "MEASUREMENT"},
				"Genoa only": {func(s *sample) {
					s.ref.Products = []string{snp.Genoa}
					s.ref.MinimumTCB = map[string]snp.TCB{snp.Genoa: {}}
				}, attestation.ErrUntrustedSigner, "product line Milan is not accepted"},
			} {
				t.Run(tname, func(t *testing.T) {
					s := load(t)
					tamper.mutate(&s)
					hw, err := s.validator(t).Check(context.Background(), s.report, s.certs, nil, s.data)
					require.Error(t, err)
					assert.Nil(t, hw)
					assertOneReason(t, err, tamper.reason)
					assert.Contains(t, err.Error(), tamper.msg)
				})
			}
		})
	}
}

// TestRealSampleAWSProvisionalFirmware: AWS's host runs provisional firmware (current
// microcode 220, committed 219, reported 217). It is accepted, and the minimum is enforced on
// the committed, launch and reported TCB.
func TestRealSampleAWSProvisionalFirmware(t *testing.T) {
	for name, c := range map[string]struct {
		microcode uint8
		want      string
	}{
		"at reported":                 {217, ""},
		"above reported":              {218, "reported TCB microcode 217 below minimum 218"},
		"above committed and launch":  {220, "committed TCB microcode 219 below minimum 220"},
		"the sample's current is 220": {221, "committed TCB microcode 219 below minimum 221"},
	} {
		t.Run(name, func(t *testing.T) {
			s := awsSample(t)
			s.ref.MinimumTCB[snp.Milan] = snp.TCB{Bootloader: 4, SNP: 24, Microcode: c.microcode}
			_, err := s.validator(t).Check(context.Background(), s.report, s.certs, nil, s.data)
			if c.want == "" {
				require.NoError(t, err)
				return
			}
			assertOneReason(t, err, attestation.ErrMeasurementPolicy)
			assert.Contains(t, err.Error(), c.want)
		})
	}
}

// TestRealSampleProductMismatch: the AWS report (version 3) names its product line in CPUID;
// a report claiming Genoa with a Milan VLEK is refused before its signature is even checked.
func TestRealSampleProductMismatch(t *testing.T) {
	s := awsSample(t)
	s.report = bytes.Clone(s.report)
	s.report[0x189] = 0x11 // model 0x11: Genoa
	s.ref.Products = nil
	s.ref.MinimumTCB = map[string]snp.TCB{snp.Milan: {}, snp.Genoa: {}, snp.Turin: {}}
	_, err := s.validator(t).Check(context.Background(), s.report, s.certs, nil, s.data)
	assertOneReason(t, err, attestation.ErrUntrustedSigner)
	assert.Contains(t, err.Error(), "report CPUID says Genoa, VLEK certificate says Milan")
}

func flip(b []byte, i int) []byte {
	b = bytes.Clone(b)
	b[i] ^= 1
	return b
}

// --- pinned roots ------------------------------------------------------------------------

// TestPinnedRoots: the embedded roots chain up, the Milan ones are the ones of the Azure
// sample, and a changed root file is refused.
func TestPinnedRoots(t *testing.T) {
	for _, product := range snp.ProductLines {
		c, ok := snp.PinnedRoots().Product(product)
		require.True(t, ok, product)
		assert.Equal(t, "ARK-"+product, c.ARK.Subject.CommonName)
		require.NoError(t, c.ASK.CheckSignatureFrom(c.ARK))
		require.NoError(t, c.ASVK.CheckSignatureFrom(c.ARK))
		require.NoError(t, c.ARK.CheckSignatureFrom(c.ARK))
	}
	for _, name := range []string{"ark", "ask"} {
		embedded, err := snp.RootsFS.ReadFile("roots/" + name + "_milan.pem")
		require.NoError(t, err)
		assert.Equal(t, readFile(t, "amd-milan-"+name+".pem"), embedded, "Milan %s", name)
	}

	files := fstest.MapFS{}
	for name := range snp.PinnedFingerprints {
		b, err := snp.RootsFS.ReadFile(name)
		require.NoError(t, err)
		files[name] = &fstest.MapFile{Data: b}
	}
	_, err := snp.LoadRoots(files, snp.PinnedFingerprints)
	require.NoError(t, err, "the loader accepts the embedded files")

	for name, change := range map[string]func(fstest.MapFS){
		"ASK replaced by a fake ASK": func(f fstest.MapFS) {
			fake := snptest.NewAMD(t, snp.Genoa, snptest.Options{})
			f["roots/ask_genoa.pem"] = &fstest.MapFile{Data: pemCert(fake.Signer.Ask.Raw)}
		},
		"ARK with one bit changed": func(f fstest.MapFS) {
			der, _ := pemDecode(f["roots/ark_turin.pem"].Data)
			f["roots/ark_turin.pem"] = &fstest.MapFile{Data: pemCert(flip(der, len(der)-20))}
		},
		"second certificate appended": func(f fstest.MapFS) {
			f["roots/ark_milan.pem"] = &fstest.MapFile{Data: append(bytes.Clone(f["roots/ark_milan.pem"].Data), f["roots/ark_genoa.pem"].Data...)}
		},
		"file missing": func(f fstest.MapFS) { delete(f, "roots/asvk_milan.pem") },
	} {
		t.Run(name, func(t *testing.T) {
			tampered := fstest.MapFS{}
			for k, v := range files {
				tampered[k] = &fstest.MapFile{Data: bytes.Clone(v.Data)}
			}
			change(tampered)
			_, err := snp.LoadRoots(tampered, snp.PinnedFingerprints)
			require.Error(t, err)
		})
	}
}

// TestNewRootsRefusesInconsistentChains: an ASK not signed by the ARK is not a chain.
func TestNewRootsRefusesInconsistentChains(t *testing.T) {
	a := snptest.NewAMD(t, snp.Milan, snptest.Options{})
	b := snptest.NewAMDWithFreshKeys(t, snp.Milan, snptest.Options{})
	_, err := snp.NewRoots(snp.ProductRoots{Product: snp.Milan, ARK: a.Signer.Ark, ASK: b.Signer.Ask, ASVK: a.Signer.Asvk})
	assert.ErrorContains(t, err, "ASK not signed by the ARK")
	_, err = snp.NewRoots(snp.ProductRoots{Product: snp.Genoa, ARK: a.Signer.Ark, ASK: a.Signer.Ask, ASVK: a.Signer.Asvk})
	assert.ErrorContains(t, err, `ARK common name "ARK-Milan", want "ARK-Genoa"`)
}

// --- reference ---------------------------------------------------------------------------

func TestReferenceValidate(t *testing.T) {
	valid := func() snp.Reference {
		r := snp.DefaultReference("ref")
		r.MinimumTCB = map[string]snp.TCB{snp.Milan: {Microcode: 1}, snp.Genoa: {}, snp.Turin: {FMC: 1}}
		r.Measurements = snp.Digests{make([]byte, 48)}
		return r
	}
	require.NoError(t, valid().Validate())
	for name, c := range map[string]struct {
		change func(*snp.Reference)
		want   string
	}{
		"no name":                  {func(r *snp.Reference) { r.Name = "" }, "name"},
		"unknown product":          {func(r *snp.Reference) { r.Products = []string{"Rome"} }, `products[0]: unknown product line "Rome"`},
		"product twice":            {func(r *snp.Reference) { r.Products = []string{snp.Milan, snp.Milan} }, "products[1]"},
		"minimum missing":          {func(r *snp.Reference) { delete(r.MinimumTCB, snp.Genoa) }, "minimumTCB.Genoa: missing"},
		"minimum of other product": {func(r *snp.Reference) { r.Products = []string{snp.Milan} }, "minimumTCB.Genoa: product line not accepted"},
		"FMC on Milan":             {func(r *snp.Reference) { r.MinimumTCB[snp.Milan] = snp.TCB{FMC: 1} }, "minimumTCB.Milan.fmc"},
		"SNP out of range":         {func(r *snp.Reference) { r.MinimumTCB[snp.Genoa] = snp.TCB{SNP: 200} }, "minimumTCB.Genoa.snp: 200"},
		"VMPL 4":                   {func(r *snp.Reference) { r.VMPL = 4 }, "vmpl: 4"},
		"short measurement":        {func(r *snp.Reference) { r.Measurements = snp.Digests{make([]byte, 32)} }, "measurement[0]: 32 bytes"},
		"no measurement":           {func(r *snp.Reference) { r.Measurements = nil }, "measurement: at least one"},
		"only warn-only ID keys": {func(r *snp.Reference) {
			r.Measurements = nil
			r.IDKeyDigests = snp.Digests{make([]byte, 48)}
			r.IDKeyEnforcement = snp.EnforceWarnOnly
		}, "measurement: at least one"},
		"short ID key":           {func(r *snp.Reference) { r.IDKeyDigests = snp.Digests{make([]byte, 47)} }, "idKeyDigests[0]: 47 bytes"},
		"unknown enforcement":    {func(r *snp.Reference) { r.IDKeyEnforcement = "maybe" }, `idKeyEnforcement: "maybe"`},
		"warn-only without keys": {func(r *snp.Reference) { r.IDKeyEnforcement = snp.EnforceWarnOnly }, "idKeyEnforcement: warn-only without"},
	} {
		t.Run(name, func(t *testing.T) {
			r := valid()
			c.change(&r)
			err := r.Validate()
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
			_, err = snp.NewValidator(snp.Config{Reference: r, Collateral: collateral.New(collateral.Config{})})
			assert.Error(t, err, "NewValidator refuses it too")
		})
	}
	_, err := snp.NewValidator(snp.Config{Reference: valid()})
	assert.ErrorContains(t, err, "no collateral cache")
}

func TestReferenceJSON(t *testing.T) {
	const doc = `{"name":"aws","products":["Milan"],"minimumTCB":{"Milan":{"bootloader":4,"tee":0,"snp":24,"microcode":217}},
	"guestPolicy":{"minimumABIMinor":31},"vmpl":0,
	"measurement":"5a5cdbad8f540ce4abca0120faec86f62ef7128a4ac711add34d468b5957c82aa2f24e8f111dadc3689b787b88ed0715",
	"idKeyDigests":["57e229e0ffe5fa92d0faddff6cae0e61c926fc9ef9afd20a8b8cfcf7129db9338cbe5bf3f6987733a2bf65d06dc38fc1"],
	"idKeyEnforcement":"warn-only","platformInfo":{"requireTSME":true},"minimumFirmware":{"major":1,"minor":55}}`
	var r snp.Reference
	require.NoError(t, jsonUnmarshalStrict([]byte(doc), &r))
	require.NoError(t, r.Validate())
	assert.Len(t, r.Measurements, 1)
	assert.Equal(t, uint8(217), r.MinimumTCB[snp.Milan].Microcode)
	assert.True(t, r.PlatformInfo.RequireTSME)
	assert.Equal(t, "1.55", r.MinimumFirmware.String())

	out, err := json.Marshal(r)
	require.NoError(t, err)
	var back snp.Reference
	require.NoError(t, jsonUnmarshalStrict(out, &back))
	assert.Equal(t, r, back, "marshal round trip: %s", out)

	var bad snp.Reference
	assert.Error(t, jsonUnmarshalStrict([]byte(`{"measurement":"zz"}`), &bad))
	assert.Error(t, jsonUnmarshalStrict([]byte(`{"measurement":5}`), &bad))
}

func TestTCBLayout(t *testing.T) {
	milan := snp.TCB{Bootloader: 4, TEE: 1, SNP: 24, Microcode: 219}
	assert.Equal(t, uint64(0xdb18000000000104), milan.Version(snp.Milan))
	assert.Equal(t, milan, snp.TCBFromVersion(snp.Genoa, milan.Version(snp.Genoa)))
	turin := snp.TCB{FMC: 1, Bootloader: 2, TEE: 3, SNP: 4, Microcode: 5}
	assert.Equal(t, uint64(0x0500000004030201), turin.Version(snp.Turin))
	assert.Equal(t, turin, snp.TCBFromVersion(snp.Turin, turin.Version(snp.Turin)))
}

// TestCheckConcurrent: one validator serves many checks at once (run with -race).
func TestCheckConcurrent(t *testing.T) {
	s := newSynth(t, snp.Genoa)
	v := s.validator(t, s.reference(), now)
	good := s.amd.Sign(t, snptest.DefaultReport())
	r := snptest.DefaultReport()
	r.Policy.Debug = true
	bad := s.amd.Sign(t, r)
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() {
			raw := good
			if i%2 == 1 {
				raw = bad
			}
			_, errs[i] = v.Check(context.Background(), raw, s.amd.Certs("VCEK"), nil, reportData())
		})
	}
	wg.Wait()
	for i, err := range errs {
		if i%2 == 0 {
			assert.NoError(t, err)
		} else {
			assert.ErrorIs(t, err, attestation.ErrMeasurementPolicy)
		}
	}
}

// TestCheckWarm: once a VCEK was accepted, its chain is not checked again, but expiry,
// revocation and the report signature still are on every check.
func TestCheckWarm(t *testing.T) {
	s := newSynth(t, snp.Milan)
	clock := now
	cache := collateral.New(collateral.Config{Fetcher: s.fetcher, Now: func() time.Time { return clock }})
	v, err := snp.NewValidator(snp.Config{Reference: s.reference(), Collateral: cache, Now: func() time.Time { return clock }, Roots: s.amd.Roots})
	require.NoError(t, err)
	raw, certs := s.amd.Sign(t, snptest.DefaultReport()), s.amd.Certs("VCEK")
	check := func(raw []byte, certs [][]byte, carried []*hardwarepb.Collateral) error {
		_, err := v.Check(context.Background(), raw, certs, carried, reportData())
		return err
	}
	require.NoError(t, check(raw, certs, nil))
	require.NoError(t, check(raw, certs, nil))

	err = check(flip(raw, 0x90), certs, nil)
	assertOneReason(t, err, attestation.ErrBadSignature)

	vcek := flip(certs[0], len(certs[0])-5)
	err = check(raw, [][]byte{vcek}, nil)
	assertOneReason(t, err, attestation.ErrUntrustedSigner)

	revoked := s.amd.CRL(t, now.Add(-time.Hour), now.Add(time.Hour), s.amd.Signer.Ask.SerialNumber)
	err = check(raw, certs, []*hardwarepb.Collateral{{Url: s.amd.CRLURL("VCEK"), Body: revoked}})
	assertOneReason(t, err, attestation.ErrUntrustedSigner)
	assert.Contains(t, err.Error(), "ASK of Milan revoked")

	clock = s.amd.Signer.Vcek.NotAfter.Add(time.Hour)
	fresh := s.amd.CRL(t, clock.Add(-time.Hour), clock.Add(time.Hour))
	err = check(raw, certs, []*hardwarepb.Collateral{{Url: s.amd.CRLURL("VCEK"), Body: fresh}})
	assertOneReason(t, err, attestation.ErrUntrustedSigner)
	assert.Contains(t, err.Error(), "expired")
}
