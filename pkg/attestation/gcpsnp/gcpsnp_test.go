package gcpsnp_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	tpmclient "github.com/google/go-tpm-tools/client"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/openconstellation/constellation/pkg/api/attestation/hardwarepb"
	"github.com/openconstellation/constellation/pkg/api/attestation/vtpmpb"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/collateral"
	"github.com/openconstellation/constellation/pkg/attestation/gcpsnp"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/measurements/measurementstest"
	"github.com/openconstellation/constellation/pkg/attestation/snp"
	"github.com/openconstellation/constellation/pkg/attestation/snpissuer"
	"github.com/openconstellation/constellation/pkg/attestation/snpissuer/snpfake"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm/vtpmtest"
)

var (
	nonce       = bytes.Repeat([]byte{0x11}, 32)
	otherNonce  = bytes.Repeat([]byte{0x22}, 32)
	start       = time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	measurement = bytes.Repeat([]byte{0x5a}, 48)
)

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Set(t time.Time) { c.mu.Lock(); defer c.mu.Unlock(); c.now = t }

// amd is a fake AMD key server (CRLs and VCEKs); nil docs make it unreachable.
type amd struct {
	mu   sync.Mutex
	docs map[string][]byte
}

func (a *amd) Fetch(_ context.Context, url string) (map[string][]string, []byte, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.docs == nil {
		return nil, nil, errors.New("connection refused")
	}
	body, ok := a.docs[url]
	if !ok {
		return nil, nil, fmt.Errorf("404 %s", url)
	}
	return nil, body, nil
}

func serve(t testing.TB, platforms ...*snpfake.Platform) *amd {
	t.Helper()
	a := &amd{docs: map[string][]byte{}}
	for _, p := range platforms {
		crl, err := p.CRL(start.Add(-time.Hour), start.Add(7*24*time.Hour))
		require.NoError(t, err)
		a.docs[p.CRLURL()] = crl
		a.docs[p.VCEKURL()] = p.Signer.Vcek.Raw
	}
	return a
}

// google is the fake Google EK/AK CA of the tests.
var google = sync.OnceValue(func() *vtpmtest.CA {
	ca, err := vtpmtest.NewPlatformCA("EK/AK CA Intermediate")
	if err != nil {
		panic(err)
	}
	return ca
})

func boot(t testing.TB, tpm *vtpm.TPM) *vtpm.TPM {
	t.Helper()
	d := sha256.Sum256([]byte("bootstrapper"))
	require.NoError(t, tpm.ExtendPCR(4, d[:]))
	return tpm
}

type vm struct {
	platform *snpfake.Platform
	issuer   *vtpm.Issuer
	pcrs     measurements.M
}

// newVM returns a GCE confidential VM on a booted TPM whose AK the CA certified (nil: none).
func newVM(t testing.TB, tpm *vtpm.TPM, opts snpfake.Options, ca *vtpmtest.CA, carry *collateral.Cache) *vm {
	t.Helper()
	opts.Now, opts.Measurement = start, measurement
	p, err := snpfake.New(opts)
	require.NoError(t, err)
	pcrs, err := tpm.ReadPCRs()
	require.NoError(t, err)
	provisionGCEAK(t, tpm)
	iss, err := gcpsnp.NewIssuer(tpm, gcpsnp.IssuerConfig{QuoteProvider: p.QuoteProvider(), Collateral: carry})
	require.NoError(t, err)
	if ca != nil {
		cert, err := ca.CertifyNodeAK(iss.AKPublic(), "gce-instance", attestation.RoleWorker, start, 90*24*time.Hour)
		require.NoError(t, err)
		// GCE's AK is a transient key the issuer holds: release it before loading it again.
		require.NoError(t, iss.Close())
		iss, err = gcpsnp.NewIssuer(tpm, gcpsnp.IssuerConfig{AKCert: cert, QuoteProvider: p.QuoteProvider(), Collateral: carry})
		require.NoError(t, err)
	}
	t.Cleanup(func() { _ = iss.Close() })
	return &vm{platform: p, issuer: iss, pcrs: measurementstest.FromRegisters(gcpsnp.Variant, pcrs)}
}

// provisionGCEAK stores GCE's AK template in the vTPM, as GCE does, once per TPM.
func provisionGCEAK(t testing.TB, tpm *vtpm.TPM) {
	t.Helper()
	if _, err := tpm.ReadNV(tpmclient.GceAKTemplateNVIndexRSA); err == nil {
		return
	} else if !errors.Is(err, vtpm.ErrNVNotDefined) {
		require.NoError(t, err)
	}
	tmpl, err := tpmclient.AKTemplateRSA().Encode()
	require.NoError(t, err)
	require.NoError(t, tpm.WriteNV(tpmclient.GceAKTemplateNVIndexRSA, tmpl))
}

