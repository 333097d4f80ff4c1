// Command csidriver is the controller half of the cluster's CSI driver for encrypted volumes
// (internal/csidriver, docs/volumes.md "The driver"). `csidriver controller` runs in a pod on
// the control planes beside the Kubernetes CSI sidecars (csi-provisioner, csi-attacher,
// csi-resizer), which talk to it on a unix socket; it creates, attaches, detaches, expands
// and deletes volumes through the storage of the platform --platform names, found through its
// metadata service at --metadata-url (the services' catalog, internal/provider/catalog/instances:
// the local providers' volume API; Azure's managed disks). The node half is not here: the node
// program serves it (csidriver.ServeNode).
//
// Every flag can also be set by the environment variable CONSTELLATION_<FLAG> (upper case,
// '-' as '_').
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"syscall"

	"github.com/openconstellation/constellation/internal/cmdutil"
	"github.com/openconstellation/constellation/internal/csidriver"
	"github.com/openconstellation/constellation/internal/provider/catalog/instances"
)

// newBacking returns the storage of platform, found through its metadata service at
// metadataURL (a variable so that the command's test can see what it is given).
var newBacking = func(platform, metadataURL string) (csidriver.Backing, error) {
	p, err := instances.Lookup(platform)
	if err != nil {
		return nil, err
	}
	return p.Volumes(metadataURL)
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "csidriver:", err)
		os.Exit(1)
	}
}

const usage = "usage: csidriver controller [--endpoint unix:///csi/csi.sock] [--platform local] --metadata-url URL [--log-level info]"

func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	if len(args) == 0 {
		return errors.New(usage)
	}
	switch args[0] {
	case "controller":
		return runController(ctx, args[1:], getenv, stderr)
	default:
		return fmt.Errorf("unknown command %q (the node half runs in the node program)\n%s", args[0], usage)
	}
}

func runController(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	fs := flag.NewFlagSet("csidriver controller", flag.ContinueOnError)
	fs.SetOutput(stderr)
	endpoint := fs.String("endpoint", "unix:///csi/csi.sock", "the CSI socket the sidecars dial (unix:///absolute/path)")
	platform := fs.String("platform", instances.Default, "the node platform whose storage keeps the volumes (local, qemu, azure)")
	metadataURL := fs.String("metadata-url", "", "the platform's metadata service, through which its storage is found (e.g. http://10.42.0.1:8080)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	if err := cmdutil.ParseFlags(fs, args, "CONSTELLATION_", getenv); err != nil {
		return err
	}
	if _, err := csidriver.SocketPath(*endpoint); err != nil {
		return fmt.Errorf("--endpoint: %w", err)
	}
	if err := checkMetadataURL(*metadataURL); err != nil {
		return fmt.Errorf("--metadata-url: %w", err)
	}
	log, err := cmdutil.Logger(stderr, *logLevel)
	if err != nil {
		return err
	}
	backing, err := newBacking(*platform, *metadataURL)
	if err != nil {
		return fmt.Errorf("--platform: %w", err)
	}
	log.Info("CSI controller starting", "driver", csidriver.Name, "endpoint", *endpoint, "platform", *platform, "metadataURL", *metadataURL)
	return csidriver.ServeController(ctx, *endpoint, csidriver.NewController(backing, log))
}

// checkMetadataURL accepts an http(s) URL of a host, nothing else (no path tricks, no
// credentials in the URL).
func checkMetadataURL(raw string) error {
	if raw == "" {
		return errors.New("missing")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return err
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("%q: want an http or https URL", raw)
	}
	if u.Host == "" || u.User != nil {
		return fmt.Errorf("%q: want scheme://host[:port]", raw)
	}
	return nil
}
