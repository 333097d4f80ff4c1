// Package nodeimage makes the container images of the local provider from locally built static
// binaries, and imports them into a node's containerd.
//
// An image is a docker-archive tarball (manifest.json, one config, one uncompressed layer), the
// format `ctr images import` and `docker load` read. Archives are deterministic: entries are
// sorted, owned by root and dated at the Unix epoch, so the same inputs give the same bytes and
// the archive's SHA-256 is a content hash. Building skips an archive whose recorded input key
// (hash of the spec and of every input file's content) is unchanged.
package nodeimage

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/openconstellation/constellation/internal/fileutil"
)

// epoch is the modification time of every entry in an archive.
var epoch = time.Unix(0, 0).UTC()

// DefaultPath is the PATH of every image.
const DefaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// File is one regular file of an image.
type File struct {
	// Src is the file on the build machine; symbolic links are followed.
	Src string
	// Path is the absolute path in the image.
	Path string
	// Mode, when set, is the file's permission bits in the image (0o4755: a set-user-ID
	// program); unset, 0755 for an executable source, 0644 otherwise.
	Mode int64
}

// Link is a symbolic link of an image.
type Link struct {
	// Path is the link's absolute path in the image, Target what it points to.
	Path, Target string
}

// Spec describes an image.
type Spec struct {
	// Ref is the image reference the archive is tagged with, e.g. registry.k8s.io/pause:3.10.1.
	Ref string
	// Files are the files of the image's only layer. Parent directories are added (0755).
	Files []File
	// Links are symbolic links of the layer. Parent directories are added (0755).
	Links []Link
	// Dirs are extra empty directories; /tmp is always there (1777).
	Dirs []string
	// Entrypoint, Cmd, Env and WorkingDir go into the image config. Env always has DefaultPath
	// unless it sets PATH itself.
	Entrypoint []string
	Cmd        []string
	Env        []string
	WorkingDir string
	// User is the user the image's processes run as (a UID, or UID:GID); empty: root.
	User string
}

// Result tells what Build made.
type Result struct {
	Ref string
	// File is the archive's path.
	File string
	// SHA256 is the archive's hash (hex).
	SHA256 string
	// Size is the archive's size in bytes.
	Size int64
	// Cached is true when the archive was up to date and not rewritten.
	Cached bool
}

