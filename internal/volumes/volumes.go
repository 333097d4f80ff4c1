// Package volumes is where the volumes of the cluster's default StorageClass live on a node,
// and the helper that creates and removes them there.
//
// The StorageClass is served by local-path-provisioner (docs/local-provider.md "Volumes"): for
// each claim it starts a helper pod on the claim's node that creates the volume's directory
// below Dir, and one that removes it when the volume is released. The helper pods run Helper
// (cmd/volumehelper, in the services image) instead of a shell script in a busybox image: the
// nodes pull no image, and the helper refuses any directory that is not a volume's own below
// Dir, so a provisioner confused about a path cannot make it remove anything else of the node.
//
// Dir is a persistent directory of the node (internal/provider/local/nodeos), in the node's
// state storage: what a volume holds reaches the disk only encrypted with the node's state key.
package volumes

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// Dir is the directory of a node that holds the volumes, one directory each.
const Dir = "/var/lib/constellation/volumes"

// Helper creates (-a create) or removes (-a delete) the volume directory -p below root, as
// local-path-provisioner's helper pods ask with the arguments -p PATH -s SIZE -m MODE -a
// ACTION. A created directory is writable by every user (mode 0777, as the provisioner's own
// setup script makes it): the workload's user is not known. Only a filesystem volume that is a
// direct child of root is accepted.
func Helper(root string, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("volumehelper", flag.ContinueOnError)
	fs.SetOutput(out)
	path := fs.String("p", "", "the volume's directory")
	fs.String("s", "", "the volume's size in bytes (not enforced)")
	mode := fs.String("m", "Filesystem", "the volume mode: Filesystem")
	action := fs.String("a", "", "create or delete")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	dir, err := volumeDir(root, *path)
	if err != nil {
		return err
	}
	if *mode != "Filesystem" {
		return fmt.Errorf("volume mode %q: only Filesystem volumes are supported", *mode)
	}
	switch *action {
	case "create":
		if err := os.Mkdir(dir, 0o777); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("creating volume %s: %w", dir, err)
		}
		// Mkdir's mode is cut by the umask.
		if err := os.Chmod(dir, 0o777); err != nil {
			return fmt.Errorf("creating volume %s: %w", dir, err)
		}
		fmt.Fprintf(out, "created volume %s\n", dir)
	case "delete":
		if err := os.RemoveAll(dir); err != nil {
			return fmt.Errorf("removing volume %s: %w", dir, err)
		}
		fmt.Fprintf(out, "removed volume %s\n", dir)
	default:
		return fmt.Errorf("action %q: want create or delete", *action)
	}
	return nil
}

// volumeDir checks that path names a directory directly below root and returns it cleaned.
func volumeDir(root, path string) (string, error) {
	if path == "" {
		return "", errors.New("no volume directory (-p)")
	}
	if !filepath.IsAbs(path) {
		return "", fmt.Errorf("volume directory %q is not absolute", path)
	}
	clean := filepath.Clean(path)
	if clean != path || filepath.Dir(clean) != filepath.Clean(root) || strings.HasPrefix(filepath.Base(clean), ".") {
		return "", fmt.Errorf("volume directory %q is not a volume's own directory below %s", path, root)
	}
	return clean, nil
}
