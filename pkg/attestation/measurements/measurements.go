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

	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/strictjson"
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
		if err := strictjson.Unmarshal(b, &raw.Expected); err != nil {
			return err
		}
	} else {
		// Keys are matched exactly: encoding/json alone would accept "warnonly" or "Expected".
		// strictjson refuses a key twice (encoding/json alone keeps the last "expected").
		var fields map[string]json.RawMessage
		if err := strictjson.Unmarshal(b, &fields); err != nil {
			return fmt.Errorf("measurement: %w", err)
		}
		for key, val := range fields {
			var err error
			switch key {
			case "expected":
				if err = strictjson.Unmarshal(val, &raw.Expected); err != nil {
					err = fmt.Errorf("expected digest must be a hex string (in YAML, quote digests that are all digits): %w", err)
				}
			case "warnOnly":
				err = strictjson.Unmarshal(val, &raw.WarnOnly)
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

// ErrUnenforcedRegister is wrapped by Validate's error when a set leaves a register the
// variant's images measure missing or warn-only, so that callers can tell this problem (an
// attacker could change that register freely) from a malformed set.
var ErrUnenforcedRegister = errors.New("image register not enforced")

// unenforced is an error that is ErrUnenforcedRegister, with its own message.
type unenforced struct{ error }

func (e unenforced) Is(target error) bool { return target == ErrUnenforcedRegister }
func (e unenforced) Unwrap() error        { return e.error }

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

// Validate checks m against the register map of a variant. A set admits exactly the images
// whose every measurement it pins, so it must:
//   - enforce (not warn-only) every register the variant's images measure
//     (variant.ImageRegisters): a register left out or warn-only is one an attacker can
//     change freely, whatever it measures (firmware, kernel, bootstrapper, configuration);
//   - not name the cluster-ID register (variant.ClusterIDRegister): it is set at init/join,
//     so a set pinning it admits one cluster's nodes only, or, pinned to zero, only nodes
//     that are not initialized; the cluster ID is checked separately;
//   - name no other register: the images do not measure it (PCRs 16..23 of a TPM can even be
//     reset by software), so a value for it proves nothing;
//   - give digests of the variant's register length.
//
// Every problem is reported, each naming the registers concerned.
func (m M) Validate(v variant.Variant) error {
	if len(m) == 0 {
		return errors.New("no measurements")
	}
	image := v.ImageRegisters()
	if len(image) == 0 {
		return fmt.Errorf("reference values for %s cannot be checked: the registers its images measure are not known (variant not implemented)", v)
	}
	clusterID, hasClusterID := v.ClusterIDRegister()
	var errs []error
	var unmeasured []uint32
	for _, i := range m.Indices() {
		switch {
		case i >= v.RegisterCount():
			errs = append(errs, fmt.Errorf("%s: index out of range for %s (valid: 0..%d)", v.RegisterName(i), v, v.RegisterCount()-1))
			continue
		case hasClusterID && i == clusterID:
			errs = append(errs, fmt.Errorf("%s must not be in a reference set: it carries the cluster-ID marker, set at init/join and checked against the cluster ID (a set pinning it admits one cluster's nodes, or with zero only uninitialized nodes); remove it", v.RegisterName(i)))
		case !slices.Contains(image, i):
			unmeasured = append(unmeasured, i)
		}
		if got := len(m[i].Expected); got != v.RegisterLen() {
			errs = append(errs, fmt.Errorf("%s: expected digest has %d bytes, %s registers have %d", v.RegisterName(i), got, v, v.RegisterLen()))
		}
	}
	var missing, warnOnly []uint32
	for _, i := range image {
		switch meas, ok := m[i]; {
		case !ok:
			missing = append(missing, i)
		case meas.WarnOnly:
			warnOnly = append(warnOnly, i)
		}
	}
	measured := fmt.Sprintf("%s images measure %s", v, registerRanges(v, image))
	if len(missing) > 0 {
		errs = append(errs, unenforced{fmt.Errorf("missing %s: %s, and a set must enforce every one of them", registerList(v, missing), measured)})
	}
	if len(warnOnly) > 0 {
		errs = append(errs, unenforced{fmt.Errorf("%s warn-only: %s, and a set must enforce every one of them (a warn-only register admits any value)", registerList(v, warnOnly), measured)})
	}
	if len(unmeasured) > 0 {
		errs = append(errs, fmt.Errorf("%s not measured by the image: %s and nothing else, and a value for a register the image does not measure proves nothing; remove it", registerList(v, unmeasured), measured))
	}
	return errors.Join(errs...)
}

// registerRanges names ascending registers compactly: "PCR 0..14", "PCR 0..3, PCR 7".
func registerRanges(v variant.Variant, idx []uint32) string {
	var parts []string
	for start := 0; start < len(idx); {
		end := start
		for end+1 < len(idx) && idx[end+1] == idx[end]+1 {
			end++
		}
		if end == start {
			parts = append(parts, v.RegisterName(idx[start]))
		} else {
			parts = append(parts, fmt.Sprintf("%s..%d", v.RegisterName(idx[start]), idx[end]))
		}
		start = end + 1
	}
	return strings.Join(parts, ", ")
}

// registerList names registers for a message: "PCR 1, PCR 2, PCR 3".
func registerList(v variant.Variant, idx []uint32) string {
	names := make([]string, len(idx))
	for n, i := range idx {
		names[n] = v.RegisterName(i)
	}
	return strings.Join(names, ", ")
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

// UnmarshalJSON decodes registers, rejecting duplicates and non-numeric indices. It walks the
// tokens itself (encoding/json's tokenizer: the indices "4" and "04" name one register, which
// a duplicate check of names alone would not see); each measurement decodes strictly.
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
