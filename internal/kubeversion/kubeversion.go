// Package kubeversion is the one list of the Kubernetes versions Constellation builds, images
// and runs, with the versions of the images kubeadm of each version expects by default (its
// constants DefaultEtcdVersion, CoreDNSVersion and PauseVersion). The configuration
// (config.SupportedKubernetesVersions), the node images (internal/nodeimage) and the build
// scripts (hack/build-kube.sh and hack/build-images.sh, through hack/kubeversions) read it;
// the pin modules under tools/ are checked against it (TestPinModules), and the built kubeadm
// of every version against its images (nodeimage's TestKubeadmImages).
package kubeversion

import (
	"fmt"
	"regexp"
	"strings"
)

// Release is a Kubernetes version and what its kubeadm deploys with it.
type Release struct {
	// Kubernetes is the version, "v1.<minor>.<patch>"; tools/kube/<Kubernetes> pins it.
	Kubernetes string
	// Etcd is the etcd release kubeadm of this version deploys ("v3.6.5": image tag
	// "3.6.5-0", EtcdTag); tools/etcd/<Etcd> pins it.
	Etcd string
	// CoreDNS is kubeadm's CoreDNSVersion ("v1.12.1", also the image tag); tools/coredns/<CoreDNS>
	// pins it.
	CoreDNS string
	// Pause is kubeadm's PauseVersion, the image tag of registry.k8s.io/pause ("3.10.1"); our
	// cmd/pause stands in for it.
	Pause string
}

// releases, oldest first. Adding a version: its pin modules (tools/kube/<version>, and
// tools/etcd/<etcd> and tools/coredns/<coredns> unless present), `make kube images`, and
// docs/configuration.md.
var releases = []Release{
	{Kubernetes: "v1.34.4", Etcd: "v3.6.5", CoreDNS: "v1.12.1", Pause: "3.10.1"},
	{Kubernetes: "v1.35.4", Etcd: "v3.6.6", CoreDNS: "v1.13.1", Pause: "3.10.1"},
}

// Default is the version of a configuration that names none.
const Default = "v1.34.4"

// Releases returns every supported release, oldest first.
func Releases() []Release { return append([]Release(nil), releases...) }

// Versions returns the supported Kubernetes versions, oldest first.
func Versions() []string {
	v := make([]string, len(releases))
	for i, r := range releases {
		v[i] = r.Kubernetes
	}
	return v
}

// Lookup returns the release of version, or an error naming the supported versions.
func Lookup(version string) (Release, error) {
	for _, r := range releases {
		if r.Kubernetes == version {
			return r, nil
		}
	}
	return Release{}, fmt.Errorf("kubernetesVersion %q is not supported (supported: %s)", version, strings.Join(Versions(), ", "))
}

// EtcdTag is the tag of kubeadm's etcd image for the release: "3.6.5-0" for etcd v3.6.5.
func (r Release) EtcdTag() string { return strings.TrimPrefix(r.Etcd, "v") + "-0" }

var versionPattern = regexp.MustCompile(`\Av1\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\z`)

// Minor returns the minor version of a "v1.<minor>.<patch>" version.
func Minor(version string) (int, error) {
	m := versionPattern.FindStringSubmatch(version)
	if m == nil {
		return 0, fmt.Errorf("kubernetes version %q: want v1.<minor>.<patch>", version)
	}
	var minor int
	_, err := fmt.Sscan(m[1], &minor)
	return minor, err
}
