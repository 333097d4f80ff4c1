package platform

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/openconstellation/constellation/internal/kubeversion"
	"github.com/openconstellation/constellation/internal/nodeimage"
	"github.com/openconstellation/constellation/internal/provider/local"
)

// ImageFiles implements provider.NodeImages.
func (Platform) ImageFiles() []string { return local.ImageFiles() }

// LayOutDefaultImage implements provider.NodeImages: the bootstrapper next to this binary,
// the Kubernetes node binaries of the version in kubeDir/<version>/bin, and a node
// configuration naming the version and the services image of the container image index in
// imagesDir. The index must hold the version's images, and the kubelet and kubeadm must report
// the version: an image never names a version it does not run.
func (Platform) LayOutDefaultImage(dir, kubernetesVersion, kubeDir, imagesDir string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	if _, err := kubeversion.Lookup(kubernetesVersion); err != nil {
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
	if _, err := index.ForKubernetes(kubernetesVersion); err != nil {
		return fmt.Errorf("the node's container images of Kubernetes %s: %w", kubernetesVersion, err)
	}
	nodeConfig := local.NodeConfig{KubernetesVersion: kubernetesVersion, Provider: Name, ServicesImage: services.Ref}
	kubeBin := filepath.Join(kubeDir, kubernetesVersion, "bin")
	return buildNodeImage(dir, filepath.Join(filepath.Dir(exe), "bootstrapper"), kubeBin, nodeConfig)
}

// buildNodeImage lays out a node image directory: the bootstrapper, the Kubernetes node
// binaries (which must report the node configuration's version), the containerd configuration
// and the node configuration.
func buildNodeImage(dir, bootstrapper, kubeBin string, nodeConfig local.NodeConfig) error {
	kubelet, kubeadm := filepath.Join(kubeBin, "kubelet"), filepath.Join(kubeBin, "kubeadm")
	if err := checkKubeVersion(nodeConfig.KubernetesVersion, kubelet, kubeadm); err != nil {
		return fmt.Errorf("node image: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for dst, src := range map[string]string{"bootstrapper": bootstrapper, "kubelet": kubelet, "kubeadm": kubeadm} {
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

// checkKubeVersion checks that the kubelet and kubeadm binaries report version (`kubelet
// --version`: "Kubernetes v1.34.4"; `kubeadm version -o short`: "v1.34.4").
func checkKubeVersion(version, kubelet, kubeadm string) error {
	for _, c := range []struct {
		bin  string
		args []string
		want string
	}{
		{kubelet, []string{"--version"}, "Kubernetes " + version},
		{kubeadm, []string{"version", "-o", "short"}, version},
	} {
		out, err := exec.Command(c.bin, c.args...).Output()
		if err != nil {
			return fmt.Errorf("%s %s (make kube builds it): %w", c.bin, strings.Join(c.args, " "), err)
		}
		if got := strings.TrimSpace(string(out)); got != c.want {
			return fmt.Errorf("%s reports %q, not Kubernetes %s", c.bin, got, version)
		}
	}
	return nil
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
