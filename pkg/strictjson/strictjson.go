// Package strictjson decodes JSON that comes from outside the process (a signed release, a
// peer's answer, a file a user or an attacker wrote) so that it has one meaning only.
//
// encoding/json matches an object's member names to struct fields ignoring letter case and
// keeps the last of duplicate names. A document with both "version" and "Version", or with
// "version" twice, therefore reads one way here and another way in a case-sensitive tool or
// one that keeps the first duplicate: a signature over the bytes then vouches for two
// different statements. This package refuses every such document:
//
//   - a member name twice in one object (anywhere, also inside values kept raw, maps and any);
//   - a member whose name matches a struct field only when letter case is ignored;
//   - invalid UTF-8 (read by encoding/json as U+FFFD, by others as the raw bytes);
//   - anything but whitespace after the one JSON value;
//   - with Unmarshal, a member that matches no field (UnmarshalIgnoreUnknown ignores those, for
//     documents whose writer may add fields: a newer peer, a provider's API).
//
// Everything else decodes exactly as with encoding/json: the decoding is that of
// github.com/go-json-experiment/json (the upstream of Go's encoding/json/v2) with its
// encoding/json (v1) options, plus the options above. Custom UnmarshalJSON and UnmarshalText
// methods, time.Duration as nanoseconds, []byte as base64, embedded structs, the ",string"
// tag option and null (leaves a value unchanged) behave as before. A type's own UnmarshalJSON
// method sees its raw value (duplicate-free, checked here): if it decodes objects itself, it
// uses this package too.
package strictjson

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"
	"sync"

	json "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	jsonv1 "github.com/go-json-experiment/json/v1"
)

// Errors of the refusals that this package adds to encoding/json's (test with errors.Is).
var (
	// ErrDuplicateName: an object names a member twice.
	ErrDuplicateName = errors.New("duplicate member name")
	// ErrCaseVariant: a member's name differs from a struct field's only in letter case.
	ErrCaseVariant = errors.New("differs from a known field only in letter case (names must match exactly)")
	// ErrUnknownField: a member names no field (Unmarshal only).
	ErrUnknownField = errors.New("unknown field")
	// ErrTrailingData: something other than whitespace follows the JSON value.
	ErrTrailingData = errors.New("data after the JSON value")
)

// Unmarshal decodes data, exactly one JSON value, into v (a non-nil pointer) as
// encoding/json.Unmarshal does, refusing duplicate member names, members that match a field
// only when letter case is ignored, members that match no field, invalid UTF-8 and data
// after the value.
func Unmarshal(data []byte, v any) error {
	return unmarshal(data, v, false)
}

// UnmarshalIgnoreUnknown is Unmarshal, but ignores members that match no field at all, as
// encoding/json does: for documents whose writer may add fields. A member that matches a
// field only when letter case is ignored is still refused: it is not unknown to
// encoding/json, which would read it into the field.
func UnmarshalIgnoreUnknown(data []byte, v any) error {
	return unmarshal(data, v, true)
}

// v1Options is encoding/json's behaviour, with exact names, no duplicates and valid UTF-8.
func v1Options(rejectUnknown bool) json.Options {
	return json.JoinOptions(
		jsonv1.DefaultOptionsV1(),
		jsontext.AllowDuplicateNames(false),
		jsontext.AllowInvalidUTF8(false),
		json.MatchCaseInsensitiveNames(false),
		json.RejectUnknownMembers(rejectUnknown),
	)
}

