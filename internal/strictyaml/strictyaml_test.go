package strictyaml

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/pkg/attestation/measurements"
)

type inner struct {
	Count int    `json:"count"`
	Label string `json:"label,omitempty"`
}

// closed is a map whose keys are a closed set (KeySet).
type closed map[string]*inner

func (closed) KnownKeys() []string { return []string{"alpha", "betaGamma"} }

// empty is a map that takes no key at all (KeySet).
type empty map[string]int

func (empty) KnownKeys() []string { return nil }

type doc struct {
	Name    string                     `json:"name"`
	Enabled bool                       `json:"enabled"`
	Small   uint8                      `json:"small"`
	Inner   *inner                     `json:"inner,omitempty"`
	List    []inner                    `json:"list,omitempty"`
	Labels  map[string]string          `json:"labels,omitempty"`
	Addr    netip.Addr                 `json:"addr,omitzero"`
	When    time.Time                  `json:"when,omitzero"`
	Sets    measurements.ReferenceSets `json:"sets,omitempty"`
	Closed  closed                     `json:"closed,omitempty"`
	Empty   empty                      `json:"empty,omitempty"`
	Skipped string                     `json:"-"`
}

func paths(err error) map[string]string {
	out := map[string]string{}
	for _, fe := range FieldErrors(err) {
		out[fe.Path] = fe.Err.Error()
	}
	return out
}

