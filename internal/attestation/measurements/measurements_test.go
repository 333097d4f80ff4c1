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

	"github.com/openconstellation/constellation/internal/attestation/variant"
)

func digest(b byte) []byte { return bytes.Repeat([]byte{b}, 32) }

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
	testCases := map[string]struct {
		m       M
		wantErr []string
	}{
		"valid":            {m: M{4: {Expected: digest(1)}, 15: {Expected: digest(0), WarnOnly: true}}},
		"empty":            {m: M{}, wantErr: []string{"no measurements"}},
		"index too large":  {m: M{24: {Expected: digest(1)}}, wantErr: []string{"PCR 24: index out of range"}},
		"short digest":     {m: M{4: {Expected: []byte{1, 2}}}, wantErr: []string{"PCR 4: expected digest has 2 bytes, qemu-vtpm registers have 32"}},
		"only warn-only":   {m: M{4: {Expected: digest(1), WarnOnly: true}}, wantErr: []string{"no enforced register"}},
		"reports all errs": {m: M{4: {Expected: []byte{1}}, 30: {Expected: digest(1)}}, wantErr: []string{"PCR 4:", "PCR 30:"}},
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
		})
	}
}

func TestReferenceSetsMatch(t *testing.T) {
	v := variant.QEMUVTPM
	old := ReferenceSet{Name: "v1", Measurements: M{4: {Expected: digest(1)}, 9: {Expected: digest(2)}, 11: {Expected: digest(3)}}}
	upgrade := ReferenceSet{Name: "v2", Measurements: M{4: {Expected: digest(4)}, 9: {Expected: digest(5)}, 12: {Expected: digest(6), WarnOnly: true}}}
	sets := ReferenceSets{old, upgrade}
	require.NoError(t, sets.Validate(v))

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
	good := M{4: {Expected: digest(1)}}
	testCases := map[string]struct {
		sets    ReferenceSets
		wantErr string
	}{
		"ok":         {sets: ReferenceSets{{Name: "a", Measurements: good}, {Name: "b", Measurements: good}}},
		"none":       {sets: nil, wantErr: "no reference-value set"},
		"no name":    {sets: ReferenceSets{{Measurements: good}}, wantErr: "name is empty"},
		"duplicate":  {sets: ReferenceSets{{Name: "a", Measurements: good}, {Name: "a", Measurements: good}}, wantErr: `"a": name used twice`},
		"bad member": {sets: ReferenceSets{{Name: "a", Measurements: M{4: {Expected: []byte{1}}}}}, wantErr: `reference set "a": PCR 4`},
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
	v1 := ReferenceSet{Name: "v1", Measurements: M{4: {Expected: digest(1)}}}
	v2 := ReferenceSet{Name: "v2", Measurements: M{4: {Expected: digest(2)}}}
	_, err := NewActive(v, nil)
	require.ErrorContains(t, err, "no reference-value set configured")

	active, err := NewActive(v, ReferenceSets{v1})
	require.NoError(t, err)
	nodeV2 := map[uint32][]byte{4: digest(2)}
	_, err = active.Load().Match(v, nodeV2)
	require.Error(t, err)

	// Upgrade: add v2 next to v1, then retire v1.
	require.NoError(t, active.Store(ReferenceSets{v1, v2}))
	res, err := active.Load().Match(v, nodeV2)
	require.NoError(t, err)
	assert.Equal(t, "v2", res.Set)
	require.NoError(t, active.Store(ReferenceSets{v2}))
	_, err = active.Load().Match(v, map[uint32][]byte{4: digest(1)})
	require.Error(t, err, "a node of the retired set must not match")

	// An invalid update is refused and changes nothing.
	bad := ReferenceSet{Name: "bad", Measurements: M{99: {Expected: digest(3)}}}
	require.Error(t, active.Store(ReferenceSets{bad}))
	assert.Equal(t, ReferenceSets{v2}, active.Load())

	// The caller's slice is copied: changing it later does not change what is in force.
	sets := ReferenceSets{v1}
	require.NoError(t, active.Store(sets))
	sets[0] = v2
	assert.Equal(t, "v1", active.Load()[0].Name)
}
