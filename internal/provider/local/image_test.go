package local_test

import (
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/attestation/softfirmware"
	"github.com/openconstellation/constellation/internal/kubeversion"
	"github.com/openconstellation/constellation/internal/nodeimage"
	"github.com/openconstellation/constellation/internal/provider/local"
)

func TestImageComponents(t *testing.T) {
	dir := t.TempDir()
	for _, name := range local.ImageFiles() {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte("content of "+name), 0o644))
	}
	got, err := local.ImageComponents(dir)
	require.NoError(t, err)
	want := []softfirmware.Component{
		{Name: "bootstrapper", PCR: local.PCRBootstrapper, Digest: sha256.Sum256([]byte("content of bootstrapper"))},
		{Name: "kubelet", PCR: local.PCRKubernetes, Digest: sha256.Sum256([]byte("content of kubelet"))},
		{Name: "kubeadm", PCR: local.PCRKubernetes, Digest: sha256.Sum256([]byte("content of kubeadm"))},
		{Name: "containerd.toml", PCR: local.PCRNodeConfig, Digest: sha256.Sum256([]byte("content of containerd.toml"))},
		{Name: "node-config.json", PCR: local.PCRNodeConfig, Digest: sha256.Sum256([]byte("content of node-config.json"))},
	}
	assert.Equal(t, want, got)

	// Order within a PCR is part of the measurement: kubelet before kubeadm.
	swapped := []softfirmware.Component{want[0], want[2], want[1], want[3], want[4]}
	assert.NotEqual(t, softfirmware.ExpectedPCRs(want)[local.PCRKubernetes], softfirmware.ExpectedPCRs(swapped)[local.PCRKubernetes])

	// Every missing file is named.
	require.NoError(t, os.Remove(filepath.Join(dir, "kubeadm")))
	require.NoError(t, os.Remove(filepath.Join(dir, "node-config.json")))
	_, err = local.ImageComponents(dir)
	require.Error(t, err)
	assert.ErrorContains(t, err, "measuring kubeadm")
	assert.ErrorContains(t, err, "measuring node-config.json")
	assert.ErrorIs(t, err, os.ErrNotExist)
}

// TestContainerdSandboxImage: every node's containerd (one configuration for every Kubernetes
// version) runs the pause image that kubeadm of each supported version expects, so the CRI
// never wants another pause image than the one imported.
func TestContainerdSandboxImage(t *testing.T) {
	for _, r := range kubeversion.Releases() {
		assert.Contains(t, local.ContainerdConfig, `sandbox_image = "`+nodeimage.PauseRef(r)+`"`, r.Kubernetes)
	}
}

func TestImageDigest(t *testing.T) {
	dir := t.TempDir()
	for _, name := range local.ImageFiles() {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte("content of "+name), 0o644))
	}
	got, err := local.ImageDigest(dir)
	require.NoError(t, err)
	// What sha256sum(1) gives, as docs/releases.md says.
	listing := ""
	for _, name := range local.ImageFiles() {
		listing += fmt.Sprintf("%x  %s\n", sha256.Sum256([]byte("content of "+name)), name)
	}
	assert.Equal(t, fmt.Sprintf("sha256:%x", sha256.Sum256([]byte(listing))), got)

	// Files that are not measured do not count; a changed measured file does.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "README"), []byte("not booted"), 0o644))
	again, err := local.ImageDigest(dir)
	require.NoError(t, err)
	assert.Equal(t, got, again)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "kubelet"), []byte("another kubelet"), 0o644))
	changed, err := local.ImageDigest(dir)
	require.NoError(t, err)
	assert.NotEqual(t, got, changed)

	// Container image archives the image carries count, as sha256sum lists them.
	require.NoError(t, os.MkdirAll(filepath.Join(dir, local.ImageArchivesDir), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, local.ImageArchivesDir, "services.tar"), []byte("services"), 0o644))
	withArchive, err := local.ImageDigest(dir)
	require.NoError(t, err)
	listing = ""
	for _, name := range local.ImageFiles() {
		content := "content of " + name
		if name == "kubelet" {
			content = "another kubelet"
		}
		listing += fmt.Sprintf("%x  %s\n", sha256.Sum256([]byte(content)), name)
	}
	listing += fmt.Sprintf("%x  images/services.tar\n", sha256.Sum256([]byte("services")))
	assert.Equal(t, fmt.Sprintf("sha256:%x", sha256.Sum256([]byte(listing))), withArchive)
	require.NoError(t, os.WriteFile(filepath.Join(dir, local.ImageArchivesDir, "services.tar"), []byte("tampered"), 0o644))
	tampered, err := local.ImageDigest(dir)
	require.NoError(t, err)
	assert.NotEqual(t, withArchive, tampered, "a changed archive changes the digest")

	require.NoError(t, os.Remove(filepath.Join(dir, "kubeadm")))
	_, err = local.ImageDigest(dir)
	assert.ErrorContains(t, err, "measuring kubeadm")
}
