package nodeimage

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// writeInput writes an input file of an image.
func writeInput(t *testing.T, dir, name, content string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(p, []byte(content), mode))
	return p
}

// readTar returns the entries of a tar stream in order, with their contents.
func readTar(t *testing.T, r io.Reader) ([]*tar.Header, map[string][]byte) {
	t.Helper()
	var hdrs []*tar.Header
	contents := map[string][]byte{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return hdrs, contents
		}
		require.NoError(t, err)
		data, err := io.ReadAll(tr)
		require.NoError(t, err)
		hdrs = append(hdrs, h)
		contents[h.Name] = data
	}
}

func sha(data []byte) string {
	s := sha256.Sum256(data)
	return hex.EncodeToString(s[:])
}

func fileSHA(t *testing.T, p string) string {
	t.Helper()
	data, err := os.ReadFile(p)
	require.NoError(t, err)
	return sha(data)
}

func testSpec(t *testing.T) Spec {
	dir := t.TempDir()
	return Spec{
		Ref: "localhost/test/app:v1",
		Files: []File{
			{Src: writeInput(t, dir, "app", "#!binary app", 0o755), Path: "/usr/local/bin/app"},
			{Src: writeInput(t, dir, "lib", "library", 0o644), Path: "/lib/x86_64-linux-gnu/libx.so.1"},
		},
		Dirs:       []string{"/var/lib/app"},
		Entrypoint: []string{"/usr/local/bin/app"},
		Cmd:        []string{"--serve"},
		Env:        []string{"MODE=test"},
	}
}

func TestArchiveFormat(t *testing.T) {
	spec := testSpec(t)
	file := filepath.Join(t.TempDir(), "app.tar")
	res, err := Build(spec, file)
	require.NoError(t, err)
	assert.False(t, res.Cached)
	assert.Equal(t, fileSHA(t, file), res.SHA256)
	info, err := os.Stat(file)
	require.NoError(t, err)
	assert.Equal(t, info.Size(), res.Size)

	f, err := os.Open(file)
	require.NoError(t, err)
	defer f.Close()
	hdrs, contents := readTar(t, f)
	for _, h := range hdrs {
		assert.True(t, h.ModTime.Equal(time.Unix(0, 0)), "%s is dated %v", h.Name, h.ModTime)
		assert.Zero(t, h.Uid, h.Name)
		assert.Zero(t, h.Gid, h.Name)
	}

	// manifest.json names the config and the layer by their hashes and tags the image.
	var manifest []Manifest
	require.NoError(t, json.Unmarshal(contents["manifest.json"], &manifest))
	require.Len(t, manifest, 1)
	m := manifest[0]
	assert.Equal(t, []string{spec.Ref}, m.RepoTags)
	cfgData, ok := contents[m.Config]
	require.True(t, ok, "config %s in the archive", m.Config)
	assert.Equal(t, sha(cfgData)+".json", m.Config)
	require.Len(t, m.Layers, 1)
	layer, ok := contents[m.Layers[0]]
	require.True(t, ok, "layer %s in the archive", m.Layers[0])
	assert.Equal(t, sha(layer)+"/layer.tar", m.Layers[0])

	// The config: platform, runtime settings, the layer's diff ID.
	var cfg Config
	require.NoError(t, json.Unmarshal(cfgData, &cfg))
	assert.Equal(t, runtime.GOARCH, cfg.Architecture)
	assert.Equal(t, "linux", cfg.OS)
	assert.Equal(t, []string{"/usr/local/bin/app"}, cfg.Config.Entrypoint)
	assert.Equal(t, []string{"--serve"}, cfg.Config.Cmd)
	assert.Equal(t, []string{DefaultPath, "MODE=test"}, cfg.Config.Env)
	assert.Equal(t, RootFS{Type: "layers", DiffIDs: []string{"sha256:" + sha(layer)}}, cfg.RootFS)

	// The layer: parents before children, sorted, modes, contents.
	lhdrs, lcontents := readTar(t, bytes.NewReader(layer))
	type entry struct {
		name string
		typ  byte
		mode int64
	}
	var got []entry
	for _, h := range lhdrs {
		got = append(got, entry{h.Name, h.Typeflag, h.Mode})
		assert.True(t, h.ModTime.Equal(time.Unix(0, 0)), "%s is dated %v", h.Name, h.ModTime)
	}
	assert.Equal(t, []entry{
		{"lib/", tar.TypeDir, 0o755},
		{"lib/x86_64-linux-gnu/", tar.TypeDir, 0o755},
		{"lib/x86_64-linux-gnu/libx.so.1", tar.TypeReg, 0o644},
		{"tmp/", tar.TypeDir, 0o1777},
		{"usr/", tar.TypeDir, 0o755},
		{"usr/local/", tar.TypeDir, 0o755},
		{"usr/local/bin/", tar.TypeDir, 0o755},
		{"usr/local/bin/app", tar.TypeReg, 0o755},
		{"var/", tar.TypeDir, 0o755},
		{"var/lib/", tar.TypeDir, 0o755},
		{"var/lib/app/", tar.TypeDir, 0o755},
	}, got)
	assert.Equal(t, "#!binary app", string(lcontents["usr/local/bin/app"]))
	assert.Equal(t, "library", string(lcontents["lib/x86_64-linux-gnu/libx.so.1"]))
}

