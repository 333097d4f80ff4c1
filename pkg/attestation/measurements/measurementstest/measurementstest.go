// Package measurementstest builds reference sets for tests that satisfy the rule every
// production path applies (measurements.M.Validate): every register the variant's images
// measure is enforced, and nothing else is named.
package measurementstest

import (
	"bytes"
	"fmt"
	"slices"

	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
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

// Loose is a reference set that admits more than the image, and the text the refusal must
// contain (naming the register).
type Loose struct {
	M    measurements.M
	Want string
}

// LooseSets returns the ways a reference set can admit more than image (a full qemu-vtpm set,
// as Image or FromRegisters make it): what an operator might write by mistake, or an attacker
// who can edit the configuration or send the init request would write to admit nodes that
// run something else. Every production path must refuse each of them.
func LooseSets(image measurements.M) map[string]Loose {
	with := func(i uint32, meas measurements.Measurement) measurements.M {
		m := measurements.M{}
		for k, v := range image {
			m[k] = v
		}
		m[i] = meas
		return m
	}
	digest := func(b byte) []byte { return bytes.Repeat([]byte{b}, 32) }
	return map[string]Loose{
		"only PCR 0 enforced":                   {measurements.M{0: image[0]}, "missing PCR 1, PCR 2"},
		"only software-resettable PCRs 16, 23":  {measurements.M{16: {Expected: digest(0)}, 23: {Expected: digest(0)}}, "PCR 16, PCR 23 not measured by the image"},
		"full set plus PCR 16":                  {with(16, measurements.Measurement{Expected: digest(0)}), "PCR 16 not measured by the image"},
		"bootstrapper PCR 11 warn-only":         {with(11, measurements.Measurement{Expected: digest(0xab), WarnOnly: true}), "PCR 11 warn-only"},
		"PCR 15 pinned to a cluster":            {with(15, measurements.Measurement{Expected: digest(7)}), "PCR 15 must not be in a reference set"},
		"PCR 15 pinned to zero (uninitialized)": {with(15, measurements.Measurement{Expected: digest(0)}), "PCR 15 must not be in a reference set"},
	}
}
