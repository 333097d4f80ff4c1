package platform

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/attestation/softfirmware"
	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/provider/local"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

func TestCheckCreate(t *testing.T) {
	testCases := map[string]struct {
		edit    func(*config.Config)
		wantErr string
	}{
		"valid":       {edit: func(*config.Config) {}},
		"no provider": {edit: func(c *config.Config) { c.Provider = nil }, wantErr: "provider.local: missing"},
		"other variant": {
			edit:    func(c *config.Config) { c.Attestation = config.AttestationFor(variant.QEMUTDX, config.VariantConfig{}) },
			wantErr: "attestation: the local provider's nodes attest with qemu-vtpm (attestation.qemuVTPM)",
		},
		"other pod network": {
			edit:    func(c *config.Config) { c.Network.PodCIDR = "10.200.0.0/16" },
			wantErr: "network: the local provider uses podCIDR 10.244.0.0/16 and serviceCIDR 10.96.0.0/12 (got 10.200.0.0/16 and 10.96.0.0/12)",
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			c := config.Default()
			c.Provider = config.ProviderFor(Name, config.ProviderBlock{ControlPlanes: 1, Image: "image"})
			c.Attestation = config.AttestationFor(variant.QEMUVTPM, config.VariantConfig{})
			tc.edit(c)
			err := checkCreate(c, Name)
			if tc.wantErr == "" {
				assert.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tc.wantErr)
		})
	}
}

// TestReferenceValues: the platform's reference values of an image are what the local
// provider measures at boot, each register named by the files it measures.
func TestReferenceValues(t *testing.T) {
	dir := t.TempDir()
	for _, name := range local.ImageFiles() {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte("content of "+name), 0o644))
	}
	rv, err := Platform{}.ReferenceValues(dir)
	require.NoError(t, err)
	components, err := local.ImageComponents(dir)
	require.NoError(t, err)
	assert.Equal(t, softfirmware.ExpectedPCRs(components), rv.Measurements)
	assert.Equal(t, []string{"kubelet", "kubeadm"}, rv.Components[local.PCRKubernetes])
}

func TestFolderAndInitSecret(t *testing.T) {
	ws := t.TempDir()
	assert.Equal(t, filepath.Join(ws, "mini"), Platform{}.Folder(ws))
	_, err := Platform{}.InitSecret(ws)
	assert.ErrorContains(t, err, "the init secret of the local cluster")
	require.NoError(t, os.MkdirAll(Platform{}.Folder(ws), 0o700))
	hash, err := writeInitSecret(Platform{}.Folder(ws))
	require.NoError(t, err)
	assert.NotEmpty(t, hash)
	secret, err := Platform{}.InitSecret(ws)
	require.NoError(t, err)
	assert.Len(t, secret, 32)
	info, err := os.Stat(filepath.Join(Platform{}.Folder(ws), initSecretFile))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm(), "the init secret is readable by its owner only")
}

// TestLayOutReleaseImage: a release's image is its base's, stamped with the version: only
// the node configuration's register changes, and laying it out again (into the same
// directory, over hard links to the base) leaves the base intact.
func TestLayOutReleaseImage(t *testing.T) {
	base := t.TempDir()
	for _, name := range local.ImageFiles() {
		require.NoError(t, os.WriteFile(filepath.Join(base, name), []byte("content of "+name), 0o644))
	}
	nodeConfig := local.NodeConfig{KubernetesVersion: "v1.34.4", Provider: "local", ServicesImage: "localhost/constellation/services:abc"}
	data, err := nodeConfig.Marshal()
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(base, local.NodeConfigFile), data, 0o644))

	services := filepath.Join(t.TempDir(), "services.tar")
	require.NoError(t, os.WriteFile(services, []byte("the release's services image"), 0o644))
	const servicesRef = "localhost/constellation/services:release"
	dir := filepath.Join(t.TempDir(), "node-image")
	for range 2 {
		facts, err := Platform{}.LayOutReleaseImage(dir, base, provider.ReleaseImage{Version: "v0.2.0", ServicesRef: servicesRef, ServicesArchive: services})
		require.NoError(t, err)
		assert.Equal(t, "v1.34.4", facts.KubernetesVersion)
		assert.Equal(t, servicesRef, facts.ServicesImage, "the release's services image")
	}
	carried, err := local.ImageArchives(dir)
	require.NoError(t, err)
	assert.Equal(t, []string{filepath.Join(dir, local.ImageArchivesDir, "services.tar")}, carried, "the image carries the services archive")
	got, err := os.ReadFile(filepath.Join(base, "bootstrapper"))
	require.NoError(t, err)
	assert.Equal(t, "content of bootstrapper", string(got), "the base image is never written")

	baseValues, err := Platform{}.ReferenceValues(base)
	require.NoError(t, err)
	released, err := Platform{}.ReferenceValues(dir)
	require.NoError(t, err)
	for _, pcr := range released.Measurements.Indices() {
		if pcr == local.PCRNodeConfig {
			assert.NotEqual(t, baseValues.Measurements[pcr], released.Measurements[pcr], "PCR %d", pcr)
			continue
		}
		assert.Equal(t, baseValues.Measurements[pcr], released.Measurements[pcr], "PCR %d", pcr)
	}
	stamped, err := os.ReadFile(filepath.Join(dir, local.NodeConfigFile))
	require.NoError(t, err)
	parsed, err := local.ParseNodeConfig(stamped)
	require.NoError(t, err)
	assert.Equal(t, "v0.2.0", parsed.Release)
	assert.Equal(t, servicesRef, parsed.ServicesImage)
}
