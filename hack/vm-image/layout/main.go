// Command layout writes the Constellation part of the VM image's root filesystem
// (docs/vm-image.md "Root filesystem"): the node image directory the sandbox nodes boot,
// laid out by the same function as `constellation mini up` (platform.LayOutImage: bootstrapper,
// kubelet, kubeadm, containerd.toml, node-config.json), in OUT/image, and the container image
// archives a node of its Kubernetes version imports (nodeimage.Index.ForKubernetes) with their
// index in OUT/images, so a node finds them as a sandbox node finds _output/images.
// hack/vm-image.sh runs it.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"

	"github.com/openconstellation/constellation/internal/kubeversion"
	"github.com/openconstellation/constellation/internal/nodeimage"
	"github.com/openconstellation/constellation/internal/provider/local/platform"
)

func main() {
	out := flag.String("out", "", "directory to write image/ and images/ into (must not exist)")
	bootstrapper := flag.String("bootstrapper", "_output/bin/bootstrapper", "the bootstrapper binary")
	version := flag.String("kubernetes", kubeversion.Default, "the Kubernetes version of the image")
	kubeDir := flag.String("kube-dir", "_output/kube", "directory of <version>/bin per Kubernetes version (make kube)")
	imagesDir := flag.String("images-dir", "_output/images", "the container image archives and their index (make images)")
	flag.Parse()
	log.SetFlags(0)
	if *out == "" {
		log.Fatal("layout: -out is required")
	}
	if _, err := os.Stat(*out); err == nil {
		log.Fatalf("layout: %s exists; a layout starts from nothing, so that nothing stale is measured", *out)
	}
	if err := run(*out, *bootstrapper, *version, *kubeDir, *imagesDir); err != nil {
		log.Fatalf("layout: %v", err)
	}
}

func run(out, bootstrapper, version, kubeDir, imagesDir string) error {
	image := filepath.Join(out, "image")
	if err := platform.LayOutImage(image, bootstrapper, version, kubeDir, imagesDir); err != nil {
		return err
	}
	// The layout hard-links where it can; the root filesystem gets copies, so that no inode's
	// link count (stored in the filesystem) depends on what else links to the build's files.
	files, err := os.ReadDir(image)
	if err != nil {
		return err
	}
	for _, f := range files {
		p := filepath.Join(image, f.Name())
		if err := os.Rename(p, p+".linked"); err != nil {
			return err
		}
		if err := copyFile(p+".linked", p); err != nil {
			return err
		}
		info, err := os.Stat(p + ".linked")
		if err != nil {
			return err
		}
		if err := os.Chmod(p, info.Mode().Perm()); err != nil {
			return err
		}
		if err := os.Remove(p + ".linked"); err != nil {
			return err
		}
	}
	index, err := nodeimage.ReadIndex(imagesDir)
	if err != nil {
		return err
	}
	index, err = index.ForKubernetes(version)
	if err != nil {
		return err
	}
	dst := filepath.Join(out, "images")
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	for _, e := range index.Images {
		if err := copyFile(filepath.Join(imagesDir, e.File), filepath.Join(dst, e.File)); err != nil {
			return fmt.Errorf("container image %s: %w", e.Ref, err)
		}
	}
	data, err := json.MarshalIndent(index, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dst, nodeimage.IndexFile), append(data, '\n'), 0o644)
}

// copyFile copies (never links: the root filesystem's inodes must not depend on what else
// links to the build's files).
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, in); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
