package azuresnp_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/binary"
	"encoding/pem"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/kds"
	sevtest "github.com/google/go-sev-guest/testing"
	"github.com/google/go-sev-guest/verify"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/openconstellation/constellation/pkg/api/attestation/hardwarepb"
	"github.com/openconstellation/constellation/pkg/api/attestation/vtpmpb"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/azure"
	"github.com/openconstellation/constellation/pkg/attestation/azure/azuretest"
	"github.com/openconstellation/constellation/pkg/attestation/azuresnp"
	"github.com/openconstellation/constellation/pkg/attestation/collateral"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/measurements/measurementstest"
	"github.com/openconstellation/constellation/pkg/attestation/snp"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm/vtpmtest"
)

var (
	nonce = bytes.Repeat([]byte{0x11}, 32)
	// testNow is inside the fake chain's validity and inside the real VCEK's (2023-08-30 to
	// 2030-08-30).
	testNow = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
)

func readSample(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("../azure/testdata/" + name)
	require.NoError(t, err)
	return b
}

// realReport is the SNP report of the real Azure sample (its file has the HCL's 20-byte
// request header after it).
func realReport(t testing.TB) []byte {
	return readSample(t, "azure-snp-attestation.bin")[:abi.ReportSize]
}

// TestRealSampleBinding: the real report binds the real runtime data, whose keys[0] is the AK.
func TestRealSampleBinding(t *testing.T) {
	report := realReport(t)
	runtime := readSample(t, "azure-snp-runtimedata.bin")
	hcl, err := azure.ParseHCLReport(azuretest.HCLReport(azure.ReportTypeSNP, report, runtime, 0))
	require.NoError(t, err)
	require.NoError(t, hcl.CheckBinding())
	rd, err := azure.ParseRuntimeData(hcl.RuntimeData)
	require.NoError(t, err)
	assert.Equal(t, 2048, rd.AK.N.BitLen())
}

// TestRealSampleSignature checks the real report as far as the samples allow: its signature
// with the real VCEK, the VCEK's chain to the pinned Milan roots at a time inside the VCEK's
// validity, and a flipped bit rejected. AMD's CRL is not among the samples, so the full check
// stops there, closed (next test).
func TestRealSampleSignature(t *testing.T) {
	report := realReport(t)
	vcek, err := x509.ParseCertificate(readSample(t, "azure-snp-vcek.cert"))
	require.NoError(t, err)
	require.NoError(t, verify.SnpReportSignature(report, vcek))

	milan, ok := snp.PinnedRoots().Product("Milan")
	require.True(t, ok)
	roots, inter := x509.NewCertPool(), x509.NewCertPool()
	roots.AddCert(milan.ARK)
	inter.AddCert(milan.ASK)
	_, err = vcek.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: testNow, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	require.NoError(t, err)
	// The chain Azure's THIM serves is the pinned one.
	chain := readSample(t, "azure-snp-certchain.pem")
	block, rest := pem.Decode(chain)
	require.NotNil(t, block)
	assert.Equal(t, milan.ASK.Raw, block.Bytes)
	block, _ = pem.Decode(rest)
	require.NotNil(t, block)
	assert.Equal(t, milan.ARK.Raw, block.Bytes)

	for _, off := range []int{0x90 /* MEASUREMENT */, 0x50 /* REPORT_DATA */, 0x2a0 /* signature */} {
		bad := bytes.Clone(report)
		bad[off] ^= 1
		assert.Error(t, verify.SnpReportSignature(bad, vcek), "bit flipped at %#x", off)
	}
}

// realReference accepts the real sample's firmware and launch.
func realReference(report []byte) snp.Reference {
	r, err := abi.ReportToProto(report)
	if err != nil {
		panic(err)
	}
	return snp.Reference{
		Name:         "azure-sample",
		Products:     []string{"Milan"},
		MinimumTCB:   map[string]snp.TCB{"Milan": {Bootloader: 2, TEE: 0, SNP: 6, Microcode: 93}},
		IDKeyDigests: snp.Digests{r.GetIdKeyDigest()},
	}
}

