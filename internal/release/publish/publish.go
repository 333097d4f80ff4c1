// Package publish makes releases: it lays out a release's node image from a base image,
// measures it with the platform's rules, and signs the manifest with the release key
// (docs/releases.md "Making a release"). cmd/release is its command line; the CLI only ever
// reads releases (internal/release/releasedir).
package publish

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/fileutil"
	"github.com/openconstellation/constellation/internal/nodeimage"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/release"
	"github.com/openconstellation/constellation/internal/release/releasedir"
	"github.com/openconstellation/constellation/internal/release/releasesource"
	"github.com/openconstellation/constellation/pkg/attestation/choose"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
)

// Options say what to release.
type Options struct {
	// Source is the release source the release is written into, as Source/<Version>.
	Source string
	// Version is the release's semantic version ("v0.2.0").
	Version string
	// BaseImage is the node image the release's image is made from (stamped with Version).
	BaseImage string
	// ImagesDir is where `make images` wrote the container images: the release's services
	// image is built from the services binaries in its bin folder.
	ImagesDir string
	// Platform measures and lays out node images.
	Platform provider.Platform
	// Signer is the release key.
	Signer *release.Signer
	// From are the images the release upgrades from: release directories (signed by
	// Signer: their reference sets are taken as signed) or plain node images (measured).
	// The release's nodes trust their join services besides their own image, so that its
	// first node can join a cluster of the previous release.
	From []string
	// CloudImages are the release's images in clouds' image stores, made from its node
	// image (constellation image upload), signed with the rest: what a cloud's nodes of the
	// release boot.
	CloudImages []release.CloudImage
}

// Publish writes release o.Version to o.Source/o.Version and returns its directory. It
// refuses to replace an existing release: a published version never changes.
func Publish(ctx context.Context, o Options) (string, error) {
	images, ok := o.Platform.(provider.NodeImages)
	if !ok {
		return "", fmt.Errorf("provider %s has no node images this tool can release", o.Platform.Name())
	}
	// The version names the release's directory (which is removed and laid out again below):
	// only a release version, one path element, may.
	if !release.IsVersion(o.Version) {
		return "", fmt.Errorf("version %q: want v and a semantic version, e.g. v0.2.0 or v0.3.0-rc.1", o.Version)
	}
	if err := release.CheckCloudImages(o.CloudImages); err != nil {
		return "", err
	}
	dir := filepath.Join(o.Source, o.Version)
	if releasedir.IsRelease(dir) {
		return "", fmt.Errorf("release %s exists in %s: a published version never changes (choose another version): %w", o.Version, dir, os.ErrExist)
	}
	// A directory left by an interrupted run (no release.json yet) is laid out again.
	if err := os.RemoveAll(dir); err != nil {
		return "", err
	}
	from, fromImages, err := fromSets(ctx, o, images)
	if err != nil {
		return "", err
	}
	nodeImage := filepath.Join(dir, releasedir.NodeImageDir)
	services, err := buildServices(o, filepath.Join(dir, "services-build"))
	if err != nil {
		return "", err
	}
	facts, err := images.LayOutReleaseImage(nodeImage, o.BaseImage, provider.ReleaseImage{
		Version: o.Version, JoinServiceSets: from, ServicesRef: services.Ref, ServicesArchive: services.File,
		UpgradesFrom: fromImages,
	})
	if err != nil {
		return "", fmt.Errorf("laying out the node image: %w", err)
	}
	if err := os.RemoveAll(filepath.Dir(services.File)); err != nil {
		return "", err
	}
	values, err := o.Platform.ReferenceValues(nodeImage)
	if err != nil {
		return "", fmt.Errorf("measuring the node image: %w", err)
	}
	// The platforms that lay out release images (provider.NodeImages) have one variant.
	m := release.Manifest{
		Version:           o.Version,
		KubernetesVersion: facts.KubernetesVersion,
		ServicesImage:     release.Image{Ref: services.Ref, Digest: "sha256:" + services.SHA256},
		CloudImages:       o.CloudImages,
		References: []choose.Reference{{
			Variant: o.Platform.ConfigRules().Variants()[0],
			Values:  choose.Values{Measurements: measurements.ReferenceSets{{Name: o.Version, Measurements: values.Measurements}}},
		}},
	}
	if err := releasedir.Write(ctx, dir, m, o.Signer, images.ImageDigest); err != nil {
		return "", err
	}
	if err := writeSourceFiles(o.Source, nodeImage, images); err != nil {
		return "", err
	}
	return dir, nil
}

