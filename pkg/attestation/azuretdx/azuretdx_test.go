package azuretdx

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-tdx-guest/abi"
	tdxpb "github.com/google/go-tdx-guest/proto/tdx"
	"github.com/google/go-tdx-guest/testing/testdata"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/openconstellation/constellation/pkg/api/attestation/hardwarepb"
	"github.com/openconstellation/constellation/pkg/api/attestation/vtpmpb"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/azure"
	"github.com/openconstellation/constellation/pkg/attestation/azure/azuretest"
	"github.com/openconstellation/constellation/pkg/attestation/collateral"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/measurements/measurementstest"
	"github.com/openconstellation/constellation/pkg/attestation/tdx"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm/vtpmtest"
)

var nonce = bytes.Repeat([]byte{0x11}, 32)

// The real TDX HCL report's TDREPORT and runtime data, as the templates of synthetic ones.
func sampleReference(t testing.TB) tdx.Reference {
	_, body := realTDReport(t)
	return tdx.Reference{
		Name:             "azure-sample",
		MrSeam:           []tdx.HexBytes{body.MrSeam},
		TdAttributes:     body.TdAttributes,
		Xfam:             body.Xfam,
		MinimumTeeTcbSvn: body.TeeTcbSvn,
	}
}

// tdReport returns the real sample's TDREPORT with REPORTDATA binding runtimeData.
func tdReport(t testing.TB, runtimeData []byte) []byte {
	hcl, _ := realTDReport(t)
	r := bytes.Clone(hcl.HardwareReport)
	copy(r[reportDataOff:reportDataOff+reportDataSize], azure.BindingReportData(runtimeData))
	return r
}

// fakeIntel stands in for the quoting enclave and Intel's signature: its quotes are the
// canned Intel quote of go-tdx-guest with the body replaced by a TDREPORT's fields, and
// "verifying" one parses it with tdx.ParseQuote (the production parser) without checking
// its signature, which no test can produce. Everything after the signature check runs as
// in production.
type fakeIntel struct {
	// edit, if set, changes the body before it is quoted: a quote of another TD report.
	edit func(b *tdxpb.TDQuoteBody)
}

func (f *fakeIntel) Quote(_ context.Context, report []byte) ([]byte, error) {
	body, err := ParseTDReport(report)
	if err != nil {
		return nil, err
	}
	if f.edit != nil {
		f.edit(body)
	}
	q, err := tdx.ParseQuote(testdata.RawQuote)
	if err != nil {
		return nil, err
	}
	q.TdQuoteBody = body
	return abi.QuoteToAbiBytes(q)
}

func fakeVerify(_ context.Context, raw []byte, _ []*hardwarepb.Collateral) (*tdx.Quote, error) {
	q, err := tdx.ParseQuote(raw)
	if err != nil {
		return nil, err
	}
	b := q.GetTdQuoteBody()
	out := &tdx.Quote{
		TeeTcbSvn: b.GetTeeTcbSvn(), MrSeam: b.GetMrSeam(), TdAttributes: b.GetTdAttributes(),
		Xfam: b.GetXfam(), MrTd: b.GetMrTd(), ReportData: b.GetReportData(), FMSPC: "00806f050000",
	}
	copy(out.Rtmrs[:], b.GetRtmrs())
	return out, nil
}

// testCheck is NewHardwareCheck with the fake Intel signature check; the policy check
// compares MRSEAM only (tdx's Validate needs the quote's signed proto).
func testCheck(t testing.TB) *HardwareCheck {
	t.Helper()
	c, err := NewHardwareCheck(ValidatorConfig{Hardware: sampleReference(t), Collateral: collateral.New(collateral.Config{})})
	require.NoError(t, err)
	c.verifyQuote = fakeVerify
	c.validateQuote = func(q *tdx.Quote) error {
		if !bytes.Equal(q.MrSeam, c.ref.MrSeam[0]) {
			return attestation.ErrMeasurementPolicy
		}
		return nil
	}
	return c
}