// TestRealSampleHardwareCheck runs the real HCL report through the check the validator
// installs, offline: it parses, its signature and chain verify, the binding holds; without
// AMD's CRL it fails closed by default (revocation unknown, not a bad signature), and passes
// with the revocation status in its claims when the caller accepts an unknown status.
func TestRealSampleHardwareCheck(t *testing.T) {
	report := realReport(t)
	runtime := readSample(t, "azure-snp-runtimedata.bin")
	rd, err := azure.ParseRuntimeData(runtime)
	require.NoError(t, err)
	hw := &hardwarepb.Hardware{
		HclReport:       azuretest.HCLReport(azure.ReportTypeSNP, report, runtime, 0),
		SnpCertificates: [][]byte{readSample(t, "azure-snp-vcek.cert")},
	}
	check := func(policy attestation.RevocationPolicy) (*attestation.Hardware, error) {
		c, err := azuresnp.NewHardwareCheck(azuresnp.ValidatorConfig{
			ValidatorCommon: attestation.ValidatorCommon{Now: func() time.Time { return testNow }, Revocation: policy},
			Hardware:        realReference(report),
			Collateral:      collateral.New(collateral.Config{Now: func() time.Time { return testNow }}),
		})
		require.NoError(t, err)
		return c.Check(context.Background(), hw, rd.AK, nil, nil)
	}
	_, err = check(attestation.RevocationRequired)
	require.ErrorIs(t, err, attestation.ErrRevocationUnknown)
	assert.ErrorContains(t, err, "CRL of the ASK")

	claims, err := check(attestation.RevocationUnknownAccepted)
	require.NoError(t, err)
	assert.Equal(t, "Milan", claims.Product)
	assert.False(t, claims.RevocationChecked)
}

// fakeAMD is a fake AMD chain (go-sev-guest's AmdSignerBuilder) with a CRL, and roots,
// cache and reference that trust it: what a verifier has, with AMD's keys replaced.
type fakeAMD struct {
	signer   *sevtest.AmdSigner
	roots    *snp.Roots
	cache    *collateral.Cache
	ref      snp.Reference
	template []byte
}

func newFakeAMD(t testing.TB) *fakeAMD { return newFakeAMDWithKeys(t, nil) }

// newFakeAMDWithKeys makes the chain with keys; nil means go-sev-guest's fixed default keys.
func newFakeAMDWithKeys(t testing.TB, keys *sevtest.AmdKeys) *fakeAMD {
	t.Helper()
	template := realReport(t)
	r, err := abi.ReportToProto(template)
	require.NoError(t, err)
	created := testNow.Add(-30 * 24 * time.Hour)
	b := &sevtest.AmdSignerBuilder{
		Keys:             keys,
		ProductName:      "Milan-B0",
		ArkCreationTime:  created,
		AskCreationTime:  created,
		AsvkCreationTime: created,
		VcekCreationTime: created,
		CSPID:            "azure-test",
		VcekCustom: sevtest.CertOverride{
			SerialNumber: big.NewInt(7),
			Extensions:   sevtest.CustomExtensions(kds.DecomposeTCBVersion(kds.TCBVersion(r.GetReportedTcb())), r.GetChipId(), "", "Milan-B0"),
		},
	}
	signer, err := b.TestOnlyCertChain()
	require.NoError(t, err)
	roots, err := snp.NewRoots(snp.ProductRoots{Product: "Milan", ARK: signer.Ark, ASK: signer.Ask, ASVK: signer.Asvk})
	require.NoError(t, err)

	cache := collateral.New(collateral.Config{Now: func() time.Time { return testNow }})
	crl, err := x509.CreateRevocationList(rand.Reader, &x509.RevocationList{
		Number:     big.NewInt(1),
		ThisUpdate: testNow.Add(-time.Hour),
		NextUpdate: testNow.Add(24 * time.Hour),
	}, signer.Ark, signer.Keys.Ark)
	require.NoError(t, err)
	require.NoError(t, cache.Put(signer.Ask.CRLDistributionPoints[0], nil, crl))
	return &fakeAMD{signer: signer, roots: roots, cache: cache, ref: realReference(template), template: template}
}

