package platform

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/nodeimage"
	"github.com/openconstellation/constellation/internal/provider/local"
)

// ImageFiles implements provider.NodeImages.
func (Platform) ImageFiles() []string { return local.ImageFiles() }

// LayOutDefaultImage implements provider.NodeImages: the bootstrapper next to this binary,
// the Kubernetes node binaries of kubeBin, and a node configuration naming the services image
// of the container image index in imagesDir.
func (Platform) LayOutDefaultImage(dir, kubeBin, imagesDir string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	index, err := nodeimage.ReadIndex(imagesDir)
	if err != nil {
		return fmt.Errorf("reading the node's container images (run 'make images' first): %w", err)
	}
	services, err := index.Find(nodeimage.ServicesRepo)
	if err != nil {
		return fmt.Errorf("the node's container images (run 'make images' first): %w", err)
	}
	nodeConfig := local.NodeConfig{KubernetesVersion: config.DefaultKubernetesVersion, Provider: Name, ServicesImage: services.Ref}
	return buildNodeImage(dir, filepath.Join(filepath.Dir(exe), "bootstrapper"), kubeBin, nodeConfig)
}

// buildNodeImage lays out a node image directory: the bootstrapper, the Kubernetes node
// binaries, the containerd configuration and the node configuration.
func buildNodeImage(dir, bootstrapper, kubeBin string, nodeConfig local.NodeConfig) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for dst, src := range map[string]string{"bootstrapper": bootstrapper, "kubelet": filepath.Join(kubeBin, "kubelet"), "kubeadm": filepath.Join(kubeBin, "kubeadm")} {
		if err := copyFile(src, filepath.Join(dir, dst), 0o755); err != nil {
			return fmt.Errorf("node image: %w", err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "containerd.toml"), []byte(local.ContainerdConfig), 0o644); err != nil {
		return err
	}
	data, err := nodeConfig.Marshal()
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, local.NodeConfigFile), data, 0o644)
}

func copyFile(src, dst string, perm os.FileMode) error {
	// A hard link when possible: the image's files are measured, never modified.
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	outf, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(outf, in); err != nil {
		outf.Close()
		return err
	}
	return outf.Close()
}
