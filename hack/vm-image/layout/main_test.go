package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/kubeversion"
	"github.com/openconstellation/constellation/internal/nodeimage"
	"github.com/openconstellation/constellation/internal/provider/local"
)

// fakeInputs writes what make build, make kube and make images leave: a bootstrapper, a
// kubelet and kubeadm reporting version, and an image index with archives of two versions and
// ours.
func fakeInputs(t *testing.T, version string) (bootstrapper, kubeDir, imagesDir string) {
	t.Helper()
	root := t.TempDir()
	bootstrapper = filepath.Join(root, "bootstrapper")
	require.NoError(t, os.WriteFile(bootstrapper, []byte("bootstrapper"), 0o755))
	kubeDir = filepath.Join(root, "kube")
	bin := filepath.Join(kubeDir, version, "bin")
	require.NoError(t, os.MkdirAll(bin, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(bin, "kubelet"), []byte("#!/bin/sh\necho Kubernetes "+version+"\n"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(bin, "kubeadm"), []byte("#!/bin/sh\necho "+version+"\n"), 0o755))
	imagesDir = filepath.Join(root, "images")
	require.NoError(t, os.MkdirAll(imagesDir, 0o755))
	idx := nodeimage.Index{Images: []nodeimage.Entry{{Ref: nodeimage.ServicesRepo + ":0123", File: "services.tar"}}}
	for _, r := range kubeversion.Releases() {
		for _, ref := range nodeimage.ReleaseRefs(r) {
			file := r.Kubernetes + "-" + filepath.Base(nodeimage.Repository(ref)) + ".tar"
			idx.Images = append(idx.Images, nodeimage.Entry{Ref: ref, File: file})
		}
	}
	for _, e := range idx.Images {
		require.NoError(t, os.WriteFile(filepath.Join(imagesDir, e.File), []byte(e.Ref), 0o644))
	}
	data, err := json.Marshal(idx)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(imagesDir, nodeimage.IndexFile), data, 0o644))
	return bootstrapper, kubeDir, imagesDir
}

func TestRun(t *testing.T) {
	version := kubeversion.Default
	bootstrapper, kubeDir, imagesDir := fakeInputs(t, version)
	out := filepath.Join(t.TempDir(), "constellation")
	require.NoError(t, run(out, bootstrapper, version, kubeDir, imagesDir))

	// The node image directory, as the sandbox's, each file a copy of its own.
	for _, f := range local.ImageFiles() {
		info, err := os.Stat(filepath.Join(out, "image", f))
		require.NoError(t, err)
		assert.Equal(t, uint64(1), uint64(info.Sys().(*syscall.Stat_t).Nlink), "%s is a copy, not a link", f)
	}
	info, err := os.Stat(filepath.Join(out, "image", "bootstrapper"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o755), info.Mode().Perm())
	data, err := os.ReadFile(filepath.Join(out, "image", local.NodeConfigFile))
	require.NoError(t, err)
	nc, err := local.ParseNodeConfig(data)
	require.NoError(t, err)
	assert.Equal(t, version, nc.KubernetesVersion)
	assert.Equal(t, nodeimage.ServicesRepo+":0123", nc.ServicesImage)

	// The archives of the image's version and ours only, with an index the node reads as it
	// reads _output/images.
	idx, err := nodeimage.ReadIndex(filepath.Join(out, "images"))
	require.NoError(t, err)
	all, err := nodeimage.ReadIndex(imagesDir)
	require.NoError(t, err)
	want, err := all.ForKubernetes(version)
	require.NoError(t, err)
	assert.Equal(t, want, idx)
	entries, err := os.ReadDir(filepath.Join(out, "images"))
	require.NoError(t, err)
	assert.Len(t, entries, len(want.Images)+1, "the archives and index.json, nothing else")
	for _, e := range want.Images {
		got, err := os.ReadFile(filepath.Join(out, "images", e.File))
		require.NoError(t, err)
		assert.Equal(t, e.Ref, string(got))
	}
}

func TestRunRefusesMissingImages(t *testing.T) {
	bootstrapper, kubeDir, imagesDir := fakeInputs(t, kubeversion.Default)
	require.NoError(t, os.Remove(filepath.Join(imagesDir, "services.tar")))
	err := run(filepath.Join(t.TempDir(), "constellation"), bootstrapper, kubeversion.Default, kubeDir, imagesDir)
	assert.ErrorContains(t, err, "services.tar")
}