// The issuer quotes only with GCE's AK: without its template in the vTPM it refuses to be
// built rather than quote with a key Google never certified.
func TestIssuerNeedsGCEAK(t *testing.T) {
	tpm := vtpmtest.Simulator(t)
	p, err := snpfake.New(snpfake.Options{ProductName: "Milan-B0", Chip: 1, Now: start, Measurement: measurement})
	require.NoError(t, err)
	_, err = gcpsnp.NewIssuer(tpm, gcpsnp.IssuerConfig{QuoteProvider: p.QuoteProvider()})
	require.Error(t, err)
}

func (v *vm) issue(t testing.TB, data []byte) []byte {
	t.Helper()
	ev, err := v.issuer.Issue(context.Background(), attestation.PurposeVerify, data)
	require.NoError(t, err)
	return ev
}

func reference(products ...string) snp.Reference {
	ref := snp.DefaultReference("gcp-test")
	ref.Products = products
	for _, p := range products {
		ref.MinimumTCB[p] = snp.TCB{Bootloader: snpfake.DefaultTCB.BlSpl, SNP: snpfake.DefaultTCB.SnpSpl, Microcode: snpfake.DefaultTCB.UcodeSpl}
	}
	ref.Measurements = snp.Digests{measurement}
	return ref
}

// newValidator returns a gcp-sev-snp validator with the fake Google CA and fake AMD roots;
// fetcher nil makes it offline.
func newValidator(t testing.TB, ref snp.Reference, pcrs measurements.M, c *clock, fetcher collateral.Fetcher, platforms ...*snpfake.Platform) *vtpm.Validator {
	t.Helper()
	var chains []snp.ProductRoots
	for _, p := range platforms {
		chains = append(chains, p.Roots())
	}
	roots, err := snp.NewRoots(chains...)
	require.NoError(t, err)
	v, err := gcpsnp.NewValidator(gcpsnp.ValidatorConfig{
		ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: measurements.ReferenceSets{{Name: "image", Measurements: pcrs}}, Now: c.Now, Log: slog.New(slog.DiscardHandler)},
		AKRoots:         google().Pool(),
		Hardware:        ref,
		Collateral:      collateral.New(collateral.Config{Fetcher: fetcher, Now: c.Now}),
		SNPRoots:        roots,
	})
	require.NoError(t, err)
	return v
}

func decode(t testing.TB, ev []byte) *vtpmpb.Evidence {
	t.Helper()
	out := &vtpmpb.Evidence{}
	require.NoError(t, proto.Unmarshal(ev, out))
	return out
}

func encode(t testing.TB, ev *vtpmpb.Evidence) []byte {
	t.Helper()
	b, err := proto.Marshal(ev)
	require.NoError(t, err)
	return b
}

func TestGenuine(t *testing.T) {
	tpm := boot(t, vtpmtest.Simulator(t))
	for _, product := range []string{"Milan-B0", "Genoa-B1", "Turin-B0"} {
		for _, omit := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/host supplies no certificates=%v", product, omit), func(t *testing.T) {
				node := newVM(t, tpm, snpfake.Options{ProductName: product, Chip: 1, OmitCertificates: omit}, google(), nil)
				v := newValidator(t, reference(node.platform.ProductLine), node.pcrs, &clock{now: start}, serve(t, node.platform), node.platform)
				got, err := v.Validate(context.Background(), node.issue(t, nonce), attestation.PurposeVerify, nonce)
				require.NoError(t, err)
				assert.True(t, got.SignerCertified)
				assert.Equal(t, "gce-instance", got.SignerName)
				require.NotNil(t, got.Hardware)
				assert.Equal(t, "VCEK", got.Hardware.Signer)
				assert.Equal(t, node.platform.ProductLine, got.Hardware.Product)
			})
		}
	}
}