func TestBuildIsDeterministic(t *testing.T) {
	spec := testSpec(t)
	dir := t.TempDir()
	a, err := Build(spec, filepath.Join(dir, "a.tar"))
	require.NoError(t, err)
	// A copy of the inputs elsewhere, with other modification times, gives the same bytes.
	other := t.TempDir()
	spec2 := spec
	spec2.Files = nil
	for i, f := range spec.Files {
		data, err := os.ReadFile(f.Src)
		require.NoError(t, err)
		info, err := os.Stat(f.Src)
		require.NoError(t, err)
		src := writeInput(t, other, string(rune('a'+i)), string(data), info.Mode())
		require.NoError(t, os.Chtimes(src, time.Now().Add(time.Hour), time.Now().Add(time.Hour)))
		spec2.Files = append(spec2.Files, File{Src: src, Path: f.Path})
	}
	// Order of files does not matter either.
	spec2.Files[0], spec2.Files[1] = spec2.Files[1], spec2.Files[0]
	b, err := Build(spec2, filepath.Join(dir, "b.tar"))
	require.NoError(t, err)
	assert.Equal(t, a.SHA256, b.SHA256)
	assert.Equal(t, fileSHA(t, filepath.Join(dir, "a.tar")), fileSHA(t, filepath.Join(dir, "b.tar")))

	// Anything else changes the hash.
	changes := map[string]func(s *Spec){
		"ref":        func(s *Spec) { s.Ref = "localhost/test/app:v2" },
		"entrypoint": func(s *Spec) { s.Entrypoint = []string{"/bin/other"} },
		"env":        func(s *Spec) { s.Env = []string{"MODE=prod"} },
		"path":       func(s *Spec) { s.Files = []File{{Src: spec.Files[0].Src, Path: "/app"}} },
		"content": func(s *Spec) {
			s.Files = []File{{Src: writeInput(t, t.TempDir(), "app", "#!binary app2", 0o755), Path: "/usr/local/bin/app"}}
		},
		"mode": func(s *Spec) {
			s.Files = []File{{Src: writeInput(t, t.TempDir(), "app", "#!binary app", 0o644), Path: "/usr/local/bin/app"}}
		},
	}
	for name, change := range changes {
		t.Run(name, func(t *testing.T) {
			s := testSpec(t)
			s.Files = spec.Files
			change(&s)
			r, err := Build(s, filepath.Join(t.TempDir(), "x.tar"))
			require.NoError(t, err)
			assert.NotEqual(t, a.SHA256, r.SHA256)
		})
	}
}

func TestBuildCache(t *testing.T) {
	spec := testSpec(t)
	file := filepath.Join(t.TempDir(), "app.tar")
	first, err := Build(spec, file)
	require.NoError(t, err)
	before, err := os.Stat(file)
	require.NoError(t, err)

	again, err := Build(spec, file)
	require.NoError(t, err)
	assert.True(t, again.Cached)
	assert.Equal(t, first.SHA256, again.SHA256)
	after, err := os.Stat(file)
	require.NoError(t, err)
	assert.True(t, os.SameFile(before, after), "a cached archive is not rewritten")

	// Each change makes Build write the archive again.
	tests := map[string]func(t *testing.T, s *Spec){
		"input content changed": func(t *testing.T, s *Spec) {
			require.NoError(t, os.WriteFile(s.Files[0].Src, []byte("#!binary app, new"), 0o755))
		},
		"archive removed":   func(t *testing.T, _ *Spec) { require.NoError(t, os.Remove(file)) },
		"archive truncated": func(t *testing.T, _ *Spec) { require.NoError(t, os.Truncate(file, 100)) },
		"stamp garbled": func(t *testing.T, _ *Spec) {
			require.NoError(t, os.WriteFile(file+".stamp", []byte("{"), 0o644))
		},
	}
	for name, change := range tests {
		t.Run(name, func(t *testing.T) {
			s := testSpec(t)
			_, err := Build(s, file)
			require.NoError(t, err)
			change(t, &s)
			r, err := Build(s, file)
			require.NoError(t, err)
			assert.False(t, r.Cached, "rebuilt")
			assert.Equal(t, fileSHA(t, file), r.SHA256)
			again, err := Build(s, file)
			require.NoError(t, err)
			assert.True(t, again.Cached, "cached after the rebuild")
		})
	}
}

