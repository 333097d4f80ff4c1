package measurements

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

func digest(b byte) []byte { return bytes.Repeat([]byte{b}, 32) }

// image returns a valid qemu-vtpm set: PCRs 0..14 enforced, zero unless given in values.
func image(values map[uint32][]byte) M {
	m := M{}
	for i := range uint32(15) {
		val, ok := values[i]
		if !ok {
			val = digest(0)
		}
		m[i] = Measurement{Expected: val}
	}
	return m
}

// with returns a copy of m with register i set to meas.
func with(m M, i uint32, meas Measurement) M {
	out := M{}
	for k, v := range m {
		out[k] = v
	}
	out[i] = meas
	return out
}

// without returns a copy of m without the registers idx.
func without(m M, idx ...uint32) M {
	out := M{}
	for k, v := range m {
		out[k] = v
	}
	for _, i := range idx {
		delete(out, i)
	}
	return out
}

func hexOf(b byte) string {
	return strings.Repeat(string("0123456789abcdef"[b>>4])+string("0123456789abcdef"[b&0xf]), 32)
}

func TestDecode(t *testing.T) {
	testCases := map[string]struct {
		json    string
		want    M
		wantErr string
	}{
		"object form": {
			json: `{"4": {"expected": "` + hexOf(1) + `", "warnOnly": true}}`,
			want: M{4: {Expected: digest(1), WarnOnly: true}},
		},
		"bare hex string is enforced": {
			json: `{"9": "` + hexOf(2) + `"}`,
			want: M{9: {Expected: digest(2)}},
		},
		"unknown field": {
			json:    `{"4": {"expected": "` + hexOf(1) + `", "warnonly": true}}`,
			wantErr: `unknown field "warnonly"`,
		},
		"duplicate register": {
			json:    `{"4": "` + hexOf(1) + `", "4": "` + hexOf(2) + `"}`,
			wantErr: "register 4 given twice",
		},
		"non-numeric index": {
			json:    `{"pcr4": "` + hexOf(1) + `"}`,
			wantErr: `register index "pcr4" is not a decimal number`,
		},
		"leading zero index": {
			json:    `{"04": "` + hexOf(1) + `"}`,
			wantErr: `register index "04"`,
		},
		"negative index": {
			json:    `{"-1": "` + hexOf(1) + `"}`,
			wantErr: `register index "-1"`,
		},
		"not hex": {
			json:    `{"4": "zz"}`,
			wantErr: "is not hex",
		},
		"empty digest": {
			json:    `{"4": {"warnOnly": true}}`,
			wantErr: "expected digest is empty",
		},
		"digest read as a number (unquoted in YAML)": {
			json:    `{"4": 1.1111111111111112e+63}`,
			wantErr: "quote digests that are all digits",
		},
		"expected read as a number": {
			json:    `{"4": {"expected": 1234}}`,
			wantErr: "quote digests that are all digits",
		},
		"not an object": {
			json:    `["4"]`,
			wantErr: "want an object",
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			var m M
			err := json.Unmarshal([]byte(tc.json), &m)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, m)
		})
	}
}

func TestEncodeSortedNumerically(t *testing.T) {
	m := M{10: {Expected: digest(1)}, 2: {Expected: digest(2), WarnOnly: true}, 1: {Expected: digest(3)}}

	js, err := json.Marshal(m)
	require.NoError(t, err)
	assert.Less(t, bytes.Index(js, []byte(`"1"`)), bytes.Index(js, []byte(`"2"`)))
	assert.Less(t, bytes.Index(js, []byte(`"2"`)), bytes.Index(js, []byte(`"10"`)))

	y, err := yaml.Marshal(m)
	require.NoError(t, err)
	lines := strings.Split(string(y), "\n")
	var keys []string
	for _, l := range lines {
		if l != "" && !strings.HasPrefix(l, " ") {
			keys = append(keys, l)
		}
	}
	assert.Equal(t, []string{`"1":`, `"2":`, `"10":`}, keys)

	for name, data := range map[string][]byte{"json": js, "yaml": y} {
		var back M
		require.NoError(t, yaml.UnmarshalStrict(data, &back), name)
		assert.Equal(t, m, back, name)
	}
}

