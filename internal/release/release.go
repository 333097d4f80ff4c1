// Package release is a Constellation release as a signed artifact: the manifest (version,
// node image, services image, the images clouds keep of its node image, the reference values
// of every variant the release supports) and its signature, a DSSE envelope carrying an in-toto v1 Statement whose predicate is the
// manifest (docs/releases.md).
//
// A release is checked in three steps, in this order, and Open runs all three: Parse (strict,
// size-bounded: refuses what is malformed), Verify (the pinned key signed it: refuses the
// unsigned, a wrong key, the tampered) and CheckPolicy of the signed release (every image
// register enforced; no downgrade).
//
// Only CheckPolicy returns a Verified release, so nothing that has not passed every check
// can be handed on. Every refusal is an *Error whose Reason says which check failed.
package release

import (
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/openconstellation/constellation/pkg/attestation/choose"
)

// PredicateType is the in-toto predicate type of a Constellation release manifest: the
// statement's predicate is a Manifest. It names the version of this format; a manifest of
// another version is refused (it cannot be read correctly).
const PredicateType = "https://github.com/openconstellation/constellation/blob/main/docs/releases.md#predicate-v1"

// Subject names of the statement: the images the release is made of.
const (
	SubjectNodeImage     = "node-image"
	SubjectServicesImage = "services-image"
	// SubjectCloudImagePrefix and the provider's name name a cloud image ("cloud-image/azure").
	SubjectCloudImagePrefix = "cloud-image/"
)

// Manifest is what a release is: the predicate of its signed statement.
type Manifest struct {
	// Version is the release's semantic version ("v1.2.3", IsVersion), compared with the
	// running one to refuse downgrades; a release is used only under this name.
	Version string `json:"version"`
	// KubernetesVersion is the Kubernetes version the release's nodes run ("v1.34.4").
	KubernetesVersion string `json:"kubernetesVersion"`
	// NodeImage is the node image the release's nodes boot.
	NodeImage Image `json:"nodeImage"`
	// ServicesImage is the image of the in-cluster services (join, key, verification).
	ServicesImage Image `json:"servicesImage"`
	// CloudImages are the images a cloud's nodes of the release boot, at most one per
	// provider: the node OS image made from the release, stored in the cloud's image store
	// (constellation image upload). A provider whose nodes boot NodeImage itself (the
	// sandbox) needs none.
	CloudImages []CloudImage `json:"cloudImages,omitempty"`
	// References are the reference values of every variant the release supports, one per
	// variant: what nodes booting NodeImage measure, with the variant's hardware block.
	References []choose.Reference `json:"references"`
}

// Image is one image of a release: where it is found and the digest that pins it.
type Image struct {
	// Ref is where the image is found: a path or URL for the node image, an OCI reference
	// for the services image. Informational: the digest is what is trusted.
	Ref string `json:"ref"`
	// Digest is "sha256:" and 64 lower-case hex digits.
	Digest string `json:"digest"`
}

// CloudImage is the release's image in one cloud's image store.
type CloudImage struct {
	// Provider is the provider whose nodes boot it ("azure"), as a configuration names it.
	Provider string `json:"provider"`
	// Ref is the image in the provider's store, as provider.<name>.image takes it (Azure: a
	// gallery image version's resource ID). Not trusted: what a node booting it measures is
	// checked against References at join, whoever stored it.
	Ref string `json:"ref"`
	// Digest is the SHA-256 of the disk the stored image was made from, as the store
	// records it (Azure: the version's constellation-image-sha256 tag).
	Digest string `json:"digest"`
}

// image is c as an Image, whose digest's form is checked alike.
func (c CloudImage) image() Image { return Image{Ref: c.Ref, Digest: c.Digest} }

