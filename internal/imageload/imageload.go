// Package imageload reads a user's container images (docker-save archives and OCI image
// layouts) and stores them as the archives local nodes import (`constellation image load`,
// docs/local-provider.md "Your own images").
//
// Every input is read and checked before anything is written: the manifest and config must
// parse, every layer's digest and diff ID must match what the manifest and config say (the
// whole content is read and hashed), and the image must be for the nodes' platform (a
// multi-platform index gives the matching image). A corrupt or truncated input fails naming
// the input and the image, and the store is left as it was. An image is stored under a name
// derived from its reference, written to a temporary file and renamed: loading a new image
// under the same name replaces the old one, never half of it.
package imageload

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/match"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

// NodePlatform is the platform of the local provider's nodes: the host's.
var NodePlatform = v1.Platform{OS: "linux", Architecture: runtime.GOARCH}

// Image is one image read from an input, checked.
type Image struct {
	// Ref is the name the nodes know it by.
	Ref name.Reference
	// Digest is the digest of its manifest.
	Digest v1.Hash
	// Source names the input it came from.
	Source string

	img v1.Image
}

// OCI annotations that name an image of a layout: containerd's full name, else the OCI
// ref name when it is a full reference (not just a tag).
const (
	annotationContainerdName = "io.containerd.image.name"
	annotationRefName        = "org.opencontainers.image.ref.name"
)

// Read reads every input (a docker-save archive file or an OCI layout directory) and
// returns its images for platform, each checked (package doc). It writes nothing.
func Read(inputs []string, platform v1.Platform) ([]Image, error) {
	if len(inputs) == 0 {
		return nil, errors.New("no image archive or OCI layout given")
	}
	var out []Image
	for _, in := range inputs {
		info, err := os.Stat(in)
		if err != nil {
			return nil, err
		}
		var imgs []Image
		if info.IsDir() {
			imgs, err = readLayout(in, platform)
		} else {
			imgs, err = readArchive(in)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", in, err)
		}
		for _, img := range imgs {
			if err := check(img, platform); err != nil {
				return nil, fmt.Errorf("%s: image %s: %w", in, img.Ref, err)
			}
		}
		out = append(out, imgs...)
	}
	return out, nil
}

// readArchive reads a docker-save archive: every image it lists under a name.
func readArchive(path string) ([]Image, error) {
	opener := func() (io.ReadCloser, error) { return os.Open(path) }
	manifest, err := tarball.LoadManifest(opener)
	if err != nil {
		return nil, fmt.Errorf("not a docker-save archive (docker save, podman save) nor an OCI layout directory: %w", err)
	}
	var out []Image
	for i, d := range manifest {
		if len(d.RepoTags) == 0 {
			return nil, fmt.Errorf("image %d (config %s) has no name: save it by name (docker save NAME:TAG)", i+1, d.Config)
		}
		for _, t := range d.RepoTags {
			tag, err := name.NewTag(t)
			if err != nil {
				return nil, fmt.Errorf("image %d: name %q: %w", i+1, t, err)
			}
			img, err := tarball.Image(opener, &tag)
			if err != nil {
				return nil, fmt.Errorf("image %s: %w", t, err)
			}
			digest, err := img.Digest()
			if err != nil {
				return nil, fmt.Errorf("image %s: %w", t, err)
			}
			out = append(out, Image{Ref: tag, Digest: digest, Source: path, img: img})
		}
	}
	return out, nil
}

// readLayout reads an OCI image layout: every image its index names, an image index (several
// platforms) resolved to platform's image.
func readLayout(dir string, platform v1.Platform) ([]Image, error) {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("not an OCI image layout (index.json, blobs/): %w", err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("OCI layout index: %w", err)
	}
	if len(im.Manifests) == 0 {
		return nil, errors.New("the OCI layout holds no image")
	}
	var out []Image
	for _, d := range im.Manifests {
		ref, err := layoutName(d)
		if err != nil {
			return nil, err
		}
		var img v1.Image
		switch {
		case d.MediaType.IsIndex():
			child, err := idx.ImageIndex(d.Digest)
			if err != nil {
				return nil, fmt.Errorf("image %s: %w", ref, err)
			}
			imgs, err := partial.FindImages(child, match.Platforms(platform))
			if err != nil {
				return nil, fmt.Errorf("image %s: %w", ref, err)
			}
			if len(imgs) != 1 {
				return nil, fmt.Errorf("image %s: %d images for %s/%s in its index, want 1", ref, len(imgs), platform.OS, platform.Architecture)
			}
			img = imgs[0]
		case d.MediaType.IsImage():
			if img, err = idx.Image(d.Digest); err != nil {
				return nil, fmt.Errorf("image %s: %w", ref, err)
			}
		default:
			return nil, fmt.Errorf("image %s: media type %s is neither an image nor an index", ref, d.MediaType)
		}
		digest, err := img.Digest()
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", ref, err)
		}
		out = append(out, Image{Ref: ref, Digest: digest, Source: dir, img: img})
	}
	return out, nil
}

// layoutName is the full name of a layout's image from its annotations.
func layoutName(d v1.Descriptor) (name.Reference, error) {
	for _, key := range []string{annotationContainerdName, annotationRefName} {
		if n := d.Annotations[key]; n != "" {
			if ref, err := name.ParseReference(n, name.StrictValidation); err == nil && strings.ContainsAny(n, "/:@") {
				return ref, nil
			}
		}
	}
	return nil, fmt.Errorf("image %s has no full name (annotation %s or %s, such as example.com/app:v1): export it by name", d.Digest, annotationContainerdName, annotationRefName)
}

// check validates img completely (every blob read and hashed) and its platform.
func check(img Image, platform v1.Platform) error {
	if err := validate.Image(img.img); err != nil {
		return fmt.Errorf("corrupt or truncated: %w", err)
	}
	cfg, err := img.img.ConfigFile()
	if err != nil {
		return err
	}
	if cfg.OS != platform.OS || cfg.Architecture != platform.Architecture {
		return fmt.Errorf("for %s/%s, the nodes run %s/%s", cfg.OS, cfg.Architecture, platform.OS, platform.Architecture)
	}
	return nil
}

// Store writes each image as a docker archive into dir (ArchiveName), atomically, and
// returns the archives' paths.
func Store(dir string, images []Image) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var paths []string
	for _, img := range images {
		path := filepath.Join(dir, ArchiveName(img.Ref))
		tmp, err := os.CreateTemp(dir, ".load-*")
		if err != nil {
			return nil, err
		}
		err = tarball.Write(img.Ref, img.img, tmp)
		if cerr := tmp.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.Rename(tmp.Name(), path)
		}
		if err != nil {
			_ = os.Remove(tmp.Name())
			return nil, fmt.Errorf("storing %s: %w", img.Ref, err)
		}
		paths = append(paths, path)
	}
	return paths, nil
}

// ArchiveName is the file an image of ref is stored as: one per name, so a new image under a
// name replaces the old one.
func ArchiveName(ref name.Reference) string {
	sum := sha256.Sum256([]byte(ref.Name()))
	return hex.EncodeToString(sum[:12]) + ".tar"
}
