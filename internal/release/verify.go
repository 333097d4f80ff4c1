package release

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"unicode"

	"github.com/secure-systems-lab/go-securesystemslib/dsse"
	"k8s.io/apimachinery/pkg/util/version"

	"github.com/openconstellation/constellation/internal/clusterrecord"
	"github.com/openconstellation/constellation/pkg/attestation/choose"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/strictjson"
)

// MaxSize bounds a signed release that Parse reads (a release is a few KiB per variant).
const MaxSize = 1 << 20

// MaxSignatures bounds the signatures of an envelope: each one the verifier may try.
const MaxSignatures = 8

// Envelope is a parsed, not yet verified, release: nothing in it is trusted.
type Envelope struct {
	env dsse.Envelope
}

// Parse reads a signed release strictly: at most MaxSize bytes of one JSON DSSE envelope
// (strictjson.Unmarshal: no unknown field, no field twice or in other letter case, nothing
// after it) of payload type PayloadType, whose payload and
// signatures are base64, with 1..MaxSignatures signatures. It checks no signature.
func Parse(data []byte) (*Envelope, error) {
	if len(data) > MaxSize {
		return nil, refuse(ReasonMalformed, "%d bytes, limit %d", len(data), MaxSize)
	}
	var env dsse.Envelope
	if err := strictjson.Unmarshal(data, &env); err != nil {
		return nil, refuse(ReasonMalformed, "not a DSSE envelope: %w", err)
	}
	if env.PayloadType != PayloadType {
		return nil, refuse(ReasonMalformed, "payload type %q, want %q (an in-toto statement)", env.PayloadType, PayloadType)
	}
	if _, err := env.DecodeB64Payload(); err != nil {
		return nil, refuse(ReasonMalformed, "payload: %w", err)
	}
	if len(env.Signatures) == 0 {
		return nil, refuse(ReasonUnsigned, "the envelope carries no signature")
	}
	if len(env.Signatures) > MaxSignatures {
		return nil, refuse(ReasonMalformed, "%d signatures, limit %d", len(env.Signatures), MaxSignatures)
	}
	for i, s := range env.Signatures {
		if s.Sig == "" {
			return nil, refuse(ReasonUnsigned, "signature #%d is empty", i)
		}
		// The encodings DSSE allows (and go-securesystemslib decodes): standard or URL-safe.
		if _, err := base64.StdEncoding.DecodeString(s.Sig); err != nil {
			if _, err := base64.URLEncoding.DecodeString(s.Sig); err != nil {
				return nil, refuse(ReasonMalformed, "signature #%d is not base64", i)
			}
		}
	}
	return &Envelope{env: env}, nil
}

// Signed is a release whose signature by the pinned key verified and whose statement and
// manifest decoded: authentic, but its policy is not checked yet (CheckPolicy).
type Signed struct {
	manifest Manifest
	keyID    string
}

// Verify checks that the pinned key signed env (the DSSE signature over the pre-authentication
// encoding of payload type and payload, with go-securesystemslib's verifier), then decodes
// the signed statement and manifest strictly.
//
// One signature by the pinned key suffices; signatures by other keys beside it are ignored
// (docs/releases.md "Decisions"): they cannot change what the pinned key signed, and
// requiring every signature to verify would forbid co-signing and key rollover.
func Verify(ctx context.Context, env *Envelope, key *PublicKey) (*Signed, error) {
	if env == nil || key == nil {
		return nil, errors.New("release: Verify needs a parsed envelope and a pinned key")
	}
	ev, err := dsse.NewEnvelopeVerifier(verifier{key})
	if err != nil {
		return nil, err
	}
	// A copy: the verifier never sees (or could change) the caller's envelope.
	e := env.env
	e.Signatures = append([]dsse.Signature(nil), env.env.Signatures...)
	_, payload, err := ev.VerifyAndDecode(ctx, &e)
	if err != nil {
		return nil, signatureRefusal(env, key, err)
	}
	st, err := decodeStatement(payload)
	if err != nil {
		return nil, refuse(ReasonMalformed, "%w", err)
	}
	m, err := decodeManifest(st.Predicate)
	if err != nil {
		return nil, refuse(ReasonMalformed, "%w", err)
	}
	if err := checkSubjects(st, m); err != nil {
		return nil, refuse(ReasonMalformed, "%w", err)
	}
	return &Signed{manifest: m, keyID: key.KeyID()}, nil
}