func TestValidate(t *testing.T) {
	v := variant.QEMUVTPM
	full := image(map[uint32][]byte{11: digest(1), 12: digest(2)})
	testCases := map[string]struct {
		m       M
		wantErr []string
	}{
		"valid":            {m: full},
		"empty":            {m: M{}, wantErr: []string{"no measurements"}},
		"index too large":  {m: with(full, 24, Measurement{Expected: digest(1)}), wantErr: []string{"PCR 24: index out of range"}},
		"short digest":     {m: with(full, 4, Measurement{Expected: []byte{1, 2}}), wantErr: []string{"PCR 4: expected digest has 2 bytes, qemu-vtpm registers have 32"}},
		"reports all errs": {m: with(with(full, 4, Measurement{Expected: []byte{1}}), 30, Measurement{Expected: digest(1)}), wantErr: []string{"PCR 4:", "PCR 30:"}},
		// Attacks: sets an operator (or an attacker who can edit the config or the
		// ConfigMap) might write that admit more than the image.
		"only PCR 0 enforced": {
			m:       M{0: {Expected: digest(0)}},
			wantErr: []string{"missing PCR 1, PCR 2, PCR 3, PCR 4, PCR 5, PCR 6, PCR 7, PCR 8, PCR 9, PCR 10, PCR 11, PCR 12, PCR 13, PCR 14: qemu-vtpm images measure PCR 0..14"},
		},
		"only software-resettable registers": {
			m:       M{16: {Expected: digest(0)}, 23: {Expected: digest(0)}},
			wantErr: []string{"missing PCR 0, PCR 1", "PCR 16, PCR 23 not measured by the image"},
		},
		"a resettable register next to a full set": {
			m:       with(full, 16, Measurement{Expected: digest(0)}),
			wantErr: []string{"PCR 16 not measured by the image"},
		},
		"bootstrapper warn-only": {
			m:       with(full, 11, Measurement{Expected: digest(1), WarnOnly: true}),
			wantErr: []string{"PCR 11 warn-only: qemu-vtpm images measure PCR 0..14, and a set must enforce every one of them"},
		},
		"everything warn-only": {
			m:       M{0: {Expected: digest(0), WarnOnly: true}},
			wantErr: []string{"PCR 0 warn-only", "missing PCR 1"},
		},
		"bootstrapper missing": {
			m:       without(full, 11),
			wantErr: []string{"missing PCR 11:"},
		},
		"cluster ID pinned": {
			m:       with(full, 15, Measurement{Expected: digest(7)}),
			wantErr: []string{"PCR 15 must not be in a reference set: it carries the cluster-ID marker"},
		},
		"cluster ID pinned to zero (uninitialized)": {
			m:       with(full, 15, Measurement{Expected: digest(0)}),
			wantErr: []string{"PCR 15 must not be in a reference set"},
		},
		"cluster ID warn-only": {
			m:       with(full, 15, Measurement{Expected: digest(0), WarnOnly: true}),
			wantErr: []string{"PCR 15 must not be in a reference set"},
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			err := tc.m.Validate(v)
			if len(tc.wantErr) == 0 {
				require.NoError(t, err)
				return
			}
			for _, want := range tc.wantErr {
				assert.ErrorContains(t, err, want)
			}
			// Only a missing or warn-only image register is reported as unenforced.
			unenforced := false
			for _, want := range tc.wantErr {
				unenforced = unenforced || strings.HasPrefix(want, "missing") || strings.Contains(want, "warn-only")
			}
			assert.Equal(t, unenforced, errors.Is(err, ErrUnenforcedRegister))
		})
	}
}

// Every variant has a register map (each is implemented); a variant without one (the zero
// variant) has no set that can be checked: fail closed.
func TestValidateUnknownRegisterMap(t *testing.T) {
	for _, v := range variant.All() {
		assert.NotEmpty(t, v.ImageRegisters(), v.String())
	}
	err := M{0: {Expected: make([]byte, 32)}}.Validate(variant.Variant{})
	require.ErrorContains(t, err, "cannot be checked")
}

