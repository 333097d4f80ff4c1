// Package releasedir is a release on disk: a directory holding the signed release
// (release.json, internal/release) and the node image it signs (node-image/), as `make
// release` writes it and the CLI reads it; a release source is a directory of such
// directories (docs/releases.md "On disk").
//
// Opening a release checks, in this order, and returns it only if all pass: the signed
// release (release.Open: parse, signature by the pinned key, policy, and that the directory
// is named by the signed version), then the node image beside it against the digest the
// release signed. A node image changed after signing is refused as tampered, before anything
// boots it; a release in a directory named otherwise (v0.3.0 holding v0.2.0) is refused as
// misnamed.
package releasedir

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"

	"k8s.io/apimachinery/pkg/util/version"

	"github.com/openconstellation/constellation/internal/fileutil"
	"github.com/openconstellation/constellation/internal/release"
)

// Names inside a release directory.
const (
	// EnvelopeFile is the signed release, a DSSE envelope.
	EnvelopeFile = "release.json"
	// NodeImageDir is the node image the release signs.
	NodeImageDir = "node-image"
)

// ImageDigest computes the digest of a node image directory as the release signs it: the
// platform's (local.ImageDigest for the local provider).
type ImageDigest func(dir string) (string, error)

// Release is an opened release: every check passed.
type Release struct {
	// Dir is the release directory.
	Dir string
	*release.Verified
}

// NodeImage is the node image directory of the release.
func (r *Release) NodeImage() string { return filepath.Join(r.Dir, NodeImageDir) }

// Version is the release's version.
func (r *Release) Version() string { return r.Manifest().Version }

// IsRelease reports whether dir holds a release (it has a release.json); it checks nothing
// else.
func IsRelease(dir string) bool {
	info, err := os.Stat(filepath.Join(dir, EnvelopeFile))
	return err == nil && info.Mode().IsRegular()
}

// Open reads the release in dir and checks it: signed by key and within policy
// (release.Open), named by its signed version (dir's last element; policy.Name is set to it),
// and its node image is the one it signed.
func Open(ctx context.Context, dir string, key *release.PublicKey, policy release.Policy, digest ImageDigest) (*Release, error) {
	data, err := readBounded(filepath.Join(dir, EnvelopeFile))
	if err != nil {
		return nil, err
	}
	// A release directory is named by its version: whoever can write the directory (a
	// source, the workspace's cache of fetched releases) cannot pass one release off as
	// another.
	policy.Name = filepath.Base(filepath.Clean(dir))
	verified, err := release.Open(ctx, data, key, policy)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, EnvelopeFile), err)
	}
	r := &Release{Dir: dir, Verified: verified}
	got, err := digest(r.NodeImage())
	if err != nil {
		return nil, fmt.Errorf("release %s: node image: %w", verified.Manifest().Version, err)
	}
	if want := verified.Manifest().NodeImage.Digest; got != want {
		return nil, &release.Error{Reason: release.ReasonTampered, Err: fmt.Errorf(
			"release %s: the node image in %s has digest %s, the release signed %s (a file of it changed after signing)",
			verified.Manifest().Version, r.NodeImage(), got, want)}
	}
	return r, nil
}

func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, &release.Error{Reason: release.ReasonUnsigned, Err: fmt.Errorf(
				"%s has no %s: not a signed release (make release writes one)", filepath.Dir(path), EnvelopeFile)}
		}
		return nil, fmt.Errorf("reading the release: %w", err)
	}
	defer f.Close()
	// One byte more than the limit, so release.Parse sees an oversized file as such.
	data, err := io.ReadAll(io.LimitReader(f, release.MaxSize+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	return data, nil
}

// Write signs m for the node image in dir/node-image (which must be laid out) and writes the
// release to dir/release.json: it fills in the node image's reference and digest, so what is
// signed is what is beside it.
func Write(ctx context.Context, dir string, m release.Manifest, s *release.Signer, digest ImageDigest) error {
	d, err := digest(filepath.Join(dir, NodeImageDir))
	if err != nil {
		return fmt.Errorf("node image: %w", err)
	}
	m.NodeImage = release.Image{Ref: NodeImageDir, Digest: d}
	data, err := release.Sign(ctx, m, s)
	if err != nil {
		return err
	}
	return fileutil.WriteAtomic(filepath.Join(dir, EnvelopeFile), append(data, '\n'), 0o644)
}

// Listed is one release of a source: opened, or refused with why.
type Listed struct {
	Dir string
	// Release is set when every check passed; Err says why not otherwise.
	Release *Release
	Err     error
}

// List opens every release in source (its subdirectories that hold a release.json), each
// against key and policy; releases come newest first, refused ones last.
func List(ctx context.Context, source string, key *release.PublicKey, policy release.Policy, digest ImageDigest) ([]Listed, error) {
	entries, err := os.ReadDir(source)
	if err != nil {
		return nil, fmt.Errorf("release source: %w", err)
	}
	var out []Listed
	for _, e := range entries {
		dir := filepath.Join(source, e.Name())
		if !e.IsDir() || !IsRelease(dir) {
			continue
		}
		r, err := Open(ctx, dir, key, policy, digest)
		out = append(out, Listed{Dir: dir, Release: r, Err: err})
	}
	Sort(out)
	return out, nil
}

// Sort orders listed releases newest first, refused ones last.
func Sort(out []Listed) {
	slices.SortStableFunc(out, func(a, b Listed) int {
		switch {
		case a.Release == nil && b.Release == nil:
			return 0
		case a.Release == nil:
			return 1
		case b.Release == nil:
			return -1
		}
		// Opened releases have semantic versions (release.CheckPolicy).
		va, vb := version.MustParseSemantic(a.Release.Version()), version.MustParseSemantic(b.Release.Version())
		switch {
		case va.GreaterThan(vb):
			return -1
		case vb.GreaterThan(va):
			return 1
		}
		return 0
	})
}