// TestOfflineVerifier: evidence whose issuer carried the CRL and VCEK verifies on a verifier
// without network; without them it fails closed.
func TestOfflineVerifier(t *testing.T) {
	tpm := boot(t, vtpmtest.Simulator(t))
	p, err := snpfake.New(snpfake.Options{ProductName: "Genoa-B1", Chip: 3, OmitCertificates: true, Now: start, Measurement: measurement})
	require.NoError(t, err)
	issuerCache := collateral.New(collateral.Config{Fetcher: serve(t, p), Now: func() time.Time { return start }})
	node := newVM(t, tpm, snpfake.Options{ProductName: "Genoa-B1", Chip: 3, OmitCertificates: true}, google(), issuerCache)
	offline := newValidator(t, reference("Genoa"), node.pcrs, &clock{now: start}, nil, node.platform)

	ev := node.issue(t, nonce)
	require.Len(t, decode(t, ev).Hardware.Collateral, 2, "CRL and VCEK carried")
	_, err = offline.Validate(context.Background(), ev, attestation.PurposeVerify, nonce)
	require.NoError(t, err)

	bare := decode(t, ev)
	bare.Hardware.Collateral = nil
	_, err = offline.Validate(context.Background(), encode(t, bare), attestation.PurposeVerify, nonce)
	require.ErrorIs(t, err, attestation.ErrUntrustedSigner)
	assert.ErrorIs(t, err, collateral.ErrOffline)
}

func TestAttacks(t *testing.T) {
	tpm := boot(t, vtpmtest.Simulator(t))
	node := newVM(t, tpm, snpfake.Options{ProductName: "Milan-B0", Chip: 1}, google(), nil)
	c := &clock{now: start}
	server := serve(t, node.platform)
	v := newValidator(t, reference("Milan"), node.pcrs, c, server, node.platform)
	genuine := node.issue(t, nonce)
	_, err := v.Validate(context.Background(), genuine, attestation.PurposeVerify, nonce)
	require.NoError(t, err, "the genuine evidence must pass, or the attacks prove nothing")

	otherCA, err := vtpmtest.NewPlatformCA("not Google")
	require.NoError(t, err)

	testCases := map[string]struct {
		evidence func(t *testing.T) []byte
		data     []byte
		want     error
		wantMsg  string
	}{
		"evidence without hardware": {
			evidence: func(t *testing.T) []byte {
				ev := decode(t, genuine)
				ev.Hardware = nil
				return encode(t, ev)
			},
			want: attestation.ErrMalformed, wantMsg: "no hardware evidence",
		},
		"AK without certificate": {
			evidence: func(t *testing.T) []byte {
				ev := decode(t, genuine)
				ev.AkCert = nil
				return encode(t, ev)
			},
			want: attestation.ErrUntrustedSigner, wantMsg: "no AK certificate",
		},
		"AK certified by another CA": {
			evidence: func(t *testing.T) []byte {
				ev := decode(t, genuine)
				cert, err := otherCA.CertifyNodeAK(ev.AkPublic, "gce-instance", attestation.RoleWorker, start, time.Hour)
				require.NoError(t, err)
				ev.AkCert = cert
				return encode(t, ev)
			},
			want: attestation.ErrUntrustedSigner, wantMsg: "AK certificate",
		},
		"report replayed from an earlier nonce, with a fresh quote": {
			evidence: func(t *testing.T) []byte {
				earlier := decode(t, node.issue(t, otherNonce))
				fresh := decode(t, genuine)
				fresh.Hardware = earlier.Hardware
				return encode(t, fresh)
			},
			want: attestation.ErrNonceMismatch, wantMsg: "must bind this quote's nonce and AK",
		},
		"whole evidence replayed for another nonce": {
			evidence: func(*testing.T) []byte { return genuine },
			data:     otherNonce,
			want:     attestation.ErrNonceMismatch,
		},
		"report tampered": {
			evidence: func(t *testing.T) []byte {
				ev := decode(t, genuine)
				ev.Hardware.SnpReport[0x90] ^= 1
				return encode(t, ev)
			},
			want: attestation.ErrBadSignature,
		},
		"product not accepted": {
			evidence: func(t *testing.T) []byte {
				genoa := newVM(t, tpm, snpfake.Options{ProductName: "Genoa-B1", Chip: 1}, google(), nil)
				return genoa.issue(t, nonce)
			},
			want: attestation.ErrUntrustedSigner, wantMsg: "product line Genoa is not accepted",
		},
		"measurement not accepted": {
			evidence: func(t *testing.T) []byte {
				ev := decode(t, genuine)
				rd, err := gcpsnp.ReportData(quoteNonce(t), ev.AkPublic)
				require.NoError(t, err)
				r := node.platform.ReportProto(rd)
				r.Measurement = bytes.Repeat([]byte{1}, 48)
				raw, err := node.platform.Sign(r)
				require.NoError(t, err)
				ev.Hardware.SnpReport = raw
				return encode(t, ev)
			},
			want: attestation.ErrMeasurementPolicy, wantMsg: "MEASUREMENT",
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			data := nonce
			if tc.data != nil {
				data = tc.data
			}
			_, err := v.Validate(context.Background(), tc.evidence(t), attestation.PurposeVerify, data)
			require.ErrorIs(t, err, tc.want)
			if tc.wantMsg != "" {
				assert.ErrorContains(t, err, tc.wantMsg)
			}
		})
	}

	t.Run("stale CRL", func(t *testing.T) {
		server.mu.Lock()
		server.docs = nil
		server.mu.Unlock()
		c.Set(start.Add(8 * 24 * time.Hour))
		_, err := v.Validate(context.Background(), genuine, attestation.PurposeVerify, nonce)
		require.ErrorIs(t, err, attestation.ErrRevocationUnknown)
		assert.ErrorIs(t, err, collateral.ErrStale)
	})
}

