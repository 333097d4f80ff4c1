package tdx

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/google/go-tdx-guest/abi"

	"github.com/openconstellation/constellation/pkg/strictjson"
)

// HexBytes is a byte string written as hex in JSON and YAML configs.
type HexBytes []byte

// MarshalText implements encoding.TextMarshaler.
func (h HexBytes) MarshalText() ([]byte, error) { return []byte(hex.EncodeToString(h)), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (h *HexBytes) UnmarshalText(b []byte) error {
	s := strings.TrimPrefix(strings.TrimSpace(string(b)), "0x")
	v, err := hex.DecodeString(s)
	if err != nil {
		return fmt.Errorf("not hex: %w", err)
	}
	*h = v
	return nil
}

// TD attribute bits (Intel TDX module ABI, TDINFO_STRUCT.ATTRIBUTES, little-endian).
const (
	// AttributeDebug: the host VMM can read and write the TD's memory and registers.
	AttributeDebug uint64 = 1 << 0
	// AttributeSeptVeDisable: EPT violations are not turned into #VE in the guest, so the
	// host cannot use them to steer the guest's control flow.
	AttributeSeptVeDisable uint64 = 1 << 28
)

// IntelQEVendorID is the QE_VENDOR_ID of Intel's quoting enclave.
var IntelQEVendorID = HexBytes{0x93, 0x9a, 0x72, 0x33, 0xf7, 0x9c, 0x4c, 0xa9, 0x94, 0x0a, 0x0d, 0xb3, 0x95, 0x7f, 0x06, 0x07}

// Reference is the hardware block of a TDX reference: what a verified TD quote's body and
// header must show. It pins the TDX module (MRSEAM) and the TD's configuration
// (attributes, XFAM) and bounds the TCB; the TD's measurements (MRTD, RTMRs) are checked by
// the variant's reference sets, since they change with every image.
//
// Secure defaults: fields without a safe default (MrSeam, TdAttributes, Xfam,
// MinimumTeeTcbSvn) are required, so a config that forgets one fails to load instead of
// accepting any value; QeVendorID defaults to Intel's.
type Reference struct {
	// Name identifies the reference in results and logs.
	Name string `json:"name"`
	// MrSeam lists the accepted measurements of the TDX module (48 bytes each), for example
	// the modules of the platform's current and next firmware.
	MrSeam []HexBytes `json:"mrSeam"`
	// TdAttributes is the required TD_ATTRIBUTES value (8 bytes, as in the quote:
	// little-endian). The DEBUG bit is forbidden.
	TdAttributes HexBytes `json:"tdAttributes"`
	// Xfam is the required XFAM value (8 bytes, little-endian): the extended CPU features
	// the TD may use.
	Xfam HexBytes `json:"xfam"`
	// MinimumTeeTcbSvn is the component-wise minimum TEE_TCB_SVN (16 bytes), on top of the
	// TCB status check against Intel's TCB info that verification always does.
	MinimumTeeTcbSvn HexBytes `json:"minimumTeeTcbSvn"`
	// QEVendorID is the required QE_VENDOR_ID (16 bytes); empty means Intel's.
	QEVendorID HexBytes `json:"qeVendorId,omitempty"`
	// MinimumQESvn and MinimumPCESvn bound the quoting enclave's and the provisioning
	// certification enclave's security versions as the quote header states them.
	MinimumQESvn  uint16 `json:"minimumQeSvn,omitempty"`
	MinimumPCESvn uint16 `json:"minimumPceSvn,omitempty"`
}

// UnmarshalJSON decodes a reference strictly (strictjson.Unmarshal): unknown fields are
// errors, so a typo does not silently leave a check at its default, and a field twice or in
// other letter case is refused, so the reference has one reading.
func (r *Reference) UnmarshalJSON(b []byte) error {
	type plain Reference
	var p plain
	if err := strictjson.Unmarshal(b, &p); err != nil {
		return fmt.Errorf("TDX reference: %w", err)
	}
	*r = Reference(p)
	return nil
}

// Validate checks the reference, naming every field that is wrong.
func (r Reference) Validate() error {
	var errs []error
	if r.Name == "" {
		errs = append(errs, errors.New("name: empty"))
	}
	if len(r.MrSeam) == 0 {
		errs = append(errs, errors.New("mrSeam: no accepted TDX module measurement (required)"))
	}
	for i, m := range r.MrSeam {
		if len(m) != abi.MrSeamSize {
			errs = append(errs, fmt.Errorf("mrSeam[%d]: %d bytes, want %d", i, len(m), abi.MrSeamSize))
		}
	}
	switch {
	case len(r.TdAttributes) != abi.TdAttributesSize:
		errs = append(errs, fmt.Errorf("tdAttributes: %d bytes, want %d (required)", len(r.TdAttributes), abi.TdAttributesSize))
	case binary.LittleEndian.Uint64(r.TdAttributes)&AttributeDebug != 0:
		errs = append(errs, errors.New("tdAttributes: the DEBUG bit is set; a debug TD's memory is readable by the host, so it can never be trusted"))
	}
	if len(r.Xfam) != abi.XfamSize {
		errs = append(errs, fmt.Errorf("xfam: %d bytes, want %d (required)", len(r.Xfam), abi.XfamSize))
	}
	if len(r.MinimumTeeTcbSvn) != abi.TeeTcbSvnSize {
		errs = append(errs, fmt.Errorf("minimumTeeTcbSvn: %d bytes, want %d (required)", len(r.MinimumTeeTcbSvn), abi.TeeTcbSvnSize))
	}
	if len(r.QEVendorID) != 0 && len(r.QEVendorID) != abi.QeVendorIDSize {
		errs = append(errs, fmt.Errorf("qeVendorId: %d bytes, want %d", len(r.QEVendorID), abi.QeVendorIDSize))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("TDX reference %q: %w", r.Name, err)
	}
	return nil
}

// qeVendorID returns the required QE vendor ID.
func (r Reference) qeVendorID() []byte {
	if len(r.QEVendorID) == 0 {
		return IntelQEVendorID
	}
	return r.QEVendorID
}
