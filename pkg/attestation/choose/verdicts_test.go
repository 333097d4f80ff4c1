package choose_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/pem"
	"os"
	"testing"
	"time"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-tdx-guest/testing/testdata"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/openconstellation/constellation/pkg/api/attestation/hardwarepb"
	"github.com/openconstellation/constellation/pkg/api/attestation/vtpmpb"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/azure"
	"github.com/openconstellation/constellation/pkg/attestation/azure/azuretest"
	"github.com/openconstellation/constellation/pkg/attestation/choose"
	"github.com/openconstellation/constellation/pkg/attestation/collateral"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/measurements/measurementstest"
	"github.com/openconstellation/constellation/pkg/attestation/snp"
	"github.com/openconstellation/constellation/pkg/attestation/tdx"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm/vtpmtest"
)

// The offline verdicts of forged evidence (docs/attestation.md "Verdict order"): through
// choose.NewValidator, the constructor `constellation verify-evidence` and every service use,
// on the real field samples, with no collateral at hand. An attacker who holds a genuine hardware report (it is in every evidence a node
// sends) presents it beside what it forged. Every check that needs no collateral runs before
// the verdict of the collateral, so such evidence is refused for the forgery, under either
// revocation policy, and never as revocation-unknown: that reason says "genuine as far as
// can be told without collateral", and an auditor or a metric must be able to rely on it.

// forgedVerdictCase is forged evidence and the reason it must be refused for.
type forgedVerdictCase struct {
	ref      choose.Reference
	now      time.Time
	evidence []byte
	// reportData, if set, is the binding checked (ValidateReportData); else the evidence
	// answers attestation.PurposeVerify over verdictNonce.
	reportData []byte
	want       error
	msg        string
}

var verdictNonce = bytes.Repeat([]byte{0x42}, 32)

func (tc forgedVerdictCase) run(t *testing.T) {
	t.Helper()
	for _, policy := range []attestation.RevocationPolicy{attestation.RevocationRequired, attestation.RevocationUnknownAccepted} {
		now := func() time.Time { return tc.now }
		v, err := choose.NewValidator(tc.ref, choose.Options{
			Collateral: collateral.New(collateral.Config{Now: now}), // no fetcher: offline
			Now:        now,
			Revocation: policy,
		})
		require.NoError(t, err)
		if tc.reportData != nil {
			_, err = attestation.ValidateReportData(context.Background(), v, tc.evidence, tc.reportData)
		} else {
			_, err = v.Validate(context.Background(), tc.evidence, attestation.PurposeVerify, verdictNonce)
		}
		require.Error(t, err, "policy %s", policy)
		t.Logf("%s: %v", policy, err)
		assert.Equal(t, attestation.Reason(tc.want), attestation.Reason(err), "policy %s: %v", policy, err)
		assert.NotErrorIs(t, err, attestation.ErrRevocationUnknown, "policy %s", policy)
		assert.NotContains(t, err.Error(), "chain verified", "a forgery is never said to have verified")
		if tc.msg != "" {
			assert.ErrorContains(t, err, tc.msg, "policy %s", policy)
		}
	}
}

// forgedQuote is evidence of variant v whose TPM quote the attacker signed with its own key
// (its AK claims every attribute of a TPM key), binding the caller's nonce and showing the
// PCR values the reference sets expect, with hw beside it.
func forgedQuote(t *testing.T, v variant.Variant, key *rsa.PrivateKey, hw *hardwarepb.Hardware) []byte {
	t.Helper()
	raw, err := vtpmtest.NewSoftwareIssuer(t, v, key, nil).Issue(context.Background(), attestation.PurposeVerify, verdictNonce)
	require.NoError(t, err)
	ev := &vtpmpb.Evidence{}
	require.NoError(t, proto.Unmarshal(raw, ev))
	ev.Hardware = hw
	out, err := proto.Marshal(ev)
	require.NoError(t, err)
	return out
}

// zeroPCRSets are the reference sets the software issuer's PCRs (all zero) match: the
// attacker shows exactly the measurements the verifier expects.
func zeroPCRSets(v variant.Variant) measurements.ReferenceSets {
	return measurements.ReferenceSets{{Name: "image", Measurements: measurementstest.Image(v, nil)}}
}

