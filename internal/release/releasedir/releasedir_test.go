package releasedir_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/provider/local"
	"github.com/openconstellation/constellation/internal/release"
	"github.com/openconstellation/constellation/internal/release/releasedir"
	"github.com/openconstellation/constellation/pkg/attestation/choose"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/measurements/measurementstest"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// writeRelease lays out a node image with marker in its files and signs it as version.
func writeRelease(t *testing.T, source, version, marker string, s *release.Signer) string {
	t.Helper()
	dir := filepath.Join(source, version)
	img := filepath.Join(dir, releasedir.NodeImageDir)
	require.NoError(t, os.MkdirAll(img, 0o755))
	for _, name := range local.ImageFiles() {
		require.NoError(t, os.WriteFile(filepath.Join(img, name), []byte(name+" "+marker), 0o644))
	}
	m := release.Manifest{
		Version:           version,
		KubernetesVersion: "v1.34.4",
		ServicesImage:     release.Image{Ref: "localhost/constellation/services:abc", Digest: "sha256:" + strings.Repeat("cd", 32)},
		References: []choose.Reference{{Variant: variant.QEMUVTPM, Values: choose.Values{
			Measurements: measurements.ReferenceSets{{Name: version, Measurements: measurementstest.Image(variant.QEMUVTPM, map[uint32][]byte{11: bytes.Repeat([]byte{1}, 32)})}},
		}}},
	}
	require.NoError(t, releasedir.Write(context.Background(), dir, m, s, local.ImageDigest))
	return dir
}

func TestOpen(t *testing.T) {
	ctx := context.Background()
	key, err := release.GenerateKey()
	require.NoError(t, err)
	other, err := release.GenerateKey()
	require.NoError(t, err)
	policy := release.Policy{Variant: variant.QEMUVTPM}

	t.Run("signed and intact", func(t *testing.T) {
		dir := writeRelease(t, t.TempDir(), "v0.2.0", "b", key)
		assert.True(t, releasedir.IsRelease(dir))
		r, err := releasedir.Open(ctx, dir, key.Public(), policy, local.ImageDigest)
		require.NoError(t, err)
		assert.Equal(t, "v0.2.0", r.Version())
		assert.Equal(t, filepath.Join(dir, "node-image"), r.NodeImage())
		want, err := local.ImageDigest(r.NodeImage())
		require.NoError(t, err)
		assert.Equal(t, want, r.Manifest().NodeImage.Digest)
	})

	for name, tc := range map[string]struct {
		change  func(t *testing.T, dir string)
		key     *release.PublicKey
		reason  release.Reason
		wantErr string
	}{
		"a node image file replaced after signing": {
			change: func(t *testing.T, dir string) {
				require.NoError(t, os.WriteFile(filepath.Join(dir, "node-image", "bootstrapper"), []byte("evil"), 0o755))
			},
			reason: release.ReasonTampered, wantErr: "changed after signing",
		},
		"a node image file missing": {
			change: func(t *testing.T, dir string) {
				require.NoError(t, os.Remove(filepath.Join(dir, "node-image", "kubeadm")))
			},
			wantErr: "measuring kubeadm",
		},
		"no release.json: a plain node image": {
			change: func(t *testing.T, dir string) {
				require.NoError(t, os.Remove(filepath.Join(dir, "release.json")))
			},
			reason: release.ReasonUnsigned, wantErr: "not a signed release",
		},
		"signed by another key": {
			key:    other.Public(),
			reason: release.ReasonWrongKey,
		},
		"a measurement changed in release.json": {
			change: func(t *testing.T, dir string) {
				// The measurement is base64 inside the payload: change the payload's bytes.
				p := filepath.Join(dir, "release.json")
				data, err := os.ReadFile(p)
				require.NoError(t, err)
				i := bytes.Index(data, []byte(`"payload":"`)) + len(`"payload":"`) + 40
				data[i] ^= 0x01
				require.NoError(t, os.WriteFile(p, data, 0o644))
			},
			reason: release.ReasonTampered,
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := writeRelease(t, t.TempDir(), "v0.2.0", "b", key)
			if tc.change != nil {
				tc.change(t, dir)
			}
			k := key.Public()
			if tc.key != nil {
				k = tc.key
			}
			r, err := releasedir.Open(ctx, dir, k, policy, local.ImageDigest)
			require.Error(t, err)
			assert.Nil(t, r)
			if tc.reason != 0 {
				assert.Equal(t, tc.reason, release.ReasonOf(err), "%v", err)
			}
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
			}
		})
	}
}

func TestList(t *testing.T) {
	ctx := context.Background()
	key, err := release.GenerateKey()
	require.NoError(t, err)
	other, err := release.GenerateKey()
	require.NoError(t, err)
	source := t.TempDir()
	writeRelease(t, source, "v0.1.0", "a", key)
	writeRelease(t, source, "v0.10.0", "c", key)
	writeRelease(t, source, "v0.2.0", "b", key)
	writeRelease(t, source, "v0.3.0", "d", other)
	require.NoError(t, os.MkdirAll(filepath.Join(source, "not-a-release"), 0o755))

	listed, err := releasedir.List(ctx, source, key.Public(), release.Policy{Running: "v0.2.0"}, local.ImageDigest)
	require.NoError(t, err)
	var got []string
	for _, l := range listed {
		if l.Release != nil {
			got = append(got, l.Release.Version())
			continue
		}
		got = append(got, filepath.Base(l.Dir)+": "+release.ReasonOf(l.Err).String())
	}
	assert.Equal(t, []string{
		"v0.10.0", "v0.2.0",
		"v0.1.0: release is a downgrade",
		"v0.3.0: release not signed by the pinned release key",
	}, got, "newest first (semantic order), refused last, each with why")

	_, err = releasedir.List(ctx, filepath.Join(source, "missing"), key.Public(), release.Policy{}, local.ImageDigest)
	assert.ErrorContains(t, err, "release source")
}
