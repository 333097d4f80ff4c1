package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/openconstellation/constellation/internal/nodeimage"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/provider/local/nodeos"
)

// LoadedImagesDir is the folder, in the provider's folder, of the images a user loaded
// (constellation image load, internal/imageload): every node imports its archives at every
// boot (--images-from, listed once the node's containerd is up), and the running nodes when
// they are loaded (POST /v1/images). The archives stay on the host: a node's containerd
// keeps images on its tmpfs, so they are imported again at each boot and are never part of
// the node's encrypted state.
const LoadedImagesDir = "loaded-images"

// loadedImagesDir is the folder of loaded images of this cluster.
func (p *Provider) loadedImagesDir() string { return filepath.Join(p.spec.Dir, LoadedImagesDir) }

// LoadImagesRequest names archives of LoadedImagesDir to import.
type LoadImagesRequest struct {
	Archives []string `json:"archives"`
}

// loadedImagesArgs are the bootstrapper arguments that make a boot import the loaded images:
// --images-from, which lists them once the node's containerd is up (so a load during the boot
// is never missed), or, for a bootstrapper of an earlier release that lacks the flag, each
// archive there now as --image.
func loadedImagesArgs(bootstrapper, dir string) []string {
	if supportsImagesFrom(bootstrapper) {
		return []string{"--images-from", dir}
	}
	archives, _ := nodeimage.ArchivesIn(dir)
	var args []string
	for _, a := range archives {
		args = append(args, "--image", a)
	}
	return args
}

// imagesFromFlag memoizes, by bootstrapper path and modification time, whether it knows
// --images-from (its usage, printed for -h, lists its flags).
var imagesFromFlag sync.Map

func supportsImagesFrom(bootstrapper string) bool {
	info, err := os.Stat(bootstrapper)
	if err != nil {
		return false
	}
	key := fmt.Sprintf("%s@%d", bootstrapper, info.ModTime().UnixNano())
	if v, ok := imagesFromFlag.Load(key); ok {
		return v.(bool)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, _ := exec.CommandContext(ctx, bootstrapper, "-h").CombinedOutput() // exits 2 after the usage
	ok := bytes.Contains(out, []byte("-images-from"))
	imagesFromFlag.Store(key, ok)
	return ok
}

// containerdWait bounds how long a load waits for a booting node's containerd.
const containerdWait = 2 * time.Minute

func (p *Provider) handleLoadImages(w http.ResponseWriter, r *http.Request) {
	// encoding/json, not strictjson: the control API's caller is this program's own CLI
	// (handleAddNodes).
	var req LoadImagesRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&req); err != nil {
		http.Error(w, "bad request: "+err.Error(), http.StatusBadRequest)
		return
	}
	paths, err := p.loadedArchives(req.Archives)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	writeJSON(w, p.loadImages(r.Context(), paths))
}

// loadedArchives resolves archive names to files of LoadedImagesDir: nothing else is ever
// imported through the API.
func (p *Provider) loadedArchives(names []string) ([]string, error) {
	if len(names) == 0 {
		return nil, errors.New("no archives named")
	}
	var paths []string
	for _, name := range names {
		if name == "" || strings.ContainsAny(name, `/\`) || name == "." || name == ".." || filepath.Ext(name) != ".tar" {
			return nil, fmt.Errorf("archive %q is not a file name of %s", name, LoadedImagesDir)
		}
		path := filepath.Join(p.loadedImagesDir(), name)
		if _, err := os.Stat(path); err != nil {
			return nil, err
		}
		paths = append(paths, path)
	}
	return paths, nil
}

// loadImages imports archives into every running node's containerd, the nodes in parallel,
// waiting for a booting node's containerd (within containerdWait); a node that is off imports
// them when it boots. A node that booted meanwhile has them either way: its boot lists the
// loaded images once its containerd is up, and the archives were written before.
func (p *Provider) loadImages(ctx context.Context, archives []string) []provider.ImageLoad {
	p.mu.Lock()
	type target struct {
		name    string
		pid     int
		running bool
	}
	var targets []target
	for _, n := range p.nodes {
		targets = append(targets, target{name: n.spec.Name, pid: n.pid, running: n.exited != nil && !n.off})
	}
	p.mu.Unlock()
	sort.Slice(targets, func(i, j int) bool { return targets[i].name < targets[j].name })

	out := make([]provider.ImageLoad, len(targets))
	var wg sync.WaitGroup
	for i, t := range targets {
		out[i] = provider.ImageLoad{Node: t.name, Deferred: !t.running}
		if !t.running {
			continue
		}
		if t.pid == 0 {
			// A machine's file system is its own (Power.PID): its images come with its image.
			out[i].Error = "this node's machine imports container images only from its node OS image"
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := importInto(ctx, t.pid, archives); err != nil {
				out[i].Error = err.Error()
				p.log.Warn("loading images", "node", t.name, "err", err)
				return
			}
			p.log.Info("images loaded", "node", t.name, "archives", len(archives))
		}()
	}
	wg.Wait()
	return out
}

// importInto waits for the containerd of the node whose process is pid, then imports
// archives in the node's mount namespace.
func importInto(ctx context.Context, pid int, archives []string) error {
	socket := fmt.Sprintf("/proc/%d/root%s", pid, nodeos.ContainerdSocket)
	ctx, cancel := context.WithTimeout(ctx, containerdWait)
	defer cancel()
	for {
		if _, err := os.Stat(socket); err == nil {
			break
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil {
			return fmt.Errorf("the node's boot ended (it imports the images at its next boot): %w", err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the node's containerd did not come up within %s (it imports the images when it does)", containerdWait)
		case <-time.After(200 * time.Millisecond):
		}
	}
	return nodeimage.ImportInMountNamespace(ctx, pid, "ctr", nodeos.ContainerdSocket, "k8s.io", archives...)
}
