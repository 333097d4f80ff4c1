package publish_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/nodeimage"
	"github.com/openconstellation/constellation/internal/provider/local"
	localplatform "github.com/openconstellation/constellation/internal/provider/local/platform"
	"github.com/openconstellation/constellation/internal/release"
	"github.com/openconstellation/constellation/internal/release/publish"
	"github.com/openconstellation/constellation/internal/release/releasedir"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

const servicesRef = "localhost/constellation/services:abc"

func baseImage(t *testing.T) (image, imagesDir string) {
	t.Helper()
	image, imagesDir = t.TempDir(), t.TempDir()
	for _, name := range local.ImageFiles() {
		require.NoError(t, os.WriteFile(filepath.Join(image, name), []byte("content of "+name), 0o755))
	}
	nc, err := local.NodeConfig{KubernetesVersion: "v1.34.4", Provider: "local", ServicesImage: servicesRef}.Marshal()
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(image, local.NodeConfigFile), nc, 0o644))
	require.NoError(t, os.MkdirAll(filepath.Join(imagesDir, "bin"), 0o755))
	for _, name := range nodeimage.ServiceBinaries {
		require.NoError(t, os.WriteFile(filepath.Join(imagesDir, "bin", name), []byte("binary "+name), 0o755))
	}
	return image, imagesDir
}

func TestPublish(t *testing.T) {
	ctx := context.Background()
	key, err := release.GenerateKey()
	require.NoError(t, err)
	image, imagesDir := baseImage(t)
	source := t.TempDir()
	o := publish.Options{Source: source, Version: "v0.2.0", BaseImage: image, ImagesDir: imagesDir, Platform: localplatform.Platform{}, Signer: key}

	dir, err := publish.Publish(ctx, o)
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(source, "v0.2.0"), dir)

	r, err := releasedir.Open(ctx, dir, key.Public(), release.Policy{Variant: variant.QEMUVTPM}, local.ImageDigest)
	require.NoError(t, err)
	m := r.Manifest()
	assert.Equal(t, "v1.34.4", m.KubernetesVersion)
	// The release carries its own services image, named by the release, in its node image.
	archive := filepath.Join(r.NodeImage(), local.ImageArchivesDir, "services.tar")
	data, err := os.ReadFile(archive)
	require.NoError(t, err)
	assert.Equal(t, fmt.Sprintf("sha256:%x", sha256.Sum256(data)), m.ServicesImage.Digest)
	assert.Equal(t, nodeimage.ServicesRepo, nodeimage.Repository(m.ServicesImage.Ref))
	assert.NotEqual(t, servicesRef, m.ServicesImage.Ref)
	assert.Contains(t, string(data), nodeimage.ReleaseEnv+"=v0.2.0")
	nc, err := local.ParseNodeConfig(mustRead(t, filepath.Join(r.NodeImage(), local.NodeConfigFile)))
	require.NoError(t, err)
	assert.Equal(t, m.ServicesImage.Ref, nc.ServicesImage, "its control planes deploy the release's services")
	assert.NoDirExists(t, filepath.Join(dir, "services-build"), "nothing but the release is left")
	ref, ok := r.Reference(variant.QEMUVTPM)
	require.True(t, ok)
	values, err := localplatform.Platform{}.ReferenceValues(r.NodeImage())
	require.NoError(t, err)
	require.Len(t, ref.Measurements, 1)
	assert.Equal(t, "v0.2.0", ref.Measurements[0].Name)
	assert.Equal(t, values.Measurements, ref.Measurements[0].Measurements, "the release signs what its image measures")
	base, err := localplatform.Platform{}.ReferenceValues(image)
	require.NoError(t, err)
	assert.NotEqual(t, base.Measurements[local.PCRNodeConfig], values.Measurements[local.PCRNodeConfig], "a release measures differently from its base")

	_, err = publish.Publish(ctx, o)
	assert.ErrorIs(t, err, os.ErrExist, "a published version never changes")

	// A release that upgrades from v0.2.0 and from the plain base image: its nodes trust
	// the join services of both, as signed and as measured.
	next := o
	next.Version, next.From = "v0.2.1", []string{dir, image}
	nextDir, err := publish.Publish(ctx, next)
	require.NoError(t, err)
	nc, err = local.ParseNodeConfig(mustRead(t, filepath.Join(nextDir, releasedir.NodeImageDir, local.NodeConfigFile)))
	require.NoError(t, err)
	require.Len(t, nc.JoinServiceSets, 2)
	assert.Equal(t, ref.Measurements[0], nc.JoinServiceSets[0], "v0.2.0's set as it signed it")
	assert.Equal(t, base.Measurements, nc.JoinServiceSets[1].Measurements, "the base image as measured")
	// Its nodes can run v0.2.0's services, which the cluster runs until the upgrade rolls
	// them: its image carries them besides its own.
	carried, err := local.ImageArchives(filepath.Join(nextDir, releasedir.NodeImageDir))
	require.NoError(t, err)
	own := filepath.Join(nextDir, releasedir.NodeImageDir, local.ImageArchivesDir, "services.tar")
	previous := filepath.Join(nextDir, releasedir.NodeImageDir, local.ImageArchivesDir, "services-v0.2.0.tar")
	assert.ElementsMatch(t, []string{own, previous}, carried)
	assert.Equal(t, data, mustRead(t, previous), "v0.2.0's own services archive")
	assert.NotEqual(t, data, mustRead(t, own))

	other, err := release.GenerateKey()
	require.NoError(t, err)
	bad := next
	bad.Version, bad.Signer, bad.From = "v0.2.2", other, []string{dir}
	_, err = publish.Publish(ctx, bad)
	assert.Equal(t, release.ReasonWrongKey, release.ReasonOf(err), "a release upgrades only from releases of its own key: %v", err)

	o.Version = "v0.3.0"
	o.ImagesDir = t.TempDir()
	_, err = publish.Publish(ctx, o)
	assert.ErrorContains(t, err, "make images")
	assert.False(t, releasedir.IsRelease(filepath.Join(source, "v0.3.0")))
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	return data
}