// report returns the sample report with REPORT_DATA set, signed by the fake VCEK.
func (f *fakeAMD) report(t testing.TB, reportData []byte) []byte {
	t.Helper()
	report := bytes.Clone(f.template)
	copy(report[0x50:0x90], reportData)
	r, s, err := f.signer.Sign(abi.SignedComponent(report))
	require.NoError(t, err)
	require.NoError(t, abi.SetSignature(r, s, report))
	return report
}

// hclReport returns an HCL report of an SNP report, signed by the fake VCEK, binding
// runtime data that names ak.
func (f *fakeAMD) hclReport(t testing.TB, ak *rsa.PublicKey) []byte {
	runtime := azuretest.RuntimeData(ak, nil)
	return azuretest.HCLReport(azure.ReportTypeSNP, f.report(t, azure.BindingReportData(runtime)), runtime, 64)
}

// certs is the fake THIM: the VCEK and the chain.
func (f *fakeAMD) Certificates(context.Context) ([][]byte, error) {
	return [][]byte{f.signer.Vcek.Raw, f.signer.Ask.Raw, f.signer.Ark.Raw}, nil
}

func (f *fakeAMD) validator(t testing.TB, sets measurements.ReferenceSets) *vtpm.Validator {
	t.Helper()
	v, err := azuresnp.NewValidator(azuresnp.ValidatorConfig{
		ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: sets, Now: func() time.Time { return testNow }},
		Hardware:        f.ref,
		Collateral:      f.cache,
		Roots:           f.roots,
	})
	require.NoError(t, err)
	return v
}

// node is an Azure SEV-SNP VM on swtpm: its HCL report (signed by the fake AMD chain, naming
// the swtpm's real AK) in NV index 0x1400001, issuing through azuresnp.NewIssuer.
type node struct {
	tpm    *vtpm.TPM
	ak     *rsa.PublicKey
	issuer *vtpm.Issuer
	sets   measurements.ReferenceSets
}

func bootNode(t *testing.T, amd *fakeAMD) *node {
	t.Helper()
	if testing.Short() {
		t.Skip("starts swtpm")
	}
	tpm, _ := vtpmtest.Swtpm(t)
	// The AK is persistent: a plain issuer loads (or creates) the same key NewIssuer uses.
	// The HCL's AK at its handle, as Azure provisions it; the issuer quotes with it.
	ak := azuretest.ProvisionAK(t, tpm)

	require.NoError(t, tpm.WriteNV(azure.HCLReportNVIndex, amd.hclReport(t, ak)))
	iss, err := azuresnp.NewIssuer(tpm, amd)
	require.NoError(t, err)
	t.Cleanup(func() { _ = iss.Close() })
	pcrs, err := tpm.ReadPCRs()
	require.NoError(t, err)
	sets := measurements.ReferenceSets{{Name: "image", Measurements: measurementstest.FromRegisters(azuresnp.Variant, pcrs)}}
	return &node{tpm: tpm, ak: ak, issuer: iss, sets: sets}
}

func (n *node) issue(t *testing.T) []byte {
	t.Helper()
	ev, err := n.issuer.Issue(context.Background(), attestation.PurposeVerify, nonce)
	require.NoError(t, err)
	return ev
}