func TestProductionCheckFailsClosedOnUnverifiableQuote(t *testing.T) {
	// The real Azure HCL report with go-tdx-guest's real Intel quote, through the check
	// NewValidator installs, with no collateral: verification cannot pass, and says so.
	c, err := NewHardwareCheck(ValidatorConfig{Hardware: sampleReference(t), Collateral: collateral.New(collateral.Config{Now: func() time.Time { return time.Date(2023, 7, 1, 0, 0, 0, 0, time.UTC) }})})
	require.NoError(t, err)
	raw, err := azureSample()
	require.NoError(t, err)
	hcl, err := azure.ParseHCLReport(raw)
	require.NoError(t, err)
	rd, err := azure.ParseRuntimeData(hcl.RuntimeData)
	require.NoError(t, err)
	_, err = c.Check(context.Background(), &hardwarepb.Hardware{HclReport: raw, TdQuote: testdata.RawQuote}, rd.AK, nil, nil)
	require.Error(t, err)
	t.Log(err)
	assert.NotEqual(t, "other", attestation.Reason(err), "a reason: %v", err)
}

func azureSample() ([]byte, error) { return os.ReadFile("../azure/testdata/azure-tdx-hclreport.bin") }

func TestCheckRealHCLReport(t *testing.T) {
	// The real HCL report, with a quote of its TDREPORT: passes, and names the AK of the
	// real runtime data as the one the quote must have been signed with.
	raw, err := azureSample()
	require.NoError(t, err)
	hcl, err := azure.ParseHCLReport(raw)
	require.NoError(t, err)
	rd, err := azure.ParseRuntimeData(hcl.RuntimeData)
	require.NoError(t, err)
	quote, err := (&fakeIntel{}).Quote(context.Background(), hcl.HardwareReport)
	require.NoError(t, err)
	hw := &hardwarepb.Hardware{HclReport: raw, TdQuote: quote}

	got, err := testCheck(t).Check(context.Background(), hw, rd.AK, nil, nil)
	require.NoError(t, err)
	assert.Equal(t, "TDX", got.Technology)
	assert.Equal(t, "azure-sample", got.Reference)
	assert.Equal(t, hcl.HardwareReport[mrTdOff:mrTdOff+48], got.Measurements["MRTD"])

	other, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	_, err = testCheck(t).Check(context.Background(), hw, &other.PublicKey, nil, nil)
	assert.ErrorIs(t, err, attestation.ErrUntrustedSigner)
}

// node is an Azure TDX VM on swtpm: an HCL report with a TDREPORT binding the swtpm's real
// AK in NV index 0x1400001, issuing through NewIssuer with the fake quoting enclave.
type node struct {
	tpm    *vtpm.TPM
	ak     *rsa.PublicKey
	intel  *fakeIntel
	issuer *vtpm.Issuer
	sets   measurements.ReferenceSets
}

func bootNode(t *testing.T) *node {
	t.Helper()
	if testing.Short() {
		t.Skip("starts swtpm")
	}
	tpm, _ := vtpmtest.Swtpm(t)
	// The HCL's AK at its handle, as Azure provisions it; the issuer quotes with it.
	ak := azuretest.ProvisionAK(t, tpm)

	require.NoError(t, tpm.WriteNV(azure.HCLReportNVIndex, hclReport(t, ak)))
	intel := &fakeIntel{}
	iss, err := NewIssuer(tpm, intel)
	require.NoError(t, err)
	t.Cleanup(func() { _ = iss.Close() })
	pcrs, err := tpm.ReadPCRs()
	require.NoError(t, err)
	return &node{tpm: tpm, ak: ak, intel: intel, issuer: iss, sets: measurements.ReferenceSets{{Name: "image", Measurements: measurementstest.FromRegisters(Variant, pcrs)}}}
}

