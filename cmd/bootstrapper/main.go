// Command bootstrapper is the first process of a local sandbox node (internal/provider/local/
// nodeboot): it boots the node OS and brings the node into its cluster by init or join, or,
// after a reboot, by rejoin or recovery.
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

	"github.com/openconstellation/constellation/internal/provider/local/nodeboot"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	var o nodeboot.Options
	var images, stores list
	flag.StringVar(&o.NodeDir, "node-dir", "", "the node's folder in the workspace")
	flag.StringVar(&o.ImageDir, "image-dir", "", "the node image (kubeadm, kubelet, containerd.toml, node-config.json)")
	flag.Var(&images, "image", "container image tarball to import (repeatable)")
	flag.Var(&stores, "images-from", "folder of further image tarballs (*.tar) to import, listed when containerd is up (repeatable)")
	flag.StringVar(&o.MetadataURL, "metadata", "http://10.42.0.1:8080", "metadata service")
	flag.StringVar(&o.InitAddr, "init-addr", ":9000", "listen address of the init server (fresh control planes)")
	flag.StringVar(&o.RecoverAddr, "recover-addr", ":9999", "listen address of the recovery server (rebooted control planes)")
	flag.Parse()
	o.Images, o.ImageStores = images, stores
	o.Log = slog.New(slog.NewJSONHandler(os.Stderr, nil))
	if o.NodeDir == "" || o.ImageDir == "" {
		fmt.Fprintln(os.Stderr, "bootstrapper: --node-dir and --image-dir are required")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := nodeboot.Run(ctx, o); err != nil {
		o.Log.Error("bootstrapper failed", "err", err)
		os.Exit(1)
	}
}
