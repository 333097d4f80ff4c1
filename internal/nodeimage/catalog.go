package nodeimage

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"github.com/openconstellation/constellation/internal/kubeversion"
)

// Names of the images of the local cluster. The images from registry.k8s.io are those kubeadm of
// each supported Kubernetes version uses by default (kubeversion.Release: its constants
// DefaultEtcdVersion, PauseVersion and CoreDNSVersion), so kubeadm and the kubelet find them in
// containerd without pulling.
const (
	Registry = "registry.k8s.io"
	// ServicesRepo and HelloRepo are our images; their tags are content hashes (ContentTag).
	ServicesRepo = "localhost/constellation/services"
	HelloRepo    = "localhost/constellation/hello"
)

// KubeRef returns the ref of a Kubernetes component's image of a version, e.g.
// KubeRef("kube-proxy", "v1.34.4").
func KubeRef(component, version string) string {
	return Registry + "/" + component + ":" + version
}

// EtcdRef, PauseRef and CoreDNSRef return the refs of a release's etcd, pause and CoreDNS images.
func EtcdRef(r kubeversion.Release) string    { return Registry + "/etcd:" + r.EtcdTag() }
func PauseRef(r kubeversion.Release) string   { return Registry + "/pause:" + r.Pause }
func CoreDNSRef(r kubeversion.Release) string { return Registry + "/coredns/coredns:" + r.CoreDNS }

// controlPlane are the components kubeadm runs as static pods from an image of the
// Kubernetes version.
var controlPlane = []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"}

// ReleaseRefs returns the refs of every image a release's kubeadm uses, in the order of
// `kubeadm config images list`: the control plane, kube-proxy, CoreDNS, pause, etcd.
func ReleaseRefs(r kubeversion.Release) []string {
	var refs []string
	for _, c := range append(controlPlane, "kube-proxy") {
		refs = append(refs, KubeRef(c, r.Kubernetes))
	}
	return append(refs, CoreDNSRef(r), PauseRef(r), EtcdRef(r))
}

// Binaries are the inputs of the catalog, all built locally.
type Binaries struct {
	// Kube maps each Kubernetes version to the directory of its binaries: kube-apiserver,
	// kube-controller-manager, kube-scheduler, kube-proxy, and etcd and etcdctl of the release's
	// etcd (hack/build-kube.sh: _output/kube/<version>/bin), all static.
	Kube map[string]string
	// CoreDNS maps each CoreDNS version to its static binary (tools/coredns/<version>).
	CoreDNS map[string]string
	// Pause is the static binary of cmd/pause.
	Pause string
	// NFT is the build machine's nft (Debian's nftables), copied with its shared libraries into
	// the kube-proxy images for kube-proxy's nftables mode.
	NFT string
}

// Image is a spec with the name of its archive (<Name>.tar in the image directory).
type Image struct {
	Name string
	Spec Spec
}

