package tdx

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestReferenceJSON(t *testing.T) {
	ref := cannedReference(t)
	b, err := json.Marshal(ref)
	require.NoError(t, err)
	assert.JSONEq(t, `{"name":"spr-e4","mrSeam":["`+cannedMrSeam+`"],"tdAttributes":"`+cannedTdAttributes+`","xfam":"`+cannedXfam+`","minimumTeeTcbSvn":"`+cannedTeeTcbSvn+`"}`, string(b))

	var back Reference
	require.NoError(t, json.Unmarshal(b, &back))
	assert.Equal(t, ref, back)
	require.NoError(t, back.Validate())

	err = json.Unmarshal([]byte(`{"name":"x","mrSeams":[]}`), &back)
	assert.ErrorContains(t, err, "unknown field")
	err = json.Unmarshal([]byte(`{"name":"x","xfam":"zz"}`), &back)
	assert.ErrorContains(t, err, "not hex")
}

func TestReferenceValidate(t *testing.T) {
	tests := map[string]struct {
		edit func(*Reference)
		msg  string
	}{
		"valid":                   {edit: func(*Reference) {}},
		"no name":                 {edit: func(r *Reference) { r.Name = "" }, msg: "name"},
		"no MRSEAM":               {edit: func(r *Reference) { r.MrSeam = nil }, msg: "mrSeam"},
		"short MRSEAM":            {edit: func(r *Reference) { r.MrSeam = []HexBytes{{1}} }, msg: "mrSeam[0]"},
		"no TD attributes":        {edit: func(r *Reference) { r.TdAttributes = nil }, msg: "tdAttributes"},
		"debug":                   {edit: func(r *Reference) { r.TdAttributes = mustHex(t, "0100004000000000") }, msg: "DEBUG"},
		"no XFAM":                 {edit: func(r *Reference) { r.Xfam = nil }, msg: "xfam"},
		"no minimum TEE TCB SVN":  {edit: func(r *Reference) { r.MinimumTeeTcbSvn = nil }, msg: "minimumTeeTcbSvn"},
		"short QE vendor ID":      {edit: func(r *Reference) { r.QEVendorID = HexBytes{1} }, msg: "qeVendorId"},
		"default QE vendor is OK": {edit: func(r *Reference) { r.QEVendorID = nil }},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ref := cannedReference(t)
			tc.edit(&ref)
			err := ref.Validate()
			if tc.msg == "" {
				assert.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tc.msg)
		})
	}
	// An empty reference names every required field.
	err := Reference{}.Validate()
	for _, field := range []string{"name", "mrSeam", "tdAttributes", "xfam", "minimumTeeTcbSvn"} {
		assert.ErrorContains(t, err, field)
	}
}
