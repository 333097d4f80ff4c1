package measurements

import (
	"bytes"
	"crypto/subtle"
	"errors"
	"fmt"
	"strings"

	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// ReferenceSet is one named set of reference values, for example the measurements of one
// image version.
type ReferenceSet struct {
	Name         string `json:"name"`
	Measurements M      `json:"measurements"`
}

// ReferenceSets are the sets active at once; evidence must match one of them.
type ReferenceSets []ReferenceSet

// Validate checks every set against the variant's register layout, and that names are
// present and unique.
func (s ReferenceSets) Validate(v variant.Variant) error {
	if len(s) == 0 {
		return errors.New("no reference-value set configured")
	}
	var errs []error
	seen := map[string]bool{}
	for i, set := range s {
		switch {
		case set.Name == "":
			errs = append(errs, fmt.Errorf("reference set #%d: name is empty", i))
		case seen[set.Name]:
			errs = append(errs, fmt.Errorf("reference set %q: name used twice", set.Name))
		}
		seen[set.Name] = true
		if err := set.Measurements.Validate(v); err != nil {
			// Every problem on its own line, each naming the set.
			problems := []error{err}
			if multi, ok := err.(interface{ Unwrap() []error }); ok {
				problems = multi.Unwrap()
			}
			for _, p := range problems {
				errs = append(errs, fmt.Errorf("reference set %q: %w", set.Name, p))
			}
		}
	}
	return errors.Join(errs...)
}

// Mismatch is one register whose value differs from a reference set.
type Mismatch struct {
	Index    uint32
	Expected []byte
	// Actual is nil when the evidence did not cover the register.
	Actual   []byte
	WarnOnly bool
}

// Result is the outcome of a successful match.
type Result struct {
	// Set is the name of the matching set (the first, in configuration order).
	Set string
	// Warnings lists the warn-only registers of Set that did not match.
	Warnings []Mismatch
}

// MismatchError reports that no set matched. It names every mismatching register of the
// closest set (the one with the fewest enforced mismatches), expected against actual.
type MismatchError struct {
	Variant variant.Variant
	// Closest is the name of the set that came closest.
	Closest string
	// Mismatches are the enforced mismatches of Closest, in register order.
	Mismatches []Mismatch
	// Sets is the number of sets that were tried.
	Sets int
}

func (e *MismatchError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "measurements match none of %d reference set(s); closest is %q with %d mismatching register(s): ", e.Sets, e.Closest, len(e.Mismatches))
	for n, m := range e.Mismatches {
		if n > 0 {
			b.WriteString("; ")
		}
		actual := "not covered by the evidence"
		if m.Actual != nil {
			actual = fmt.Sprintf("%x", m.Actual)
		}
		fmt.Fprintf(&b, "%s: expected %x, got %s", e.Variant.RegisterName(m.Index), m.Expected, actual)
	}
	return b.String()
}

// Match compares actual register values with every set. It returns the first set whose
// enforced registers all match, or a *MismatchError describing the closest set.
func (s ReferenceSets) Match(v variant.Variant, actual map[uint32][]byte) (Result, error) {
	if len(s) == 0 {
		return Result{}, errors.New("no reference-value set configured")
	}
	closest := -1
	var closestMismatches []Mismatch
	for i, set := range s {
		enforced, warnings := compare(set.Measurements, actual)
		if len(enforced) == 0 {
			return Result{Set: set.Name, Warnings: warnings}, nil
		}
		if closest < 0 || len(enforced) < len(closestMismatches) {
			closest, closestMismatches = i, enforced
		}
	}
	return Result{}, &MismatchError{Variant: v, Closest: s[closest].Name, Mismatches: closestMismatches, Sets: len(s)}
}

// compare returns the enforced and the warn-only mismatches of actual against m, in register
// order. Comparison is constant-time per register: reference values are public, but there is
// no reason to leak how many leading bytes matched.
func compare(m M, actual map[uint32][]byte) (enforced, warnOnly []Mismatch) {
	for _, i := range m.Indices() {
		want := m[i]
		got, ok := actual[i]
		if ok && len(got) == len(want.Expected) && subtle.ConstantTimeCompare(got, want.Expected) == 1 {
			continue
		}
		mm := Mismatch{Index: i, Expected: want.Expected, WarnOnly: want.WarnOnly}
		if ok {
			mm.Actual = bytes.Clone(got)
		}
		if want.WarnOnly {
			warnOnly = append(warnOnly, mm)
		} else {
			enforced = append(enforced, mm)
		}
	}
	return enforced, warnOnly
}

// Describe renders a warn-only mismatch for a log line or a Verified warning.
func (m Mismatch) Describe(v variant.Variant) string {
	actual := "not covered by the evidence"
	if m.Actual != nil {
		actual = fmt.Sprintf("%x", m.Actual)
	}
	return fmt.Sprintf("%s: expected %x, got %s (warn-only)", v.RegisterName(m.Index), m.Expected, actual)
}
