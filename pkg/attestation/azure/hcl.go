// Package azure parses what Azure's confidential VMs (azure-sev-snp, azure-tdx) attest with:
// the HCL report that Azure's paravisor (the HCL) writes into the vTPM's NV index 0x1400001.
//
// The HCL report is a hardware report (an SEV-SNP attestation report or a TDX TDREPORT) whose
// report data binds a JSON document, the runtime data, that follows it: SHA-256 of the runtime
// data is REPORT_DATA[0:32] and REPORT_DATA[32:64] is zero. The runtime data names the vTPM's
// attestation key (the JWK "HCLAkPub"), so a hardware report that verifies makes the vTPM's
// quotes hardware evidence: the quote's AK must be that key.
//
// This package only parses and checks that binding; the variant packages (azuresnp, azuretdx)
// verify the hardware report itself.
package azure

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"

	"github.com/openconstellation/constellation/pkg/attestation"
)

// HCLReportNVIndex is the vTPM NV index where Azure's HCL stores the HCL report.
const HCLReportNVIndex = 0x01400001

// ReportType is the kind of hardware report inside an HCL report.
type ReportType uint32

// Report types (the HCL's IGVM report types).
const (
	ReportTypeSNP ReportType = 2
	ReportTypeTDX ReportType = 4
)

func (t ReportType) String() string {
	switch t {
	case ReportTypeSNP:
		return "SEV-SNP"
	case ReportTypeTDX:
		return "TDX"
	}
	return fmt.Sprintf("report type %d", uint32(t))
}

// Layout of an HCL report (all integers little endian):
//
//	0     header: "HCLA", version (1 or 2), report size, request type, status, 12 reserved bytes
//	32    hardware report area of 1184 bytes: an SNP report fills it, a TDREPORT (1024
//	      bytes) is followed by zeros
//	1216  request data header: data size (20 + runtime data size), version (1), report
//	      type, report data hash type (1 = SHA-256), runtime data size
//	1236  runtime data (JSON), up to the report size in the header
//
// An NV index is read whole, so what follows the report is the index's zero padding.
//
// The header version is 2 in the reports of current paravisors (OpenHCL's ATTESTATION_VERSION)
// and 1 in those of older ones, found in the field on Milan hosts; the layout is the same in
// both (reports of version 1 with the byte changed to 2 pass every check), so both are read
// alike. The header is signed by nothing: its version only selects the layout, and everything
// the verdict rests on is in the hardware report and the runtime data it binds. A version this
// package has not seen is refused rather than guessed at.
const (
	hclHeaderSize       = 32
	hardwareAreaSize    = 1184
	requestHeaderOffset = hclHeaderSize + hardwareAreaSize // 1216
	requestHeaderSize   = 20
	runtimeDataOffset   = requestHeaderOffset + requestHeaderSize // 1236

	hclSignature      = "HCLA"
	requestVersion    = 1
	hashTypeSHA256    = 1
	snpReportSize     = 1184
	tdReportSize      = 1024
	snpReportDataOff  = 0x50
	tdReportDataOff   = 128
	reportDataSize    = 64
	maxRuntimeDataLen = 16 << 10
)

// HCLReport is a parsed HCL report. Nothing in it is verified: the hardware report's
// signature (SNP) or quote (TDX) is the variant's to check.
type HCLReport struct {
	Type ReportType
	// HardwareReport is the SNP ATTESTATION_REPORT (1184 bytes) or the TDREPORT (1024 bytes).
	HardwareReport []byte
	// RuntimeData is the JSON document the hardware report binds (ParseRuntimeData).
	RuntimeData []byte
}

// ParseHCLReport parses an HCL report as read from HCLReportNVIndex, checking every size
// and offset: the header's sizes must agree with each other and with the data, the hash type
// must be SHA-256, and the bytes the layout leaves unused must be zero. Errors wrap
// attestation.ErrMalformed.
func ParseHCLReport(b []byte) (*HCLReport, error) {
	r, err := parseHCLReport(b)
	if err != nil {
		return nil, fmt.Errorf("%w: HCL report: %w", attestation.ErrMalformed, err)
	}
	return r, nil
}

