package imageload

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/nodeimage"
)

var host = NodePlatform

// image returns a random image (two layers) for platform p.
func image(t testing.TB, p v1.Platform) v1.Image {
	t.Helper()
	img, err := random.Image(1024, 2)
	require.NoError(t, err)
	cfg, err := img.ConfigFile()
	require.NoError(t, err)
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = p.OS, p.Architecture
	img, err = mutate.ConfigFile(img, cfg)
	require.NoError(t, err)
	return img
}

func dockerArchive(t testing.TB, refs map[string]v1.Image) string {
	t.Helper()
	m := map[name.Tag]v1.Image{}
	for r, img := range refs {
		tag, err := name.NewTag(r)
		require.NoError(t, err)
		m[tag] = img
	}
	path := filepath.Join(t.TempDir(), "images.tar")
	require.NoError(t, tarball.MultiWriteToFile(path, m))
	return path
}

func digest(t testing.TB, img v1.Image) v1.Hash {
	t.Helper()
	d, err := img.Digest()
	require.NoError(t, err)
	return d
}

// TestReadAndStore: a docker-save archive with two named images and an OCI layout with a
// single image and a multi-platform index are read by name and digest; stored archives read
// back to the same images; storing a name again replaces its archive.
func TestReadAndStore(t *testing.T) {
	app, web := image(t, host), image(t, host)
	archive := dockerArchive(t, map[string]v1.Image{"example.com/app:v1": app, "example.com/web:v2": web})

	other := v1.Platform{OS: "linux", Architecture: "s390x"}
	multi := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: image(t, other), Descriptor: v1.Descriptor{Platform: &other}},
		mutate.IndexAddendum{Add: web, Descriptor: v1.Descriptor{Platform: &host}})
	dir := filepath.Join(t.TempDir(), "layout")
	lp, err := layout.Write(dir, empty.Index)
	require.NoError(t, err)
	require.NoError(t, lp.AppendImage(app, layout.WithAnnotations(map[string]string{annotationContainerdName: "example.com/app:oci"})))
	require.NoError(t, lp.AppendIndex(multi, layout.WithAnnotations(map[string]string{annotationRefName: "example.com/web:multi"})))

	imgs, err := Read([]string{archive, dir}, host)
	require.NoError(t, err)
	got := map[string]v1.Hash{}
	for _, img := range imgs {
		got[img.Ref.Name()] = img.Digest
	}
	assert.Equal(t, map[string]v1.Hash{
		"example.com/app:v1": digest(t, app), "example.com/web:v2": digest(t, web),
		"example.com/app:oci": digest(t, app), "example.com/web:multi": digest(t, web),
	}, got)

	store := filepath.Join(t.TempDir(), "store")
	paths, err := Store(store, imgs)
	require.NoError(t, err)
	require.Len(t, paths, 4)
	stored, err := nodeimage.ArchivesIn(store)
	require.NoError(t, err)
	assert.Len(t, stored, 4)
	back, err := Read(paths[:1], host)
	require.NoError(t, err)
	assert.Equal(t, imgs[0].Digest, back[0].Digest)

	newer := dockerArchive(t, map[string]v1.Image{"example.com/app:v1": image(t, host)})
	again, err := Read([]string{newer}, host)
	require.NoError(t, err)
	_, err = Store(store, again)
	require.NoError(t, err)
	stored, err = nodeimage.ArchivesIn(store)
	require.NoError(t, err)
	assert.Len(t, stored, 4, "the same name replaces its archive")
	entries, err := os.ReadDir(store)
	require.NoError(t, err)
	assert.Len(t, entries, 4, "no temporary file left")
}

// TestReadRejects: what cannot be loaded fails naming the input, and nothing is stored.
func TestReadRejects(t *testing.T) {
	good := dockerArchive(t, map[string]v1.Image{"example.com/app:v1": image(t, host)})
	raw, err := os.ReadFile(good)
	require.NoError(t, err)
	write := func(name string, data []byte) string {
		p := filepath.Join(t.TempDir(), name)
		require.NoError(t, os.WriteFile(p, data, 0o644))
		return p
	}
	truncated := write("truncated.tar", raw[:len(raw)*2/3])
	// A byte inside a layer's data: the archive still lists, its digest does not match.
	corruptPath := write("corrupt.tar", corruptLayer(t, raw))
	s390x := dockerArchive(t, map[string]v1.Image{"example.com/app:s390x": image(t, v1.Platform{OS: "linux", Architecture: "s390x"})})
	untagged := filepath.Join(t.TempDir(), "layout")
	lp, err := layout.Write(untagged, empty.Index)
	require.NoError(t, err)
	require.NoError(t, lp.AppendImage(image(t, host), layout.WithAnnotations(map[string]string{annotationRefName: "latest"})))
	emptyLayout := filepath.Join(t.TempDir(), "empty")
	_, err = layout.Write(emptyLayout, empty.Index)
	require.NoError(t, err)

	for name, tc := range map[string]struct {
		inputs []string
		want   string
	}{
		"nothing":                  {nil, "no image archive"},
		"missing file":             {[]string{filepath.Join(t.TempDir(), "nope.tar")}, "no such file"},
		"not an archive":           {[]string{write("notes.txt", []byte("hello"))}, "not a docker-save archive"},
		"truncated":                {[]string{truncated}, truncated},
		"corrupt layer":            {[]string{good, corruptPath}, "corrupt or truncated"},
		"another platform":         {[]string{s390x}, "for linux/s390x, the nodes run linux/" + host.Architecture},
		"layout without full name": {[]string{untagged}, "has no full name"},
		"empty layout":             {[]string{emptyLayout}, "holds no image"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Read(tc.inputs, host)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// FuzzRead: any file is read as images or refused, never a panic.
func FuzzRead(f *testing.F) {
	img, err := random.Image(64, 1)
	require.NoError(f, err)
	tag, err := name.NewTag("example.com/app:v1")
	require.NoError(f, err)
	path := filepath.Join(f.TempDir(), "seed.tar")
	require.NoError(f, tarball.WriteToFile(path, tag, img))
	seed, err := os.ReadFile(path)
	require.NoError(f, err)
	f.Add(seed)
	f.Add([]byte("not a tar"))
	f.Fuzz(func(t *testing.T, data []byte) {
		p := filepath.Join(t.TempDir(), "in.tar")
		require.NoError(t, os.WriteFile(p, data, 0o644))
		_, _ = Read([]string{p}, host)
	})
}

// corruptLayer rewrites a docker archive with one byte of its first layer blob flipped.
func corruptLayer(t *testing.T, archive []byte) []byte {
	t.Helper()
	r := tar.NewReader(bytes.NewReader(archive))
	var out bytes.Buffer
	w := tar.NewWriter(&out)
	flipped := false
	for {
		h, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		data, err := io.ReadAll(r)
		require.NoError(t, err)
		if !flipped && strings.HasSuffix(h.Name, ".tar.gz") && len(data) > 100 {
			data[len(data)/2] ^= 0xff
			flipped = true
		}
		require.NoError(t, w.WriteHeader(h))
		_, err = w.Write(data)
		require.NoError(t, err)
	}
	require.NoError(t, w.Close())
	require.True(t, flipped, "no layer in the archive")
	return out.Bytes()
}
