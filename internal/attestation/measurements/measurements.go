// Package measurements holds reference values: for each measured register (a TPM PCR, an
// SNP/TDX register) the digest a genuine node must show, and whether a mismatch is fatal
// (enforced) or only reported (warn-only).
//
// Several reference-value sets may be active at once (ReferenceSets): evidence passes if any
// set matches, and the result names that set. This is what makes rolling upgrades safe: the
// new image's set is added, nodes roll, the old set is retired.
//
// Encoding (JSON, and YAML through sigs.k8s.io/yaml), registers in numeric order:
//
//	{"4": {"expected": "<hex>", "warnOnly": false}, "9": "<hex>"}
//
// A bare hex string is shorthand for an enforced register. Unknown fields, duplicate
// registers, non-numeric indices and non-hex digests are rejected when decoding; lengths and
// index ranges are checked against a variant by Validate.
package measurements

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/openconstellation/constellation/internal/attestation/variant"
)

// Measurement is the reference value of one register.
type Measurement struct {
	// Expected is the digest the register must hold.
	Expected []byte
	// WarnOnly makes a mismatch a warning instead of a rejection.
	WarnOnly bool
}

type measurementJSON struct {
	Expected string `json:"expected"`
	WarnOnly bool   `json:"warnOnly"`
}

// MarshalJSON encodes m as {"expected": hex, "warnOnly": bool}.
func (m Measurement) MarshalJSON() ([]byte, error) {
	return json.Marshal(measurementJSON{Expected: hex.EncodeToString(m.Expected), WarnOnly: m.WarnOnly})
}

// UnmarshalJSON accepts the object form or a bare hex string (enforced).
func (m *Measurement) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	var raw measurementJSON
	if len(b) > 0 && (b[0] == '-' || ('0' <= b[0] && b[0] <= '9')) {
		// The usual cause: an unquoted all-digit hex digest in YAML, read as a number (and
		// rounded, so the digits cannot be recovered here).
		return errors.New("measurement: expected digest must be a hex string, got a number (in YAML, quote digests that are all digits)")
	}
	if len(b) > 0 && b[0] == '"' {
		if err := json.Unmarshal(b, &raw.Expected); err != nil {
			return err
		}
	} else {
		// Keys are matched exactly: encoding/json alone would accept "warnonly" or "Expected".
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(b, &fields); err != nil {
			return fmt.Errorf("measurement: %w", err)
		}
		for key, val := range fields {
			var err error
			switch key {
			case "expected":
				if err = json.Unmarshal(val, &raw.Expected); err != nil {
					err = fmt.Errorf("expected digest must be a hex string (in YAML, quote digests that are all digits): %w", err)
				}
			case "warnOnly":
				err = json.Unmarshal(val, &raw.WarnOnly)
			default:
				err = fmt.Errorf("unknown field %q (known: expected, warnOnly)", key)
			}
			if err != nil {
				return fmt.Errorf("measurement: %w", err)
			}
		}
	}
	if raw.Expected == "" {
		return errors.New("measurement: expected digest is empty")
	}
	expected, err := hex.DecodeString(raw.Expected)
	if err != nil {
		return fmt.Errorf("measurement: expected digest %q is not hex: %w", raw.Expected, err)
	}
	*m = Measurement{Expected: expected, WarnOnly: raw.WarnOnly}
	return nil
}

// M maps register indices to reference values.
type M map[uint32]Measurement

// Indices returns the register indices of m in ascending order.
func (m M) Indices() []uint32 {
	idx := make([]uint32, 0, len(m))
	for i := range m {
		idx = append(idx, i)
	}
	slices.Sort(idx)
	return idx
}

// Validate checks m against the register layout of a variant: at least one enforced
// register, indices in range, digests of the variant's register length.
func (m M) Validate(v variant.Variant) error {
	if len(m) == 0 {
		return errors.New("no measurements")
	}
	var errs []error
	enforced := 0
	for _, i := range m.Indices() {
		if i >= v.RegisterCount() {
			errs = append(errs, fmt.Errorf("%s: index out of range for %s (valid: 0..%d)", v.RegisterName(i), v, v.RegisterCount()-1))
		}
		if got := len(m[i].Expected); got != v.RegisterLen() {
			errs = append(errs, fmt.Errorf("%s: expected digest has %d bytes, %s registers have %d", v.RegisterName(i), got, v, v.RegisterLen()))
		}
		if !m[i].WarnOnly {
			enforced++
		}
	}
	if enforced == 0 {
		errs = append(errs, errors.New("no enforced register: such a set would accept any evidence"))
	}
	return errors.Join(errs...)
}

// MarshalJSON writes registers in numeric order (encoding/json would sort "10" before "2").
func (m M) MarshalJSON() ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteByte('{')
	for n, i := range m.Indices() {
		if n > 0 {
			buf.WriteByte(',')
		}
		val, err := json.Marshal(m[i])
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(&buf, "%q:", strconv.FormatUint(uint64(i), 10))
		buf.Write(val)
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
}

// UnmarshalJSON decodes registers, rejecting duplicates and non-numeric indices.
func (m *M) UnmarshalJSON(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	tok, err := dec.Token()
	if err != nil {
		return fmt.Errorf("measurements: %w", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return fmt.Errorf("measurements: want an object of register index to measurement, got %v", tok)
	}
	out := M{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return fmt.Errorf("measurements: %w", err)
		}
		key := tok.(string) // object keys are always strings
		idx, err := strconv.ParseUint(key, 10, 32)
		if err != nil || (len(key) > 1 && key[0] == '0') {
			return fmt.Errorf("measurements: register index %q is not a decimal number", key)
		}
		if _, dup := out[uint32(idx)]; dup {
			return fmt.Errorf("measurements: register %d given twice", idx)
		}
		var meas Measurement
		if err := dec.Decode(&meas); err != nil {
			return fmt.Errorf("measurements: register %d: %w", idx, err)
		}
		out[uint32(idx)] = meas
	}
	if _, err := dec.Token(); err != nil {
		return fmt.Errorf("measurements: %w", err)
	}
	*m = out
	return nil
}

// String renders m compactly in index order, for logs.
func (m M) String() string {
	parts := make([]string, 0, len(m))
	for _, i := range m.Indices() {
		suffix := ""
		if m[i].WarnOnly {
			suffix = " (warn-only)"
		}
		parts = append(parts, fmt.Sprintf("%d=%x%s", i, m[i].Expected, suffix))
	}
	return strings.Join(parts, " ")
}