func TestUnmarshalProblems(t *testing.T) {
	digest := strings.Repeat("ab", 32)
	testCases := map[string]struct {
		yaml string
		// want maps each expected field path to a part of its message; every problem must
		// be reported, and nothing else.
		want map[string]string
		// wantErr is used for problems that are not about one field.
		wantErr string
	}{
		"unknown top-level field":         {yaml: "name: a\nnmae: b\n", want: map[string]string{"nmae": "unknown field (known: addr, closed, empty, enabled, inner, labels, list, name, sets, small, when)"}},
		"miscased field":                  {yaml: "Name: a\n", want: map[string]string{"Name": `did you mean "name"`}},
		"unknown nested field":            {yaml: "inner: {count: 1, extra: 2}\n", want: map[string]string{"inner.extra": "unknown field"}},
		"unknown field in list":           {yaml: "list:\n- count: 1\n- cuont: 2\n", want: map[string]string{"list[1].cuont": "unknown field"}},
		"json-ignored field":              {yaml: "Skipped: x\n", want: map[string]string{"Skipped": "unknown field"}},
		"string given a number":           {yaml: "name: 1.30\n", want: map[string]string{"name": "must be a string, got the number 1.3 (YAML reads unquoted digits"}},
		"string given a boolean":          {yaml: "name: yes\n", want: map[string]string{"name": "got the boolean true (YAML reads unquoted yes/no"}},
		"int given a string":              {yaml: "inner: {count: three}\n", want: map[string]string{"inner.count": `must be an integer, got the string "three"`}},
		"int given a fraction":            {yaml: "inner: {count: 1.5}\n", want: map[string]string{"inner.count": "must be an integer of 64 bits, got 1.5"}},
		"uint overflow":                   {yaml: "small: 256\n", want: map[string]string{"small": "non-negative integer of 8 bits"}},
		"uint negative":                   {yaml: "small: -1\n", want: map[string]string{"small": "non-negative integer"}},
		"bool given a string":             {yaml: "enabled: \"true\"\n", want: map[string]string{"enabled": "must be true or false"}},
		"struct given a list":             {yaml: "inner: [1]\n", want: map[string]string{"inner": "must be a mapping, got a list"}},
		"list given a mapping":            {yaml: "list: {count: 1}\n", want: map[string]string{"list": "must be a list, got a mapping"}},
		"map value of the wrong kind":     {yaml: "labels: {a: [1]}\n", want: map[string]string{"labels.a": "must be a string, got a list"}},
		"text unmarshaler refuses":        {yaml: "addr: 10.0.0.300\n", want: map[string]string{"addr": "ParseAddr"}},
		"text unmarshaler given a number": {yaml: "addr: 1234\n", want: map[string]string{"addr": "got the number 1234 (YAML reads unquoted digits"}},
		"json unmarshaler refuses":        {yaml: "when: yesterday\n", want: map[string]string{"when": "cannot parse"}},
		"several problems at once": {
			yaml: "name: [a]\nenabled: 1\ninner: {count: x}\nbogus: 1\n",
			want: map[string]string{"name": "must be a string", "enabled": "must be true or false", "inner.count": "must be an integer", "bogus": "unknown field"},
		},
		"measurement digest unquoted all digits": {
			yaml: "sets:\n- name: a\n  measurements:\n    11: " + strings.Repeat("1", 64) + "\n",
			want: map[string]string{"sets[0].measurements": "quote digests that are all digits"},
		},
		"measurement digest unquoted with an e": {
			yaml: "sets:\n- name: a\n  measurements:\n    11: {expected: " + strings.Repeat("0", 60) + "1e12}\n",
			want: map[string]string{"sets[0].measurements": "quote digests that are all digits"},
		},
		"measurements null": {
			yaml: "sets:\n- name: a\n  measurements: null\n",
			want: map[string]string{"sets[0].measurements": "want an object"},
		},
		"unknown field in reference set": {
			yaml: "sets:\n- name: a\n  measurements: {\"4\": \"" + digest + "\"}\n  extra: 1\n",
			want: map[string]string{"sets[0].extra": "unknown field (known: measurements, name)"},
		},
		"closed map, unknown key":   {yaml: "closed: {alpha: {count: 1}, delta: {}}\n", want: map[string]string{"closed.delta": "unknown field (known: alpha, betaGamma)"}},
		"closed map, miscased key":  {yaml: "closed: {betagamma: {}}\n", want: map[string]string{"closed.betagamma": `unknown field (did you mean "betaGamma"?)`}},
		"closed map, value checked": {yaml: "closed: {alpha: {count: x, extra: 1}}\n", want: map[string]string{"closed.alpha.count": "must be an integer", "closed.alpha.extra": "unknown field"}},
		"closed map without keys":   {yaml: "empty: {a: 1}\n", want: map[string]string{"empty.a": "unknown field (known: none)"}},
		"duplicate key":             {yaml: "name: a\nname: b\n", wantErr: `key "name" already set`},
		"syntax error":              {yaml: "name: [a\n", wantErr: "invalid YAML"},
		"empty document":            {yaml: "", wantErr: "the document is empty"},
		"only a comment":            {yaml: "# nothing\n", wantErr: "the document is empty"},
		"null document":             {yaml: "null\n", wantErr: "the document is empty"},
		"not a mapping":             {yaml: "- a\n", want: map[string]string{"": "must be a mapping, got a list"}},
		"scalar document":           {yaml: "hello\n", want: map[string]string{"": `must be a mapping, got the string "hello"`}},
		"two documents":             {yaml: "name: a\n---\nname: b\n", wantErr: "more than one YAML document"},
		"two documents, 2nd bad":    {yaml: "name: a\n---\n[\n", wantErr: "invalid YAML"},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			var d doc
			err := Unmarshal([]byte(tc.yaml), &d)
			require.Error(t, err)
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
				return
			}
			got := paths(err)
			require.Len(t, got, len(tc.want), "problems: %v", err)
			for path, msg := range tc.want {
				require.Contains(t, got, path, "problems: %v", err)
				assert.Contains(t, got[path], msg)
			}
		})
	}
}

func TestUnmarshalAccepts(t *testing.T) {
	digest := strings.Repeat("0", 64)
	var d doc
	err := Unmarshal([]byte(`
name: "1.30"
enabled: true
small: 255
inner: {count: -3, label: x}
list: [{count: 1}]
labels: {"yes": "no"}
closed: {betaGamma: {count: 2}}
addr: 10.0.0.1
when: 2025-01-02T03:04:05Z
sets:
- name: a
  measurements:
    4: "`+digest+`"
    11: {expected: "`+digest+`", warnOnly: true}
`), &d)
	require.NoError(t, err)
	assert.Equal(t, doc{
		Name: "1.30", Enabled: true, Small: 255, Inner: &inner{Count: -3, Label: "x"}, List: []inner{{Count: 1}},
		Labels: map[string]string{"yes": "no"}, Closed: closed{"betaGamma": {Count: 2}}, Addr: netip.MustParseAddr("10.0.0.1"),
		When: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC),
		Sets: measurements.ReferenceSets{{Name: "a", Measurements: measurements.M{
			4: {Expected: make([]byte, 32)}, 11: {Expected: make([]byte, 32), WarnOnly: true},
		}}},
	}, d)

	// null leaves a field unset, as encoding/json does.
	d = doc{}
	require.NoError(t, Unmarshal([]byte("name: a\ninner: null\nlist: ~\n"), &d))
	assert.Equal(t, doc{Name: "a"}, d)
}