// Catalog returns every image from registry.k8s.io the given releases need, made from b:
// per release kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy, etcd, pause
// and CoreDNS; an image two releases share (the same ref: pause, or etcd of the same version) is
// made once. Each archive is named by its image and tag, e.g. kube-apiserver-v1.34.4 or
// etcd-3.6.5-0.
//
// Kubernetes binaries and etcd are in /usr/local/bin (on PATH: kubeadm's static pods run them by
// name; its kube-proxy DaemonSet runs /usr/local/bin/kube-proxy), pause is /pause and CoreDNS
// /coredns, both the entrypoint, as upstream's images have them. The etcd image also has
// etcdctl, as upstream's does: the CLI runs it in a control plane's etcd pod to remove the etcd
// member of a control plane it scales down (internal/kube/etcdmember).
func Catalog(b Binaries, releases ...kubeversion.Release) ([]Image, error) {
	var images []Image
	seen := map[string]bool{}
	add := func(img Image) {
		if !seen[img.Spec.Ref] {
			seen[img.Spec.Ref] = true
			images = append(images, img)
		}
	}
	for _, r := range releases {
		kube, ok := b.Kube[r.Kubernetes]
		if !ok {
			return nil, fmt.Errorf("no binaries of Kubernetes %s (hack/build-kube.sh builds them)", r.Kubernetes)
		}
		coredns, ok := b.CoreDNS[r.CoreDNS]
		if !ok {
			return nil, fmt.Errorf("no CoreDNS %s binary for Kubernetes %s", r.CoreDNS, r.Kubernetes)
		}
		for _, c := range controlPlane {
			add(Image{Name: c + "-" + r.Kubernetes, Spec: Spec{
				Ref:   KubeRef(c, r.Kubernetes),
				Files: []File{{Src: filepath.Join(kube, c), Path: "/usr/local/bin/" + c}},
			}})
		}
		proxy, err := KubeProxy(filepath.Join(kube, "kube-proxy"), b.NFT, r.Kubernetes)
		if err != nil {
			return nil, err
		}
		add(proxy)
		add(Image{Name: "etcd-" + r.EtcdTag(), Spec: Spec{
			Ref: EtcdRef(r),
			Files: []File{
				{Src: filepath.Join(kube, "etcd"), Path: "/usr/local/bin/etcd"},
				{Src: filepath.Join(kube, "etcdctl"), Path: "/usr/local/bin/etcdctl"},
			},
			Dirs: []string{"/var/lib/etcd"},
		}})
		add(Pause(b.Pause, r))
		add(Image{Name: "coredns-" + r.CoreDNS, Spec: Spec{
			Ref:        CoreDNSRef(r),
			Files:      []File{{Src: coredns, Path: "/coredns"}},
			Entrypoint: []string{"/coredns"},
		}})
	}
	return images, nil
}

// KubeProxy returns the kube-proxy image of a version: kube-proxy in /usr/local/bin and nft (with its
// shared libraries) in /usr/sbin for kube-proxy's nftables mode.
//
// Why nftables: kube-proxy's nftables mode needs only nft (one binary, knftables drives it),
// while iptables mode needs iptables-legacy or iptables-nft with its save/restore variants for two
// families. nft works in a node's network namespace on our machines (tables, maps and nat hooks),
// and nftables is what kube-proxy moves to. The provider sets mode: nftables (and
// conntrack.maxPerCore: 0, since a network namespace cannot set the global conntrack sysctls).
func KubeProxy(kubeProxy, nft, version string) (Image, error) {
	nftFiles, err := WithLibraries(nft, "/usr/sbin/nft")
	if err != nil {
		return Image{}, fmt.Errorf("kube-proxy image: %w", err)
	}
	return Image{Name: "kube-proxy-" + version, Spec: Spec{
		Ref: KubeRef("kube-proxy", version),
		// nft names protocols by /etc/protocols: without it, it lists the map elements
		// kube-proxy wrote as "tcp" as "6", and kube-proxy compares what it reads back.
		Files: append([]File{
			{Src: kubeProxy, Path: "/usr/local/bin/kube-proxy"},
			{Src: Protocols, Path: "/etc/protocols"},
		}, nftFiles...),
		// kube-proxy's DaemonSet mounts /run/xtables.lock and /lib/modules.
		Dirs: []string{"/run", "/lib/modules"},
	}}, nil
}

// Protocols is the protocol table put into the kube-proxy image (Debian's netbase).
var Protocols = "/etc/protocols"

// Pause returns a release's pause image: /pause, the entrypoint.
func Pause(binary string, r kubeversion.Release) Image {
	return Image{Name: "pause-" + r.Pause, Spec: Spec{
		Ref:        PauseRef(r),
		Files:      []File{{Src: binary, Path: "/pause"}},
		Entrypoint: []string{"/pause"},
	}}
}

