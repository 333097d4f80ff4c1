package choose

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// The catalog lists each implemented variant once, and every registered variant is
// implemented.
func TestBuiltInsListEveryVariantOnce(t *testing.T) {
	seen := map[variant.Variant]bool{}
	for _, e := range BuiltIns() {
		assert.False(t, seen[e.Variant], "%s listed twice", e.Variant)
		seen[e.Variant] = true
		assert.NotNil(t, e.NewValidator, e.Variant.String())
		assert.NotNil(t, e.NewIssuer, e.Variant.String())
		got, err := Lookup(e.Variant)
		require.NoError(t, err)
		assert.Equal(t, e.Variant, got.Variant)
	}
	for _, v := range variant.All() {
		assert.True(t, seen[v], "%s has no entry", v)
	}
}

// The canonical encoding of a reference decodes to the same reference, for every variant.
func TestReferenceEncodingRoundTrips(t *testing.T) {
	for v, ref := range references() {
		t.Run(v.String(), func(t *testing.T) {
			data, err := ref.Encode()
			require.NoError(t, err)
			got, err := DecodeReference(data)
			require.NoError(t, err)
			assert.Equal(t, ref, got)
			require.NoError(t, got.Validate())
		})
	}
}

func TestDecodeReferenceRefuses(t *testing.T) {
	for name, tc := range map[string]struct {
		data string
		want string
	}{
		"not JSON":        {`variant`, "decoding the attestation reference: invalid character"},
		"unknown field":   {`{"variant":"qemu-vtpm","hardware":{}}`, `unknown field "hardware"`},
		"unknown variant": {`{"variant":"tpm-9000"}`, `unknown attestation variant "tpm-9000"`},
		"trailing data":   {`{"variant":"qemu-vtpm"} {}`, "data after the JSON value"},
		"stray brace":     {`{"variant":"qemu-vtpm"}}`, "data after the JSON value"},
		"stray bracket":   {`{"variant":"qemu-vtpm"}]`, "data after the JSON value"},
		"oversized":       {`"` + string(make([]byte, MaxEncodedReferenceSize)) + `"`, "limit"},
		// One reading only: encoding/json alone keeps the last of two fields and matches names
		// ignoring case, so each of these read one way here and another way elsewhere.
		"variant twice":             {`{"variant":"aws-nitro-tpm","variant":"qemu-vtpm"}`, `duplicate member name "variant"`},
		"Variant beside variant":    {`{"variant":"qemu-vtpm","Variant":"aws-nitro-tpm"}`, `field "Variant": differs from a known field only in letter case`},
		"opt-in in another case":    {`{"variant":"qemu-vtpm","AcceptUnauthenticatedAK":true}`, "letter case"},
		"expected digest twice":     {`{"variant":"qemu-vtpm","measurements":[{"name":"a","measurements":{"4":{"expected":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa","expected":"bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"}}}]}`, `duplicate member name "expected"`},
		"set name in another case":  {`{"variant":"qemu-vtpm","measurements":[{"name":"a","Name":"b","measurements":{}}]}`, "letter case"},
		"TDX field in another case": {`{"variant":"qemu-tdx","tdx":{"name":"x","MrSeam":[]}}`, "letter case"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := DecodeReference([]byte(tc.data))
			assert.ErrorContains(t, err, tc.want)
		})
	}
}

// A cluster's reference follows the variant's AK policy beyond Validate: a variant whose
// keys only configured roots vouch for must have them, without the opt-in.
func TestValidateForCluster(t *testing.T) {
	refs := references()
	optIn := refs[variant.QEMUVTPM]
	optIn.AKRoots, optIn.AcceptUnauthenticatedAK = "", true
	noRoots := refs[variant.QEMUVTPM]
	noRoots.AKRoots = ""
	for name, tc := range map[string]struct {
		ref  Reference
		want string
	}{
		"qemu-vtpm with roots":          {ref: refs[variant.QEMUVTPM]},
		"aws-nitro-tpm with its opt-in": {ref: refs[variant.AWSNitroTPM]},
		"gcp-sev-snp with pinned roots": {ref: refs[variant.GCPSEVSNP]},
		"qemu-vtpm without roots":       {ref: noRoots, want: "akRoots: no certificate"},
		"qemu-vtpm with the opt-in":     {ref: optIn, want: "acceptUnauthenticatedAK: a qemu-vtpm cluster trusts its nodes' attestation keys through the platform's AK roots only"},
	} {
		t.Run(name, func(t *testing.T) {
			err := tc.ref.ValidateForCluster()
			if tc.want == "" {
				assert.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tc.want)
		})
	}
	// Outside a cluster the opt-in replaces the roots.
	assert.NoError(t, optIn.Validate())
	// NewValidator applies the same rules when asked to build a cluster's validator.
	_, err := NewValidator(optIn, Options{})
	assert.NoError(t, err)
	_, err = NewValidator(optIn, Options{Cluster: true})
	assert.ErrorContains(t, err, "akRoots: no certificate", "the opt-in does not replace the roots of a cluster")
	_, err = NewValidator(noRoots, Options{Cluster: true})
	assert.ErrorContains(t, err, "akRoots: no certificate")
}