// The version names the release's directory, which Publish clears before laying it out: a
// version that is not one path element is refused before anything on disk is touched.
func TestPublishRefusesAVersionThatIsNotOne(t *testing.T) {
	key, err := release.GenerateKey()
	require.NoError(t, err)
	image, imagesDir := baseImage(t)
	parent := t.TempDir()
	source := filepath.Join(parent, "releases")
	require.NoError(t, os.MkdirAll(source, 0o755))
	keep := filepath.Join(parent, "keep")
	require.NoError(t, os.WriteFile(keep, []byte("not the release's"), 0o644))
	for _, v := range []string{"..", "../keep", "v0.2.0/../..", "0.2.0", ""} {
		_, err := publish.Publish(context.Background(), publish.Options{Source: source, Version: v, BaseImage: image, ImagesDir: imagesDir,
			Platform: localplatform.Platform{}, Signer: key})
		assert.ErrorContains(t, err, "want v and a semantic version", "%q", v)
		assert.FileExists(t, keep)
	}
}

// A release names its images in clouds' image stores, signed with the rest; --cloud-image
// is read strictly, and a malformed one refused before anything is laid out.
func TestPublishCloudImages(t *testing.T) {
	key, err := release.GenerateKey()
	require.NoError(t, err)
	image, imagesDir := baseImage(t)
	source := t.TempDir()
	const ref = "/subscriptions/s/resourceGroups/images/providers/Microsoft.Compute/galleries/g/images/node/versions/0.2.0"
	digest := "sha256:" + fmt.Sprintf("%x", sha256.Sum256([]byte("disk")))
	azure, err := publish.ParseCloudImage("azure=" + ref + "@" + digest)
	require.NoError(t, err)
	assert.Equal(t, release.CloudImage{Provider: "azure", Ref: ref, Digest: digest}, azure)

	dir, err := publish.Publish(context.Background(), publish.Options{Source: source, Version: "v0.2.0", BaseImage: image, ImagesDir: imagesDir,
		Platform: localplatform.Platform{}, Signer: key, CloudImages: []release.CloudImage{azure}})
	require.NoError(t, err)
	r, err := releasedir.Open(context.Background(), dir, key.Public(), release.Policy{CloudImageOf: "azure"}, local.ImageDigest)
	require.NoError(t, err)
	got, ok := r.CloudImage("azure")
	require.True(t, ok)
	assert.Equal(t, azure, got)

	for _, bad := range []string{
		"azure",                         // no reference
		"azure=" + ref,                  // no digest
		"azure=" + ref + "@sha256:abc",  // short digest
		"Azure=" + ref + "@" + digest,   // not a provider's name
		"azure=" + ref + " x@" + digest, // a space in the reference
		"=" + ref + "@" + digest,        // no provider
		"azure=@" + digest,              // empty reference
	} {
		_, err := publish.ParseCloudImage(bad)
		assert.Error(t, err, "%q", bad)
	}
	_, err = publish.Publish(context.Background(), publish.Options{Source: source, Version: "v0.3.0", BaseImage: image, ImagesDir: imagesDir,
		Platform: localplatform.Platform{}, Signer: key, CloudImages: []release.CloudImage{azure, azure}})
	assert.ErrorContains(t, err, "provider azure has two images")
	assert.NoDirExists(t, filepath.Join(source, "v0.3.0"))
}
