package azuretdx

import (
	"encoding/hex"
	"os"
	"testing"

	tdxpb "github.com/google/go-tdx-guest/proto/tdx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/azure"
)

func realTDReport(t testing.TB) (*azure.HCLReport, *tdxpb.TDQuoteBody) {
	t.Helper()
	raw, err := os.ReadFile("../azure/testdata/azure-tdx-hclreport.bin")
	require.NoError(t, err)
	hcl, err := azure.ParseHCLReport(raw)
	require.NoError(t, err)
	body, err := ParseTDReport(hcl.HardwareReport)
	require.NoError(t, err)
	return hcl, body
}

func TestParseRealTDReport(t *testing.T) {
	hcl, body := realTDReport(t)
	assert.Equal(t, "020106", hex.EncodeToString(body.TeeTcbSvn[:3]))
	assert.Equal(t, "360304d3", hex.EncodeToString(body.MrSeam[:4]))
	assert.Equal(t, make([]byte, 8), body.TdAttributes)
	assert.Equal(t, "e718060000000000", hex.EncodeToString(body.Xfam))
	assert.Equal(t, "024a32b0", hex.EncodeToString(body.MrTd[:4]))
	require.Len(t, body.Rtmrs, 4)
	for i, r := range body.Rtmrs {
		assert.Equal(t, make([]byte, 48), r, "RTMR%d", i)
	}
	// REPORTDATA is the binding of the runtime data.
	assert.Equal(t, azure.BindingReportData(hcl.RuntimeData), body.ReportData)
	require.NoError(t, azure.CheckBinding(body.ReportData, hcl.RuntimeData))
}

func TestParseTDReportRejects(t *testing.T) {
	hcl, _ := realTDReport(t)
	_, err := ParseTDReport(hcl.HardwareReport[:1023])
	assert.ErrorIs(t, err, attestation.ErrMalformed)
	wrongType := append([]byte(nil), hcl.HardwareReport...)
	wrongType[0] = 0x00 // an SGX report
	_, err = ParseTDReport(wrongType)
	assert.ErrorIs(t, err, attestation.ErrMalformed)
}

func TestCheckQuoteBodyNamesTheDifferingField(t *testing.T) {
	_, report := realTDReport(t)
	require.NoError(t, CheckQuoteBody(report, proto.Clone(report).(*tdxpb.TDQuoteBody)))

	flip := func(f func(b *tdxpb.TDQuoteBody) []byte) *tdxpb.TDQuoteBody {
		b := proto.Clone(report).(*tdxpb.TDQuoteBody)
		f(b)[0] ^= 1
		return b
	}
	tests := map[string]*tdxpb.TDQuoteBody{
		"TEE_TCB_SVN":    flip(func(b *tdxpb.TDQuoteBody) []byte { return b.TeeTcbSvn }),
		"MRSEAM":         flip(func(b *tdxpb.TDQuoteBody) []byte { return b.MrSeam }),
		"MRSIGNERSEAM":   flip(func(b *tdxpb.TDQuoteBody) []byte { return b.MrSignerSeam }),
		"SEAMATTRIBUTES": flip(func(b *tdxpb.TDQuoteBody) []byte { return b.SeamAttributes }),
		"TDATTRIBUTES":   flip(func(b *tdxpb.TDQuoteBody) []byte { return b.TdAttributes }),
		"XFAM":           flip(func(b *tdxpb.TDQuoteBody) []byte { return b.Xfam }),
		"MRTD":           flip(func(b *tdxpb.TDQuoteBody) []byte { return b.MrTd }),
		"MRCONFIGID":     flip(func(b *tdxpb.TDQuoteBody) []byte { return b.MrConfigId }),
		"MROWNER":        flip(func(b *tdxpb.TDQuoteBody) []byte { return b.MrOwner }),
		"MROWNERCONFIG":  flip(func(b *tdxpb.TDQuoteBody) []byte { return b.MrOwnerConfig }),
		"REPORTDATA":     flip(func(b *tdxpb.TDQuoteBody) []byte { return b.ReportData }),
		"RTMR0":          flip(func(b *tdxpb.TDQuoteBody) []byte { return b.Rtmrs[0] }),
		"RTMR3":          flip(func(b *tdxpb.TDQuoteBody) []byte { return b.Rtmrs[3] }),
		"RTMR": func() *tdxpb.TDQuoteBody {
			b := proto.Clone(report).(*tdxpb.TDQuoteBody)
			b.Rtmrs = b.Rtmrs[:3]
			return b
		}(),
	}
	for field, quoted := range tests {
		t.Run(field, func(t *testing.T) {
			err := CheckQuoteBody(report, quoted)
			require.ErrorIs(t, err, attestation.ErrBadSignature)
			assert.ErrorContains(t, err, field)
		})
	}
}
