package strictjson_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/pkg/strictjson"
)

// manifest is shaped like the documents this package guards: nested, embedded and listed
// structs, maps, raw values, and the types whose encoding/json form must not change.
type manifest struct {
	Version   string            `json:"version"`
	NodeImage image             `json:"nodeImage"`
	Images    []image           `json:"images,omitempty"`
	ByName    map[string]image  `json:"byName,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	Optional  *image            `json:"optional,omitempty"`
	Raw       json.RawMessage   `json:"raw,omitempty"`
	Any       any               `json:"any,omitempty"`
	Timeout   time.Duration     `json:"timeout,omitempty"`
	Blob      []byte            `json:"blob,omitempty"`
	Count     int               `json:"count,string,omitempty"`
	When      time.Time         `json:"when,omitzero"`
	Hex       hexBytes          `json:"hex,omitempty"`
	Key       string            `json:"key,omitempty"`
	Untagged  string
	Ignored   string `json:"-"`
	embedded
}

type image struct {
	Ref    string `json:"ref"`
	Digest string `json:"digest"`
}

type embedded struct {
	Extra string `json:"extra,omitempty"`
}

// hexBytes decodes itself: it sees its raw value.
type hexBytes []byte

func (h *hexBytes) UnmarshalJSON(b []byte) error {
	var s string
	if err := strictjson.Unmarshal(b, &s); err != nil {
		return err
	}
	*h = hexBytes(s)
	return nil
}

func TestUnmarshalRefuses(t *testing.T) {
	testCases := map[string]struct {
		in             string
		ignoreUnknown  bool // refused by UnmarshalIgnoreUnknown too (always by Unmarshal)
		want           error
		wantMsgContain string
	}{
		"version and Version": {
			in: `{"version":"v1.3.0","Version":"v9.9.9"}`, ignoreUnknown: true, want: strictjson.ErrCaseVariant,
			wantMsgContain: `field "Version": differs from a known field only in letter case`,
		},
		"Version alone": {in: `{"Version":"v9.9.9"}`, ignoreUnknown: true, want: strictjson.ErrCaseVariant},
		"VERSION":       {in: `{"VERSION":"v9.9.9"}`, ignoreUnknown: true, want: strictjson.ErrCaseVariant},
		// encoding/json folds Unicode too: the long s (U+017F) matches "s", the Kelvin sign "k".
		"long s":         {in: `{"verſion":"v9.9.9"}`, ignoreUnknown: true, want: strictjson.ErrCaseVariant},
		"kelvin sign":    {in: `{"\u212aey":"x"}`, ignoreUnknown: true, want: strictjson.ErrCaseVariant},
		"untagged lower": {in: `{"untagged":"x"}`, ignoreUnknown: true, want: strictjson.ErrCaseVariant},
		"nested case variant": {
			in: `{"nodeImage":{"digest":"sha256:aa","Digest":"sha256:bb"}}`, ignoreUnknown: true, want: strictjson.ErrCaseVariant,
			wantMsgContain: `field "Digest" in "/nodeImage"`,
		},
		"case variant in list":     {in: `{"images":[{"ref":"a"},{"REF":"b"}]}`, ignoreUnknown: true, want: strictjson.ErrCaseVariant},
		"case variant in map":      {in: `{"byName":{"a":{"Ref":"b"}}}`, ignoreUnknown: true, want: strictjson.ErrCaseVariant},
		"case variant via pointer": {in: `{"optional":{"Digest":"x"}}`, ignoreUnknown: true, want: strictjson.ErrCaseVariant},
		"embedded case variant":    {in: `{"Extra":"x"}`, ignoreUnknown: true, want: strictjson.ErrCaseVariant},
		"version twice": {
			in: `{"version":"v1.3.0","version":"v9.9.9"}`, ignoreUnknown: true, want: strictjson.ErrDuplicateName,
			wantMsgContain: `duplicate member name "version"`,
		},
		"nested twice":         {in: `{"nodeImage":{"digest":"a","digest":"b"}}`, ignoreUnknown: true, want: strictjson.ErrDuplicateName, wantMsgContain: `duplicate member name "digest" in "/nodeImage"`},
		"map key twice":        {in: `{"labels":{"a":"1","a":"2"}}`, ignoreUnknown: true, want: strictjson.ErrDuplicateName},
		"twice in raw":         {in: `{"raw":{"a":1,"a":2}}`, ignoreUnknown: true, want: strictjson.ErrDuplicateName},
		"twice in any":         {in: `{"any":{"a":1,"a":2}}`, ignoreUnknown: true, want: strictjson.ErrDuplicateName},
		"twice, unknown":       {in: `{"x":1,"x":2}`, ignoreUnknown: true, want: strictjson.ErrDuplicateName},
		"twice, escaped":       {in: `{"version":"a","vers\u0069on":"b"}`, ignoreUnknown: true, want: strictjson.ErrDuplicateName},
		"unknown field":        {in: `{"version":"v1","colour":"red"}`, want: strictjson.ErrUnknownField, wantMsgContain: `unknown field "colour"`},
		"nested unknown field": {in: `{"nodeImage":{"colour":"red"}}`, want: strictjson.ErrUnknownField, wantMsgContain: `unknown field "colour" in "/nodeImage"`},
		"ignored field named":  {in: `{"Ignored":"x"}`, want: strictjson.ErrUnknownField},
		"trailing garbage":     {in: `{"version":"v1"} x`, ignoreUnknown: true, want: strictjson.ErrTrailingData},
		"stray brace":          {in: `{"version":"v1"}}`, ignoreUnknown: true, want: strictjson.ErrTrailingData},
		"second value":         {in: `{"version":"v1"} {"version":"v9"}`, ignoreUnknown: true, want: strictjson.ErrTrailingData},
		"invalid UTF-8":        {in: "{\"version\":\"v1\xff\"}", ignoreUnknown: true, wantMsgContain: "invalid UTF-8"},
		"empty":                {in: ``, ignoreUnknown: true, wantMsgContain: "unexpected end of JSON input"},
		"not JSON":             {in: `version: v1`, ignoreUnknown: true, wantMsgContain: "invalid character 'v' at start of value"},
		"wrong type":           {in: `{"version":1}`, ignoreUnknown: true, wantMsgContain: "cannot unmarshal"},
		"custom decoder":       {in: `{"hex":1}`, ignoreUnknown: true, wantMsgContain: "cannot unmarshal"},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			decoders := map[string]func([]byte, any) error{"Unmarshal": strictjson.Unmarshal}
			if tc.ignoreUnknown {
				decoders["UnmarshalIgnoreUnknown"] = strictjson.UnmarshalIgnoreUnknown
			}
			for dname, decode := range decoders {
				m := manifest{Version: "unchanged"}
				err := decode([]byte(tc.in), &m)
				require.Error(t, err, dname)
				if tc.want != nil {
					assert.ErrorIs(t, err, tc.want, dname)
				}
				assert.Contains(t, err.Error(), tc.wantMsgContain, dname)
				if tc.want != nil {
					assert.Equal(t, manifest{Version: "unchanged"}, m, "%s: a refused document must not be decoded", dname)
				}
			}
			if errors.Is(tc.want, strictjson.ErrCaseVariant) || errors.Is(tc.want, strictjson.ErrDuplicateName) {
				// The attack is real: encoding/json reads the document without complaint.
				var m manifest
				assert.NoError(t, json.Unmarshal([]byte(tc.in), &m), "encoding/json")
			}
		})
	}
}

// TestSameAsEncodingJSON: what strictjson accepts decodes exactly as encoding/json decodes it.
func TestSameAsEncodingJSON(t *testing.T) {
	testCases := map[string]struct {
		in            string
		ignoreUnknown bool
	}{
		"full": {in: `{
			"version": "v1.3.0",
			"nodeImage": {"ref": "node.raw", "digest": "sha256:aa"},
			"images": [{"ref": "a", "digest": "b"}, {"ref": "c"}],
			"byName": {"x": {"ref": "y"}, "X": {"ref": "z"}},
			"labels": {"a": "1", "A": "2"},
			"optional": {"digest": "d"},
			"raw": {"b": [1, 2, {"c": null}], "B": true},
			"any": {"n": 1.5, "l": [true, null, "s"]},
			"timeout": 1500000000,
			"blob": "aGVsbG8=",
			"count": "42",
			"when": "2026-11-26T10:00:00+01:00",
			"hex": "ab",
			"Untagged": "u",
			"extra": "e"
		}`},
		"nulls":                {in: `{"version":null,"nodeImage":null,"images":null,"optional":null,"raw":null,"any":null,"count":"null"}`},
		"empty object":         {in: `{}`},
		"whitespace after":     {in: "{\"version\":\"v1\"} \n\t"},
		"unknown, ignored":     {in: `{"version":"v1","colour":"red","nested":{"Version":1}}`, ignoreUnknown: true},
		"escaped name":         {in: `{"vers\u0069on":"v1"}`},
		"unicode":              {in: `{"version":"v1 \u00e9 \ud83d\ude00 é"}`},
		"blob without padding": {in: `{"blob":"aGVsbG8"}`},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			decode := strictjson.Unmarshal
			if tc.ignoreUnknown {
				decode = strictjson.UnmarshalIgnoreUnknown
			}
			// Decoding merges into what is there, as encoding/json does.
			got := manifest{Version: "before", Labels: map[string]string{"kept": "yes"}}
			want := manifest{Version: "before", Labels: map[string]string{"kept": "yes"}}
			wantErr := json.Unmarshal([]byte(tc.in), &want)
			gotErr := decode([]byte(tc.in), &got)
			if wantErr != nil {
				assert.Error(t, gotErr)
				return
			}
			require.NoError(t, gotErr)
			assert.Equal(t, want, got)
		})
	}
}

func TestNotAPointer(t *testing.T) {
	var m manifest
	assert.Error(t, strictjson.Unmarshal([]byte(`{}`), m))
	assert.Error(t, strictjson.Unmarshal([]byte(`{}`), nil))
	assert.Error(t, strictjson.Unmarshal([]byte(`{}`), (*manifest)(nil)))
}

// TestErrorsName: each refusal says what it refuses.
func TestErrorsName(t *testing.T) {
	var m manifest
	err := strictjson.Unmarshal([]byte(`{"version":"v1.3.0","Version":"v9.9.9"}`), &m)
	require.Error(t, err)
	assert.True(t, errors.Is(err, strictjson.ErrCaseVariant))
	assert.True(t, strings.Contains(err.Error(), "letter case"), err.Error())
}
