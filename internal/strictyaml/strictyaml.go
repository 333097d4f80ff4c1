// Package strictyaml reads and writes the YAML files of the CLI (configuration, state) through
// their JSON field tags, strictly:
//
//   - YAML is converted to JSON by sigs.k8s.io/yaml (duplicate keys are errors); a file holds
//     exactly one document, and that document is a mapping.
//   - Before decoding, the document is checked against the Go type: every unknown or miscased
//     field, every value of the wrong kind, and every value a field's own decoder
//     (json.Unmarshaler, encoding.TextUnmarshaler) refuses is reported, each as a *FieldError
//     that names the field path (for example provider.local.controlPlanes). encoding/json
//     alone would stop at the first problem, match keys case-insensitively, and not say where.
//     The document then decodes with strictjson, as every JSON input does.
//     A map type whose keys are a closed set known at run time (KeySet) has its keys checked
//     as a struct's fields are.
//   - Scalars are not coerced: an unquoted 1.30 is a number, not the string "1.30", and
//     all-digit hex digests must be quoted (YAML reads them as numbers).
//
// Marshal writes fields in struct order (not alphabetically) and quotes every string YAML
// would otherwise read as something else, so its output decodes back to the same value.
package strictyaml

import (
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"

	yaml2 "go.yaml.in/yaml/v2"
	"sigs.k8s.io/yaml"

	"github.com/openconstellation/constellation/pkg/strictjson"
)

// FieldError is a problem with one field of a document.
type FieldError struct {
	// Path names the field: keys joined by dots, list elements as [i], for example
	// attestation.qemuVTPM.measurements[0].name. Empty for the document itself.
	Path string
	// Err says what is wrong.
	Err error
}

func (e *FieldError) Error() string {
	if e.Path == "" {
		return e.Err.Error()
	}
	return e.Path + ": " + e.Err.Error()
}

func (e *FieldError) Unwrap() error { return e.Err }

// FieldErrors returns the *FieldErrors in err (a single one, or those joined by errors.Join
// at any depth), in order.
func FieldErrors(err error) []*FieldError {
	var out []*FieldError
	var walk func(error)
	walk = func(err error) {
		if fe, ok := err.(*FieldError); ok {
			out = append(out, fe)
			return
		}
		switch e := err.(type) {
		case interface{ Unwrap() []error }:
			for _, inner := range e.Unwrap() {
				walk(inner)
			}
		case interface{ Unwrap() error }:
			walk(e.Unwrap())
		}
	}
	walk(err)
	return out
}

// Unmarshal decodes the YAML document data into v, a pointer to a struct. Problems with
// fields are returned joined (errors.Join), one *FieldError each; syntax errors of the YAML
// itself come from the YAML parser and carry its line number.
func Unmarshal(data []byte, v any) error {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() || rv.Elem().Kind() != reflect.Struct {
		return fmt.Errorf("strictyaml: decoding into %T: want a non-nil pointer to a struct", v)
	}
	if err := singleDocument(data); err != nil {
		return err
	}
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return fmt.Errorf("invalid YAML: %w", err)
	}
	// The generic reading that check walks. The YAML parser refused duplicate keys, and a
	// miscased field is check's to report (with a hint), so encoding/json reads this.
	var doc any
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()
	if err := dec.Decode(&doc); err != nil {
		return fmt.Errorf("invalid YAML: %w", err)
	}
	if doc == nil {
		return &FieldError{Err: errors.New("the document is empty")}
	}
	var problems []error
	check("", rv.Elem().Type(), doc, &problems)
	if len(problems) > 0 {
		return errors.Join(problems...)
	}
	// The check above found nothing; the strict JSON decoder of every other input (no
	// unknown field, none twice or in other letter case) decodes, and stays a backstop.
	if err := strictjson.Unmarshal(js, v); err != nil {
		return fmt.Errorf("decoding: %w", err)
	}
	return nil
}

// singleDocument refuses a stream of several YAML documents: the JSON conversion would
// silently keep only the first.
func singleDocument(data []byte) error {
	dec := yaml2.NewDecoder(bytes.NewReader(data))
	var first any
	if err := dec.Decode(&first); err != nil {
		if errors.Is(err, io.EOF) {
			return nil // empty: reported as such after conversion
		}
		return fmt.Errorf("invalid YAML: %w", err)
	}
	var second any
	switch err := dec.Decode(&second); {
	case errors.Is(err, io.EOF):
		return nil
	case err != nil:
		return fmt.Errorf("invalid YAML: %w", err)
	default:
		return &FieldError{Err: errors.New("the file holds more than one YAML document")}
	}
}

