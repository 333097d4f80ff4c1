package awssnp_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/google/go-sev-guest/abi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/openconstellation/constellation/pkg/api/attestation/vtpmpb"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/awssnp"
	"github.com/openconstellation/constellation/pkg/attestation/collateral"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/measurements/measurementstest"
	"github.com/openconstellation/constellation/pkg/attestation/snp"
	"github.com/openconstellation/constellation/pkg/attestation/snpissuer/snpfake"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm/vtpmtest"
)

var (
	nonce       = bytes.Repeat([]byte{0x11}, 32)
	otherNonce  = bytes.Repeat([]byte{0x22}, 32)
	start       = time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	measurement = bytes.Repeat([]byte{0xa5}, 48)
)

// clock is the shared time of the validator and its collateral cache.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Set(t time.Time) { c.mu.Lock(); defer c.mu.Unlock(); c.now = t }

// amd is a fake AMD key server: it serves CRLs until it goes offline.
type amd struct {
	mu      sync.Mutex
	docs    map[string][]byte
	offline bool
}

func (a *amd) Fetch(_ context.Context, url string) (map[string][]string, []byte, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.offline {
		return nil, nil, errors.New("connection refused")
	}
	body, ok := a.docs[url]
	if !ok {
		return nil, nil, fmt.Errorf("404 %s", url)
	}
	return nil, body, nil
}

// vm is an AWS confidential VM: a vTPM and the chip it runs on.
type vm struct {
	platform *snpfake.Platform
	issuer   *vtpm.Issuer
	pcrs     measurements.M
}

// boot measures the image into a fresh TPM.
func boot(t testing.TB, tpm *vtpm.TPM) *vtpm.TPM {
	t.Helper()
	d := sha256.Sum256([]byte("bootstrapper"))
	require.NoError(t, tpm.ExtendPCR(4, d[:]))
	return tpm
}

// newVM returns a VM on a booted TPM, on a chip that signs with its VLEK unless opts say
// vcek.
func newVM(t testing.TB, tpm *vtpm.TPM, opts snpfake.Options, vcek ...bool) *vm {
	t.Helper()
	opts.Signer = abi.VlekReportSigner
	if len(vcek) > 0 && vcek[0] {
		opts.Signer = abi.VcekReportSigner
	}
	opts.Now, opts.Measurement = start, measurement
	p, err := snpfake.New(opts)
	require.NoError(t, err)
	pcrs, err := tpm.ReadPCRs()
	require.NoError(t, err)
	iss, err := awssnp.NewIssuer(tpm, awssnp.IssuerConfig{QuoteProvider: p.QuoteProvider()})
	require.NoError(t, err)
	return &vm{platform: p, issuer: iss, pcrs: measurementstest.FromRegisters(awssnp.Variant, pcrs)}
}

func (v *vm) issue(t testing.TB, data []byte) []byte {
	t.Helper()
	ev, err := v.issuer.Issue(context.Background(), attestation.PurposeVerify, data)
	require.NoError(t, err)
	return ev
}

// verifier is a validator configured as a verifier would be, with the fake AMD roots.
type verifier struct {
	clock *clock
	amd   *amd
	v     *vtpm.Validator
}

func reference(products ...string) snp.Reference {
	ref := snp.DefaultReference("aws-test")
	ref.Products = products
	for _, p := range products {
		ref.MinimumTCB[p] = snp.TCB{Bootloader: snpfake.DefaultTCB.BlSpl, SNP: snpfake.DefaultTCB.SnpSpl, Microcode: snpfake.DefaultTCB.UcodeSpl}
	}
	ref.Measurements = snp.Digests{measurement}
	return ref
}

func newVerifier(t testing.TB, ref snp.Reference, pcrs measurements.M, platforms ...*snpfake.Platform) *verifier {
	t.Helper()
	c := &clock{now: start}
	a := &amd{docs: map[string][]byte{}}
	var chains []snp.ProductRoots
	for _, p := range platforms {
		crl, err := p.CRL(start.Add(-time.Hour), start.Add(7*24*time.Hour))
		require.NoError(t, err)
		a.docs[p.CRLURL()] = crl
		chains = append(chains, p.Roots())
	}
	roots, err := snp.NewRoots(chains...)
	require.NoError(t, err)
	v, err := awssnp.NewValidator(awssnp.ValidatorConfig{
		ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: measurements.ReferenceSets{{Name: "image", Measurements: pcrs}}, Now: c.Now, Log: slog.New(slog.DiscardHandler)},
		Hardware:        ref,
		Collateral:      collateral.New(collateral.Config{Fetcher: a, Now: c.Now}),
		SNPRoots:        roots,
	})
	require.NoError(t, err)
	return &verifier{clock: c, amd: a, v: v}
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