func hclReport(t testing.TB, ak *rsa.PublicKey) []byte {
	runtime := azuretest.RuntimeData(ak, nil)
	return azuretest.HCLReport(azure.ReportTypeTDX, tdReport(t, runtime), runtime, 100)
}

// validator is NewValidator with the fake Intel signature check (testCheck).
func (n *node) validator(t testing.TB) *vtpm.Validator {
	t.Helper()
	v, err := vtpm.NewValidator(vtpm.ValidatorConfig{ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: n.sets}, Variant: Variant, Hardware: testCheck(t)})
	require.NoError(t, err)
	return v
}

func (n *node) issue(t *testing.T) []byte {
	t.Helper()
	ev, err := n.issuer.Issue(context.Background(), attestation.PurposeVerify, nonce)
	require.NoError(t, err)
	return ev
}

func TestEndToEndOnSwtpm(t *testing.T) {
	n := bootNode(t)
	got, err := n.validator(t).Validate(context.Background(), n.issue(t), attestation.PurposeVerify, nonce)
	require.NoError(t, err)
	require.NotNil(t, got.Hardware)
	assert.Equal(t, "TDX", got.Hardware.Technology)
	assert.Equal(t, Variant, got.Variant)
}

func TestEndToEndAttacks(t *testing.T) {
	n := bootNode(t)
	v := n.validator(t)
	genuine := n.issue(t)
	other, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)

	// A quote whose body differs from the TDREPORT in one field: a genuine quote of another
	// TD report, presented with this VM's HCL report.
	for _, field := range []struct {
		name string
		get  func(b *tdxpb.TDQuoteBody) []byte
	}{
		{"MRSEAM", (*tdxpb.TDQuoteBody).GetMrSeam},
		{"MRTD", (*tdxpb.TDQuoteBody).GetMrTd},
		{"RTMR2", func(b *tdxpb.TDQuoteBody) []byte { return b.GetRtmrs()[2] }},
		{"TDATTRIBUTES", (*tdxpb.TDQuoteBody).GetTdAttributes},
		{"XFAM", (*tdxpb.TDQuoteBody).GetXfam},
		{"TEE_TCB_SVN", (*tdxpb.TDQuoteBody).GetTeeTcbSvn},
		{"REPORTDATA", (*tdxpb.TDQuoteBody).GetReportData},
	} {
		t.Run("quote body differs in "+field.name, func(t *testing.T) {
			ev := decode(t, genuine)
			hcl, err := azure.ParseHCLReport(ev.Hardware.HclReport)
			require.NoError(t, err)
			quote, err := (&fakeIntel{edit: func(b *tdxpb.TDQuoteBody) { field.get(b)[5] ^= 0x10 }}).Quote(context.Background(), hcl.HardwareReport)
			require.NoError(t, err)
			ev.Hardware.TdQuote = quote
			_, err = v.Validate(context.Background(), encode(t, ev), attestation.PurposeVerify, nonce)
			require.ErrorIs(t, err, attestation.ErrBadSignature)
			assert.ErrorContains(t, err, "TD quote's "+field.name)
		})
	}

	tests := map[string]struct {
		tamper  func(t *testing.T, ev *vtpmpb.Evidence)
		wantErr error
		msg     string
	}{
		"HCL report of another VM, with its own genuine quote": {
			tamper: func(t *testing.T, ev *vtpmpb.Evidence) {
				raw := hclReport(t, &other.PublicKey)
				hcl, err := azure.ParseHCLReport(raw)
				require.NoError(t, err)
				quote, err := (&fakeIntel{}).Quote(context.Background(), hcl.HardwareReport)
				require.NoError(t, err)
				ev.Hardware.HclReport, ev.Hardware.TdQuote = raw, quote
			},
			wantErr: attestation.ErrUntrustedSigner,
			msg:     "HCLAkPub",
		},
		"runtime data edited to name the attacker's AK": {
			tamper: func(t *testing.T, ev *vtpmpb.Evidence) {
				hcl, err := azure.ParseHCLReport(ev.Hardware.HclReport)
				require.NoError(t, err)
				ev.Hardware.HclReport = azuretest.HCLReport(azure.ReportTypeTDX, hcl.HardwareReport, azuretest.RuntimeData(&other.PublicKey, nil), 0)
			},
			wantErr: attestation.ErrBadSignature,
			msg:     "runtime data changed",
		},
		"TDREPORT's REPORTDATA rewritten to match edited runtime data (quote unchanged)": {
			tamper: func(t *testing.T, ev *vtpmpb.Evidence) {
				runtime := azuretest.RuntimeData(&other.PublicKey, nil)
				ev.Hardware.HclReport = azuretest.HCLReport(azure.ReportTypeTDX, tdReport(t, runtime), runtime, 0)
			},
			wantErr: attestation.ErrBadSignature,
			msg:     "REPORTDATA",
		},
		"TD quote missing": {
			tamper:  func(_ *testing.T, ev *vtpmpb.Evidence) { ev.Hardware.TdQuote = nil },
			wantErr: attestation.ErrMalformed,
			msg:     "without a TD quote",
		},
		"TD quote truncated": {
			tamper:  func(_ *testing.T, ev *vtpmpb.Evidence) { ev.Hardware.TdQuote = ev.Hardware.TdQuote[:600] },
			wantErr: attestation.ErrMalformed,
		},
		"SNP HCL report": {
			tamper: func(_ *testing.T, ev *vtpmpb.Evidence) {
				ev.Hardware.HclReport = azuretest.HCLReport(azure.ReportTypeSNP, make([]byte, 1184), azuretest.RuntimeData(n.ak, nil), 0)
			},
			wantErr: attestation.ErrMalformed,
			msg:     "needs TDX",
		},
		"SNP certificates smuggled alongside": {
			tamper:  func(_ *testing.T, ev *vtpmpb.Evidence) { ev.Hardware.SnpCertificates = [][]byte{{1}} },
			wantErr: attestation.ErrMalformed,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ev := decode(t, genuine)
			tc.tamper(t, ev)
			_, err := v.Validate(context.Background(), encode(t, ev), attestation.PurposeVerify, nonce)
			require.ErrorIs(t, err, tc.wantErr)
			if tc.msg != "" {
				assert.ErrorContains(t, err, tc.msg)
			}
		})
	}
	_, err = v.Validate(context.Background(), genuine, attestation.PurposeVerify, nonce)
	require.NoError(t, err)
}

