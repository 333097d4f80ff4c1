package azuretdx_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"os"
	"testing"
	"time"

	"github.com/google/go-tdx-guest/testing/testdata"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/openconstellation/constellation/pkg/api/attestation/hardwarepb"
	"github.com/openconstellation/constellation/pkg/api/attestation/vtpmpb"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/azure"
	"github.com/openconstellation/constellation/pkg/attestation/azure/azuretest"
	"github.com/openconstellation/constellation/pkg/attestation/azuretdx"
	"github.com/openconstellation/constellation/pkg/attestation/choose"
	"github.com/openconstellation/constellation/pkg/attestation/collateral"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/measurements/measurementstest"
	"github.com/openconstellation/constellation/pkg/attestation/tdx"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm/vtpmtest"
)

// TestOfflineVerdictsOfEditedHCLReport: an attacker holds a genuine Intel-signed TD quote
// (go-tdx-guest's real one: its TD is not this VM, no quote of the real Azure sample's
// TDREPORT is published) and edits the unsigned parts of Azure's HCL report around it (the
// real sample's) so that they name its own AK, which signs the TPM quote. Through
// choose.NewValidator, what `constellation verify-evidence` and the services build, offline
// (no collateral at hand) under either revocation policy, the evidence is refused for the
// edit, never as revocation-unknown: the TDREPORT-vs-quote and runtime-data checks need no
// collateral, so they run before its verdict (docs/attestation.md "Verdict order").
// TestOfflineVerdictsAzureTDX (pkg/attestation/choose) is the case of an unedited HCL report.
func TestOfflineVerdictsOfEditedHCLReport(t *testing.T) {
	raw, err := os.ReadFile("../azure/testdata/azure-tdx-hclreport.bin")
	require.NoError(t, err)
	sample, err := azure.ParseHCLReport(raw)
	require.NoError(t, err)
	quote, err := tdx.ParseQuote(testdata.RawQuote)
	require.NoError(t, err)
	body := quote.GetTdQuoteBody()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	attackerRuntime := azuretest.RuntimeData(&key.PublicKey, nil)

	// The sample's TDREPORT rewritten to repeat the genuine quote's body: the quote then
	// covers it, but its REPORTDATA binds the other TD's data, not the runtime data.
	repeating := azuretdx.RewriteTDReport(sample.HardwareReport, body)
	// ... and with its REPORTDATA rewritten to bind the attacker's runtime data.
	rebound := bytes.Clone(repeating)
	copy(rebound[128:192], azure.BindingReportData(attackerRuntime))
	// ... and with one RTMR the quote does not show.
	otherRTMR := bytes.Clone(repeating)
	otherRTMR[720+48] ^= 1 // RTMR1

	for name, tc := range map[string]struct {
		tdReport, runtime []byte
		want              error
		msg               string
	}{
		"TDREPORT edited to repeat the quote, runtime data the sample's": {
			tdReport: repeating, runtime: sample.RuntimeData,
			want: attestation.ErrBadSignature, msg: "runtime data changed",
		},
		"TDREPORT edited to repeat the quote, runtime data naming the attacker's AK": {
			tdReport: repeating, runtime: attackerRuntime,
			want: attestation.ErrBadSignature, msg: "runtime data changed",
		},
		"TDREPORT's REPORTDATA edited to bind runtime data naming the attacker's AK": {
			tdReport: rebound, runtime: attackerRuntime,
			want: attestation.ErrBadSignature, msg: "TD quote's REPORTDATA",
		},
		"TDREPORT's RTMR1 edited": {
			tdReport: otherRTMR, runtime: sample.RuntimeData,
			want: attestation.ErrBadSignature, msg: "TD quote's RTMR1",
		},
		"runtime data edited to name the attacker's AK, TDREPORT the sample's": {
			tdReport: sample.HardwareReport, runtime: attackerRuntime,
			want: attestation.ErrBadSignature, msg: "the quote is of another TD report",
		},
	} {
		t.Run(name, func(t *testing.T) {
			hw := &hardwarepb.Hardware{
				HclReport: azuretest.HCLReport(azure.ReportTypeTDX, tc.tdReport, tc.runtime, 0),
				TdQuote:   testdata.RawQuote,
			}
			evidence := forgedQuote(t, key, hw)
			for _, policy := range []attestation.RevocationPolicy{attestation.RevocationRequired, attestation.RevocationUnknownAccepted} {
				_, err := offlineValidator(t, body, policy).Validate(context.Background(), evidence, attestation.PurposeVerify, verdictNonce)
				require.Error(t, err)
				t.Logf("%s: %v", policy, err)
				assert.Equal(t, attestation.Reason(tc.want), attestation.Reason(err), "policy %s: %v", policy, err)
				assert.NotErrorIs(t, err, attestation.ErrRevocationUnknown)
				assert.NotContains(t, err.Error(), "chain verified")
				assert.ErrorContains(t, err, tc.msg)
			}
		})
	}
}

var verdictNonce = bytes.Repeat([]byte{0x42}, 32)

// offlineValidator is choose.NewValidator for azure-tdx with no collateral at hand, at a time
// inside the validity of the genuine quote's PCK chain, with a reference the genuine quote's
// body and the forged TPM quote's PCRs (all zero) match.
func offlineValidator(t *testing.T, body interface {
	GetMrSeam() []byte
	GetTdAttributes() []byte
	GetXfam() []byte
	GetTeeTcbSvn() []byte
}, policy attestation.RevocationPolicy,
) attestation.Validator {
	t.Helper()
	now := func() time.Time { return time.Date(2023, 7, 1, 0, 0, 0, 0, time.UTC) }
	v, err := choose.NewValidator(choose.Reference{Variant: variant.AzureTDX, Values: choose.Values{
		Measurements: measurements.ReferenceSets{{Name: "image", Measurements: measurementstest.Image(variant.AzureTDX, nil)}},
		HardwareValues: choose.HardwareValues{TDX: &tdx.Reference{
			Name:             "spr-e4",
			MrSeam:           []tdx.HexBytes{body.GetMrSeam()},
			TdAttributes:     body.GetTdAttributes(),
			Xfam:             body.GetXfam(),
			MinimumTeeTcbSvn: body.GetTeeTcbSvn(),
		}},
	}}, choose.Options{Collateral: collateral.New(collateral.Config{Now: now}), Now: now, Revocation: policy})
	require.NoError(t, err)
	return v
}

// forgedQuote is azure-tdx evidence whose TPM quote the attacker signed with its own key,
// binding the caller's nonce and showing all-zero PCRs, with hw beside it.
func forgedQuote(t *testing.T, key *rsa.PrivateKey, hw *hardwarepb.Hardware) []byte {
	t.Helper()
	raw, err := vtpmtest.NewSoftwareIssuer(t, variant.AzureTDX, key, nil).Issue(context.Background(), attestation.PurposeVerify, verdictNonce)
	require.NoError(t, err)
	ev := &vtpmpb.Evidence{}
	require.NoError(t, proto.Unmarshal(raw, ev))
	ev.Hardware = hw
	out, err := proto.Marshal(ev)
	require.NoError(t, err)
	return out
}
