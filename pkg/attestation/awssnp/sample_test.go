package awssnp

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"os"
	"testing"
	"time"

	"github.com/google/go-sev-guest/abi"
	spb "github.com/google/go-sev-guest/proto/sevsnp"
	"github.com/google/go-sev-guest/verify"
	"github.com/google/go-sev-guest/verify/trust"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/pkg/api/attestation/hardwarepb"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/collateral"
	"github.com/openconstellation/constellation/pkg/attestation/snp"
)

// The AK binding of the real sample (testdata/README.md).
const sampleReportData = "87ab7caf510e1b3520dc3cceb64ee44128e10976fb0d3fc5e274699d8aaf506154af4c1de0a026b49fdf861e9ac75551551b3534d1c61369a3b08f5baed0db2f"

// sampleTime is inside the VLEK's validity.
var sampleTime = time.Date(2025, 6, 1, 0, 0, 0, 0, time.UTC)

func loadSample(t *testing.T) *hardwarepb.Hardware {
	t.Helper()
	b64, err := os.ReadFile("testdata/aws-snp-vlek-report.b64")
	require.NoError(t, err)
	report, err := base64.StdEncoding.DecodeString(string(b64))
	require.NoError(t, err)
	vlekPEM, err := os.ReadFile("testdata/aws-snp-vlek.pem")
	require.NoError(t, err)
	block, _ := pem.Decode(vlekPEM)
	require.NotNil(t, block)
	return &hardwarepb.Hardware{SnpReport: report[:abi.ReportSize], SnpCertificates: [][]byte{block.Bytes}}
}

// sampleReference accepts the sample's launch: its TCB minimums are its reported TCB (the
// oldest of its TCBs), as the validator enforces them on committed, launch and reported.
func sampleReference(t *testing.T, hw *hardwarepb.Hardware) snp.Reference {
	t.Helper()
	r, err := abi.ReportToProto(hw.SnpReport)
	require.NoError(t, err)
	ref := snp.DefaultReference("aws-sample")
	ref.Products = []string{snp.Milan}
	ref.MinimumTCB[snp.Milan] = snp.TCB{Microcode: 217}
	ref.Measurements = snp.Digests{r.GetMeasurement()}
	return ref
}

// TestRealSample runs AWS's real report through the aws-sev-snp hardware check with AMD's
// pinned roots, offline. No CRL signed by AMD's real ARK is at hand, so by default the check
// fails closed with the revocation status unknown, after the signature and chain verified;
// accepting an unknown status, the whole production path passes. The signature, chain and
// binding are also checked separately below with go-sev-guest and the same pinned roots.
func TestRealSample(t *testing.T) {
	hw := loadSample(t)
	want, err := hex.DecodeString(sampleReportData)
	require.NoError(t, err)

	check := func(policy attestation.RevocationPolicy) (*attestation.Hardware, error) {
		c, err := NewHardwareCheck(ValidatorConfig{
			ValidatorCommon: attestation.ValidatorCommon{Now: func() time.Time { return sampleTime }, Revocation: policy},
			Hardware:        sampleReference(t, hw),
			Collateral:      collateral.New(collateral.Config{Now: func() time.Time { return sampleTime }}),
		})
		require.NoError(t, err)
		return c.check(context.Background(), hw, want)
	}
	_, err = check(attestation.RevocationRequired)
	require.ErrorIs(t, err, attestation.ErrRevocationUnknown)
	assert.ErrorIs(t, err, collateral.ErrOffline, "only the CRL is missing")
	assert.ErrorContains(t, err, "CRL of the ASVK")
	claims, err := check(attestation.RevocationUnknownAccepted)
	require.NoError(t, err)
	assert.Equal(t, "VLEK", claims.Signer)
	assert.False(t, claims.RevocationChecked)

	// The binding: REPORT_DATA is SHA-512 of the AK, exactly what this variant requires.
	r, err := abi.ReportToProto(hw.SnpReport)
	require.NoError(t, err)
	assert.Equal(t, want, r.GetReportData())
	info, err := abi.ParseSignerInfo(r.GetSignerInfo())
	require.NoError(t, err)
	assert.Equal(t, abi.VlekReportSigner, info.SigningKey)

	// Signature and chain with the pinned roots the validator uses.
	roots, ok := snp.PinnedRoots().Product(snp.Milan)
	require.True(t, ok)
	verifySample := func(report *spb.Report) error {
		return verify.SnpAttestation(&spb.Attestation{
			Report:           report,
			CertificateChain: &spb.CertificateChain{VlekCert: hw.SnpCertificates[0], AskCert: roots.ASVK.Raw, ArkCert: roots.ARK.Raw},
		}, &verify.Options{
			DisableCertFetching: true,
			Now:                 sampleTime,
			Product:             &spb.SevProduct{Name: spb.SevProduct_SEV_PRODUCT_MILAN},
			TrustedRoots: map[string][]*trust.AMDRootCerts{snp.Milan: {{
				ProductLine:  snp.Milan,
				ProductCerts: &trust.ProductCerts{Ark: roots.ARK, Ask: roots.ASVK, Asvk: roots.ASVK},
			}}},
		})
	}
	require.NoError(t, verifySample(r))
	tampered := append([]byte(nil), hw.SnpReport...)
	tampered[0x50] ^= 1 // REPORT_DATA: a report for another AK
	tr, err := abi.ReportToProto(tampered)
	require.NoError(t, err)
	assert.Error(t, verifySample(tr))
}