// Services returns the image of our in-cluster services (join, key and verification service,
// and the programs of the StorageClasses): every given binary in /usr/local/bin under its own
// name, no entrypoint (each pod names its command). The tag is the content hash, so a changed binary gives a new ref.
func Services(binaries ...string) (Image, error) {
	if len(binaries) == 0 {
		return Image{}, errors.New("services image: no binaries")
	}
	var files []File
	for _, b := range binaries {
		files = append(files, File{Src: b, Path: "/usr/local/bin/" + filepath.Base(b)})
	}
	return contentTagged("services", ServicesRepo, Spec{Files: files})
}

// ServiceBinaries are the binaries of the services image, by name: cmd/<name>;
// local-path-provisioner (tools/local-path-provisioner), the node-local StorageClass's
// provisioner, whose helper pods run volumehelper; and the Kubernetes CSI sidecars
// (tools/<name>) that run beside csidriver's controller half (docs/volumes.md "Deployment").
var ServiceBinaries = []string{"joinservice", "keyservice", "verificationservice", "volumehelper", "csidriver",
	"local-path-provisioner", "csi-provisioner", "csi-attacher", "csi-resizer"}

// ReleaseEnv is the variable of a release's services image that names the release.
const ReleaseEnv = "CONSTELLATION_RELEASE"

// ReleaseServices returns the services image of release: Services' image with ReleaseEnv set to
// release, so each release's services image has a tag of its own (as each release's node image
// measures differently), even when built from the same binaries.
func ReleaseServices(release string, binaries ...string) (Image, error) {
	img, err := Services(binaries...)
	if err != nil {
		return Image{}, err
	}
	spec := img.Spec
	spec.Ref, spec.Env = "", []string{ReleaseEnv + "=" + release}
	return contentTagged("services", ServicesRepo, spec)
}

// Hello returns the image of the end-to-end tests' HTTP server (test/e2e/hello): /hello, the
// entrypoint, serving on :8080.
func Hello(binary string) (Image, error) {
	return contentTagged("hello", HelloRepo, Spec{
		Files:      []File{{Src: binary, Path: "/hello"}},
		Entrypoint: []string{"/hello"},
	})
}

func contentTagged(name, repo string, spec Spec) (Image, error) {
	tag, err := ContentTag(spec)
	if err != nil {
		return Image{}, fmt.Errorf("%s image: %w", name, err)
	}
	spec.Ref = repo + ":" + tag
	return Image{Name: name, Spec: spec}, nil
}

// WithLibraries returns a dynamically linked binary at path in the image, plus the shared
// libraries and loader that ldd resolves for it, each at the path ldd names (symbolic links on
// the build machine become regular files in the image). A static binary comes alone.
func WithLibraries(binary, inImage string) ([]File, error) {
	if _, err := os.Stat(binary); err != nil {
		return nil, err
	}
	files := []File{{Src: binary, Path: inImage}}
	var stderr bytes.Buffer
	cmd := exec.Command("ldd", binary)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		if strings.Contains(string(out)+stderr.String(), "not a dynamic executable") {
			return files, nil
		}
		return nil, fmt.Errorf("ldd %s: %w: %s", binary, err, strings.TrimSpace(stderr.String()))
	}
	libs, err := parseLdd(out)
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %w", binary, err)
	}
	for _, l := range libs {
		files = append(files, File{Src: l, Path: l})
	}
	return files, nil
}

// parseLdd returns the absolute library paths of ldd's output, sorted.
func parseLdd(out []byte) ([]string, error) {
	var libs []string
	s := bufio.NewScanner(bytes.NewReader(out))
	for s.Scan() {
		line := strings.TrimSpace(s.Text())
		if line == "" || strings.HasPrefix(line, "linux-vdso") || strings.Contains(line, "statically linked") {
			continue
		}
		if strings.Contains(line, "=> not found") {
			return nil, fmt.Errorf("library not found: %s", line)
		}
		if _, after, ok := strings.Cut(line, "=> "); ok {
			line = after
		}
		p, _, _ := strings.Cut(line, " ")
		if !filepath.IsAbs(p) {
			return nil, fmt.Errorf("unexpected line %q", line)
		}
		libs = append(libs, p)
	}
	sort.Strings(libs)
	return libs, s.Err()
}