var (
	jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// check compares the decoded JSON value v with type t and appends a *FieldError for every
// problem below path. The first rule that applies decides:
//
//  1. a type with its own JSON decoder gets exactly what encoding/json would give it;
//  2. null leaves the field unset;
//  3. a type with its own text decoder gets a string;
//  4. otherwise the kind decides: pointers and interfaces, mappings (structs, maps), lists,
//     scalars.
func check(path string, t reflect.Type, v any, problems *[]error) {
	bad := badAt(path, problems)
	switch {
	case reflect.PointerTo(t).Implements(jsonUnmarshaler) || t.Implements(jsonUnmarshaler):
		checkJSONUnmarshaler(t, v, bad)
	case v == nil:
		// null leaves the field unset, as in encoding/json
	case reflect.PointerTo(t).Implements(textUnmarshaler) || t.Implements(textUnmarshaler):
		checkTextUnmarshaler(t, v, bad)
	case t.Kind() == reflect.Pointer:
		check(path, t.Elem(), v, problems)
	case t.Kind() == reflect.Interface:
		// any value
	case t.Kind() == reflect.Struct:
		checkStruct(path, t, v, problems)
	case t.Kind() == reflect.Map:
		checkMap(path, t, v, problems)
	case t.Kind() == reflect.Slice || t.Kind() == reflect.Array:
		checkList(path, t, v, problems)
	default:
		checkScalar(t, v, bad)
	}
}

// badAt returns a function appending a *FieldError at path to problems.
func badAt(path string, problems *[]error) func(format string, args ...any) {
	return func(format string, args ...any) {
		*problems = append(*problems, &FieldError{Path: path, Err: fmt.Errorf(format, args...)})
	}
}

// checkJSONUnmarshaler gives v to t's own decoder (null too).
func checkJSONUnmarshaler(t reflect.Type, v any, bad func(string, ...any)) {
	raw, err := json.Marshal(v)
	if err != nil {
		bad("%w", err)
		return
	}
	if err := strictjson.Unmarshal(raw, reflect.New(t).Interface()); err != nil {
		bad("%w", err)
	}
}

// checkTextUnmarshaler gives v, which must be a string, to t's own text decoder.
func checkTextUnmarshaler(t reflect.Type, v any, bad func(string, ...any)) {
	s, ok := v.(string)
	if !ok {
		bad("must be a string, got %s%s", describe(v), quoteHint(v))
		return
	}
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if err := reflect.New(t).Interface().(encoding.TextUnmarshaler).UnmarshalText([]byte(s)); err != nil {
		bad("%w", err)
	}
}

// checkStruct checks every key of the mapping v, in sorted order, against t's JSON fields.
func checkStruct(path string, t reflect.Type, v any, problems *[]error) {
	obj, ok := v.(map[string]any)
	if !ok {
		badAt(path, problems)("must be a mapping, got %s", describe(v))
		return
	}
	fields := jsonFields(t)
	for _, k := range sortedKeys(obj) {
		sub := join(path, k)
		f, ok := fields[k]
		if !ok {
			*problems = append(*problems, &FieldError{Path: sub, Err: unknownField(k, slices.Collect(maps.Keys(fields)))})
			continue
		}
		check(sub, f.Type, obj[k], problems)
	}
}

// checkMap checks every value of the mapping v, in sorted key order, against t's elements.
func checkMap(path string, t reflect.Type, v any, problems *[]error) {
	obj, ok := v.(map[string]any)
	if !ok {
		badAt(path, problems)("must be a mapping, got %s", describe(v))
		return
	}
	if t.Key().Kind() != reflect.String {
		// Only string-keyed maps appear in our files; let encoding/json decide the rest.
		return
	}
	ks, closed := reflect.Zero(t).Interface().(KeySet)
	var known []string
	if closed {
		known = ks.KnownKeys()
	}
	for _, k := range sortedKeys(obj) {
		sub := join(path, k)
		if closed && !slices.Contains(known, k) {
			*problems = append(*problems, &FieldError{Path: sub, Err: unknownField(k, known)})
			continue
		}
		check(sub, t.Elem(), obj[k], problems)
	}
}

// KeySet is implemented by a string-keyed map type whose keys are a closed set that is known
// only at run time, so no struct can spell it (the configuration's attestation block, keyed
// by the catalog's variants). Unmarshal refuses any other key as it refuses an unknown field
// of a struct, with the same hint. KnownKeys is called on the map type's zero value.
type KeySet interface {
	KnownKeys() []string
}

func sortedKeys(obj map[string]any) []string {
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// checkList checks the list v against the slice or array type t, element by element.
func checkList(path string, t reflect.Type, v any, problems *[]error) {
	bad := badAt(path, problems)
	list, ok := v.([]any)
	if !ok {
		bad("must be a list, got %s", describe(v))
		return
	}
	if t.Kind() == reflect.Array && len(list) != t.Len() {
		bad("must be a list of %d, got %d", t.Len(), len(list))
		return
	}
	for i, elem := range list {
		check(fmt.Sprintf("%s[%d]", path, i), t.Elem(), elem, problems)
	}
}

// checkScalar checks a string, bool or number against t, numbers against t's size.
func checkScalar(t reflect.Type, v any, bad func(string, ...any)) {
	switch t.Kind() {
	case reflect.String:
		if _, ok := v.(string); !ok {
			bad("must be a string, got %s%s", describe(v), quoteHint(v))
		}
	case reflect.Bool:
		if _, ok := v.(bool); !ok {
			bad("must be true or false, got %s", describe(v))
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		n, ok := v.(json.Number)
		if !ok {
			bad("must be an integer, got %s", describe(v))
			return
		}
		if _, err := strconv.ParseInt(n.String(), 10, t.Bits()); err != nil {
			bad("must be an integer of %d bits, got %s", t.Bits(), n)
		}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		n, ok := v.(json.Number)
		if !ok {
			bad("must be a non-negative integer, got %s", describe(v))
			return
		}
		if _, err := strconv.ParseUint(n.String(), 10, t.Bits()); err != nil {
			bad("must be a non-negative integer of %d bits, got %s", t.Bits(), n)
		}
	case reflect.Float32, reflect.Float64:
		n, ok := v.(json.Number)
		if !ok {
			bad("must be a number, got %s", describe(v))
			return
		}
		if _, err := strconv.ParseFloat(n.String(), t.Bits()); err != nil {
			bad("must be a number, got %s", n)
		}
	default:
		bad("strictyaml: fields of kind %s are not supported", t.Kind())
	}
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// jsonFields maps the JSON names of t's fields (as encoding/json sees them, embedded structs
// inlined) to the fields.
func jsonFields(t reflect.Type) map[string]reflect.StructField {
	out := map[string]reflect.StructField{}
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				for k, inner := range jsonFields(ft) {
					if _, shadowed := out[k]; !shadowed {
						out[k] = inner
					}
				}
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f
	}
	return out
}

// unknownField says that key is none of known: the known key it miscases, or all of them.
func unknownField(key string, known []string) error {
	for _, k := range known {
		if strings.EqualFold(k, key) {
			return fmt.Errorf("unknown field (did you mean %q?)", k)
		}
	}
	if len(known) == 0 {
		return errors.New("unknown field (known: none)")
	}
	known = slices.Sorted(slices.Values(known))
	return fmt.Errorf("unknown field (known: %s)", strings.Join(known, ", "))
}

func describe(v any) string {
	switch v := v.(type) {
	case nil:
		return "null"
	case string:
		return fmt.Sprintf("the string %q", v)
	case json.Number:
		return "the number " + v.String()
	case bool:
		return "the boolean " + strconv.FormatBool(v)
	case []any:
		return "a list"
	case map[string]any:
		return "a mapping"
	default:
		return fmt.Sprintf("%T", v)
	}
}

// quoteHint explains the common cause of a number or boolean where a string belongs.
func quoteHint(v any) string {
	switch v.(type) {
	case json.Number:
		return " (YAML reads unquoted digits as a number: quote the value)"
	case bool:
		return " (YAML reads unquoted yes/no/on/off/true/false as a boolean: quote the value)"
	}
	return ""
}

// Marshal encodes v (through its JSON encoding) as YAML, keeping the field order of the JSON
// encoding and quoting every string that YAML would read as another type.
func Marshal(v any) ([]byte, error) {
	js, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	// encoding/json's tokenizer, not strictjson: it re-reads json.Marshal's output just above.
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()
	ordered, err := orderedValue(dec)
	if err != nil {
		return nil, fmt.Errorf("strictyaml: re-reading JSON: %w", err)
	}
	return yaml2.Marshal(ordered)
}

// orderedValue reads the next JSON value of dec as a YAML value whose mappings keep their
// order (yaml.MapSlice). yaml.v2 is the YAML library sigs.k8s.io/yaml decodes with, so its
// encoder quotes exactly the strings that decoder would not read back as strings.
func orderedValue(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			m := yaml2.MapSlice{}
			for dec.More() {
				key, err := dec.Token()
				if err != nil {
					return nil, err
				}
				val, err := orderedValue(dec)
				if err != nil {
					return nil, err
				}
				m = append(m, yaml2.MapItem{Key: key, Value: val})
			}
			_, err := dec.Token()
			return m, err
		case '[':
			list := []any{}
			for dec.More() {
				val, err := orderedValue(dec)
				if err != nil {
					return nil, err
				}
				list = append(list, val)
			}
			_, err := dec.Token()
			return list, err
		}
		return nil, fmt.Errorf("unexpected %v", t)
	case json.Number:
		if i, err := t.Int64(); err == nil {
			return i, nil
		}
		if u, err := strconv.ParseUint(t.String(), 10, 64); err == nil {
			return u, nil
		}
		return t.Float64()
	default:
		return tok, nil // string, bool, nil
	}
}
