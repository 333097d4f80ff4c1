package platform

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/kubeversion"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/nodeimage"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/provider/local"
	"github.com/openconstellation/constellation/internal/provider/local/cluster"
)

// fakeKubeDir writes, per version, a kubelet and a kubeadm that report it (as the real ones
// do: `kubelet --version`, `kubeadm version -o short`) into kubeDir/<version>/bin.
func fakeKubeDir(t *testing.T, versions ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, v := range versions {
		bin := filepath.Join(dir, v, "bin")
		require.NoError(t, os.MkdirAll(bin, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(bin, "kubelet"), []byte("#!/bin/sh\necho Kubernetes "+v+"\n"), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(bin, "kubeadm"), []byte("#!/bin/sh\necho "+v+"\n"), 0o755))
	}
	return dir
}

// fakeIndex writes an image index holding the images of versions and ours (no archives).
func fakeIndex(t *testing.T, versions ...string) string {
	t.Helper()
	dir := t.TempDir()
	idx := nodeimage.Index{Images: []nodeimage.Entry{{Ref: nodeimage.ServicesRepo + ":0123", File: "services.tar"}}}
	for _, v := range versions {
		r, err := kubeversion.Lookup(v)
		require.NoError(t, err)
		for i, ref := range nodeimage.ReleaseRefs(r) {
			idx.Images = append(idx.Images, nodeimage.Entry{Ref: ref, File: fmt.Sprintf("%s-%d.tar", v, i)})
		}
	}
	data, err := json.Marshal(idx)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, nodeimage.IndexFile), data, 0o644))
	return dir
}

func TestBuildNodeImage(t *testing.T) {
	kubeDir := fakeKubeDir(t, "v1.34.4", "v1.35.4")
	bootstrapper := filepath.Join(t.TempDir(), "bootstrapper")
	require.NoError(t, os.WriteFile(bootstrapper, []byte("bootstrapper"), 0o755))
	testCases := map[string]struct {
		version, bin string
		wantErr      string
	}{
		"v1.34.4":            {version: "v1.34.4", bin: "v1.34.4"},
		"v1.35.4":            {version: "v1.35.4", bin: "v1.35.4"},
		"binaries of v1.34":  {version: "v1.35.4", bin: "v1.34.4", wantErr: `reports "Kubernetes v1.34.4", not Kubernetes v1.35.4`},
		"no binaries at all": {version: "v1.35.4", bin: "v1.36.0", wantErr: "make kube builds it"},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "image")
			nc := local.NodeConfig{KubernetesVersion: tc.version, Provider: Name, ServicesImage: nodeimage.ServicesRepo + ":0123"}
			err := buildNodeImage(dir, bootstrapper, filepath.Join(kubeDir, tc.bin, "bin"), nc)
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
				_, statErr := os.Stat(dir)
				assert.ErrorIs(t, statErr, os.ErrNotExist, "nothing laid out")
				return
			}
			require.NoError(t, err)
			for _, f := range local.ImageFiles() {
				assert.FileExists(t, filepath.Join(dir, f))
			}
			data, err := os.ReadFile(filepath.Join(dir, local.NodeConfigFile))
			require.NoError(t, err)
			got, err := local.ParseNodeConfig(data)
			require.NoError(t, err)
			assert.Equal(t, nc, got)
		})
	}
}

func TestLayOutDefaultImageErrors(t *testing.T) {
	kubeDir := fakeKubeDir(t, "v1.34.4", "v1.35.4")
	testCases := map[string]struct {
		version, images string
		wantErr         string
	}{
		"unsupported version": {version: "v1.33.0", images: fakeIndex(t, "v1.34.4"), wantErr: `kubernetesVersion "v1.33.0" is not supported (supported: v1.34.4, v1.35.4)`},
		"no index":            {version: "v1.35.4", images: t.TempDir(), wantErr: "run 'make images' first"},
		"images of another version": {
			version: "v1.35.4", images: fakeIndex(t, "v1.34.4"),
			wantErr: "the node's container images of Kubernetes v1.35.4: no image in the index: registry.k8s.io/coredns/coredns:v1.13.1, registry.k8s.io/etcd:3.6.6-0",
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "image")
			err := Platform{}.LayOutDefaultImage(dir, tc.version, kubeDir, tc.images)
			assert.ErrorContains(t, err, tc.wantErr)
		})
	}
}

