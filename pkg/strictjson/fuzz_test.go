package strictjson_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/pkg/strictjson"
)

// small is the fuzzed type: a top-level struct, a nested one, a list of structs, a map.
type small struct {
	Version string            `json:"version"`
	Name    string            // untagged: named "Name"
	Inner   smallInner        `json:"inner"`
	List    []smallInner      `json:"list"`
	Map     map[string]string `json:"map"`
}

type smallInner struct {
	A int  `json:"a"`
	B bool `json:"b"`
}

// fieldsAt are the struct fields of the objects of a small document, by the object's place
// (its path with list indexes written as []). Objects elsewhere (map, unknown members) are
// not structs: only duplicates matter there.
var fieldsAt = map[string][]string{
	"":        {"version", "Name", "inner", "list", "map"},
	"/inner":  {"a", "b"},
	"/list[]": {"a", "b"},
}

// FuzzUnmarshal: a document that decodes has exactly one spelling per field (no duplicate
// names in any object, no name that matches a field only ignoring case) and nothing after
// its value, and decodes to what encoding/json makes of it.
func FuzzUnmarshal(f *testing.F) {
	for _, seed := range []string{
		`{"version":"v1.3.0","Name":"n","inner":{"a":1,"b":true},"list":[{"a":2},{"b":false}],"map":{"k":"v","K":"w"}}`,
		`{"version":"v1.3.0","Version":"v9.9.9"}`,
		`{"version":"v1.3.0","version":"v9.9.9"}`,
		`{"Version":"v9.9.9"}`,
		`{"verſion":"v9.9.9"}`,
		`{"name":"n"}`,
		`{"inner":{"a":1,"A":2}}`,
		`{"list":[{"a":1},{"B":true}]}`,
		`{"map":{"k":"v","k":"w"}}`,
		`{"version":"v1"} {"version":"v2"}`,
		`{"version":"v1"}}`,
		`{"unknown":{"x":1,"X":2},"other":[1,{"a":1}]}`,
		`{"vers\u0069on":"v1","version":"v2"}`,
		`{"version":"\ud800"}`,
		"{\"version\":\"\xff\"}",
		`[]`, `null`, ``, `{`,
	} {
		f.Add([]byte(seed), false)
		f.Add([]byte(seed), true)
	}
	f.Fuzz(func(t *testing.T, data []byte, ignoreUnknown bool) {
		decode := strictjson.Unmarshal
		if ignoreUnknown {
			decode = strictjson.UnmarshalIgnoreUnknown
		}
		var got small
		if err := decode(data, &got); err != nil {
			return
		}
		require.NoError(t, checkSpellings(data, ignoreUnknown))
		var want small
		require.NoError(t, json.Unmarshal(data, &want), "encoding/json refuses what strictjson accepted")
		assert.Equal(t, want, got, "strictjson and encoding/json read the document differently")
	})
}

// checkSpellings re-reads data with encoding/json's plain tokenizer and checks each object's
// names: none twice, and in the objects that are structs, each exactly a field (ignoring
// unknown names if ignoreUnknown), never a field in other letter case.
func checkSpellings(data []byte, ignoreUnknown bool) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := walk(dec, "", ignoreUnknown); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("data after the value")
	}
	return nil
}

// walk reads one value at path (a place of fieldsAt, or "?" outside any struct).
func walk(dec *json.Decoder, path string, ignoreUnknown bool) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch tok {
	case json.Delim('{'):
		fields, isStruct := fieldsAt[path]
		seen := map[string]bool{}
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				return err
			}
			name := tok.(string)
			if seen[name] {
				return errors.New("duplicate name " + name + " at " + path)
			}
			seen[name] = true
			sub := "?"
			if isStruct {
				exact := false
				for _, field := range fields {
					switch {
					case name == field:
						exact = true
					case strings.EqualFold(name, field):
						return errors.New("name " + name + " at " + path + " is field " + field + " in other case")
					}
				}
				if !exact && !ignoreUnknown {
					return errors.New("unknown name " + name + " at " + path)
				}
				if exact {
					sub = path + "/" + name
				}
			}
			if err := walk(dec, sub, ignoreUnknown); err != nil {
				return err
			}
		}
		_, err := dec.Token()
		return err
	case json.Delim('['):
		for dec.More() {
			if err := walk(dec, path+"[]", ignoreUnknown); err != nil {
				return err
			}
		}
		_, err := dec.Token()
		return err
	}
	return nil
}