func TestGenuineProducts(t *testing.T) {
	tpm := boot(t, vtpmtest.Simulator(t))
	for _, product := range []string{"Milan-B1", "Genoa-B1", "Turin-B0"} {
		t.Run(product, func(t *testing.T) {
			node := newVM(t, tpm, snpfake.Options{ProductName: product, Chip: 1})
			ver := newVerifier(t, reference(node.platform.ProductLine), node.pcrs, node.platform)
			got, err := ver.v.Validate(context.Background(), node.issue(t, nonce), attestation.PurposeVerify, nonce)
			require.NoError(t, err)
			require.NotNil(t, got.Hardware)
			assert.Equal(t, "VLEK", got.Hardware.Signer)
			assert.Equal(t, node.platform.ProductLine, got.Hardware.Product)
			assert.Equal(t, measurement, got.Hardware.Measurements["MEASUREMENT"])
			assert.Equal(t, "image", got.ReferenceSet)
		})
	}
}

// TestAttacks attacks the validator from the host's side: the attacker controls everything
// outside the confidential VM, including the evidence on the wire.
func TestAttacks(t *testing.T) {
	tpm := boot(t, vtpmtest.Simulator(t))
	node := newVM(t, tpm, snpfake.Options{ProductName: "Milan-B1", Chip: 1})
	ver := newVerifier(t, reference("Milan"), node.pcrs, node.platform)
	genuine := node.issue(t, nonce)
	_, err := ver.v.Validate(context.Background(), genuine, attestation.PurposeVerify, nonce)
	require.NoError(t, err, "the genuine evidence must pass, or the attacks prove nothing")

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
		"quote replayed for another nonce": {
			evidence: func(*testing.T) []byte { return genuine },
			data:     otherNonce,
			want:     attestation.ErrNonceMismatch,
		},
		"report tampered (measurement)": {
			evidence: func(t *testing.T) []byte {
				ev := decode(t, genuine)
				ev.Hardware.SnpReport[0x90] ^= 1
				return encode(t, ev)
			},
			want: attestation.ErrBadSignature,
		},
		"report tampered (REPORT_DATA)": {
			evidence: func(t *testing.T) []byte {
				ev := decode(t, genuine)
				ev.Hardware.SnpReport[0x50] ^= 1
				return encode(t, ev)
			},
			want: attestation.ErrBadSignature,
		},
		"report truncated": {
			evidence: func(t *testing.T) []byte {
				ev := decode(t, genuine)
				ev.Hardware.SnpReport = ev.Hardware.SnpReport[:abi.ReportSize-1]
				return encode(t, ev)
			},
			want: attestation.ErrMalformed,
		},
		"VLEK certificate removed": {
			evidence: func(t *testing.T) []byte {
				ev := decode(t, genuine)
				ev.Hardware.SnpCertificates = nil
				return encode(t, ev)
			},
			want: attestation.ErrUntrustedSigner, wantMsg: "without VLEK certificate",
		},
		"report of a chip signed with its VCEK": {
			evidence: func(t *testing.T) []byte {
				other := newVM(t, tpm, snpfake.Options{ProductName: "Milan-B1", Chip: 1}, true)
				return other.issue(t, nonce)
			},
			want: attestation.ErrUntrustedSigner, wantMsg: "want VLEK",
		},
		"report bound to another AK (this TPM's ECC AK)": {
			evidence: func(t *testing.T) []byte {
				// A report made for another key of the same VM: the quote verifies, the
				// report is genuine, but it vouches for a different AK.
				ev := decode(t, genuine)
				rd, err := awssnp.ReportData(otherAK(t, tpm))
				require.NoError(t, err)
				raw, err := node.platform.Report(rd)
				require.NoError(t, err)
				ev.Hardware.SnpReport = raw
				return encode(t, ev)
			},
			want: attestation.ErrNonceMismatch, wantMsg: "SHA-512 of the quote's AK",
		},
		"report from another chip's VLEK": {
			evidence: func(t *testing.T) []byte {
				// A chain of another (fake) AMD: its VLEK is not certified by the pinned ASVK.
				other, err := snpfake.New(snpfake.Options{ProductName: "Milan-B1", Signer: abi.VlekReportSigner, Now: start, Measurement: measurement, Keys: otherKeys(t)})
				require.NoError(t, err)
				ev := decode(t, genuine)
				rd, err := awssnp.ReportData(akOf(t, ev))
				require.NoError(t, err)
				raw, err := other.Report(rd)
				require.NoError(t, err)
				ev.Hardware.SnpReport = raw
				ev.Hardware.SnpCertificates = [][]byte{other.Endorsement().Raw}
				return encode(t, ev)
			},
			want: attestation.ErrUntrustedSigner,
		},
		"product not accepted (Genoa report, Milan reference)": {
			evidence: func(t *testing.T) []byte {
				other := newVM(t, tpm, snpfake.Options{ProductName: "Genoa-B1", Chip: 1})
				return other.issue(t, nonce)
			},
			want: attestation.ErrUntrustedSigner, wantMsg: "product line Genoa is not accepted",
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			data := nonce
			if tc.data != nil {
				data = tc.data
			}
			_, err := ver.v.Validate(context.Background(), tc.evidence(t), attestation.PurposeVerify, data)
			require.ErrorIs(t, err, tc.want)
			if tc.wantMsg != "" {
				assert.ErrorContains(t, err, tc.wantMsg)
			}
		})
	}
}