// unmarshal runs four steps, the first three on data alone and a fresh value, so that v is
// written only by the last one, after the input passed every check:
//  1. syntax: one JSON value, nothing after it, no duplicate names, valid UTF-8;
//  2. shape: decode into a fresh value of v's type, recording which objects are decoded
//     into which struct type (by their offset in data);
//  3. names: every member of those objects names a field exactly (and, unless ignoreUnknown,
//     names one);
//  4. decode into v.
//
// A type's own UnmarshalJSON therefore runs twice (steps 2 and 4): like every decoder method,
// it must only set its value. The names of step 3 are those of the struct types v's type
// declares; a value already set in an interface field of *v is not looked into.
func unmarshal(data []byte, v any, ignoreUnknown bool) error {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return fmt.Errorf("strictjson: decoding into %T: want a non-nil pointer", v)
	}
	if err := checkSyntax(data); err != nil {
		return err
	}
	structs := map[int64]reflect.Type{}
	record := json.WithUnmarshalers(json.UnmarshalFromFunc(func(dec *jsontext.Decoder, p any) error {
		if t := reflect.TypeOf(p).Elem(); t.Kind() == reflect.Struct && dec.PeekKind() == '{' && !decodesItself(t) {
			structs[dec.InputOffset()] = t
		}
		return errors.ErrUnsupported // decode as usual: this only records
	}))
	if err := json.Unmarshal(data, reflect.New(rv.Elem().Type()).Interface(), v1Options(false), record); err != nil {
		return err
	}
	if err := checkNames(data, structs, ignoreUnknown); err != nil {
		return err
	}
	return json.Unmarshal(data, v, v1Options(!ignoreUnknown))
}

// checkSyntax reads data as one JSON value followed by nothing but whitespace, with
// duplicate names and invalid UTF-8 refused, and words the refusals this package adds.
func checkSyntax(data []byte) error {
	dec := jsontext.NewDecoder(bytes.NewReader(data), jsontext.AllowDuplicateNames(false), jsontext.AllowInvalidUTF8(false))
	_, err := dec.ReadValue()
	if err == nil {
		if _, err := dec.ReadToken(); err != io.EOF {
			return fmt.Errorf("%w (at offset %d)", ErrTrailingData, dec.InputOffset())
		}
		return nil
	}
	if err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF) {
		return errUnexpectedEnd // not io.EOF itself: a caller could take it for the end of a stream
	}
	var serr *jsontext.SyntacticError
	if errors.As(err, &serr) && errors.Is(serr.Err, jsontext.ErrDuplicateName) {
		return fmt.Errorf("%w %q%s", ErrDuplicateName, serr.JSONPointer.LastToken(), in(serr.JSONPointer.Parent()))
	}
	return syntaxError{err} // invalid UTF-8 among them
}

var errUnexpectedEnd = errors.New("unexpected end of JSON input")

// syntaxError is a syntax error of the JSON text, worded as encoding/json words its own.
type syntaxError struct{ err error }

func (e syntaxError) Error() string { return strings.TrimPrefix(e.err.Error(), "jsontext: ") }

func (e syntaxError) Unwrap() error { return e.err }

// checkNames walks data's tokens and checks the member names of every object that step 2
// decoded into a struct type (structs, by the offset before the object).
func checkNames(data []byte, structs map[int64]reflect.Type, ignoreUnknown bool) error {
	// checkSyntax has refused duplicates already: no need to track names again.
	dec := jsontext.NewDecoder(bytes.NewReader(data), jsontext.AllowDuplicateNames(true))
	known := map[reflect.Type]map[string]nameMatch{}
	// stack holds, for each open object or array, the struct type of an object (nil for
	// arrays and other objects); expectName whether the object's next token is a name.
	type frame struct {
		t          reflect.Type
		object     bool
		expectName bool
	}
	var stack []frame
	for {
		off := dec.InputOffset()
		tok, err := dec.ReadToken()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return syntaxError{err} // checkSyntax accepted data: unreachable
		}
		kind := tok.Kind()
		if n := len(stack); n > 0 && stack[n-1].object {
			top := &stack[n-1]
			if kind == '}' {
				stack = stack[:n-1]
				continue
			}
			if top.expectName {
				top.expectName = false
				if top.t != nil {
					if err := checkName(top.t, tok.String(), dec.StackPointer().Parent(), known, ignoreUnknown); err != nil {
						return err
					}
				}
				continue
			}
			top.expectName = true // the member's value: the next token is a name or '}'
		}
		switch kind {
		case '{':
			stack = append(stack, frame{t: structs[off], object: true, expectName: true})
		case '[':
			stack = append(stack, frame{})
		case ']':
			stack = stack[:len(stack)-1]
		}
	}
}

