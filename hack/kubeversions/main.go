// Command kubeversions prints the supported Kubernetes releases (internal/kubeversion) for the
// build scripts, one line each, oldest first: the Kubernetes version, then the etcd, CoreDNS
// and pause versions its kubeadm expects, e.g. "v1.34.4 v3.6.5 v1.12.1 3.10.1".
package main

import (
	"fmt"

	"github.com/openconstellation/constellation/internal/kubeversion"
)

func main() {
	for _, r := range kubeversion.Releases() {
		fmt.Println(r.Kubernetes, r.Etcd, r.CoreDNS, r.Pause)
	}
}
