// Command kubeversions prints the supported Kubernetes releases (internal/kubeversion) for the
// build scripts, one line each, oldest first: the Kubernetes version, then the etcd, CoreDNS
// and pause versions its kubeadm expects, e.g. "v1.34.4 v3.6.5 v1.12.1 3.10.1".
//
// $KUBE_VERSIONS narrows the list: "default" is the default version only (what `make up`
// needs: a cold build of each further version costs about 10 minutes), otherwise a comma- or
// space-separated list of supported versions. Unset or empty: every supported version.
package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/openconstellation/constellation/internal/kubeversion"
)

func main() {
	releases, err := selected(os.Getenv("KUBE_VERSIONS"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubeversions: KUBE_VERSIONS:", err)
		os.Exit(2)
	}
	for _, r := range releases {
		fmt.Println(r.Kubernetes, r.Etcd, r.CoreDNS, r.Pause)
	}
}

func selected(want string) ([]kubeversion.Release, error) {
	want = strings.TrimSpace(want)
	switch want {
	case "":
		return kubeversion.Releases(), nil
	case "default":
		want = kubeversion.Default
	}
	var out []kubeversion.Release
	for _, v := range strings.FieldsFunc(want, func(r rune) bool { return r == ',' || r == ' ' }) {
		r, err := kubeversion.Lookup(v)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}