func readTestdata(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b
}

func attackerKey(t *testing.T) *rsa.PrivateKey {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	return key
}

// TestOfflineVerdictsAzureSEVSNP: the real Azure HCL report (SNP report signed by its real
// VCEK, which chains to AMD's pinned Milan roots; runtime data naming the HCL's AK), offline.
func TestOfflineVerdictsAzureSEVSNP(t *testing.T) {
	sample := readTestdata(t, "../azure/testdata/azure-snp-attestation.bin")
	report := sample[:abi.ReportSize]
	runtime := readTestdata(t, "../azure/testdata/azure-snp-runtimedata.bin")
	vcek := readTestdata(t, "../azure/testdata/azure-snp-vcek.cert")
	r, err := abi.ReportToProto(report)
	require.NoError(t, err)
	ref := choose.Reference{Variant: variant.AzureSEVSNP, Values: choose.Values{
		Measurements: zeroPCRSets(variant.AzureSEVSNP),
		HardwareValues: choose.HardwareValues{SNP: &snp.Reference{
			Name:         "azure-sample",
			Products:     []string{snp.Milan},
			MinimumTCB:   map[string]snp.TCB{snp.Milan: {Bootloader: 2, TEE: 0, SNP: 6, Microcode: 93}},
			IDKeyDigests: snp.Digests{r.GetIdKeyDigest()},
		}},
	}}
	// Inside the real VCEK's validity (2023-08-30 to 2030-08-30).
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	key := attackerKey(t)
	attackerRuntime := azuretest.RuntimeData(&key.PublicKey, nil)
	hw := func(report, runtime []byte) *hardwarepb.Hardware {
		return &hardwarepb.Hardware{
			HclReport:       azuretest.HCLReport(azure.ReportTypeSNP, report, runtime, 0),
			SnpCertificates: [][]byte{vcek},
		}
	}
	editedReport := bytes.Clone(report)
	editedReport[0x90] ^= 1 // MEASUREMENT
	rebound := bytes.Clone(report)
	copy(rebound[0x50:0x90], azure.BindingReportData(attackerRuntime)) // REPORT_DATA binding the attacker's runtime data

	for name, tc := range map[string]forgedVerdictCase{
		"quote re-signed by the attacker's AK beside the genuine HCL report": {
			evidence: forgedQuote(t, variant.AzureSEVSNP, key, hw(report, runtime)),
			want:     attestation.ErrUntrustedSigner, msg: "the quote's AK is not the AK",
		},
		"runtime data edited to name the attacker's AK": {
			evidence: forgedQuote(t, variant.AzureSEVSNP, key, hw(report, attackerRuntime)),
			want:     attestation.ErrBadSignature, msg: "runtime data changed",
		},
		"SNP report's REPORT_DATA edited to bind the attacker's runtime data": {
			evidence: forgedQuote(t, variant.AzureSEVSNP, key, hw(rebound, attackerRuntime)),
			want:     attestation.ErrBadSignature, msg: "SEV-SNP report signature does not verify",
		},
		"SNP report's MEASUREMENT edited": {
			evidence: forgedQuote(t, variant.AzureSEVSNP, key, hw(editedReport, runtime)),
			want:     attestation.ErrBadSignature, msg: "SEV-SNP report signature does not verify",
		},
	} {
		t.Run(name, func(t *testing.T) {
			tc.ref, tc.now = ref, now
			tc.run(t)
		})
	}
}

// TestOfflineVerdictsAzureTDX: the real Azure TDX HCL report beside go-tdx-guest's real TD
// quote (Intel-signed, of another TD: no quote of the sample's TDREPORT is published), with a
// TPM quote of the attacker's AK. More edits of the TDREPORT and the runtime data, which need
// the TDREPORT's layout, are in azuretdx (TestOfflineVerdictsOfEditedHCLReport).
func TestOfflineVerdictsAzureTDX(t *testing.T) {
	hcl := readTestdata(t, "../azure/testdata/azure-tdx-hclreport.bin")
	key := attackerKey(t)
	ref := choose.Reference{Variant: variant.AzureTDX, Values: choose.Values{
		Measurements:   zeroPCRSets(variant.AzureTDX),
		HardwareValues: choose.HardwareValues{TDX: cannedTDXReference(t)},
	}}
	forgedVerdictCase{
		ref: ref, now: cannedTDXNow,
		evidence: forgedQuote(t, variant.AzureTDX, key, &hardwarepb.Hardware{HclReport: hcl, TdQuote: testdata.RawQuote}),
		want:     attestation.ErrBadSignature, msg: "the quote is of another TD report",
	}.run(t)
}