// TestRelayedReportAttack is the attack on a nonce-only binding (the archived upstream's).
// The attacker runs VM B: a GCE VM with a Google-certified vTPM AK, but not the expected
// confidential VM (or not the expected image). Asked for evidence over nonce N, B has the
// confidential VM A produce evidence for N (A's verification service answers anyone's nonce),
// takes A's SNP report, and sends it with B's own quote over N. With REPORT_DATA bound to N
// only, both parts would check out. Bound to N and A's AK, the report does not match B's AK.
func TestRelayedReportAttack(t *testing.T) {
	if testing.Short() {
		t.Skip("starts swtpm")
	}
	tpmA := boot(t, vtpmtest.Simulator(t))
	tpmB, _ := vtpmtest.Swtpm(t)
	boot(t, tpmB)
	a := newVM(t, tpmA, snpfake.Options{ProductName: "Milan-B0", Chip: 1}, google(), nil)
	b := newVM(t, tpmB, snpfake.Options{ProductName: "Milan-B0", Chip: 2}, google(), nil)
	for name, pcrs := range map[string]measurements.M{"B's PCRs expected": b.pcrs, "A's PCRs expected": a.pcrs} {
		t.Run(name, func(t *testing.T) {
			v := newValidator(t, reference("Milan"), pcrs, &clock{now: start}, serve(t, a.platform), a.platform)
			relayed := decode(t, b.issue(t, nonce))
			relayed.Hardware = decode(t, a.issue(t, nonce)).Hardware
			_, err := v.Validate(context.Background(), encode(t, relayed), attestation.PurposeVerify, nonce)
			require.ErrorIs(t, err, attestation.ErrNonceMismatch)
			assert.ErrorContains(t, err, "must bind this quote's nonce and AK")
		})
	}
}

// quoteNonce is the nonce the quotes of the tests carry.
func quoteNonce(t testing.TB) []byte {
	t.Helper()
	n, err := attestation.ReportData(attestation.PurposeVerify, nonce)
	require.NoError(t, err)
	return n
}

func TestReportData(t *testing.T) {
	ak := []byte("TPMT_PUBLIC of an AK")
	n := bytes.Repeat([]byte{7}, attestation.ReportDataSize)
	rd, err := gcpsnp.ReportData(n, ak)
	require.NoError(t, err)
	for name, other := range map[string]func() ([64]byte, error){
		"other nonce": func() ([64]byte, error) { return gcpsnp.ReportData(bytes.Repeat([]byte{8}, 32), ak) },
		"other AK":    func() ([64]byte, error) { return gcpsnp.ReportData(n, []byte("TPMT_PUBLIC of another")) },
	} {
		o, err := other()
		require.NoError(t, err)
		assert.NotEqual(t, rd, o, name)
	}
	_, err = gcpsnp.ReportData(n[:31], ak)
	assert.Error(t, err, "a nonce of another length would make the encoding ambiguous")
	_, err = gcpsnp.ReportData(n, nil)
	assert.Error(t, err)
}

// nonceOnly is the archived upstream's gcp-sev-snp binding: REPORT_DATA = the quote's nonce.
type nonceOnly struct{ snp *snp.Validator }

func (c nonceOnly) Check(ctx context.Context, hw *hardwarepb.Hardware, _ crypto.PublicKey, _, nonce []byte) (*attestation.Hardware, error) {
	return c.snp.Check(ctx, hw.GetSnpReport(), hw.GetSnpCertificates(), hw.GetCollateral(), nonce)
}

