package nodeimage

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/openconstellation/constellation/internal/fileutil"
	"github.com/openconstellation/constellation/internal/kubeversion"
)

// IndexFile is the name of the index in an image directory.
const IndexFile = "index.json"

// Index lists the archives of an image directory (_output/images/index.json).
type Index struct {
	Images []Entry `json:"images"`
}

// Entry is an archive of an index.
type Entry struct {
	Ref string `json:"ref"`
	// File is the archive's name, relative to the index's directory.
	File   string `json:"file"`
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

// BuildAll builds each image into dir/<Name>.tar (skipping those up to date) and writes
// dir/index.json listing them, in the order given.
func BuildAll(dir string, images []Image) (Index, []Result, error) {
	var idx Index
	var results []Result
	names := map[string]bool{}
	for _, img := range images {
		if names[img.Name] {
			return Index{}, nil, fmt.Errorf("image name %s given twice", img.Name)
		}
		names[img.Name] = true
		res, err := Build(img.Spec, filepath.Join(dir, img.Name+".tar"))
		if err != nil {
			return Index{}, nil, err
		}
		results = append(results, res)
		idx.Images = append(idx.Images, Entry{Ref: res.Ref, File: img.Name + ".tar", SHA256: res.SHA256, Size: res.Size})
	}
	data, err := json.MarshalIndent(idx, "", "  ")
	if err != nil {
		return Index{}, nil, err
	}
	if err := fileutil.WriteAtomic(filepath.Join(dir, IndexFile), append(data, '\n'), 0o644); err != nil {
		return Index{}, nil, fmt.Errorf("writing image index: %w", err)
	}
	return idx, results, nil
}

// ReadIndex reads dir/index.json.
func ReadIndex(dir string) (Index, error) {
	data, err := os.ReadFile(filepath.Join(dir, IndexFile))
	if err != nil {
		return Index{}, fmt.Errorf("reading image index (run `make images`): %w", err)
	}
	// encoding/json, not strictjson: the index is the build's own output (Build writes it).
	var idx Index
	if err := json.Unmarshal(data, &idx); err != nil {
		return Index{}, fmt.Errorf("reading image index %s: %w", filepath.Join(dir, IndexFile), err)
	}
	for _, e := range idx.Images {
		if e.Ref == "" || e.File == "" || filepath.IsAbs(e.File) || strings.Contains(e.File, "..") {
			return Index{}, fmt.Errorf("image index %s: bad entry %+v", filepath.Join(dir, IndexFile), e)
		}
	}
	return idx, nil
}

// Find returns the entry whose ref is in repository repo (the ref without its tag), e.g.
// Find(ServicesRepo) for the current services image.
func (idx Index) Find(repo string) (Entry, error) {
	for _, e := range idx.Images {
		if Repository(e.Ref) == repo {
			return e, nil
		}
	}
	return Entry{}, fmt.Errorf("%w: %s", ErrNotInIndex, repo)
}

// ErrNotInIndex is returned by Find for a repository that has no image in the index.
var ErrNotInIndex = errors.New("no image in the index")

// refPattern: registry host, at least one path component, and a tag or a sha256 digest.
var refPattern = regexp.MustCompile(`\A[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)+(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}|@sha256:[0-9a-f]{64})\z`)

// IsPinnedRef reports whether ref is registry/name[/...] with a tag or a sha256 digest: the
// form of the refs nodes import and never pull.
func IsPinnedRef(ref string) bool { return refPattern.MatchString(ref) }

// Repository returns ref without its tag: registry.k8s.io/pause:3.10.1 gives registry.k8s.io/pause.
func Repository(ref string) string {
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		return ref[:i]
	}
	return ref
}

// Tag returns ref's tag: registry.k8s.io/pause:3.10.1 gives 3.10.1; "" if it has none.
func Tag(ref string) string {
	if repo := Repository(ref); repo != ref {
		return ref[len(repo)+1:]
	}
	return ""
}

// ForWorker returns the entries without the images only a control plane runs: its static
// pods' (kube-apiserver, kube-controller-manager, kube-scheduler and etcd, of every version). A
// worker never runs them, and importing them at every boot cost it about half its import time
// and memory (265 instead of 533 MB of archives, held twice in containerd's tmpfs).
func (idx Index) ForWorker() Index {
	var out Index
	for _, e := range idx.Images {
		if !ControlPlaneOnly(e.Ref) {
			out.Images = append(out.Images, e)
		}
	}
	return out
}

// ControlPlaneOnly reports whether ref is an image only control planes run (ForWorker).
func ControlPlaneOnly(ref string) bool {
	repo := Repository(ref)
	if repo == Registry+"/etcd" {
		return true
	}
	for _, c := range controlPlane {
		if repo == Registry+"/"+c {
			return true
		}
	}
	return false
}

// Files returns the paths of the index's archives in dir.
func (idx Index) Files(dir string) []string {
	files := make([]string, 0, len(idx.Images))
	for _, e := range idx.Images {
		files = append(files, filepath.Join(dir, e.File))
	}
	return files
}

// ForKubernetes returns the entries a node running the given Kubernetes versions imports: the
// images of each version's kubeadm (ReleaseRefs) and every image that is not from
// registry.k8s.io (ours: services, hello), in the index's order. A node imports only its own
// version's images (docs/local-provider.md, "Images"): every further version costs it about
// 0.7 GB of memory and seconds of import at every boot. A missing image of a version is an
// error naming it, as is a version that is not supported.
func (idx Index) ForKubernetes(versions ...string) (Index, error) {
	want := map[string]bool{}
	for _, v := range versions {
		r, err := kubeversion.Lookup(v)
		if err != nil {
			return Index{}, err
		}
		for _, ref := range ReleaseRefs(r) {
			want[ref] = true
		}
	}
	var out Index
	for _, e := range idx.Images {
		if want[e.Ref] || !strings.HasPrefix(e.Ref, Registry+"/") {
			out.Images = append(out.Images, e)
			delete(want, e.Ref)
		}
	}
	if len(want) > 0 {
		missing := make([]string, 0, len(want))
		for ref := range want {
			missing = append(missing, ref)
		}
		sort.Strings(missing)
		return Index{}, fmt.Errorf("%w: %s (run `make images`)", ErrNotInIndex, strings.Join(missing, ", "))
	}
	return out, nil
}