// cannedTDXNow is inside the validity of the PCK chain of go-tdx-guest's canned quote.
var cannedTDXNow = time.Date(2023, 7, 1, 0, 0, 0, 0, time.UTC)

// cannedTDXReference is a TDX reference the canned quote matches.
func cannedTDXReference(t *testing.T) *tdx.Reference {
	t.Helper()
	q, err := tdx.ParseQuote(testdata.RawQuote)
	require.NoError(t, err)
	b := q.GetTdQuoteBody()
	return &tdx.Reference{
		Name:             "spr-e4",
		MrSeam:           []tdx.HexBytes{b.GetMrSeam()},
		TdAttributes:     b.GetTdAttributes(),
		Xfam:             b.GetXfam(),
		MinimumTeeTcbSvn: b.GetTeeTcbSvn(),
	}
}

// TestOfflineVerdictsQEMUTDX: go-tdx-guest's real TD quote, genuine but presented for a
// binding or a reference it does not match.
func TestOfflineVerdictsQEMUTDX(t *testing.T) {
	q, err := tdx.ParseQuote(testdata.RawQuote)
	require.NoError(t, err)
	b := q.GetTdQuoteBody()
	registers := map[uint32][]byte{tdx.RegisterMRTD: b.GetMrTd()}
	for i := range 3 {
		registers[tdx.RegisterRTMR0+uint32(i)] = b.GetRtmrs()[i]
	}
	sets := measurements.ReferenceSets{{Name: "canned", Measurements: measurementstest.Image(variant.QEMUTDX, registers)}}
	ref := func(sets measurements.ReferenceSets, hw *tdx.Reference) choose.Reference {
		return choose.Reference{Variant: variant.QEMUTDX, Values: choose.Values{Measurements: sets, HardwareValues: choose.HardwareValues{TDX: hw}}}
	}
	otherModule := cannedTDXReference(t)
	otherModule.MrSeam = []tdx.HexBytes{bytes.Repeat([]byte{7}, 48)}
	otherImage := measurements.ReferenceSets{{Name: "other", Measurements: measurementstest.Image(variant.QEMUTDX, map[uint32][]byte{tdx.RegisterMRTD: bytes.Repeat([]byte{7}, 48)})}}
	evidence, err := proto.Marshal(&hardwarepb.TDX{Variant: variant.QEMUTDX.String(), Quote: testdata.RawQuote})
	require.NoError(t, err)
	tampered := bytes.Clone(testdata.RawQuote)
	tampered[48+136] ^= 1 // MRTD
	tamperedEvidence, err := proto.Marshal(&hardwarepb.TDX{Variant: variant.QEMUTDX.String(), Quote: tampered})
	require.NoError(t, err)

	for name, tc := range map[string]forgedVerdictCase{
		"quote replayed for another binding": {
			ref: ref(sets, cannedTDXReference(t)), evidence: evidence, reportData: bytes.Repeat([]byte{1}, 64),
			want: attestation.ErrNonceMismatch, msg: "REPORTDATA",
		},
		"quote of another TDX module": {
			ref: ref(sets, otherModule), evidence: evidence, reportData: b.GetReportData(),
			want: attestation.ErrMeasurementPolicy, msg: "MR_SEAM",
		},
		"quote of another image": {
			ref: ref(otherImage, cannedTDXReference(t)), evidence: evidence, reportData: b.GetReportData(),
			want: attestation.ErrMeasurementPolicy,
		},
		"quote body edited": {
			ref: ref(sets, cannedTDXReference(t)), evidence: tamperedEvidence, reportData: b.GetReportData(),
			want: attestation.ErrBadSignature,
		},
	} {
		t.Run(name, func(t *testing.T) {
			tc.now = cannedTDXNow
			tc.run(t)
		})
	}
}