func parseHCLReport(b []byte) (*HCLReport, error) {
	if len(b) < runtimeDataOffset {
		return nil, fmt.Errorf("%d bytes, shorter than its %d-byte headers and hardware report", len(b), runtimeDataOffset)
	}
	u32 := func(off int) uint32 { return binary.LittleEndian.Uint32(b[off : off+4]) }
	if string(b[0:4]) != hclSignature {
		return nil, fmt.Errorf("signature %q, want %q", b[0:4], hclSignature)
	}
	if v := u32(4); v != 1 && v != 2 {
		return nil, fmt.Errorf("header version %d, want 1 or 2 (the versions of the same layout seen in the field)", v)
	}
	if s := u32(16); s != 0 {
		return nil, fmt.Errorf("header status %#x: the HCL reports a failed request", s)
	}
	reportSize := u32(8)
	dataSize := u32(requestHeaderOffset)
	if v := u32(requestHeaderOffset + 4); v != requestVersion {
		return nil, fmt.Errorf("request data version %d, want %d", v, requestVersion)
	}
	typ := ReportType(u32(requestHeaderOffset + 8))
	if h := u32(requestHeaderOffset + 12); h != hashTypeSHA256 {
		return nil, fmt.Errorf("report data hash type %d, want %d (SHA-256)", h, hashTypeSHA256)
	}
	runtimeSize := u32(requestHeaderOffset + 16)
	if runtimeSize == 0 || runtimeSize > maxRuntimeDataLen {
		return nil, fmt.Errorf("runtime data size %d, want 1..%d", runtimeSize, maxRuntimeDataLen)
	}
	// runtimeSize is bounded above, so none of these sums overflow.
	if dataSize != requestHeaderSize+runtimeSize {
		return nil, fmt.Errorf("request data size %d, but header and runtime data make %d", dataSize, requestHeaderSize+runtimeSize)
	}
	end := uint32(runtimeDataOffset) + runtimeSize
	if reportSize != end {
		return nil, fmt.Errorf("report size %d, but headers and runtime data make %d", reportSize, end)
	}
	if uint64(end) > uint64(len(b)) {
		return nil, fmt.Errorf("runtime data of %d bytes ends at %d, past the %d bytes read", runtimeSize, end, len(b))
	}
	if !allZero(b[end:]) {
		return nil, fmt.Errorf("non-zero bytes after the report's end at %d", end)
	}

	var hwSize int
	switch typ {
	case ReportTypeSNP:
		hwSize = snpReportSize
	case ReportTypeTDX:
		hwSize = tdReportSize
	default:
		return nil, fmt.Errorf("%s, want %d (SEV-SNP) or %d (TDX)", typ, ReportTypeSNP, ReportTypeTDX)
	}
	hwEnd := hclHeaderSize + hwSize
	if !allZero(b[hwEnd:requestHeaderOffset]) {
		return nil, fmt.Errorf("non-zero bytes after the %d-byte %s report", hwSize, typ)
	}
	return &HCLReport{
		Type:           typ,
		HardwareReport: bytes.Clone(b[hclHeaderSize:hwEnd]),
		RuntimeData:    bytes.Clone(b[runtimeDataOffset:end]),
	}, nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// BindingReportData returns the REPORT_DATA a hardware report binding runtimeData carries:
// SHA-256(runtimeData) followed by 32 zero bytes (the HCL's SHA-256 hash type).
func BindingReportData(runtimeData []byte) []byte {
	out := make([]byte, reportDataSize)
	sum := sha256.Sum256(runtimeData)
	copy(out, sum[:])
	return out
}

// ReportData returns the REPORT_DATA field of the hardware report (64 bytes).
func (r *HCLReport) ReportData() []byte {
	off := snpReportDataOff
	if r.Type == ReportTypeTDX {
		off = tdReportDataOff
	}
	return bytes.Clone(r.HardwareReport[off : off+reportDataSize])
}

// CheckBinding checks that the hardware report's REPORT_DATA binds the runtime data (see
// BindingReportData). It does not verify the hardware report: the binding means something
// only once the report's signature (SNP) or quote (TDX) verified. Errors wrap
// attestation.ErrBadSignature: runtime data that is not the one the hardware report covers
// was changed after the report was made.
func (r *HCLReport) CheckBinding() error {
	return CheckBinding(r.ReportData(), r.RuntimeData)
}

// CheckBinding checks that reportData (a hardware report's 64-byte REPORT_DATA) binds
// runtimeData, naming which half differs.
func CheckBinding(reportData, runtimeData []byte) error {
	want := BindingReportData(runtimeData)
	switch {
	case len(reportData) != reportDataSize:
		return fmt.Errorf("%w: REPORT_DATA of %d bytes, want %d", attestation.ErrMalformed, len(reportData), reportDataSize)
	case !bytes.Equal(reportData[:32], want[:32]):
		return fmt.Errorf("%w: SHA-256 of the runtime data %x is not REPORT_DATA[0:32] %x: runtime data changed after the hardware report was made", attestation.ErrBadSignature, want[:32], reportData[:32])
	case !bytes.Equal(reportData[32:], want[32:]):
		return fmt.Errorf("%w: REPORT_DATA[32:64] is not zero: the report binds more than the runtime data", attestation.ErrBadSignature)
	}
	return nil
}