// signatureRefusal words a failed verification. Key IDs are unauthenticated hints: a
// signature naming the pinned key that does not verify means the signed bytes changed (or a
// forgery); signatures naming only other keys (or none) mean another key signed.
func signatureRefusal(env *Envelope, key *PublicKey, err error) error {
	var others []string
	for _, s := range env.env.Signatures {
		if s.KeyID == key.KeyID() {
			return refuse(ReasonTampered, "the signature by the pinned key %s does not match the release's contents: %w", key.KeyID(), err)
		}
		id := s.KeyID
		if id == "" {
			id = "(no key ID)"
		}
		others = append(others, id)
	}
	return refuse(ReasonWrongKey, "signed by %s, not by the pinned key %s: %w", strings.Join(others, ", "), key.KeyID(), err)
}

// decodeManifest decodes the predicate strictly (strictjson.Unmarshal): no unknown field, no
// field twice or in other letter case, nothing after it. protojson accepted the statement,
// but it reads the predicate as a map, so "version" and "Version" are two keys to it.
func decodeManifest(pred []byte) (Manifest, error) {
	var m Manifest
	if err := strictjson.Unmarshal(pred, &m); err != nil {
		return Manifest{}, fmt.Errorf("release manifest: %w", err)
	}
	return m, nil
}

// checkSubjects requires the statement's subjects to be exactly the manifest's images (its
// node and services images and each cloud image), so that the statement and its predicate
// cannot name different images.
func checkSubjects(st statement, m Manifest) error {
	want := m.subjects()
	// Two cloud images of one provider share a subject name: they must not pass as one.
	if len(want) != 2+len(m.CloudImages) {
		return errors.New("the manifest names two cloud images of one provider: a release names one image per provider")
	}
	if len(st.Subject) != len(want) {
		return fmt.Errorf("statement has %d subjects, want %d (%s)", len(st.Subject), len(want), strings.Join(slices.Sorted(maps.Keys(want)), ", "))
	}
	seen := map[string]bool{}
	for _, s := range st.Subject {
		img, ok := want[s.Name]
		if !ok || seen[s.Name] {
			return fmt.Errorf("statement subject %q: want each of %s once", s.Name, strings.Join(slices.Sorted(maps.Keys(want)), ", "))
		}
		seen[s.Name] = true
		hexDigits, err := img.sha256Hex()
		if err != nil {
			return fmt.Errorf("manifest image %s: %w", s.Name, err)
		}
		if len(s.Digest) != 1 || s.Digest["sha256"] != hexDigits {
			return fmt.Errorf("statement subject %s: digest %v does not match the manifest's %s", s.Name, s.Digest, img.Digest)
		}
	}
	return nil
}

// subjects are the images of m by their subject names: what the statement about m lists.
func (m Manifest) subjects() map[string]Image {
	out := map[string]Image{SubjectNodeImage: m.NodeImage, SubjectServicesImage: m.ServicesImage}
	for _, c := range m.CloudImages {
		out[SubjectCloudImagePrefix+c.Provider] = c.image()
	}
	return out
}

// Policy is what the running cluster requires of a release beyond its signature.
type Policy struct {
	// Name, if set, is the name the release was found under: its directory's name, its
	// entry in a source's index, the last element of its URL. The signed version must be
	// exactly this name (ReasonMisnamed), so that whoever controls where releases are kept
	// cannot pass one release off as another (a replay of v0.2.0 as v0.3.0 would hold the
	// cluster back on v0.2.0 while its user believes it moved). releasedir.Open and
	// releasesource set it from where they found the release, whatever the caller passed.
	Name string
	// Running is the version the cluster runs ("v1.2.3"); empty: no cluster yet, any
	// version is accepted.
	Running string
	// AllowDowngrade accepts a release older than Running (--allow-downgrade).
	AllowDowngrade bool
	// Variant, if set, is the cluster's attestation variant: the release must carry its
	// reference values, or the cluster's nodes could not join once they run its image.
	Variant variant.Variant
	// CloudImageOf, if set, is the cluster's provider when its nodes boot an image the cloud
	// keeps: the release must name its image there (Manifest.CloudImages).
	CloudImageOf string
}

