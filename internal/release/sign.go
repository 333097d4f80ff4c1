package release

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	intoto "github.com/in-toto/attestation/go/v1"
	"github.com/secure-systems-lab/go-securesystemslib/dsse"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/openconstellation/constellation/pkg/strictjson"
)

// PayloadType is the DSSE payload type of a release: an in-toto statement.
const PayloadType = "application/vnd.in-toto+json"

// Sign checks m (as a verifier will: well-formed digests, valid reference values that
// enforce every image register) and returns it signed by s: the JSON of a DSSE envelope whose
// payload is an in-toto v1 Statement with the images as subjects and m as predicate.
func Sign(ctx context.Context, m Manifest, s *Signer) ([]byte, error) {
	if err := checkManifest(m); err != nil {
		return nil, err
	}
	payload, err := statementJSON(m)
	if err != nil {
		return nil, err
	}
	es, err := dsse.NewEnvelopeSigner(s)
	if err != nil {
		return nil, err
	}
	env, err := es.SignPayload(ctx, PayloadType, payload)
	if err != nil {
		return nil, fmt.Errorf("signing the release: %w", err)
	}
	return json.Marshal(env)
}

// statement is the JSON form of an in-toto v1 Statement (github.com/in-toto/attestation,
// spec/v1/statement.md) with the predicate kept as raw JSON. The in-toto Go bindings hold a
// predicate as a google.protobuf.Struct, whose numbers are float64 (protojson writes 1000000
// as 1e+06), so the payload is written and read through this type and checked with the
// bindings (protojson.Unmarshal and Statement.Validate) on both sides.
type statement struct {
	Type          string          `json:"_type"`
	Subject       []subject       `json:"subject"`
	PredicateType string          `json:"predicateType"`
	Predicate     json.RawMessage `json:"predicate"`
}

// subject is an in-toto ResourceDescriptor with the fields a release uses.
type subject struct {
	Name   string            `json:"name"`
	Digest map[string]string `json:"digest"`
}

// statementJSON is the in-toto statement of m.
func statementJSON(m Manifest) ([]byte, error) {
	images := m.subjects()
	var subjects []subject
	for _, name := range slices.Sorted(maps.Keys(images)) {
		hexDigits, err := images[name].sha256Hex()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		subjects = append(subjects, subject{Name: name, Digest: map[string]string{"sha256": hexDigits}})
	}
	pred, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encoding the manifest: %w", err)
	}
	payload, err := json.Marshal(statement{
		Type:          intoto.StatementTypeUri,
		Subject:       subjects,
		PredicateType: PredicateType,
		Predicate:     pred,
	})
	if err != nil {
		return nil, err
	}
	if _, err := decodeStatement(payload); err != nil {
		return nil, fmt.Errorf("the release's own statement: %w", err)
	}
	return payload, nil
}

// decodeStatement reads an in-toto v1 statement of PredicateType strictly: the in-toto
// bindings parse it (protojson refuses unknown and duplicate fields) and validate it, and its
// predicate is taken from the same text.
func decodeStatement(payload []byte) (statement, error) {
	var st intoto.Statement
	if err := protojson.Unmarshal(payload, &st); err != nil {
		return statement{}, fmt.Errorf("in-toto statement: %w", err)
	}
	if err := st.Validate(); err != nil {
		return statement{}, fmt.Errorf("in-toto statement: %w", err)
	}
	if st.GetType() != intoto.StatementTypeUri {
		return statement{}, fmt.Errorf("in-toto statement type %q, want %q", st.GetType(), intoto.StatementTypeUri)
	}
	if st.GetPredicateType() != PredicateType {
		return statement{}, fmt.Errorf("predicate type %q, want %q", st.GetPredicateType(), PredicateType)
	}
	// protojson accepted the text, so it has no duplicate or unknown keys: this second read
	// of it cannot see another value than the first (and strictjson refuses the same again).
	var raw struct {
		Predicate json.RawMessage `json:"predicate"`
	}
	if err := strictjson.UnmarshalIgnoreUnknown(payload, &raw); err != nil {
		return statement{}, fmt.Errorf("in-toto statement: %w", err)
	}
	out := statement{Type: st.GetType(), PredicateType: st.GetPredicateType(), Predicate: raw.Predicate}
	for _, rd := range st.GetSubject() {
		out.Subject = append(out.Subject, subject{Name: rd.GetName(), Digest: rd.GetDigest()})
	}
	return out, nil
}
