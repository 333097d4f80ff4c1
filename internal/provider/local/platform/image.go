package platform

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/openconstellation/constellation/internal/kubeversion"
	"github.com/openconstellation/constellation/internal/nodeimage"
	"github.com/openconstellation/constellation/internal/provider"
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
	return LayOutImage(dir, filepath.Join(filepath.Dir(exe), "bootstrapper"), kubernetesVersion, kubeDir, imagesDir)
}

// LayOutImage is LayOutDefaultImage with the bootstrapper binary named: the VM image build
// (hack/vm-image) lays out the same node image directory inside the VM's root filesystem.
func LayOutImage(dir, bootstrapper, kubernetesVersion, kubeDir, imagesDir string) error {
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
	return buildNodeImage(dir, bootstrapper, kubeBin, nodeConfig)
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
	// Remove dst first: if it is a hard link to src (an image laid out again), writing it
	// would truncate src.
	if err := os.Remove(dst); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
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

// servicesArchive is a release's own services image in its node image's local.ImageArchivesDir;
// the services images of the releases it upgrades from are services-<their version>.tar.
const servicesArchive = "services.tar"

// carryServicesOf copies the own services archive of each release node image in from into
// dir's archives, named by the release: a node of the new release joins a cluster whose
// services are the old release's until the upgrade rolls them.
func carryServicesOf(dir string, from []string) error {
	for _, img := range from {
		src := filepath.Join(img, local.ImageArchivesDir, servicesArchive)
		if _, err := os.Stat(src); errors.Is(err, os.ErrNotExist) {
			continue // an image that carries no services of its own (not a release)
		}
		data, err := os.ReadFile(filepath.Join(img, local.NodeConfigFile))
		if err != nil {
			return fmt.Errorf("node image %s: %w", img, err)
		}
		nc, err := local.ParseNodeConfig(data)
		if err != nil {
			return fmt.Errorf("node image %s: %w", img, err)
		}
		if nc.Release == "" {
			return fmt.Errorf("node image %s carries a services image but names no release", img)
		}
		if err := copyFile(src, filepath.Join(dir, local.ImageArchivesDir, "services-"+nc.Release+".tar"), 0o644); err != nil {
			return fmt.Errorf("node image: the services image of %s: %w", nc.Release, err)
		}
	}
	return nil
}

// ImageListing implements provider.NodeImages (local.ImageListing).
func (Platform) ImageListing(dir string) ([]byte, error) { return local.ImageListing(dir) }

// ReadImageFacts implements provider.NodeImages: the image's node configuration, parsed and
// validated (local.ParseNodeConfig).
func (Platform) ReadImageFacts(image fs.FS) (provider.ImageFacts, error) {
	data, err := fs.ReadFile(image, local.NodeConfigFile)
	if err != nil {
		return provider.ImageFacts{}, fmt.Errorf("node image: %w", err)
	}
	nc, err := local.ParseNodeConfig(data)
	if err != nil {
		return provider.ImageFacts{}, fmt.Errorf("node image: %w", err)
	}
	return provider.ImageFacts{KubernetesVersion: nc.KubernetesVersion, ServicesImage: nc.ServicesImage, Release: nc.Release, JoinServiceSets: nc.JoinServiceSets}, nil
}

// ImageDigest implements provider.NodeImages (local.ImageDigest).
func (Platform) ImageDigest(dir string) (string, error) { return local.ImageDigest(dir) }

// LayOutReleaseImage implements provider.NodeImages: base's files (hard links where possible),
// its node configuration with Release set to the version, the join services it trusts and the
// release's services image (node-config.json is measured, so the release's PCR 12 differs from
// every other release's), and the services image's archive in images/ (local.ImageArchives:
// covered by the image's digest, imported by its nodes).
func (Platform) LayOutReleaseImage(dir, base string, r provider.ReleaseImage) (provider.ImageFacts, error) {
	data, err := os.ReadFile(filepath.Join(base, local.NodeConfigFile))
	if err != nil {
		return provider.ImageFacts{}, fmt.Errorf("base node image: %w", err)
	}
	nodeConfig, err := local.ParseNodeConfig(data)
	if err != nil {
		return provider.ImageFacts{}, fmt.Errorf("base node image: %w", err)
	}
	nodeConfig.Release = r.Version
	nodeConfig.JoinServiceSets = r.JoinServiceSets
	nodeConfig.ServicesImage = r.ServicesRef
	if err := os.MkdirAll(filepath.Join(dir, local.ImageArchivesDir), 0o755); err != nil {
		return provider.ImageFacts{}, err
	}
	if err := copyFile(r.ServicesArchive, filepath.Join(dir, local.ImageArchivesDir, servicesArchive), 0o644); err != nil {
		return provider.ImageFacts{}, fmt.Errorf("node image: the services image: %w", err)
	}
	if err := carryServicesOf(dir, r.UpgradesFrom); err != nil {
		return provider.ImageFacts{}, err
	}
	for _, name := range local.ImageFiles() {
		if name == local.NodeConfigFile {
			continue
		}
		if err := copyFile(filepath.Join(base, name), filepath.Join(dir, name), 0o755); err != nil {
			return provider.ImageFacts{}, fmt.Errorf("node image: %w", err)
		}
	}
	stamped, err := nodeConfig.Marshal()
	if err != nil {
		return provider.ImageFacts{}, err
	}
	if err := os.WriteFile(filepath.Join(dir, local.NodeConfigFile), stamped, 0o644); err != nil {
		return provider.ImageFacts{}, err
	}
	return provider.ImageFacts{KubernetesVersion: nodeConfig.KubernetesVersion, ServicesImage: nodeConfig.ServicesImage}, nil
}