// stamp is stored beside an archive (<file>.stamp): the input key it was made from and its hash.
type stamp struct {
	Key    string `json:"key"`
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

// Build writes the docker archive of spec to file, unless the archive there was made from the
// same inputs. The archive is written atomically (temporary file, then rename).
func Build(spec Spec, file string) (Result, error) {
	if err := spec.validate(); err != nil {
		return Result{}, err
	}
	key, err := spec.key(true)
	if err != nil {
		return Result{}, err
	}
	res := Result{Ref: spec.Ref, File: file}
	if st, ok := readStamp(file); ok && st.Key == key {
		res.SHA256, res.Size, res.Cached = st.SHA256, st.Size, true
		return res, nil
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return Result{}, fmt.Errorf("creating image directory: %w", err)
	}
	res.SHA256, res.Size, err = writeArchive(spec, file)
	if err != nil {
		return Result{}, fmt.Errorf("building image %s: %w", spec.Ref, err)
	}
	data, err := json.Marshal(stamp{Key: key, SHA256: res.SHA256, Size: res.Size})
	if err != nil {
		return Result{}, err
	}
	if err := fileutil.WriteAtomic(file+".stamp", data, 0o644); err != nil {
		return Result{}, fmt.Errorf("writing stamp of %s: %w", file, err)
	}
	return res, nil
}

// readStamp returns the stamp of file if the archive is there with the recorded size.
func readStamp(file string) (stamp, bool) {
	data, err := os.ReadFile(file + ".stamp")
	if err != nil {
		return stamp{}, false
	}
	// encoding/json, not strictjson: a stamp is the build's own cache note (a bad one only
	// rebuilds the archive).
	var st stamp
	if err := json.Unmarshal(data, &st); err != nil {
		return stamp{}, false
	}
	info, err := os.Stat(file)
	if err != nil || info.Size() != st.Size {
		return stamp{}, false
	}
	return st, true
}

// ContentTag is a tag derived from everything in spec except its Ref: for images whose tag
// names their content (localhost/constellation/services:<ContentTag>).
func ContentTag(spec Spec) (string, error) {
	key, err := spec.key(false)
	if err != nil {
		return "", err
	}
	return key[:16], nil
}

func (s Spec) validate() error {
	if s.Ref == "" || !strings.Contains(s.Ref, ":") {
		return fmt.Errorf("image ref %q: want name:tag", s.Ref)
	}
	seen := map[string]bool{}
	for _, f := range s.Files {
		p := path.Clean(f.Path)
		if !path.IsAbs(f.Path) || p == "/" {
			return fmt.Errorf("image %s: path %q of %s is not an absolute file path", s.Ref, f.Path, f.Src)
		}
		if seen[p] {
			return fmt.Errorf("image %s: path %s given twice", s.Ref, p)
		}
		seen[p] = true
	}
	for _, l := range s.Links {
		p := path.Clean(l.Path)
		if !path.IsAbs(l.Path) || p == "/" || l.Target == "" {
			return fmt.Errorf("image %s: link %q -> %q: want an absolute path and a target", s.Ref, l.Path, l.Target)
		}
		if seen[p] {
			return fmt.Errorf("image %s: path %s given twice", s.Ref, p)
		}
		seen[p] = true
	}
	for _, f := range s.Files {
		if f.Mode&^0o7777 != 0 {
			return fmt.Errorf("image %s: mode %o of %s: permission bits only", s.Ref, f.Mode, f.Path)
		}
	}
	for _, d := range s.Dirs {
		if !path.IsAbs(d) {
			return fmt.Errorf("image %s: directory %q is not absolute", s.Ref, d)
		}
	}
	return nil
}

// key hashes the spec (with or without its ref) and the content of every file.
func (s Spec) key(withRef bool) (string, error) {
	h := sha256.New()
	desc := struct {
		Ref                            string `json:",omitempty"`
		Entrypoint, Cmd, Env, Dirs     []string
		WorkingDir                     string
		Files                          [][2]string
		Format, Architecture, Platform string
		// Added after the first images: absent when unused, so earlier keys stay as they were.
		Modes map[string]int64 `json:",omitempty"`
		Links [][2]string      `json:",omitempty"`
		User  string           `json:",omitempty"`
	}{
		Entrypoint: s.Entrypoint, Cmd: s.Cmd, Env: s.env(), Dirs: s.Dirs, WorkingDir: s.WorkingDir,
		// Format changes whenever writeArchive changes what it writes.
		Format: "docker-archive/1", Architecture: runtime.GOARCH, Platform: runtime.GOOS,
	}
	if withRef {
		desc.Ref = s.Ref
	}
	for _, f := range s.Files {
		sum, err := fileHash(f.Src)
		if err != nil {
			return "", err
		}
		desc.Files = append(desc.Files, [2]string{path.Clean(f.Path), sum})
		if f.Mode != 0 {
			if desc.Modes == nil {
				desc.Modes = map[string]int64{}
			}
			desc.Modes[path.Clean(f.Path)] = f.Mode
		}
	}
	for _, l := range s.Links {
		desc.Links = append(desc.Links, [2]string{path.Clean(l.Path), l.Target})
	}
	sort.Slice(desc.Links, func(i, j int) bool { return desc.Links[i][0] < desc.Links[j][0] })
	desc.User = s.User
	sort.Slice(desc.Files, func(i, j int) bool { return desc.Files[i][0] < desc.Files[j][0] })
	if err := json.NewEncoder(h).Encode(desc); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func (s Spec) env() []string {
	for _, e := range s.Env {
		if strings.HasPrefix(e, "PATH=") {
			return s.Env
		}
	}
	return append([]string{DefaultPath}, s.Env...)
}

// fileHashes caches the content hashes of input files for the life of the process, keyed by
// what stat tells, so a binary in several images is read once.
var fileHashes sync.Map

type fileID struct {
	path  string
	size  int64
	mtime time.Time
	ino   uint64
}

func fileHash(name string) (string, error) {
	info, err := os.Stat(name)
	if err != nil {
		return "", fmt.Errorf("image input: %w", err)
	}
	if !info.Mode().IsRegular() {
		return "", fmt.Errorf("image input %s is not a regular file", name)
	}
	id := fileID{path: name, size: info.Size(), mtime: info.ModTime(), ino: inode(info)}
	if sum, ok := fileHashes.Load(id); ok {
		return sum.(string), nil
	}
	f, err := os.Open(name)
	if err != nil {
		return "", fmt.Errorf("image input: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("hashing image input %s: %w", name, err)
	}
	sum := hex.EncodeToString(h.Sum(nil))
	fileHashes.Store(id, sum)
	return sum, nil
}

// Manifest is an entry of a docker archive's manifest.json.
type Manifest struct {
	Config   string
	RepoTags []string
	Layers   []string
}

// Config is the part of an image config (the OCI/docker image config) that we write.
type Config struct {
	Architecture string          `json:"architecture"`
	OS           string          `json:"os"`
	Config       ContainerConfig `json:"config"`
	RootFS       RootFS          `json:"rootfs"`
	History      []History       `json:"history,omitempty"`
}

// ContainerConfig is the config.config of an image config.
type ContainerConfig struct {
	Entrypoint []string `json:"Entrypoint,omitempty"`
	Cmd        []string `json:"Cmd,omitempty"`
	Env        []string `json:"Env,omitempty"`
	WorkingDir string   `json:"WorkingDir,omitempty"`
	User       string   `json:"User,omitempty"`
}

// RootFS lists the layers of an image by the digests of their uncompressed tars.
type RootFS struct {
	Type    string   `json:"type"`
	DiffIDs []string `json:"diff_ids"`
}

// History is an entry of an image config's history.
type History struct {
	Created   time.Time `json:"created"`
	CreatedBy string    `json:"created_by,omitempty"`
}

// writeArchive writes the archive of spec to file atomically and returns its hash and size.
// In order:
//
//  1. the layer tar, into a temporary file, hashed on the way (its diff ID);
//  2. the image config and the manifest naming the config and the layer;
//  3. the archive: the layer's directory, the layer, the config, the manifest;
//  4. synced, made readable and renamed into place.
func writeArchive(spec Spec, file string) (sum string, size int64, err error) {
	dir := filepath.Dir(file)
	layer, err := os.CreateTemp(dir, ".layer-*")
	if err != nil {
		return "", 0, fmt.Errorf("creating layer file: %w", err)
	}
	defer func() {
		layer.Close()
		os.Remove(layer.Name())
	}()
	diffID, layerSize, err := writeLayerFile(layer, spec)
	if err != nil {
		return "", 0, err
	}
	meta, err := imageMetadata(spec, diffID)
	if err != nil {
		return "", 0, err
	}

	out, err := os.CreateTemp(dir, ".image-*")
	if err != nil {
		return "", 0, fmt.Errorf("creating archive: %w", err)
	}
	defer func() {
		if err != nil {
			out.Close()
			os.Remove(out.Name())
		}
	}()
	h := sha256.New()
	cw := &countWriter{w: io.MultiWriter(out, h)}
	if err := packArchive(cw, meta, layer, layerSize); err != nil {
		return "", 0, err
	}
	if err := install(out, file); err != nil {
		return "", 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), cw.n, nil
}

// writeLayerFile writes the layer tar of spec to layer and rewinds it; it returns the layer's
// diff ID (hex SHA-256 of the tar) and size.
func writeLayerFile(layer *os.File, spec Spec) (diffID string, size int64, err error) {
	lh := sha256.New()
	if err := writeLayer(io.MultiWriter(layer, lh), spec); err != nil {
		return "", 0, err
	}
	size, err = layer.Seek(0, io.SeekCurrent)
	if err != nil {
		return "", 0, err
	}
	if _, err := layer.Seek(0, io.SeekStart); err != nil {
		return "", 0, err
	}
	return hex.EncodeToString(lh.Sum(nil)), size, nil
}

// archiveMetadata is what an archive holds besides its layer: the layer's directory and
// name, the image config and its name, the manifest.
type archiveMetadata struct {
	diffID, layerName, cfgName string
	cfg, manifest              []byte
}

// imageMetadata is the image config of spec with the layer diffID, and the manifest.
func imageMetadata(spec Spec, diffID string) (archiveMetadata, error) {
	cfg, err := json.Marshal(Config{
		Architecture: runtime.GOARCH,
		OS:           runtime.GOOS,
		Config: ContainerConfig{
			Entrypoint: spec.Entrypoint, Cmd: spec.Cmd, Env: spec.env(), WorkingDir: spec.WorkingDir,
			User: spec.User,
		},
		RootFS:  RootFS{Type: "layers", DiffIDs: []string{"sha256:" + diffID}},
		History: []History{{Created: epoch, CreatedBy: "constellation nodeimage"}},
	})
	if err != nil {
		return archiveMetadata{}, err
	}
	cfgSum := sha256.Sum256(cfg)
	m := archiveMetadata{diffID: diffID, layerName: diffID + "/layer.tar", cfgName: hex.EncodeToString(cfgSum[:]) + ".json", cfg: cfg}
	m.manifest, err = json.Marshal([]Manifest{{Config: m.cfgName, RepoTags: []string{spec.Ref}, Layers: []string{m.layerName}}})
	if err != nil {
		return archiveMetadata{}, err
	}
	return m, nil
}

// packArchive writes the docker archive to w: the layer's directory, the layer (size bytes
// from layer), the config, the manifest.
func packArchive(w io.Writer, m archiveMetadata, layer io.Reader, size int64) error {
	tw := tar.NewWriter(w)
	if err := addDir(tw, m.diffID, 0o755); err != nil {
		return err
	}
	if err := addReader(tw, m.layerName, 0o644, size, layer); err != nil {
		return err
	}
	if err := addBytes(tw, m.cfgName, m.cfg); err != nil {
		return err
	}
	if err := addBytes(tw, "manifest.json", m.manifest); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("writing archive: %w", err)
	}
	return nil
}

// install syncs and closes the temporary archive out, makes it readable and renames it to
// file.
func install(out *os.File, file string) error {
	if err := out.Sync(); err != nil {
		return fmt.Errorf("writing archive: %w", err)
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("writing archive: %w", err)
	}
	if err := os.Chmod(out.Name(), 0o644); err != nil {
		return err
	}
	if err := os.Rename(out.Name(), file); err != nil {
		return fmt.Errorf("writing archive: %w", err)
	}
	return nil
}

// layerEntry is one entry of a layer: a directory, a file copied from src, or a link.
type layerEntry struct {
	src    string
	mode   int64
	dir    bool
	target string // a symbolic link's
}

// layerEntries maps every path of spec's layer (without the leading /) to its entry: the
// directories (given, /tmp, and every parent), the files and the links.
func layerEntries(spec Spec) (map[string]layerEntry, error) {
	entries := map[string]layerEntry{"tmp": {mode: 0o1777, dir: true}}
	addParents := func(p string) {
		for d := path.Dir(p); d != "." && d != "/"; d = path.Dir(d) {
			rel := strings.TrimPrefix(d, "/")
			if _, ok := entries[rel]; !ok {
				entries[rel] = layerEntry{mode: 0o755, dir: true}
			}
		}
	}
	for _, d := range spec.Dirs {
		d = path.Clean(d)
		addParents(d)
		if _, ok := entries[strings.TrimPrefix(d, "/")]; !ok {
			entries[strings.TrimPrefix(d, "/")] = layerEntry{mode: 0o755, dir: true}
		}
	}
	for _, f := range spec.Files {
		p := path.Clean(f.Path)
		addParents(p)
		info, err := os.Stat(f.Src)
		if err != nil {
			return nil, fmt.Errorf("image input: %w", err)
		}
		mode := int64(0o644)
		if info.Mode().Perm()&0o111 != 0 {
			mode = 0o755
		}
		if f.Mode != 0 {
			mode = f.Mode
		}
		rel := strings.TrimPrefix(p, "/")
		if e, ok := entries[rel]; ok && e.dir {
			return nil, fmt.Errorf("image %s: %s is both a directory and a file", spec.Ref, p)
		}
		entries[rel] = layerEntry{src: f.Src, mode: mode}
	}
	for _, l := range spec.Links {
		p := path.Clean(l.Path)
		addParents(p)
		rel := strings.TrimPrefix(p, "/")
		if e, ok := entries[rel]; ok && e.dir {
			return nil, fmt.Errorf("image %s: %s is both a directory and a link", spec.Ref, p)
		}
		entries[rel] = layerEntry{target: l.Target, mode: 0o777}
	}
	return entries, nil
}

// writeLayer writes the layer tar of spec: every directory, then every file, sorted by path,
// parents before children.
func writeLayer(w io.Writer, spec Spec) error {
	entries, err := layerEntries(spec)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	// Sorting by path components puts every directory right before its children.
	sort.Slice(names, func(i, j int) bool {
		return strings.ReplaceAll(names[i], "/", "\x00") < strings.ReplaceAll(names[j], "/", "\x00")
	})
	tw := tar.NewWriter(w)
	for _, n := range names {
		e := entries[n]
		if e.dir {
			if err := addDir(tw, n, e.mode); err != nil {
				return err
			}
			continue
		}
		if e.target != "" {
			h := header(n, tar.TypeSymlink, e.mode, 0)
			h.Linkname = e.target
			if err := tw.WriteHeader(h); err != nil {
				return fmt.Errorf("writing tar entry %s: %w", n, err)
			}
			continue
		}
		if err := addFile(tw, n, e.mode, e.src); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("writing layer: %w", err)
	}
	return nil
}

func header(name string, typ byte, mode, size int64) *tar.Header {
	return &tar.Header{
		Typeflag: typ, Name: name, Mode: mode, Size: size, ModTime: epoch, Format: tar.FormatPAX,
	}
}

func addDir(tw *tar.Writer, name string, mode int64) error {
	if err := tw.WriteHeader(header(name+"/", tar.TypeDir, mode, 0)); err != nil {
		return fmt.Errorf("writing tar entry %s: %w", name, err)
	}
	return nil
}

func addBytes(tw *tar.Writer, name string, data []byte) error {
	return addReader(tw, name, 0o644, int64(len(data)), bytes.NewReader(data))
}

func addReader(tw *tar.Writer, name string, mode, size int64, r io.Reader) error {
	if err := tw.WriteHeader(header(name, tar.TypeReg, mode, size)); err != nil {
		return fmt.Errorf("writing tar entry %s: %w", name, err)
	}
	n, err := io.Copy(tw, r)
	if err != nil {
		return fmt.Errorf("writing tar entry %s: %w", name, err)
	}
	if n != size {
		return fmt.Errorf("writing tar entry %s: %d bytes, want %d", name, n, size)
	}
	return nil
}

func addFile(tw *tar.Writer, name string, mode int64, src string) error {
	f, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("image input: %w", err)
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return fmt.Errorf("image input: %w", err)
	}
	if !info.Mode().IsRegular() {
		return fmt.Errorf("image input %s: %w", src, fs.ErrInvalid)
	}
	if err := addReader(tw, name, mode, info.Size(), f); err != nil {
		if errors.Is(err, io.ErrShortWrite) {
			return fmt.Errorf("image input %s changed while being read: %w", src, err)
		}
		return err
	}
	return nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

func inode(info fs.FileInfo) uint64 {
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		return st.Ino
	}
	return 0
}