func TestIMDS(t *testing.T) {
	report := bytes.Repeat([]byte{0x81}, tdReportSize)
	quote := testdata.RawQuote
	tests := map[string]struct {
		status  int
		body    string
		wantErr string
	}{
		"quote":            {http.StatusOK, `{"quote":"` + base64.RawURLEncoding.EncodeToString(quote) + `"}`, ""},
		"padded base64":    {http.StatusOK, `{"quote":"` + base64.URLEncoding.EncodeToString(quote) + `"}`, ""},
		"no quote":         {http.StatusOK, `{}`, "no base64url quote"},
		"not base64":       {http.StatusOK, `{"quote":"***"}`, "no base64url quote"},
		"HTTP error":       {http.StatusInternalServerError, `{}`, "500"},
		"response too big": {http.StatusOK, strings.Repeat(" ", 65<<10), "larger"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				var req struct{ Report string }
				if r.Method != http.MethodPost || json.NewDecoder(r.Body).Decode(&req) != nil || req.Report != base64.RawURLEncoding.EncodeToString(report) {
					http.Error(w, "bad request", http.StatusBadRequest)
					return
				}
				w.WriteHeader(tc.status)
				_, _ = w.Write([]byte(tc.body))
			}))
			t.Cleanup(srv.Close)
			got, err := (&IMDS{Client: srv.Client(), URL: srv.URL}).Quote(context.Background(), report)
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, quote, got)
		})
	}
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
