// Command kubeversions prints the supported Kubernetes releases (internal/kubeversion) for the
// build scripts, one line each, oldest first: the Kubernetes version, then the etcd, CoreDNS
// and pause versions its kubeadm expects, e.g. "v1.34.4 v3.6.5 v1.12.1 3.10.1".
//
// $KUBE_VERSIONS narrows the list: a comma- or space-separated list of supported versions and
// these words: "default", the default version (what `make up` needs: a cold build of each
// further version costs about 10 minutes), and "built", every supported version whose binaries
// hack/build-kube.sh has built completely ($CONSTELLATION_KUBE_DIR, or _output/kube:
// <version>/bin/.stamp). `make release` builds its own version and keeps the images of the
// built ones ("<version>,built"): a cluster of the version it upgrades from still needs
// them. Each version is printed once. Unset or empty: every supported version.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/openconstellation/constellation/internal/kubeversion"
)

func main() {
	kubeDir := os.Getenv("CONSTELLATION_KUBE_DIR")
	if kubeDir == "" {
		kubeDir = filepath.Join("_output", "kube")
	}
	releases, err := selected(os.Getenv("KUBE_VERSIONS"), kubeDir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubeversions: KUBE_VERSIONS:", err)
		os.Exit(2)
	}
	for _, r := range releases {
		fmt.Println(r.Kubernetes, r.Etcd, r.CoreDNS, r.Pause)
	}
}

// selected returns the releases want names, oldest first, each once; kubeDir is where the
// built versions are.
func selected(want, kubeDir string) ([]kubeversion.Release, error) {
	want = strings.TrimSpace(want)
	if want == "" {
		return kubeversion.Releases(), nil
	}
	chosen := map[string]bool{}
	for _, v := range strings.FieldsFunc(want, func(r rune) bool { return r == ',' || r == ' ' }) {
		switch v {
		case "default":
			chosen[kubeversion.Default] = true
		case "built":
			for _, r := range kubeversion.Releases() {
				if _, err := os.Stat(filepath.Join(kubeDir, r.Kubernetes, "bin", ".stamp")); err == nil {
					chosen[r.Kubernetes] = true
				}
			}
		default:
			if _, err := kubeversion.Lookup(v); err != nil {
				return nil, err
			}
			chosen[v] = true
		}
	}
	out := slices.DeleteFunc(kubeversion.Releases(), func(r kubeversion.Release) bool { return !chosen[r.Kubernetes] })
	if len(out) == 0 {
		return nil, fmt.Errorf("%q names no version", want)
	}
	return out, nil
}
