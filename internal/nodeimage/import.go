package nodeimage

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// importParallel is how many archives Import hands to containerd at once. Parallel imports
// overlap ctr's per-image round trips with unpacking: the control-plane set took 12 s one by
// one and 5 s all at once into a containerd on tmpfs.
const importParallel = 4

// Import imports docker archives into the containerd at socket, in namespace (kubelet's CRI
// uses "k8s.io"), with ctr (Debian's containerd package). ctr unpacks each image for the
// default snapshotter (overlayfs) and the machine's platform, so the CRI can create containers
// from it at once; the archives' configs name linux and the build machine's architecture.
//
// Archives are imported in parallel; one whose parallel import failed is tried once more alone
// (concurrent writes of the same blob can collide). The error names every archive that failed.
func Import(ctx context.Context, ctr, socket, namespace string, archives ...string) error {
	// ctr waits for a missing socket to appear; fail at once instead.
	if _, err := os.Stat(socket); err != nil {
		return fmt.Errorf("importing images: containerd socket: %w", err)
	}
	return importAll(ctx, nil, ctr, socket, namespace, archives)
}

// ImportInMountNamespace is Import run in the mount namespace of process pid: a running local
// node's containerd socket and snapshots are in the node's own mount namespace (nodeos), which
// the host reaches only through one of the node's processes. The archives' paths must be
// visible there (the node sees the host's workspace).
func ImportInMountNamespace(ctx context.Context, pid int, ctr, socket, namespace string, archives ...string) error {
	if _, err := os.Stat(fmt.Sprintf("/proc/%d/root%s", pid, socket)); err != nil {
		return fmt.Errorf("importing images: containerd socket of process %d: %w", pid, err)
	}
	return importAll(ctx, []string{"nsenter", "--target", strconv.Itoa(pid), "--mount", "--"}, ctr, socket, namespace, archives)
}

// importAll imports archives with ctr (prefixed by prefix), in parallel, each failed one once
// more alone.
func importAll(ctx context.Context, prefix []string, ctr, socket, namespace string, archives []string) error {
	errs := make([]error, len(archives))
	sem := make(chan struct{}, importParallel)
	var wg sync.WaitGroup
	for i, a := range archives {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			errs[i] = importOne(ctx, prefix, ctr, socket, namespace, a)
		}()
	}
	wg.Wait()
	for i, a := range archives {
		if errs[i] != nil && ctx.Err() == nil {
			errs[i] = importOne(ctx, prefix, ctr, socket, namespace, a)
		}
	}
	return errors.Join(errs...)
}

func importOne(ctx context.Context, prefix []string, ctr, socket, namespace, archive string) error {
	args := append(append(append([]string(nil), prefix...), ctr), "--address", socket, "--namespace", namespace,
		"images", "import", archive)
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("importing %s into containerd at %s: %w: %s", archive, socket, err, tail(out.String()))
	}
	return nil
}

// ArchivesIn returns the image archives (*.tar) in dir, sorted by name; none if dir does not
// exist.
func ArchivesIn(dir string) ([]string, error) {
	archives, err := filepath.Glob(filepath.Join(dir, "*.tar"))
	if err != nil {
		return nil, err
	}
	sort.Strings(archives)
	return archives, nil
}

// tail returns the last lines of a command's output for an error message.
func tail(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > 5 {
		lines = lines[len(lines)-5:]
	}
	return strings.Join(lines, "\n")
}