// Verified is a release that passed every check: parsed, signed by the pinned key, and
// within the policy. Only CheckPolicy makes one (its fields are unexported, so no other
// package can), so a *Verified is proof that the checks ran.
type Verified struct {
	manifest  Manifest
	keyID     string
	downgrade bool
}

// Manifest returns the verified manifest.
func (v *Verified) Manifest() Manifest { return v.manifest }

// KeyID is the pinned key that signed the release.
func (v *Verified) KeyID() string { return v.keyID }

// Downgrade reports whether the release is older than Policy.Running (and the policy allowed
// it), for the CLI's plan to say so.
func (v *Verified) Downgrade() bool { return v.downgrade }

// CheckPolicy checks the signed manifest: every reference set of every variant enforces every
// register the variant's images measure, and every variant's reference values are valid; its
// version is p.Name (if set); it supports p.Variant; its version is semantic and, unless p
// allows a downgrade, not older than p.Running.
func (s *Signed) CheckPolicy(p Policy) (*Verified, error) {
	if err := checkManifest(s.manifest); err != nil {
		return nil, err
	}
	// The name first: a replayed release is refused as what it is, naming both versions,
	// before any other check could word it as something else (a downgrade).
	if p.Name != "" && p.Name != s.manifest.Version {
		return nil, refuse(ReasonMisnamed, "published as %q, but signed as %s: a release is used only under its own signed version", p.Name, s.manifest.Version)
	}
	if !p.Variant.IsZero() {
		if _, ok := s.manifest.reference(p.Variant); !ok {
			var have []string
			for _, ref := range s.manifest.References {
				have = append(have, ref.Variant.String())
			}
			return nil, refuse(ReasonUnsupportedVariant, "release %s has no reference values for %s (it supports %s)", s.manifest.Version, p.Variant, strings.Join(have, ", "))
		}
	}
	if p.CloudImageOf != "" {
		if _, ok := s.manifest.cloudImage(p.CloudImageOf); !ok {
			have := []string{"none"}
			if len(s.manifest.CloudImages) > 0 {
				have = nil
			}
			for _, c := range s.manifest.CloudImages {
				have = append(have, c.Provider)
			}
			return nil, refuse(ReasonNoCloudImage, "release %s names no image for provider %s (it names images for: %s): its nodes there would have nothing to boot", s.manifest.Version, p.CloudImageOf, strings.Join(have, ", "))
		}
	}
	downgrade := false
	if p.Running != "" {
		running, err := version.ParseSemantic(p.Running)
		if err != nil {
			return nil, fmt.Errorf("running version %q: %w", p.Running, err)
		}
		rel := version.MustParseSemantic(s.manifest.Version) // checked by checkManifest
		if rel.LessThan(running) {
			if !p.AllowDowngrade {
				return nil, refuse(ReasonDowngrade, "release %s is older than the running %s (--allow-downgrade accepts it)", s.manifest.Version, p.Running)
			}
			downgrade = true
		}
	}
	return &Verified{manifest: s.manifest, keyID: s.keyID, downgrade: downgrade}, nil
}