// sha256Hex returns the hex digits of a "sha256:<hex>" digest, checking its form.
func (i Image) sha256Hex() (string, error) {
	hexDigits, ok := strings.CutPrefix(i.Digest, "sha256:")
	if !ok {
		return "", fmt.Errorf("digest %q: want sha256:<64 hex digits>", i.Digest)
	}
	b, err := hex.DecodeString(hexDigits)
	if err != nil || len(b) != 32 || hex.EncodeToString(b) != hexDigits {
		return "", fmt.Errorf("digest %q: want sha256:<64 lower-case hex digits>", i.Digest)
	}
	return hexDigits, nil
}

// Reason is which check refused a release.
type Reason int

// Reasons a release is refused.
const (
	// ReasonMalformed: the input is not a release: not a DSSE envelope, too large, not an
	// in-toto v1 statement of PredicateType, or a manifest that does not decode.
	ReasonMalformed Reason = iota + 1
	// ReasonUnsigned: the envelope carries no signature.
	ReasonUnsigned
	// ReasonWrongKey: no signature is by the pinned release key (signed by another key).
	ReasonWrongKey
	// ReasonTampered: a signature names the pinned key but does not verify: the payload
	// (a measurement, the payload type, anything) changed after signing, or it is forged.
	ReasonTampered
	// ReasonUnenforced: a reference set leaves a register the variant's images measure
	// missing or warn-only.
	ReasonUnenforced
	// ReasonInvalidReference: a variant's reference values are invalid otherwise (unknown
	// variant, a register the image does not measure, a bad hardware block, a variant
	// listed twice).
	ReasonInvalidReference
	// ReasonDowngrade: the release is older than the running one and downgrades were not
	// allowed.
	ReasonDowngrade
	// ReasonUnsupportedVariant: the release has no reference values for the cluster's
	// attestation variant.
	ReasonUnsupportedVariant
	// ReasonMisnamed: the release was found under another name (a directory, a source's
	// index, a release URL, a cache entry) than its signed version: a genuine release
	// replayed under a newer name would hold a cluster back on it.
	ReasonMisnamed
	// ReasonNoCloudImage: the release names no image for the cluster's provider, whose
	// nodes boot an image the cloud keeps.
	ReasonNoCloudImage
)

func (r Reason) String() string {
	switch r {
	case ReasonMalformed:
		return "malformed release"
	case ReasonUnsigned:
		return "unsigned release"
	case ReasonWrongKey:
		return "release not signed by the pinned release key"
	case ReasonTampered:
		return "release signature does not verify (tampered)"
	case ReasonUnenforced:
		return "release leaves an image register unenforced"
	case ReasonInvalidReference:
		return "release has invalid reference values"
	case ReasonDowngrade:
		return "release is a downgrade"
	case ReasonUnsupportedVariant:
		return "release does not support the cluster's attestation variant"
	case ReasonMisnamed:
		return "release is not the version it is published as"
	case ReasonNoCloudImage:
		return "release has no image for the cluster's provider"
	default:
		return fmt.Sprintf("release refused (reason %d)", int(r))
	}
}

// Error is a refused release: the check that refused it and why.
type Error struct {
	Reason Reason
	Err    error
}

func (e *Error) Error() string { return e.Reason.String() + ": " + e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// ReasonOf returns the Reason of a refusal, or 0 if err is not one.
func ReasonOf(err error) Reason {
	var e *Error
	if errors.As(err, &e) {
		return e.Reason
	}
	return 0
}

func refuse(r Reason, format string, args ...any) error {
	return &Error{Reason: r, Err: fmt.Errorf(format, args...)}
}

// versionPattern is a release version: "v" and a semantic version (semver.org 2.0.0, no
// leading zeros in its numbers), with optional pre-release and build identifiers, each
// non-empty. Such a name is one path element that never leaves its folder ("..", "/" and a
// backslash cannot occur), so a release's version can name its directory and its URL.
var versionPattern = regexp.MustCompile(`\Av(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)` +
	`(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?(\+[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?\z`)

// IsVersion reports whether s is a release version as a manifest must carry it ("v1.2.3",
// "v1.2.3-rc.1"): the one form of a release's name wherever it is used (a release
// directory, a source's index, a release URL, the workspace's cache of fetched releases).
func IsVersion(s string) bool { return versionPattern.MatchString(s) }