func TestEndToEndOnSwtpm(t *testing.T) {
	amd := newFakeAMD(t)
	n := bootNode(t, amd)
	v := amd.validator(t, n.sets)

	ev := n.issue(t)
	got, err := v.Validate(context.Background(), ev, attestation.PurposeVerify, nonce)
	require.NoError(t, err)
	require.NotNil(t, got.Hardware)
	assert.Equal(t, "Milan", got.Hardware.Product)
	assert.Equal(t, "VCEK", got.Hardware.Signer)
	assert.Equal(t, "azure-sample", got.Hardware.Reference)
	assert.Equal(t, azuresnp.Variant, got.Variant)

	// The evidence carries what the platform has: the NV index as read and the THIM's certificates.
	var decoded vtpmpb.Evidence
	require.NoError(t, proto.Unmarshal(ev, &decoded))
	nv, err := n.tpm.ReadNV(azure.HCLReportNVIndex)
	require.NoError(t, err)
	assert.Equal(t, nv, decoded.GetHardware().GetHclReport())
	assert.Len(t, decoded.GetHardware().GetSnpCertificates(), 3)

	// An older paravisor writes header version 1 (same layout, signed by nothing): the same
	// evidence passes with the same claims.
	binary.LittleEndian.PutUint32(decoded.Hardware.HclReport[4:], 1)
	v1, err := proto.Marshal(&decoded)
	require.NoError(t, err)
	gotV1, err := v.Validate(context.Background(), v1, attestation.PurposeVerify, nonce)
	require.NoError(t, err, "header version 1")
	assert.Equal(t, got.Hardware, gotV1.Hardware)
}

// TestEndToEndAttacks tampers with genuine evidence from the attacker's side, each time
// re-encoding it as a relay or a compromised host could, and validates with the validator
// cmd/ builds (azuresnp.NewValidator).
func TestEndToEndAttacks(t *testing.T) {
	amd := newFakeAMD(t)
	n := bootNode(t, amd)
	v := amd.validator(t, n.sets)
	genuine := n.issue(t)

	otherAK, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	hclOf := func(ev *vtpmpb.Evidence) []byte { return ev.GetHardware().GetHclReport() }
	hcl, err := azure.ParseHCLReport(hclOf(decode(t, genuine)))
	require.NoError(t, err)

	tests := map[string]struct {
		tamper  func(ev *vtpmpb.Evidence)
		wantErr error
		msg     string
	}{
		"HCL report of another VM (runtime data names another AK)": {
			// A genuine, correctly signed HCL report, of a VM whose AK is not this quote's.
			tamper:  func(ev *vtpmpb.Evidence) { ev.Hardware.HclReport = amd.hclReport(t, &otherAK.PublicKey) },
			wantErr: attestation.ErrUntrustedSigner,
			msg:     "HCLAkPub",
		},
		"runtime data edited to name the attacker's AK (hash mismatch)": {
			tamper: func(ev *vtpmpb.Evidence) {
				runtime := azuretest.RuntimeData(&otherAK.PublicKey, nil)
				ev.Hardware.HclReport = azuretest.HCLReport(azure.ReportTypeSNP, hcl.HardwareReport, runtime, 0)
			},
			wantErr: attestation.ErrBadSignature,
			msg:     "runtime data changed",
		},
		"runtime data edited in place (one byte of vmUniqueId)": {
			tamper: func(ev *vtpmpb.Evidence) {
				b := bytes.Clone(hclOf(ev))
				i := 1236 + bytes.Index(hcl.RuntimeData, []byte(`"vmUniqueId":"0`)) + len(`"vmUniqueId":"`)
				b[i] = '1'
				ev.Hardware.HclReport = b
			},
			wantErr: attestation.ErrBadSignature,
			msg:     "runtime data changed",
		},
		"SNP report tampered (MEASUREMENT bit)": {
			tamper: func(ev *vtpmpb.Evidence) {
				b := bytes.Clone(hclOf(ev))
				b[32+0x90] ^= 1
				ev.Hardware.HclReport = b
			},
			wantErr: attestation.ErrBadSignature,
			msg:     "signature",
		},
		"SNP report re-signed by a key AMD did not certify": {
			tamper: func(ev *vtpmpb.Evidence) {
				// Another fake AMD, with keys of its own: its ARK is not the validator's.
				other := newFakeAMDWithKeys(t, otherAMDKeys(t))
				runtime := azuretest.RuntimeData(n.ak, nil)
				ev.Hardware.HclReport = azuretest.HCLReport(azure.ReportTypeSNP, other.report(t, azure.BindingReportData(runtime)), runtime, 0)
				ev.Hardware.SnpCertificates = [][]byte{other.signer.Vcek.Raw}
			},
			wantErr: attestation.ErrUntrustedSigner,
		},
		"VCEK missing": {
			// A version 2 report names no product line; without the VCEK it cannot be checked.
			tamper:  func(ev *vtpmpb.Evidence) { ev.Hardware.SnpCertificates = nil },
			wantErr: attestation.ErrMalformed,
			msg:     "without its VCEK",
		},
		"VCEK replaced by the ASK": {
			tamper:  func(ev *vtpmpb.Evidence) { ev.Hardware.SnpCertificates = [][]byte{amd.signer.Ask.Raw} },
			wantErr: attestation.ErrMalformed,
		},
		"HCL report missing": {
			tamper:  func(ev *vtpmpb.Evidence) { ev.Hardware.HclReport = nil },
			wantErr: attestation.ErrMalformed,
		},
		"hardware evidence removed": {
			tamper:  func(ev *vtpmpb.Evidence) { ev.Hardware = nil },
			wantErr: attestation.ErrMalformed,
		},
		"bare SNP report smuggled alongside": {
			tamper:  func(ev *vtpmpb.Evidence) { ev.Hardware.SnpReport = hcl.HardwareReport },
			wantErr: attestation.ErrMalformed,
		},
		"TDX HCL report": {
			tamper: func(ev *vtpmpb.Evidence) {
				ev.Hardware.HclReport = readSample(t, "azure-tdx-hclreport.bin")
			},
			wantErr: attestation.ErrMalformed,
			msg:     "TDX",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ev := decode(t, genuine)
			tc.tamper(ev)
			_, err := v.Validate(context.Background(), encode(t, ev), attestation.PurposeVerify, nonce)
			require.ErrorIs(t, err, tc.wantErr)
			if tc.msg != "" {
				assert.ErrorContains(t, err, tc.msg)
			}
		})
	}

	// The genuine evidence still passes: every failure above is the tampering's.
	_, err = v.Validate(context.Background(), genuine, attestation.PurposeVerify, nonce)
	require.NoError(t, err)
}