// writeSourceFiles writes what serving the source over HTTP needs (releasesource): the node
// image's listing beside it, and the source's index of releases.
func writeSourceFiles(source, nodeImage string, images provider.NodeImages) error {
	listing, err := images.ImageListing(nodeImage)
	if err != nil {
		return err
	}
	if err := fileutil.WriteAtomic(filepath.Join(nodeImage, releasesource.ListingFile), listing, 0o644); err != nil {
		return err
	}
	entries, err := os.ReadDir(source)
	if err != nil {
		return err
	}
	idx := releasesource.Index{Releases: []string{}}
	for _, e := range entries {
		// Only directories named by a version: a reader opens each under its name.
		if e.IsDir() && release.IsVersion(e.Name()) && releasedir.IsRelease(filepath.Join(source, e.Name())) {
			idx.Releases = append(idx.Releases, e.Name())
		}
	}
	data, err := json.MarshalIndent(idx, "", "  ")
	if err != nil {
		return err
	}
	return fileutil.WriteAtomic(filepath.Join(source, releasesource.IndexFile), append(data, '\n'), 0o644)
}

// buildServices builds the release's services image into dir: the services binaries `make
// images` built (<ImagesDir>/bin) with the release named in it (nodeimage.ReleaseServices), so
// every release's services image has a tag of its own; the release carries the archive.
func buildServices(o Options, dir string) (nodeimage.Result, error) {
	var binaries []string
	for _, name := range nodeimage.ServiceBinaries {
		bin := filepath.Join(o.ImagesDir, "bin", name)
		if _, err := os.Stat(bin); err != nil {
			return nodeimage.Result{}, fmt.Errorf("the services binaries (run 'make images' first): %w", err)
		}
		binaries = append(binaries, bin)
	}
	img, err := nodeimage.ReleaseServices(o.Version, binaries...)
	if err != nil {
		return nodeimage.Result{}, err
	}
	res, err := nodeimage.Build(img.Spec, filepath.Join(dir, "services.tar"))
	if err != nil {
		return nodeimage.Result{}, fmt.Errorf("building the services image: %w", err)
	}
	return res, nil
}

// fromSets are the reference sets of the images o.From names, for the platform's variant: a
// release's as it signed them (opened with the signer's own key), a plain image's measured
// and named as `config generate` names it; and the node images of the releases among them
// (verified), whose services the release's nodes must be able to run.
func fromSets(ctx context.Context, o Options, images provider.NodeImages) (measurements.ReferenceSets, []string, error) {
	v := o.Platform.ConfigRules().Variants()[0]
	var sets measurements.ReferenceSets
	var releaseImages []string
	for _, dir := range o.From {
		if releasedir.IsRelease(dir) {
			r, err := releasedir.Open(ctx, dir, o.Signer.Public(), release.Policy{Variant: v}, images.ImageDigest)
			if err != nil {
				return nil, nil, fmt.Errorf("--from %s: %w", dir, err)
			}
			ref, _ := r.Reference(v) // the policy required it
			sets = append(sets, ref.Measurements...)
			releaseImages = append(releaseImages, r.NodeImage())
			continue
		}
		values, err := o.Platform.ReferenceValues(dir)
		if err != nil {
			return nil, nil, fmt.Errorf("--from %s: measuring the node image: %w", dir, err)
		}
		sets = append(sets, measurements.ReferenceSet{Name: config.ReferenceSetName("local-", values.Measurements), Measurements: values.Measurements})
	}
	return sets, releaseImages, nil
}

// ParseCloudImage reads a cloud image as --cloud-image gives it: PROVIDER=REF@sha256:HEX.
func ParseCloudImage(s string) (release.CloudImage, error) {
	provider, rest, ok := strings.Cut(s, "=")
	i := strings.LastIndex(rest, "@sha256:")
	if !ok || i < 0 {
		return release.CloudImage{}, fmt.Errorf("--cloud-image %q: want PROVIDER=REF@sha256:<64 hex digits>", s)
	}
	c := release.CloudImage{Provider: provider, Ref: rest[:i], Digest: rest[i+1:]}
	if err := release.CheckCloudImages([]release.CloudImage{c}); err != nil {
		return release.CloudImage{}, fmt.Errorf("--cloud-image %q: %w", s, err)
	}
	return c, nil
}