// TestReportFromAnotherVM: a host runs two VMs (two vTPMs) and swaps their SNP reports.
func TestReportFromAnotherVM(t *testing.T) {
	if testing.Short() {
		t.Skip("starts swtpm")
	}
	tpmA := boot(t, vtpmtest.Simulator(t))
	tpmB, _ := vtpmtest.Swtpm(t)
	boot(t, tpmB)
	a := newVM(t, tpmA, snpfake.Options{ProductName: "Milan-B1", Chip: 1})
	b := newVM(t, tpmB, snpfake.Options{ProductName: "Milan-B1", Chip: 2})
	evA, evB := decode(t, a.issue(t, nonce)), decode(t, b.issue(t, nonce))
	for name, pcrs := range map[string]measurements.M{"A": a.pcrs, "B": b.pcrs} {
		ver := newVerifier(t, reference("Milan"), pcrs, a.platform)
		swapped := proto.Clone(evA).(*vtpmpb.Evidence)
		swapped.Hardware = evB.Hardware
		if name == "B" {
			swapped = proto.Clone(evB).(*vtpmpb.Evidence)
			swapped.Hardware = evA.Hardware
		}
		_, err := ver.v.Validate(context.Background(), encode(t, swapped), attestation.PurposeVerify, nonce)
		require.ErrorIs(t, err, attestation.ErrNonceMismatch, "quote of VM %s with the other VM's report", name)
	}
}

// TestStaleCRL: after the CRL's next update a verifier that cannot fetch a new one refuses
// everything (fail closed), and accepts again once AMD is reachable.
func TestStaleCRL(t *testing.T) {
	tpm := boot(t, vtpmtest.Simulator(t))
	node := newVM(t, tpm, snpfake.Options{ProductName: "Milan-B1", Chip: 1})
	ver := newVerifier(t, reference("Milan"), node.pcrs, node.platform)
	ev := node.issue(t, nonce)
	_, err := ver.v.Validate(context.Background(), ev, attestation.PurposeVerify, nonce)
	require.NoError(t, err)

	ver.amd.mu.Lock()
	ver.amd.offline = true
	ver.amd.mu.Unlock()
	_, err = ver.v.Validate(context.Background(), ev, attestation.PurposeVerify, nonce)
	require.NoError(t, err, "a cached CRL before its next update serves without network")

	ver.clock.Set(start.Add(8 * 24 * time.Hour))
	_, err = ver.v.Validate(context.Background(), ev, attestation.PurposeVerify, nonce)
	require.ErrorIs(t, err, attestation.ErrRevocationUnknown)
	assert.ErrorIs(t, err, collateral.ErrStale)

	// AMD publishes a CRL revoking the ASVK: refused although fresh.
	crl, err := node.platform.CRL(start.Add(8*24*time.Hour-time.Minute), start.Add(15*24*time.Hour), node.platform.Intermediate().SerialNumber)
	require.NoError(t, err)
	ver.amd.mu.Lock()
	ver.amd.offline = false
	ver.amd.docs[node.platform.CRLURL()] = crl
	ver.amd.mu.Unlock()
	_, err = ver.v.Validate(context.Background(), ev, attestation.PurposeVerify, nonce)
	require.ErrorIs(t, err, attestation.ErrUntrustedSigner)
	assert.ErrorContains(t, err, "revoked")
}

// TestOfflineVerifier: with a collateral cache the issuer carries the VLEK CRL, and a
// verifier without network checks the evidence with it; without it, it fails closed.
func TestOfflineVerifier(t *testing.T) {
	tpm := boot(t, vtpmtest.Simulator(t))
	node := newVM(t, tpm, snpfake.Options{ProductName: "Milan-B1", Chip: 1})
	crl, err := node.platform.CRL(start.Add(-time.Hour), start.Add(7*24*time.Hour))
	require.NoError(t, err)
	issuerCache := collateral.New(collateral.Config{Fetcher: &amd{docs: map[string][]byte{node.platform.CRLURL(): crl}}, Now: func() time.Time { return start }})
	iss, err := awssnp.NewIssuer(tpm, awssnp.IssuerConfig{QuoteProvider: node.platform.QuoteProvider(), Collateral: issuerCache})
	require.NoError(t, err)
	ev, err := iss.Issue(context.Background(), attestation.PurposeVerify, nonce)
	require.NoError(t, err)
	require.Len(t, decode(t, ev).Hardware.Collateral, 1)

	ver := newVerifier(t, reference("Milan"), node.pcrs, node.platform)
	ver.amd.offline = true
	_, err = ver.v.Validate(context.Background(), ev, attestation.PurposeVerify, nonce)
	require.NoError(t, err)

	bare := decode(t, ev)
	bare.Hardware.Collateral = nil
	_, err = ver.v.Validate(context.Background(), encode(t, bare), attestation.PurposeVerify, nonce)
	require.ErrorIs(t, err, attestation.ErrRevocationUnknown)
	assert.ErrorContains(t, err, "connection refused")
}
