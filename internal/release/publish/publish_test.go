package publish_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
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
	index, err := json.Marshal(nodeimage.Index{Images: []nodeimage.Entry{{Ref: servicesRef, File: "services.tar", SHA256: strings.Repeat("ef", 32), Size: 1}}})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(imagesDir, nodeimage.IndexFile), index, 0o644))
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
	assert.Equal(t, release.Image{Ref: servicesRef, Digest: "sha256:" + strings.Repeat("ef", 32)}, m.ServicesImage)
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

	o.Version = "v0.3.0"
	o.ImagesDir = t.TempDir()
	_, err = publish.Publish(ctx, o)
	assert.ErrorContains(t, err, "make images")
	assert.False(t, releasedir.IsRelease(filepath.Join(source, "v0.3.0")))
}