func TestReferenceSetsMatch(t *testing.T) {
	v := variant.QEMUVTPM
	old := ReferenceSet{Name: "v1", Measurements: M{4: {Expected: digest(1)}, 9: {Expected: digest(2)}, 11: {Expected: digest(3)}}}
	upgrade := ReferenceSet{Name: "v2", Measurements: M{4: {Expected: digest(4)}, 9: {Expected: digest(5)}, 12: {Expected: digest(6), WarnOnly: true}}}
	// Match does not depend on Validate's register rule: these sets are small on purpose.
	sets := ReferenceSets{old, upgrade}

	testCases := map[string]struct {
		actual         map[uint32][]byte
		wantSet        string
		wantWarnings   int
		wantClosest    string
		wantMismatches []uint32
	}{
		"matches first set": {
			actual:  map[uint32][]byte{4: digest(1), 9: digest(2), 11: digest(3), 12: digest(0)},
			wantSet: "v1",
		},
		"matches second set with warning": {
			actual:       map[uint32][]byte{4: digest(4), 9: digest(5), 11: digest(3), 12: digest(0)},
			wantSet:      "v2",
			wantWarnings: 1,
		},
		"no match, closest is v2": {
			actual:         map[uint32][]byte{4: digest(4), 9: digest(9), 11: digest(9)},
			wantClosest:    "v2",
			wantMismatches: []uint32{9},
		},
		"no match, every register of closest named": {
			actual:         map[uint32][]byte{4: digest(9), 9: digest(9), 11: digest(3)},
			wantClosest:    "v1",
			wantMismatches: []uint32{4, 9},
		},
		"register missing from evidence": {
			actual:         map[uint32][]byte{4: digest(1), 9: digest(2)},
			wantClosest:    "v1",
			wantMismatches: []uint32{11},
		},
		"wrong length never matches": {
			actual:         map[uint32][]byte{4: digest(1)[:31], 9: digest(2), 11: digest(3)},
			wantClosest:    "v1",
			wantMismatches: []uint32{4},
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			res, err := sets.Match(v, tc.actual)
			if tc.wantSet != "" {
				require.NoError(t, err)
				assert.Equal(t, tc.wantSet, res.Set)
				assert.Len(t, res.Warnings, tc.wantWarnings)
				return
			}
			var mmErr *MismatchError
			require.True(t, errors.As(err, &mmErr), "want *MismatchError, got %v", err)
			assert.Equal(t, tc.wantClosest, mmErr.Closest)
			var got []uint32
			for _, m := range mmErr.Mismatches {
				got = append(got, m.Index)
				assert.Contains(t, err.Error(), v.RegisterName(m.Index)+": expected ")
			}
			assert.Equal(t, tc.wantMismatches, got)
			assert.Contains(t, err.Error(), "none of 2 reference set(s)")
		})
	}
}

func TestReferenceSetsValidate(t *testing.T) {
	good := image(nil)
	testCases := map[string]struct {
		sets    ReferenceSets
		wantErr string
	}{
		"ok":          {sets: ReferenceSets{{Name: "a", Measurements: good}, {Name: "b", Measurements: good}}},
		"none":        {sets: nil, wantErr: "no reference-value set"},
		"no name":     {sets: ReferenceSets{{Measurements: good}}, wantErr: "name is empty"},
		"duplicate":   {sets: ReferenceSets{{Name: "a", Measurements: good}, {Name: "a", Measurements: good}}, wantErr: `"a": name used twice`},
		"bad member":  {sets: ReferenceSets{{Name: "a", Measurements: with(good, 4, Measurement{Expected: []byte{1}})}}, wantErr: `reference set "a": PCR 4`},
		"partial set": {sets: ReferenceSets{{Name: "a", Measurements: good}, {Name: "pcr0-only", Measurements: M{0: {Expected: digest(0)}}}}, wantErr: `reference set "pcr0-only": missing PCR 1`},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			err := tc.sets.Validate(variant.QEMUVTPM)
			if tc.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.wantErr)
		})
	}
}