// TestIssuerRefusesAnotherVMsHCLReport: an issuer whose TPM holds an HCL report naming another
// AK says so, instead of issuing evidence every validator refuses.
func TestIssuerRefusesAnotherVMsHCLReport(t *testing.T) {
	amd := newFakeAMD(t)
	n := bootNode(t, amd)
	other, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	require.NoError(t, n.tpm.WriteNV(azure.HCLReportNVIndex, amd.hclReport(t, &other.PublicKey)))
	_, err = n.issuer.Issue(context.Background(), attestation.PurposeVerify, nonce)
	require.ErrorIs(t, err, attestation.ErrUntrustedSigner)
	assert.ErrorContains(t, err, "another key than the HCL report's AK")
}

// TestIssuerWithoutHCLReport: a TPM without the HCL's NV index (not an Azure confidential VM)
// issues no evidence.
func TestIssuerWithoutHCLReport(t *testing.T) {
	if testing.Short() {
		t.Skip("starts swtpm")
	}
	tpm, _ := vtpmtest.Swtpm(t)
	azuretest.ProvisionAK(t, tpm)
	iss, err := azuresnp.NewIssuer(tpm, newFakeAMD(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = iss.Close() })
	_, err = iss.Issue(context.Background(), attestation.PurposeVerify, nonce)
	require.ErrorIs(t, err, vtpm.ErrNVNotDefined)
}