// TestOfflineVerdictsAWSSEVSNP: AWS's real VLEK-signed report (it binds the AK of the
// instance that made it) beside a TPM quote of the attacker's AK.
func TestOfflineVerdictsAWSSEVSNP(t *testing.T) {
	b64 := readTestdata(t, "../awssnp/testdata/aws-snp-vlek-report.b64")
	report, err := base64.StdEncoding.DecodeString(string(b64))
	require.NoError(t, err)
	report = report[:abi.ReportSize]
	block, _ := pem.Decode(readTestdata(t, "../awssnp/testdata/aws-snp-vlek.pem"))
	require.NotNil(t, block)
	r, err := abi.ReportToProto(report)
	require.NoError(t, err)
	hwRef := snp.DefaultReference("aws-sample")
	hwRef.Products = []string{snp.Milan}
	hwRef.MinimumTCB[snp.Milan] = snp.TCB{Microcode: 217}
	hwRef.Measurements = snp.Digests{r.GetMeasurement()}
	ref := choose.Reference{Variant: variant.AWSSEVSNP, Values: choose.Values{
		Measurements:   zeroPCRSets(variant.AWSSEVSNP),
		HardwareValues: choose.HardwareValues{SNP: &hwRef},
	}}
	forgedVerdictCase{
		ref: ref, now: time.Date(2025, 6, 1, 0, 0, 0, 0, time.UTC), // inside the VLEK's validity
		evidence: forgedQuote(t, variant.AWSSEVSNP, attackerKey(t), &hardwarepb.Hardware{SnpReport: report, SnpCertificates: [][]byte{block.Bytes}}),
		want:     attestation.ErrNonceMismatch, msg: "REPORT_DATA",
	}.run(t)
}

// TestEmptyEvidenceIsMalformed: an empty evidence file (or body) is malformed evidence for
// every variant and every entry point, not evidence of another variant.
func TestEmptyEvidenceIsMalformed(t *testing.T) {
	for _, v := range choose.Implemented() {
		t.Run(v.String(), func(t *testing.T) {
			val, err := choose.NewValidator(emptyEvidenceReference(t, v), choose.Options{Collateral: collateral.New(collateral.Config{})})
			require.NoError(t, err)
			for _, evidence := range [][]byte{nil, {}} {
				_, err = val.Validate(context.Background(), evidence, attestation.PurposeVerify, verdictNonce)
				assert.ErrorIs(t, err, attestation.ErrMalformed, "Validate")
				assert.Equal(t, "malformed", attestation.Reason(err))
				_, err = attestation.ValidateReportData(context.Background(), val, evidence, verdictNonce)
				assert.ErrorIs(t, err, attestation.ErrMalformed, "ValidateReportData")
				_, err = attestation.CollateralURLs(val, evidence)
				if _, lists := val.(attestation.CollateralLister); lists {
					assert.ErrorIs(t, err, attestation.ErrMalformed, "CollateralURLs")
				}
			}
		})
	}
}

// emptyEvidenceReference is a valid reference for v; what it accepts does not matter.
func emptyEvidenceReference(t *testing.T, v variant.Variant) choose.Reference {
	t.Helper()
	e, err := choose.Lookup(v)
	require.NoError(t, err)
	vals := choose.Values{Measurements: zeroPCRSets(v)}
	switch e.Hardware {
	case choose.HardwareSNP:
		hw := snp.DefaultReference("any")
		hw.Products = []string{snp.Milan}
		hw.MinimumTCB = map[string]snp.TCB{snp.Milan: {Microcode: 1}}
		hw.Measurements = snp.Digests{bytes.Repeat([]byte{1}, 48)}
		vals.SNP = &hw
	case choose.HardwareTDX:
		vals.TDX = cannedTDXReference(t)
	}
	switch e.AK {
	case choose.AKUnauthenticated:
		vals.AcceptUnauthenticatedAK = true
	case choose.AKRootsRequired:
		vals.AKRoots = vtpmtest.NewCA(t, "ak-ca", nil).PEM()
	}
	return choose.Reference{Variant: v, Values: vals}
}
