package azuretdx

import (
	"bytes"
	"fmt"

	tdxpb "github.com/google/go-tdx-guest/proto/tdx"

	"github.com/openconstellation/constellation/pkg/attestation"
)

// TDREPORT layout (Intel TDX module ABI: REPORTMACSTRUCT, TEE_TCB_INFO, TDINFO): byte ranges of
// the fields a TD quote's body repeats.
const (
	tdReportSize   = 1024
	tdReportType   = 0x81 // REPORTTYPE.TYPE of a TDX report
	reportDataOff  = 128
	teeTcbSvnOff   = 256 + 8 // TEE_TCB_INFO.TEE_TCB_SVN, after the VALID bitmap
	mrSeamOff      = teeTcbSvnOff + 16
	mrSignerOff    = mrSeamOff + 48
	seamAttrOff    = mrSignerOff + 48
	tdInfoOff      = 512
	tdAttrOff      = tdInfoOff
	xfamOff        = tdAttrOff + 8
	mrTdOff        = xfamOff + 8
	mrConfigIDOff  = mrTdOff + 48
	mrOwnerOff     = mrConfigIDOff + 48
	mrOwnerCfgOff  = mrOwnerOff + 48
	rtmrOff        = mrOwnerCfgOff + 48
	rtmrCount      = 4
	registerSize   = 48
	reportDataSize = 64
)

// ParseTDReport decodes the fields of a TDREPORT that a TD quote's body repeats, as go-tdx-guest's
// TDQuoteBody. A TDREPORT is MAC'ed by the CPU for the local quoting enclave, not signed:
// nothing in it is trustworthy until a verified quote repeats it (CheckQuoteBody).
func ParseTDReport(b []byte) (*tdxpb.TDQuoteBody, error) {
	if len(b) != tdReportSize {
		return nil, fmt.Errorf("%w: TDREPORT of %d bytes, want %d", attestation.ErrMalformed, len(b), tdReportSize)
	}
	if b[0] != tdReportType {
		return nil, fmt.Errorf("%w: TDREPORT type %#x, want %#x (TDX)", attestation.ErrMalformed, b[0], tdReportType)
	}
	field := func(off, n int) []byte { return bytes.Clone(b[off : off+n]) }
	body := &tdxpb.TDQuoteBody{
		TeeTcbSvn:      field(teeTcbSvnOff, 16),
		MrSeam:         field(mrSeamOff, registerSize),
		MrSignerSeam:   field(mrSignerOff, registerSize),
		SeamAttributes: field(seamAttrOff, 8),
		TdAttributes:   field(tdAttrOff, 8),
		Xfam:           field(xfamOff, 8),
		MrTd:           field(mrTdOff, registerSize),
		MrConfigId:     field(mrConfigIDOff, registerSize),
		MrOwner:        field(mrOwnerOff, registerSize),
		MrOwnerConfig:  field(mrOwnerCfgOff, registerSize),
		ReportData:     field(reportDataOff, reportDataSize),
	}
	for i := range rtmrCount {
		body.Rtmrs = append(body.Rtmrs, field(rtmrOff+i*registerSize, registerSize))
	}
	return body, nil
}

// quoteField is one field a TD quote's body repeats from the TDREPORT.
type quoteField struct {
	name string
	get  func(*tdxpb.TDQuoteBody) []byte
}

// allFields are every field of a TD quote's body but the RTMRs.
var allFields = []quoteField{
	{"TEE_TCB_SVN", (*tdxpb.TDQuoteBody).GetTeeTcbSvn},
	{"MRSEAM", (*tdxpb.TDQuoteBody).GetMrSeam},
	{"MRSIGNERSEAM", (*tdxpb.TDQuoteBody).GetMrSignerSeam},
	{"SEAMATTRIBUTES", (*tdxpb.TDQuoteBody).GetSeamAttributes},
	{"TDATTRIBUTES", (*tdxpb.TDQuoteBody).GetTdAttributes},
	{"XFAM", (*tdxpb.TDQuoteBody).GetXfam},
	{"MRTD", (*tdxpb.TDQuoteBody).GetMrTd},
	{"MRCONFIGID", (*tdxpb.TDQuoteBody).GetMrConfigId},
	{"MROWNER", (*tdxpb.TDQuoteBody).GetMrOwner},
	{"MROWNERCONFIG", (*tdxpb.TDQuoteBody).GetMrOwnerConfig},
	{"REPORTDATA", (*tdxpb.TDQuoteBody).GetReportData},
}

// exposedFields are the fields tdx.Quote exposes of a verified quote's body.
var exposedFields = []quoteField{allFields[0], allFields[1], allFields[4], allFields[5], allFields[6], allFields[10]}

// CheckQuoteBody checks that a verified TD quote's body repeats every field of the TDREPORT:
// only then does the quote's signature cover the TDREPORT, and with it the runtime data the
// TDREPORT's REPORTDATA binds. The first differing field is named. Errors wrap
// attestation.ErrBadSignature.
func CheckQuoteBody(report, quoted *tdxpb.TDQuoteBody) error {
	return compareFields(report, quoted, allFields)
}

// compareFields compares fields and all RTMRs of report and quoted.
func compareFields(report, quoted *tdxpb.TDQuoteBody, fields []quoteField) error {
	if len(report.GetRtmrs()) != len(quoted.GetRtmrs()) {
		return fmt.Errorf("%w: the TD quote has %d RTMRs, the TDREPORT %d: the quote is of another TD report", attestation.ErrBadSignature, len(quoted.GetRtmrs()), len(report.GetRtmrs()))
	}
	differs := func(name string, rep, quot []byte) error {
		return fmt.Errorf("%w: the TD quote's %s %x differs from the TDREPORT's %x: the quote is of another TD report", attestation.ErrBadSignature, name, quot, rep)
	}
	for _, f := range fields {
		if rep, quot := f.get(report), f.get(quoted); !bytes.Equal(rep, quot) {
			return differs(f.name, rep, quot)
		}
	}
	for i := range report.GetRtmrs() {
		if rep, quot := report.GetRtmrs()[i], quoted.GetRtmrs()[i]; !bytes.Equal(rep, quot) {
			return differs(fmt.Sprintf("RTMR%d", i), rep, quot)
		}
	}
	return nil
}