// TestRelayedReportAttackControl shows the relay of TestRelayedReportAttack succeeds against
// a nonce-only binding: the attack is real, and only the AK in the binding stops it.
func TestRelayedReportAttackControl(t *testing.T) {
	if testing.Short() {
		t.Skip("starts swtpm")
	}
	tpmA := boot(t, vtpmtest.Simulator(t))
	tpmB, _ := vtpmtest.Swtpm(t)
	boot(t, tpmB)
	pA, err := snpfake.New(snpfake.Options{ProductName: "Milan-B0", Chip: 1, Now: start, Measurement: measurement})
	require.NoError(t, err)
	upstreamIssuer := func(tpm *vtpm.TPM) *vtpm.Issuer {
		src, err := snpissuer.New(snpissuer.Config{QuoteProvider: pA.QuoteProvider(), ReportData: func(_, n []byte) ([64]byte, error) {
			var rd [64]byte
			copy(rd[:], n)
			return rd, nil
		}})
		require.NoError(t, err)
		iss, err := vtpm.NewIssuer(tpm, vtpm.IssuerConfig{Variant: gcpsnp.Variant, Hardware: src})
		require.NoError(t, err)
		cert, err := google().CertifyNodeAK(iss.AKPublic(), "gce-instance", attestation.RoleWorker, start, 90*24*time.Hour)
		require.NoError(t, err)
		iss, err = vtpm.NewIssuer(tpm, vtpm.IssuerConfig{Variant: gcpsnp.Variant, AKCert: cert, Hardware: src})
		require.NoError(t, err)
		return iss
	}
	a, b := upstreamIssuer(tpmA), upstreamIssuer(tpmB)
	roots, err := snp.NewRoots(pA.Roots())
	require.NoError(t, err)
	c := &clock{now: start}
	sv, err := snp.NewValidator(snp.Config{Reference: reference("Milan"), Collateral: collateral.New(collateral.Config{Fetcher: serve(t, pA), Now: c.Now}), Roots: roots, Now: c.Now})
	require.NoError(t, err)
	pcrs, err := tpmB.ReadPCRs()
	require.NoError(t, err)
	v, err := vtpm.NewValidator(vtpm.ValidatorConfig{
		ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: measurements.ReferenceSets{{Name: "image", Measurements: measurementstest.FromRegisters(gcpsnp.Variant, pcrs)}}, Now: c.Now},
		Variant:         gcpsnp.Variant,
		AKRoots:         google().Pool(),
		Hardware:        nonceOnly{sv},
	})
	require.NoError(t, err)

	evA, err := a.Issue(context.Background(), attestation.PurposeVerify, nonce)
	require.NoError(t, err)
	evB, err := b.Issue(context.Background(), attestation.PurposeVerify, nonce)
	require.NoError(t, err)
	relayed := decode(t, evB)
	relayed.Hardware = decode(t, evA).Hardware
	got, err := v.Validate(context.Background(), encode(t, relayed), attestation.PurposeVerify, nonce)
	require.NoError(t, err, "a nonce-only binding accepts B's quote with A's report")
	assert.Equal(t, decode(t, evB).AkPublic, relayed.AkPublic)
	assert.NotNil(t, got.Hardware)
}

// TestDefaultAKRootsAreGoogles: a validator configured without AK roots trusts Google's CA
// only, so an AK certified by anyone else (here the tests' CA) is refused.
func TestDefaultAKRootsAreGoogles(t *testing.T) {
	tpm := boot(t, vtpmtest.Simulator(t))
	node := newVM(t, tpm, snpfake.Options{ProductName: "Milan-B0", Chip: 1}, google(), nil)
	roots, err := snp.NewRoots(node.platform.Roots())
	require.NoError(t, err)
	c := &clock{now: start}
	v, err := gcpsnp.NewValidator(gcpsnp.ValidatorConfig{
		ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: measurements.ReferenceSets{{Name: "image", Measurements: node.pcrs}}, Now: c.Now},
		Hardware:        reference("Milan"),
		Collateral:      collateral.New(collateral.Config{Fetcher: serve(t, node.platform), Now: c.Now}),
		SNPRoots:        roots,
	})
	require.NoError(t, err)
	_, err = v.Validate(context.Background(), node.issue(t, nonce), attestation.PurposeVerify, nonce)
	require.ErrorIs(t, err, attestation.ErrUntrustedSigner)
	assert.ErrorContains(t, err, "AK certificate")
}
