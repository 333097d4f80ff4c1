// Command bootstrapper is the first process of a node: the node program
// (internal/bootstrapper/boot) on the node platform --platform names (the provider catalog's
// node side, internal/provider/catalog/nodes; default the local provider's sandbox; auto, on
// the node OS image, the one the machine's firmware names). It boots the node OS and brings
// the node into its cluster by init or join, or, after a reboot, by rejoin or recovery.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/openconstellation/constellation/internal/bootstrapper/boot"
	"github.com/openconstellation/constellation/internal/dmi"
	"github.com/openconstellation/constellation/internal/provider/catalog/nodes"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	var o boot.Options
	var pc boot.PlatformConfig
	var images, stores list
	platform := flag.String("platform", nodes.Default, "the node platform ("+strings.Join(nodes.Names(), ", ")+"), or "+nodes.Auto+": the one the machine's firmware names")
	flag.StringVar(&pc.NodeDir, "node-dir", "", "the node's folder in the workspace (local)")
	flag.StringVar(&pc.ImageDir, "image-dir", "", "the node image (kubeadm, kubelet, containerd.toml, node-config.json)")
	flag.Var(&images, "image", "container image tarball to import (repeatable)")
	flag.Var(&stores, "images-from", "folder of further image tarballs (*.tar) to import, listed when containerd is up (repeatable)")
	flag.StringVar(&pc.MetadataURL, "metadata", "", "the platform's metadata service (default: the platform's)")
	flag.StringVar(&o.InitAddr, "init-addr", ":9000", "listen address of the init server (fresh control planes)")
	flag.StringVar(&o.RecoverAddr, "recover-addr", ":9999", "listen address of the recovery server (rebooted control planes)")
	flag.Parse()
	pc.Images, pc.ImageStores = images, stores
	o.Log = slog.New(slog.NewJSONHandler(os.Stderr, nil))
	pc.Log = o.Log
	name, err := platformName(*platform, o.Log)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bootstrapper:", err)
		os.Exit(2)
	}
	newPlatform, err := nodes.Lookup(name)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bootstrapper:", err)
		os.Exit(2)
	}
	p, err := newPlatform(pc)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bootstrapper:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := boot.Run(ctx, p, o); err != nil {
		o.Log.Error("bootstrapper failed", "err", err)
		os.Exit(1)
	}
}

// platformName is the node platform flag names, or for nodes.Auto the one the machine's
// firmware identity names, logged with what it said.
func platformName(flag string, log *slog.Logger) (string, error) {
	if flag != nodes.Auto {
		return flag, nil
	}
	info, err := dmi.Read(dmi.Dir)
	if err != nil {
		return "", err
	}
	name, err := nodes.Detect(info)
	if err != nil {
		return "", err
	}
	log.Info("node platform detected", "platform", name, "dmi", info.String())
	return name, nil
}
