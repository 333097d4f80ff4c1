// Command coredns is CoreDNS with only the plugins of kubeadm's default Corefile, built from the
// pinned module version (the one kubeadm of its Kubernetes version deploys). Fewer plugins than upstream's build keep
// the build fast and the binary small; the plugin order is upstream's (plugin.cfg).
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

// directives are the plugins of kubeadm's default Corefile in the order of upstream's plugin.cfg,
// which decides the order a query passes through them.
var directives = []string{
	"reload",
	"ready",
	"health",
	"prometheus",
	"errors",
	"log",
	"loadbalance",
	"cache",
	"kubernetes",
	"loop",
	"forward",
}

func init() { dnsserver.Directives = directives }

func main() { coremain.Run() }
