// Package measurementstest builds reference sets for tests that satisfy the rule every
// production path applies (measurements.M.Validate): every register the variant's images
// measure is enforced, and nothing else is named.
package measurementstest

import (
	"fmt"
	"slices"

	"github.com/openconstellation/constellation/internal/attestation/measurements"
	"github.com/openconstellation/constellation/internal/attestation/variant"
)

// Image returns an enforced reference set over every register v's images measure: the value
// in values where given, else the zero digest (what a register nothing was measured into
// holds). It panics on a value for a register the images do not measure: a test mistake.
func Image(v variant.Variant, values map[uint32][]byte) measurements.M {
	image := v.ImageRegisters()
	for i := range values {
		if !slices.Contains(image, i) {
			panic(fmt.Sprintf("measurementstest.Image: %s is not measured by %s images", v.RegisterName(i), v))
		}
	}
	m := measurements.M{}
	for _, i := range image {
		val, ok := values[i]
		if !ok {
			val = make([]byte, v.RegisterLen())
		}
		m[i] = measurements.Measurement{Expected: val}
	}
	return m
}

// FromRegisters returns an enforced reference set over every register v's images measure,
// with the values of actual (for example read from a TPM); registers of actual the images
// do not measure (the cluster-ID marker, PCRs 16..23) are left out. It panics if actual
// lacks an image register: a test mistake.
func FromRegisters(v variant.Variant, actual map[uint32][]byte) measurements.M {
	m := measurements.M{}
	for _, i := range v.ImageRegisters() {
		val, ok := actual[i]
		if !ok {
			panic(fmt.Sprintf("measurementstest.FromRegisters: no value for %s", v.RegisterName(i)))
		}
		m[i] = measurements.Measurement{Expected: val}
	}
	return m
}
