package local

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"

	"github.com/openconstellation/constellation/internal/attestation/softfirmware"
	"github.com/openconstellation/constellation/internal/nodeimage"
)

// PCRKubernetes holds the Kubernetes node binaries (kubelet, then kubeadm).
const PCRKubernetes = 13

// Files of a node image directory and the PCR each is measured into (docs/attestation.md).
// The order is the boot order, so it is part of the measurement.
var imageFiles = []struct {
	name string
	pcr  int
}{
	{"bootstrapper", PCRBootstrapper},
	{"kubelet", PCRKubernetes},
	{"kubeadm", PCRKubernetes},
	{"containerd.toml", PCRNodeConfig},
	{"node-config.json", PCRNodeConfig},
}

// ImageFiles returns the names of the files a node image directory holds, in measurement
// order.
func ImageFiles() []string {
	names := make([]string, len(imageFiles))
	for i, f := range imageFiles {
		names[i] = f.name
	}
	return names
}

// ImageComponents measures the files of a node image directory: what the provider extends
// into a node's vTPM before the node's software starts, and what softfirmware.ExpectedPCRs turns into
// reference values offline. A directory that lacks files is refused, naming each missing one.
func ImageComponents(dir string) ([]softfirmware.Component, error) {
	var out []softfirmware.Component
	var problems []error
	for _, f := range imageFiles {
		c, err := softfirmware.FileComponent(f.name, f.pcr, filepath.Join(dir, f.name))
		if err != nil {
			problems = append(problems, err)
			continue
		}
		out = append(out, c)
	}
	if len(problems) > 0 {
		return nil, errors.Join(problems...)
	}
	return out, nil
}

// ContainerdConfig is the containerd configuration of the local node image (a measured
// component). Root and state are on the node's /run tmpfs (docs/local-provider.md);
// restrict_oom_score_adj because the sandbox lacks CAP_SYS_RESOURCE (platform facts §7);
// the CNI configuration is written per node below /run/constellation/cni.
const ContainerdConfig = `version = 2
root = "/run/containerd/root"
state = "/run/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.aufs", "io.containerd.internal.v1.tracing", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins."io.containerd.grpc.v1.cri"]
  restrict_oom_score_adj = true
  sandbox_image = "registry.k8s.io/pause:3.10.1"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "/run/constellation/cni"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "/etc/containerd/certs.d"
`

// ImageArchivesDir is the folder of a node image that holds container image archives the
// node imports at boot besides the provider's index: a release carries its services image
// there (docs/releases.md), so its nodes can run it whatever the index holds.
const ImageArchivesDir = "images"

// ImageArchives returns the archives (*.tar) in dir's ImageArchivesDir, sorted by name; none
// if it does not exist.
func ImageArchives(dir string) ([]string, error) {
	return nodeimage.ArchivesIn(filepath.Join(dir, ImageArchivesDir))
}

// ImageDigest is the digest of a node image directory, what a release signs as its node image
// (docs/releases.md): the SHA-256 of its ImageListing, so `sha256sum bootstrapper kubelet
// kubeadm containerd.toml node-config.json images/*.tar | sha256sum` in the directory gives the
// same hex. It covers exactly the measured files and the archives: what else the directory
// holds is neither booted, imported nor signed.
func ImageDigest(dir string) (string, error) {
	listing, err := ImageListing(dir)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(listing)
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}

// ImageListing is the sha256sum(1) listing of a node image directory: its files in
// measurement order, then its container image archives (ImageArchives), each as "<hex>  <path
// relative to dir>". A release source serves it beside the image (releasesource.ListingFile), so
// a download can check the listing against the signed digest before it fetches the files it
// names.
func ImageListing(dir string) ([]byte, error) {
	components, err := ImageComponents(dir)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	for _, c := range components {
		fmt.Fprintf(&b, "%x  %s\n", c.Digest, c.Name)
	}
	archives, err := ImageArchives(dir)
	if err != nil {
		return nil, err
	}
	for _, a := range archives {
		sum, err := fileSHA256(a)
		if err != nil {
			return nil, fmt.Errorf("node image archive: %w", err)
		}
		fmt.Fprintf(&b, "%x  %s\n", sum, path.Join(ImageArchivesDir, filepath.Base(a)))
	}
	return b.Bytes(), nil
}

func fileSHA256(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return nil, err
	}
	return h.Sum(nil), nil
}