func TestContentTag(t *testing.T) {
	spec := testSpec(t)
	tag, err := ContentTag(spec)
	require.NoError(t, err)
	assert.Len(t, tag, 16)

	renamed := spec
	renamed.Ref = "localhost/other:x"
	same, err := ContentTag(renamed)
	require.NoError(t, err)
	assert.Equal(t, tag, same, "the ref is not part of the content")

	changed := spec
	changed.Files = []File{spec.Files[0]}
	other, err := ContentTag(changed)
	require.NoError(t, err)
	assert.NotEqual(t, tag, other)
}

func TestBuildRefusesBadSpecs(t *testing.T) {
	dir := t.TempDir()
	bin := writeInput(t, dir, "bin", "x", 0o755)
	tests := map[string]Spec{
		"no tag":         {Ref: "localhost/app", Files: []File{{Src: bin, Path: "/app"}}},
		"relative path":  {Ref: "localhost/app:1", Files: []File{{Src: bin, Path: "app"}}},
		"root path":      {Ref: "localhost/app:1", Files: []File{{Src: bin, Path: "/"}}},
		"path twice":     {Ref: "localhost/app:1", Files: []File{{Src: bin, Path: "/app"}, {Src: bin, Path: "/./app"}}},
		"file is a dir":  {Ref: "localhost/app:1", Files: []File{{Src: bin, Path: "/tmp"}}},
		"relative dir":   {Ref: "localhost/app:1", Dirs: []string{"var"}},
		"missing input":  {Ref: "localhost/app:1", Files: []File{{Src: filepath.Join(dir, "none"), Path: "/app"}}},
		"input is a dir": {Ref: "localhost/app:1", Files: []File{{Src: dir, Path: "/app"}}},
		"link no target": {Ref: "localhost/app:1", Links: []Link{{Path: "/bin/sh"}}},
		"link relative":  {Ref: "localhost/app:1", Links: []Link{{Path: "bin/sh", Target: "busybox"}}},
		"link on a file": {Ref: "localhost/app:1", Files: []File{{Src: bin, Path: "/app"}}, Links: []Link{{Path: "/app", Target: "x"}}},
		"mode not perm":  {Ref: "localhost/app:1", Files: []File{{Src: bin, Path: "/app", Mode: 0o100755}}},
	}
	for name, spec := range tests {
		t.Run(name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "x.tar")
			_, err := Build(spec, out)
			assert.Error(t, err)
			assert.NoFileExists(t, out)
		})
	}
}

// TestLinksModesUser: symbolic links, explicit modes (set-user-ID) and the image's user reach
// the layer and the config, and each changes the input key.
func TestLinksModesUser(t *testing.T) {
	dir := t.TempDir()
	bin := writeInput(t, dir, "busybox", "#!busybox", 0o755)
	spec := Spec{
		Ref:   "localhost/test/box:v1",
		Files: []File{{Src: bin, Path: "/bin/busybox"}, {Src: bin, Path: "/usr/bin/nnp", Mode: 0o4755}},
		Links: []Link{{Path: "/bin/sh", Target: "busybox"}, {Path: "/usr/local/bin/wget", Target: "/bin/busybox"}},
		User:  "1234",
	}
	file := filepath.Join(t.TempDir(), "box.tar")
	_, err := Build(spec, file)
	require.NoError(t, err)

	data, err := os.ReadFile(file)
	require.NoError(t, err)
	_, contents := readTar(t, bytes.NewReader(data))
	var manifest []Manifest
	require.NoError(t, json.Unmarshal(contents["manifest.json"], &manifest))
	var cfg Config
	require.NoError(t, json.Unmarshal(contents[manifest[0].Config], &cfg))
	assert.Equal(t, "1234", cfg.Config.User)
	hdrs, _ := readTar(t, bytes.NewReader(contents[manifest[0].Layers[0]]))
	got := map[string]*tar.Header{}
	for _, h := range hdrs {
		got[h.Name] = h
	}
	require.Contains(t, got, "bin/sh")
	assert.Equal(t, byte(tar.TypeSymlink), got["bin/sh"].Typeflag)
	assert.Equal(t, "busybox", got["bin/sh"].Linkname)
	require.Contains(t, got, "usr/local/bin/wget")
	assert.Equal(t, "/bin/busybox", got["usr/local/bin/wget"].Linkname)
	require.Contains(t, got, "usr/local/bin/", "a link's parents are added")
	assert.Equal(t, int64(0o4755), got["usr/bin/nnp"].Mode)
	assert.Equal(t, int64(0o755), got["bin/busybox"].Mode)

	base, err := spec.key(true)
	require.NoError(t, err)
	for name, change := range map[string]func(*Spec){
		"link target": func(s *Spec) { s.Links = []Link{{Path: "/bin/sh", Target: "other"}, s.Links[1]} },
		"mode":        func(s *Spec) { s.Files = []File{s.Files[0], {Src: bin, Path: "/usr/bin/nnp", Mode: 0o755}} },
		"user":        func(s *Spec) { s.User = "0" },
	} {
		changed := spec
		change(&changed)
		k, err := changed.key(true)
		require.NoError(t, err)
		assert.NotEqual(t, base, k, name)
	}
}