func TestUnmarshalTarget(t *testing.T) {
	var s string
	require.ErrorContains(t, Unmarshal([]byte("a"), &s), "pointer to a struct")
	require.ErrorContains(t, Unmarshal([]byte("a: 1"), nil), "pointer to a struct")
}

func TestMarshalRoundTrip(t *testing.T) {
	// Strings chosen so that YAML would read them as something else unquoted.
	tricky := []string{"yes", "n", "Off", "1.30", "0777", "0b101", "12e45", "1_000", "~", "null", ".inf",
		"2001-12-14", "1:20", "- x", "a: b", "#c", " lead", "trail ", "multi\nline\n", "", "0x1f", strings.Repeat("1", 64)}
	for _, s := range tricky {
		t.Run(s, func(t *testing.T) {
			in := doc{Name: s, Labels: map[string]string{s: s}, List: []inner{{Label: s}}}
			out, err := Marshal(in)
			require.NoError(t, err)
			var back doc
			require.NoError(t, Unmarshal(out, &back), "%s", out)
			assert.Equal(t, in, back, "%s", out)
		})
	}
}

func TestMarshalOrder(t *testing.T) {
	d := doc{Name: "a", Inner: &inner{Count: 1}, Sets: measurements.ReferenceSets{{Name: "s", Measurements: measurements.M{
		2: {Expected: make([]byte, 32)}, 10: {Expected: make([]byte, 32)},
	}}}}
	out, err := Marshal(d)
	require.NoError(t, err)
	s := string(out)
	// Struct order, not alphabetical; registers in numeric order.
	assert.Less(t, strings.Index(s, "name:"), strings.Index(s, "enabled:"))
	assert.Less(t, strings.Index(s, "enabled:"), strings.Index(s, "inner:"))
	assert.Less(t, strings.Index(s, `"2":`), strings.Index(s, `"10":`))
	// All-digit hex digests are quoted.
	assert.Contains(t, s, `expected: "`+strings.Repeat("0", 64)+`"`)
}

func TestFieldErrors(t *testing.T) {
	a := &FieldError{Path: "a", Err: errors.New("x")}
	b := &FieldError{Path: "b", Err: errors.New("y")}
	err := errors.Join(a, errors.New("plain"), errors.Join(b))
	assert.Equal(t, []*FieldError{a, b}, FieldErrors(err))
	assert.Equal(t, []*FieldError{a}, FieldErrors(errors.Join(errors.New("w"), errors.Join(a))))
	assert.Equal(t, []*FieldError{b}, FieldErrors(wrap{b}))
	assert.Nil(t, FieldErrors(nil))
	assert.Equal(t, "a: x", a.Error())
	assert.Equal(t, "x", (&FieldError{Err: errors.New("x")}).Error())
}

type wrap struct{ err error }

func (w wrap) Error() string { return "wrapped: " + w.err.Error() }
func (w wrap) Unwrap() error { return w.err }

// FuzzUnmarshal: arbitrary input never panics; whatever decodes survives a round trip
// (Marshal, Unmarshal, Marshal gives the same document).
func FuzzUnmarshal(f *testing.F) {
	f.Add([]byte("name: a\ninner: {count: 1}\nlist: [{count: 2, label: x}]\nlabels: {a: b}\n"))
	f.Add([]byte("sets:\n- name: a\n  measurements:\n    4: \"" + strings.Repeat("ab", 32) + "\"\n"))
	f.Add([]byte("name: &a [*a]\n"))
	f.Add([]byte("- a\n---\nb\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 4096 {
			return
		}
		var d doc
		if err := Unmarshal(data, &d); err != nil {
			return
		}
		out, err := Marshal(d)
		require.NoError(t, err)
		var back doc
		require.NoError(t, Unmarshal(out, &back), "%s", out)
		// Compared by encoding: nil and empty collections are the same document.
		again, err := Marshal(back)
		require.NoError(t, err)
		require.Equal(t, string(out), string(again))
	})
}
