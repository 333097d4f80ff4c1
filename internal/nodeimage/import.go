package nodeimage

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
)

// Import imports docker archives into the containerd at socket, in namespace (kubelet's CRI
// uses "k8s.io"), with ctr (Debian's containerd package). ctr unpacks each image for the
// default snapshotter (overlayfs) and the machine's platform, so the CRI can create containers
// from it at once; the archives' configs name linux and the build machine's architecture.
// Archives are imported one after the other; the first failure stops the import.
func Import(ctx context.Context, ctr, socket, namespace string, archives ...string) error {
	for _, a := range archives {
		cmd := exec.CommandContext(ctx, ctr, "--address", socket, "--namespace", namespace,
			"images", "import", a)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("importing %s into containerd at %s: %w: %s", a, socket, err, tail(out.String()))
		}
	}
	return nil
}

// tail returns the last lines of a command's output for an error message.
func tail(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > 5 {
		lines = lines[len(lines)-5:]
	}
	return strings.Join(lines, "\n")
}
