package releasesource_test

import (
	"context"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/provider/local"
	"github.com/openconstellation/constellation/internal/release"
	"github.com/openconstellation/constellation/internal/release/releasedir"
	"github.com/openconstellation/constellation/internal/release/releasesource"
)

// mirror is a release source an attacker controls: it holds copies of genuine releases of
// upstream, each under the name the attacker chooses, and an index listing those names.
func mirror(t *testing.T, upstream string, names map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	var listed []string
	for name, genuine := range names {
		require.NoError(t, os.CopyFS(filepath.Join(dir, name), os.DirFS(filepath.Join(upstream, genuine))))
		listed = append(listed, name)
	}
	data, err := json.Marshal(releasesource.Index{Releases: listed})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, releasesource.IndexFile), data, 0o644))
	return dir
}

// A mirror that serves the genuine, correctly signed v0.2.0 as v0.3.0 (a freeze: the user
// believes they moved to v0.3.0 and keeps v0.2.0's flaws) is refused wherever the name
// reaches: opening it, fetching it (nothing written), listing it (shown refused, naming both
// versions; never as available).
func TestReplayUnderANewerName(t *testing.T) {
	ctx := context.Background()
	key, err := release.GenerateKey()
	require.NoError(t, err)
	upstream := t.TempDir()
	publishRelease(t, upstream, key, "v0.2.0")
	srv := serve(t, mirror(t, upstream, map[string]string{"v0.2.0": "v0.2.0", "v0.3.0": "v0.2.0"}))
	c := releasesource.Client{}

	_, _, err = c.Open(ctx, srv.URL+"/v0.3.0", key.Public(), policy)
	require.Error(t, err, "opening v0.3.0, which is v0.2.0")
	assert.Equal(t, release.ReasonMisnamed, release.ReasonOf(err), "%v", err)
	assert.ErrorContains(t, err, "v0.3.0")
	assert.ErrorContains(t, err, "signed as v0.2.0")

	into := t.TempDir()
	_, err = c.Fetch(ctx, srv.URL+"/v0.3.0", into, key.Public(), policy)
	require.Error(t, err, "fetching v0.3.0, which is v0.2.0")
	assert.Equal(t, release.ReasonMisnamed, release.ReasonOf(err), "%v", err)
	entries, err := os.ReadDir(into)
	require.NoError(t, err)
	assert.Empty(t, entries, "nothing is cached")
	assert.False(t, srv.askedFor(releasesource.ListingFile), "nothing of the node image was fetched")

	listed, err := c.List(ctx, srv.URL, key.Public(), policy, local.ImageDigest)
	require.NoError(t, err)
	var available, refused []string
	for _, l := range listed {
		if l.Release != nil {
			available = append(available, l.Release.Version())
			continue
		}
		refused = append(refused, l.Err.Error())
		assert.Equal(t, release.ReasonMisnamed, release.ReasonOf(l.Err), "%v", l.Err)
	}
	assert.Equal(t, []string{"v0.2.0"}, available, "only the genuine name is available")
	require.Len(t, refused, 1)
	assert.Contains(t, refused[0], "v0.3.0")
	assert.Contains(t, refused[0], "v0.2.0")
}

// A release URL whose last element leaves the source (.., encoded or not) or is not a
// version is refused before anything is fetched or written: the name becomes a path in the
// workspace.
func TestReleaseURLNamesAVersion(t *testing.T) {
	ctx := context.Background()
	key, err := release.GenerateKey()
	require.NoError(t, err)
	upstream := t.TempDir()
	publishRelease(t, upstream, key, "v0.2.0")
	// A genuine release at the root, where ".." leads.
	root := t.TempDir()
	require.NoError(t, os.CopyFS(root, os.DirFS(filepath.Join(upstream, "v0.2.0"))))
	srv := serve(t, root)
	for name, u := range map[string]string{
		"a path up":          srv.URL + "/releases/..",
		"a path up, slash":   srv.URL + "/releases/../",
		"an encoded dot-dot": srv.URL + "/releases/%2e%2e",
		"not a version":      srv.URL + "/releases/latest",
		"the root":           srv.URL,
	} {
		t.Run(name, func(t *testing.T) {
			into := filepath.Join(t.TempDir(), "releases")
			require.NoError(t, os.MkdirAll(into, 0o755))
			_, err := releasesource.Client{}.Fetch(ctx, u, into, key.Public(), policy)
			require.Error(t, err)
			assert.ErrorContains(t, err, "not a release version")
			entries, err := os.ReadDir(filepath.Dir(into))
			require.NoError(t, err)
			assert.Len(t, entries, 1, "nothing beside the releases folder")
			entries, err = os.ReadDir(into)
			require.NoError(t, err)
			assert.Empty(t, entries)
		})
	}
}

// An index that lists a name twice is refused: a listing shows every release once.
func TestVersionsRefusesADuplicate(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, releasesource.IndexFile), []byte(`{"releases": ["v0.2.0", "v0.2.0"]}`), 0o644))
	_, err := releasesource.Client{}.Versions(context.Background(), serve(t, dir).URL)
	assert.ErrorContains(t, err, "twice")
}

// What a release's node image says about itself is read, before the image is fetched, only
// through its signed listing: a file that is not the listed one is refused, a name the
// listing does not have does not exist.
func TestImageFiles(t *testing.T) {
	ctx := context.Background()
	key, err := release.GenerateKey()
	require.NoError(t, err)
	source := t.TempDir()
	publishRelease(t, source, key, "v0.2.0")
	srv := serve(t, source)
	c := releasesource.Client{}
	listed, err := c.List(ctx, srv.URL, key.Public(), policy, local.ImageDigest)
	require.NoError(t, err)
	require.Len(t, listed, 1)
	require.NoError(t, listed[0].Err)
	files, err := c.ImageFiles(ctx, listed[0].Release)
	require.NoError(t, err)
	want, err := os.ReadFile(filepath.Join(source, "v0.2.0", releasedir.NodeImageDir, local.NodeConfigFile))
	require.NoError(t, err)
	got, err := fs.ReadFile(files, local.NodeConfigFile)
	require.NoError(t, err)
	assert.Equal(t, want, got)
	_, err = fs.ReadFile(files, "not-listed")
	assert.ErrorIs(t, err, fs.ErrNotExist)
	_, err = fs.ReadFile(files, "../index.json")
	assert.ErrorIs(t, err, fs.ErrInvalid)

	require.NoError(t, os.WriteFile(filepath.Join(source, "v0.2.0", releasedir.NodeImageDir, local.NodeConfigFile), []byte(`{"evil":1}`), 0o644))
	_, err = fs.ReadFile(files, local.NodeConfigFile)
	assert.Equal(t, release.ReasonTampered, release.ReasonOf(err), "%v", err)
}