// TestRealSampleRefusals: the sample is refused before any network when it cannot be an
// aws-sev-snp report for the caller.
func TestRealSampleRefusals(t *testing.T) {
	check, err := NewHardwareCheck(ValidatorConfig{
		ValidatorCommon: attestation.ValidatorCommon{Now: func() time.Time { return sampleTime }},
		Hardware:        sampleReference(t, loadSample(t)),
		Collateral:      collateral.New(collateral.Config{Now: func() time.Time { return sampleTime }}),
	})
	require.NoError(t, err)
	want, err := hex.DecodeString(sampleReportData)
	require.NoError(t, err)
	testCases := map[string]struct {
		edit    func(hw *hardwarepb.Hardware)
		wantErr error
		wantMsg string
	}{
		"without VLEK certificate": {
			edit:    func(hw *hardwarepb.Hardware) { hw.SnpCertificates = nil },
			wantErr: attestation.ErrUntrustedSigner, wantMsg: "without VLEK certificate",
		},
		"claiming a VCEK signed it": {
			edit:    func(hw *hardwarepb.Hardware) { hw.SnpReport[0x48] &^= 0x1c },
			wantErr: attestation.ErrUntrustedSigner, wantMsg: "want VLEK",
		},
		"no report": {
			edit:    func(hw *hardwarepb.Hardware) { hw.SnpReport = nil },
			wantErr: attestation.ErrMalformed,
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			hw := loadSample(t)
			tc.edit(hw)
			_, err := check.check(context.Background(), hw, want)
			require.ErrorIs(t, err, tc.wantErr)
			if tc.wantMsg != "" {
				assert.ErrorContains(t, err, tc.wantMsg)
			}
		})
	}
}

// FuzzHardwareCheck feeds arbitrary reports and certificates to the aws-sev-snp hardware
// check: it must never panic, and every refusal must name one attestation reason.
func FuzzHardwareCheck(f *testing.F) {
	b64, err := os.ReadFile("testdata/aws-snp-vlek-report.b64")
	require.NoError(f, err)
	report, err := base64.StdEncoding.DecodeString(string(b64))
	require.NoError(f, err)
	vlekPEM, err := os.ReadFile("testdata/aws-snp-vlek.pem")
	require.NoError(f, err)
	block, _ := pem.Decode(vlekPEM)
	f.Add(report[:abi.ReportSize], block.Bytes)
	f.Add(report, vlekPEM)
	f.Add([]byte{}, []byte{})
	ref := snp.DefaultReference("fuzz")
	ref.Products = []string{snp.Milan}
	ref.MinimumTCB[snp.Milan] = snp.TCB{}
	ref.Measurements = snp.Digests{make([]byte, 48)}
	check, err := NewHardwareCheck(ValidatorConfig{
		ValidatorCommon: attestation.ValidatorCommon{Now: func() time.Time { return sampleTime }},
		Hardware:        ref,
		Collateral:      collateral.New(collateral.Config{Now: func() time.Time { return sampleTime }}),
	})
	require.NoError(f, err)
	want, err := hex.DecodeString(sampleReportData)
	require.NoError(f, err)
	f.Fuzz(func(t *testing.T, report, cert []byte) {
		_, err := check.check(context.Background(), &hardwarepb.Hardware{SnpReport: report, SnpCertificates: [][]byte{cert}}, want)
		if err == nil {
			t.Fatal("accepted without a CRL")
		}
		if attestation.Reason(err) == "other" {
			t.Fatalf("refusal without a reason: %v", err)
		}
	})
}