// nameMatch is how a member name matches a struct type's fields.
type nameMatch int

const (
	matchExact nameMatch = iota
	matchFolded
	matchNone
)

// checkName refuses name in the object at (decoded into t) if it names a field only when letter
// case is ignored (or, unless ignoreUnknown, no field). The JSON library decides what t's
// fields are (tags, embedded structs, "-"): name is tried as the only member of an object,
// once matched exactly and once ignoring case.
func checkName(t reflect.Type, name string, at jsontext.Pointer, known map[reflect.Type]map[string]nameMatch, ignoreUnknown bool) error {
	m, ok := known[t][name]
	if !ok {
		if _, exact := exactNames.Load(typeName{t, name}); exact {
			m, ok = matchExact, true
		}
	}
	if !ok {
		quoted, err := jsontext.AppendQuote(nil, name)
		if err != nil {
			return fmt.Errorf("field %q%s: %w", name, in(at), err) // checkSyntax accepted name: unreachable
		}
		probe := append(append([]byte{'{'}, quoted...), `:null}`...)
		// Ignoring case first: most unknown names (the ones an attacker can vary) take one probe.
		switch {
		case isUnknownName(json.Unmarshal(probe, reflect.New(t).Interface(), probeOptions(true))):
			m = matchNone
		case isUnknownName(json.Unmarshal(probe, reflect.New(t).Interface(), probeOptions(false))):
			m = matchFolded
		default:
			m = matchExact
		}
		if known[t] == nil {
			known[t] = map[string]nameMatch{}
		}
		known[t][name] = m
		if m == matchExact {
			exactNames.Store(typeName{t, name}, struct{}{})
		}
	}
	switch {
	case m == matchFolded:
		return fmt.Errorf("field %q%s: %w", name, in(at), ErrCaseVariant)
	case m == matchNone && !ignoreUnknown:
		return fmt.Errorf("%w %q%s", ErrUnknownField, name, in(at))
	}
	return nil
}

// exactNames remembers, across calls, the member names that name a field of a struct type
// exactly, so that a document of known fields (a webhook's every request) costs no probes
// after the first. Only exact names are kept: they are bounded by the types' fields, while
// unknown names and case variants are the sender's to vary.
var exactNames sync.Map // typeName → struct{}

type typeName struct {
	t    reflect.Type
	name string
}

// probeOptions decode a one-member probe, reporting an unknown member as ErrUnknownName.
func probeOptions(foldCase bool) json.Options {
	return json.JoinOptions(
		jsonv1.DefaultOptionsV1(),
		jsonv1.ReportErrorsWithLegacySemantics(false), // keeps ErrUnknownName testable
		json.MatchCaseInsensitiveNames(foldCase),
		json.RejectUnknownMembers(true),
	)
}

func isUnknownName(err error) bool { return errors.Is(err, json.ErrUnknownName) }

// decodesItself reports whether t's own method decodes its JSON (it then sees the raw value
// and is responsible for its names).
func decodesItself(t reflect.Type) bool {
	p := reflect.PointerTo(t)
	return p.Implements(jsonUnmarshalerV1) || p.Implements(jsonUnmarshalerV2)
}

var (
	jsonUnmarshalerV1 = reflect.TypeFor[interface{ UnmarshalJSON([]byte) error }]()
	jsonUnmarshalerV2 = reflect.TypeFor[json.UnmarshalerFrom]()
)

// in names the object at p for a message: ` in "/nodeImage"`, nothing for the document.
func in(p jsontext.Pointer) string {
	if p == "" {
		return ""
	}
	return " in " + strconv.Quote(string(p))
}