func TestTHIM(t *testing.T) {
	amd := newFakeAMD(t)
	pemOf := func(certs ...*x509.Certificate) string {
		var b strings.Builder
		for _, c := range certs {
			_ = pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
		}
		return b.String()
	}
	tests := map[string]struct {
		status  int
		body    string
		wantErr string
	}{
		"VCEK and chain": {http.StatusOK, `{"vcekCert":` + quote(pemOf(amd.signer.Vcek)) + `,"certificateChain":` + quote(pemOf(amd.signer.Ask, amd.signer.Ark)) + `,"tcbm":"x"}`, ""},
		"no VCEK":        {http.StatusOK, `{"vcekCert":"","certificateChain":""}`, "vcekCert"},
		"two VCEKs":      {http.StatusOK, `{"vcekCert":` + quote(pemOf(amd.signer.Vcek, amd.signer.Vcek)) + `}`, "vcekCert"},
		"not JSON":       {http.StatusOK, `<html>`, "response"},
		"HTTP error":     {http.StatusNotFound, `{}`, "404"},
		"too large":      {http.StatusOK, strings.Repeat(" ", 65<<10), "larger"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("Metadata") != "true" {
					http.Error(w, "no Metadata header", http.StatusBadRequest)
					return
				}
				w.WriteHeader(tc.status)
				_, _ = w.Write([]byte(tc.body))
			}))
			t.Cleanup(srv.Close)
			certs, err := (&azuresnp.THIM{Client: srv.Client(), URL: srv.URL}).Certificates(context.Background())
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, [][]byte{amd.signer.Vcek.Raw, amd.signer.Ask.Raw, amd.signer.Ark.Raw}, certs)
		})
	}
}

// BenchmarkValidate measures one full azure-sev-snp validation (TPM quote, HCL report, SNP
// report signature and chain, CRL from the warm collateral cache, policy) of genuine evidence.
func BenchmarkValidate(b *testing.B) {
	if testing.Short() {
		b.Skip("starts swtpm")
	}
	amd := newFakeAMD(b)
	tpm, _ := vtpmtest.Swtpm(b)
	require.NoError(b, tpm.WriteNV(azure.HCLReportNVIndex, amd.hclReport(b, azuretest.ProvisionAK(b, tpm))))
	iss, err := azuresnp.NewIssuer(tpm, amd)
	require.NoError(b, err)
	pcrs, err := tpm.ReadPCRs()
	require.NoError(b, err)
	v := amd.validator(b, measurements.ReferenceSets{{Name: "image", Measurements: measurementstest.FromRegisters(azuresnp.Variant, pcrs)}})
	ev, err := iss.Issue(context.Background(), attestation.PurposeVerify, nonce)
	require.NoError(b, err)
	ctx := context.Background()
	b.ResetTimer()
	for b.Loop() {
		if _, err := v.Validate(ctx, ev, attestation.PurposeVerify, nonce); err != nil {
			b.Fatal(err)
		}
	}
}

func otherAMDKeys(t testing.TB) *sevtest.AmdKeys {
	t.Helper()
	rsaKey := func() *rsa.PrivateKey {
		k, err := rsa.GenerateKey(rand.Reader, 2048)
		require.NoError(t, err)
		return k
	}
	vcek, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	require.NoError(t, err)
	return &sevtest.AmdKeys{Ark: rsaKey(), Ask: rsaKey(), Asvk: rsaKey(), Vcek: vcek}
}

func quote(s string) string {
	b := strings.NewReplacer("\n", `\n`).Replace(s)
	return `"` + b + `"`
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

// The issuer quotes only with the HCL's AK (azure.AKHandle): on a vTPM without it, it
// refuses to be built rather than quote with go-tpm-tools' default AK, which no runtime data
// names.
func TestIssuerNeedsTheHCLAK(t *testing.T) {
	if testing.Short() {
		t.Skip("starts swtpm")
	}
	tpm, _ := vtpmtest.Swtpm(t)
	_, err := azuresnp.NewIssuer(tpm, newFakeAMD(t))
	require.Error(t, err)
	assert.ErrorContains(t, err, "platform")
}