func FuzzDecodeReferenceSets(f *testing.F) {
	f.Add([]byte(`[{"name":"a","measurements":{"4":{"expected":"` + hexOf(1) + `","warnOnly":false},"9":"` + hexOf(2) + `"}}]`))
	f.Add([]byte("- name: a\n  measurements:\n    \"4\": " + hexOf(1) + "\n"))
	f.Add([]byte(`{"4": {"expected": ""}}`))
	// Full sets that pass validation (so the round trip runs), and the loose sets the
	// register rule refuses: warn-only PCR 11, PCR 15 pinned, PCR 16.
	full, err := json.Marshal(ReferenceSets{{Name: "full", Measurements: image(map[uint32][]byte{11: digest(1)})}})
	require.NoError(f, err)
	f.Add(full)
	for _, loose := range []M{
		with(image(nil), 11, Measurement{Expected: digest(1), WarnOnly: true}),
		with(image(nil), 15, Measurement{Expected: digest(0)}),
		with(image(nil), 16, Measurement{Expected: digest(0)}),
	} {
		data, err := json.Marshal(ReferenceSets{{Name: "loose", Measurements: loose}})
		require.NoError(f, err)
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var sets ReferenceSets
		if err := yaml.UnmarshalStrict(data, &sets); err != nil {
			return
		}
		if sets.Validate(variant.QEMUVTPM) != nil {
			return
		}
		// A valid decoded config must survive a round trip unchanged.
		out, err := yaml.Marshal(sets)
		require.NoError(t, err)
		var back ReferenceSets
		require.NoError(t, yaml.UnmarshalStrict(out, &back))
		require.Equal(t, sets, back)
	})
}

func TestActiveSwap(t *testing.T) {
	v := variant.QEMUVTPM
	v1 := ReferenceSet{Name: "v1", Measurements: image(map[uint32][]byte{4: digest(1)})}
	v2 := ReferenceSet{Name: "v2", Measurements: image(map[uint32][]byte{4: digest(2)})}
	_, err := NewActive(v, nil)
	require.ErrorContains(t, err, "no reference-value set configured")

	active, err := NewActive(v, ReferenceSets{v1})
	require.NoError(t, err)
	nodeV2 := registers(v2.Measurements)
	_, err = active.Load().Match(v, nodeV2)
	require.Error(t, err)

	// Upgrade: add v2 next to v1, then retire v1.
	require.NoError(t, active.Store(ReferenceSets{v1, v2}))
	res, err := active.Load().Match(v, nodeV2)
	require.NoError(t, err)
	assert.Equal(t, "v2", res.Set)
	require.NoError(t, active.Store(ReferenceSets{v2}))
	_, err = active.Load().Match(v, registers(v1.Measurements))
	require.Error(t, err, "a node of the retired set must not match")

	// An invalid update is refused and changes nothing.
	bad := ReferenceSet{Name: "bad", Measurements: M{99: {Expected: digest(3)}}}
	require.Error(t, active.Store(ReferenceSets{bad}))
	assert.Equal(t, ReferenceSets{v2}, active.Load())
	// So is a set that admits too much, even next to a good one: the good sets stay in force.
	for name, loose := range map[string]M{
		"only PCR 0":       {0: {Expected: digest(0)}},
		"PCR 11 warn-only": with(v2.Measurements, 11, Measurement{Expected: digest(0), WarnOnly: true}),
		"PCR 15 pinned":    with(v2.Measurements, 15, Measurement{Expected: digest(0)}),
	} {
		err := active.Store(ReferenceSets{v2, {Name: name, Measurements: loose}})
		require.Error(t, err, name)
		assert.ErrorContains(t, err, `reference set "`+name+`"`)
		assert.Equal(t, ReferenceSets{v2}, active.Load(), name)
		_, err = NewActive(v, ReferenceSets{{Name: name, Measurements: loose}})
		require.Error(t, err, name)
	}

	// The caller's slice is copied: changing it later does not change what is in force.
	sets := ReferenceSets{v1}
	require.NoError(t, active.Store(sets))
	sets[0] = v2
	assert.Equal(t, "v1", active.Load()[0].Name)
}

// registers returns the register values a node matching m exactly shows.
func registers(m M) map[uint32][]byte {
	out := map[uint32][]byte{}
	for i, meas := range m {
		out[i] = meas.Expected
	}
	return out
}