// TestCheckImages: create refuses, before any node exists, a node image of another version
// than the configuration's and an index without the version's images; a node imports the
// images of its image's version and ours.
func TestCheckImages(t *testing.T) {
	kubeDir := fakeKubeDir(t, "v1.34.4", "v1.35.4")
	bootstrapper := filepath.Join(t.TempDir(), "bootstrapper")
	require.NoError(t, os.WriteFile(bootstrapper, []byte("bootstrapper"), 0o755))
	image := func(version string) string {
		dir := filepath.Join(t.TempDir(), "image")
		nc := local.NodeConfig{KubernetesVersion: version, Provider: Name, ServicesImage: nodeimage.ServicesRepo + ":0123"}
		require.NoError(t, buildNodeImage(dir, bootstrapper, filepath.Join(kubeDir, version, "bin"), nc))
		return dir
	}
	v134, v135 := image("v1.34.4"), image("v1.35.4")
	both := fakeIndex(t, "v1.34.4", "v1.35.4")
	testCases := map[string]struct {
		confVersion, image, images string
		wantImages                 int
		wantErr                    string
	}{
		"v1.35.4":        {confVersion: "v1.35.4", image: v135, images: both, wantImages: 8},
		"v1.34.4":        {confVersion: "v1.34.4", image: v134, images: both, wantImages: 8},
		"other version":  {confVersion: "v1.35.4", image: v134, images: both, wantErr: "runs Kubernetes v1.34.4, but constellation-conf.yaml says kubernetesVersion v1.35.4"},
		"missing images": {confVersion: "v1.35.4", image: v135, images: fakeIndex(t, "v1.34.4"), wantErr: "registry.k8s.io/kube-apiserver:v1.35.4"},
		"no index":       {confVersion: "v1.35.4", image: v135, images: t.TempDir(), wantErr: "run 'make images' first"},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			conf := config.Default()
			conf.KubernetesVersion = tc.confVersion
			req := provider.CreateRequest{Config: conf, ImagesDir: tc.images, Nodes: []provider.NodeSpec{{Name: "control-plane-0", Role: metadata.ControlPlane, Image: tc.image}}}
			dir, err := checkImages(req)
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.images, dir)
			files, err := cluster.NodeImages(dir, tc.image, metadata.ControlPlane)
			require.NoError(t, err)
			assert.Len(t, files, tc.wantImages, "7 of the version, and ours")
			assert.Contains(t, files, filepath.Join(dir, "services.tar"))
			assert.Contains(t, files, filepath.Join(dir, tc.confVersion+"-0.tar"))
			// A worker's: kube-proxy, CoreDNS, pause and ours; not the control plane's static
			// pods (kube-apiserver, kube-controller-manager, kube-scheduler, etcd).
			files, err = cluster.NodeImages(dir, tc.image, metadata.Worker)
			require.NoError(t, err)
			assert.Len(t, files, 4, "kube-proxy, CoreDNS, pause, ours")
			assert.Contains(t, files, filepath.Join(dir, "services.tar"))
			assert.Contains(t, files, filepath.Join(dir, tc.confVersion+"-3.tar"), "kube-proxy")
			for _, i := range []int{0, 1, 2, 6} {
				assert.NotContains(t, files, filepath.Join(dir, fmt.Sprintf("%s-%d.tar", tc.confVersion, i)))
			}
		})
	}

	// A node of an upgrade's release runs its cluster's older version too: it imports both.
	t.Run("further versions", func(t *testing.T) {
		files, err := cluster.NodeImages(both, v135, metadata.ControlPlane, "v1.34.4")
		require.NoError(t, err)
		assert.Contains(t, files, filepath.Join(both, "v1.35.4-0.tar"))
		assert.Contains(t, files, filepath.Join(both, "v1.34.4-0.tar"))
		assert.Contains(t, files, filepath.Join(both, "services.tar"))
		_, err = cluster.NodeImages(both, v135, metadata.ControlPlane, "v1.33.0")
		assert.ErrorContains(t, err, `kubernetesVersion "v1.33.0" is not supported`)
		_, err = cluster.NodeImages(fakeIndex(t, "v1.35.4"), v135, metadata.ControlPlane, "v1.34.4")
		assert.ErrorContains(t, err, "registry.k8s.io/kube-apiserver:v1.34.4")
	})
}