// checkManifest checks what a manifest must be whoever reads it: what Sign refuses to sign
// and CheckPolicy refuses to accept.
func checkManifest(m Manifest) error {
	if !IsVersion(m.Version) {
		return refuse(ReasonMalformed, "version %q: want v and a semantic version, e.g. v1.2.3 or v1.2.3-rc.1", m.Version)
	}
	if _, err := version.ParseSemantic(m.Version); err != nil {
		return refuse(ReasonMalformed, "version %q: %w", m.Version, err)
	}
	if !clusterrecord.IsKubernetesVersion(m.KubernetesVersion) {
		return refuse(ReasonMalformed, "kubernetesVersion %q: want v1.X.Y", m.KubernetesVersion)
	}
	if _, err := m.NodeImage.sha256Hex(); err != nil {
		return refuse(ReasonMalformed, "node image: %w", err)
	}
	if _, err := m.ServicesImage.sha256Hex(); err != nil {
		return refuse(ReasonMalformed, "services image: %w", err)
	}
	if err := CheckCloudImages(m.CloudImages); err != nil {
		return refuse(ReasonMalformed, "%w", err)
	}
	if len(m.References) == 0 {
		return refuse(ReasonInvalidReference, "no reference values: a release supports at least one variant")
	}
	seen := map[variant.Variant]bool{}
	for i, ref := range m.References {
		if seen[ref.Variant] {
			return refuse(ReasonInvalidReference, "references[%d]: variant %s listed twice", i, ref.Variant)
		}
		seen[ref.Variant] = true
		// The existing validation (choose.Reference.Validate, measurements.M.Validate) is
		// the rule; an unenforced image register gets its own reason.
		if err := ref.Validate(); err != nil {
			reason := ReasonInvalidReference
			if errors.Is(err, measurements.ErrUnenforcedRegister) {
				reason = ReasonUnenforced
			}
			return refuse(reason, "reference values of %s: %w", variantName(ref.Variant), err)
		}
	}
	return nil
}

// providerPattern is a provider's name as a configuration's provider block is keyed.
var providerPattern = regexp.MustCompile(`\A[a-z][a-z0-9]{0,31}\z`)

// maxCloudImageRef bounds a cloud image's reference (an Azure resource ID is well below).
const maxCloudImageRef = 1024

// CheckCloudImages checks each cloud image's form: a provider's name, at most one image per
// provider, a reference of printable characters without spaces, a sha256 digest.
func CheckCloudImages(images []CloudImage) error {
	seen := map[string]bool{}
	for i, c := range images {
		if !providerPattern.MatchString(c.Provider) {
			return fmt.Errorf("cloudImages[%d]: provider %q: want a provider's name (lower-case letters and digits)", i, c.Provider)
		}
		if seen[c.Provider] {
			return fmt.Errorf("cloudImages[%d]: provider %s has two images: a release names one image per provider", i, c.Provider)
		}
		seen[c.Provider] = true
		if c.Ref == "" || len(c.Ref) > maxCloudImageRef || strings.IndexFunc(c.Ref, func(r rune) bool { return r <= ' ' || r == 0x7f || !unicode.IsPrint(r) }) >= 0 {
			return fmt.Errorf("cloudImages[%d] (%s): ref %q: want 1 to %d printable characters without spaces", i, c.Provider, c.Ref, maxCloudImageRef)
		}
		if _, err := c.image().sha256Hex(); err != nil {
			return fmt.Errorf("cloudImages[%d] (%s): %w", i, c.Provider, err)
		}
	}
	return nil
}

func variantName(v variant.Variant) string {
	if v.IsZero() {
		return "(no variant)"
	}
	return v.String()
}

// Open runs every check in order (Parse, Verify, CheckPolicy) and returns the release only
// if all pass.
func Open(ctx context.Context, data []byte, key *PublicKey, p Policy) (*Verified, error) {
	env, err := Parse(data)
	if err != nil {
		return nil, err
	}
	signed, err := Verify(ctx, env, key)
	if err != nil {
		return nil, err
	}
	return signed.CheckPolicy(p)
}

// Reference returns the verified reference values of variant vr, if the release supports it.
func (v *Verified) Reference(vr variant.Variant) (choose.Reference, bool) {
	return v.manifest.reference(vr)
}

// CloudImage returns the verified image the release names for provider's nodes, if any.
func (v *Verified) CloudImage(provider string) (CloudImage, bool) {
	return v.manifest.cloudImage(provider)
}

func (m Manifest) cloudImage(provider string) (CloudImage, bool) {
	for _, c := range m.CloudImages {
		if c.Provider == provider {
			return c, true
		}
	}
	return CloudImage{}, false
}

func (m Manifest) reference(v variant.Variant) (choose.Reference, bool) {
	for _, ref := range m.References {
		if ref.Variant == v {
			return ref, true
		}
	}
	return choose.Reference{}, false
}
