package azuretdx

import (
	"bytes"

	tdxpb "github.com/google/go-tdx-guest/proto/tdx"
)

// RewriteTDReport returns report (a TDREPORT) with the fields a TD quote's body repeats
// replaced by body's: ParseTDReport's inverse, for tests outside the package that forge
// TDREPORTs (only a package test may know the layout).
func RewriteTDReport(report []byte, body *tdxpb.TDQuoteBody) []byte {
	out := bytes.Clone(report)
	for _, f := range []struct {
		off int
		val []byte
	}{
		{teeTcbSvnOff, body.GetTeeTcbSvn()},
		{mrSeamOff, body.GetMrSeam()},
		{mrSignerOff, body.GetMrSignerSeam()},
		{seamAttrOff, body.GetSeamAttributes()},
		{tdAttrOff, body.GetTdAttributes()},
		{xfamOff, body.GetXfam()},
		{mrTdOff, body.GetMrTd()},
		{mrConfigIDOff, body.GetMrConfigId()},
		{mrOwnerOff, body.GetMrOwner()},
		{mrOwnerCfgOff, body.GetMrOwnerConfig()},
		{reportDataOff, body.GetReportData()},
	} {
		copy(out[f.off:], f.val)
	}
	for i, r := range body.GetRtmrs() {
		copy(out[rtmrOff+i*registerSize:], r)
	}
	return out
}
