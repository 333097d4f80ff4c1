package releasesource_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/nodeimage"
	"github.com/openconstellation/constellation/internal/provider/local"
	localplatform "github.com/openconstellation/constellation/internal/provider/local/platform"
	"github.com/openconstellation/constellation/internal/release"
	"github.com/openconstellation/constellation/internal/release/publish"
	"github.com/openconstellation/constellation/internal/release/releasedir"
	"github.com/openconstellation/constellation/internal/release/releasesource"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// publishRelease writes release version of a small node image into source, as `make release`
// does, and returns the signing key.
func publishRelease(t *testing.T, source string, key *release.Signer, version string) {
	t.Helper()
	image, imagesDir := t.TempDir(), t.TempDir()
	for _, name := range local.ImageFiles() {
		require.NoError(t, os.WriteFile(filepath.Join(image, name), []byte("content of "+name), 0o755))
	}
	nc, err := local.NodeConfig{KubernetesVersion: "v1.34.4", Provider: "local", ServicesImage: "localhost/constellation/services:abc"}.Marshal()
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(image, local.NodeConfigFile), nc, 0o644))
	require.NoError(t, os.MkdirAll(filepath.Join(imagesDir, "bin"), 0o755))
	for _, name := range nodeimage.ServiceBinaries {
		require.NoError(t, os.WriteFile(filepath.Join(imagesDir, "bin", name), []byte("binary "+name), 0o755))
	}
	_, err = publish.Publish(context.Background(), publish.Options{Source: source, Version: version, BaseImage: image,
		ImagesDir: imagesDir, Platform: localplatform.Platform{}, Signer: key})
	require.NoError(t, err)
}

// served serves dir over HTTP and records the paths asked for.
type served struct {
	*httptest.Server
	mu    sync.Mutex
	asked []string
}

func serve(t *testing.T, dir string) *served {
	s := &served{}
	files := http.FileServer(http.Dir(dir))
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.asked = append(s.asked, r.URL.Path)
		s.mu.Unlock()
		files.ServeHTTP(w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *served) askedFor(suffix string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.asked {
		if strings.HasSuffix(p, suffix) {
			return true
		}
	}
	return false
}

var policy = release.Policy{Variant: variant.QEMUVTPM}

func TestFetch(t *testing.T) {
	ctx := context.Background()
	key, err := release.GenerateKey()
	require.NoError(t, err)
	source := t.TempDir()
	publishRelease(t, source, key, "v0.1.0")
	publishRelease(t, source, key, "v0.2.0")
	srv := serve(t, source)
	c := releasesource.Client{}

	versions, err := c.Versions(ctx, srv.URL)
	require.NoError(t, err)
	assert.Equal(t, []string{"v0.1.0", "v0.2.0"}, versions)

	verified, _, err := c.Open(ctx, srv.URL+"/v0.2.0", key.Public(), policy)
	require.NoError(t, err)
	assert.Equal(t, "v0.2.0", verified.Manifest().Version)

	into := t.TempDir()
	dest := filepath.Join(into, "v0.2.0")
	for range 2 { // a second fetch replaces the first
		got, err := c.Fetch(ctx, srv.URL+"/v0.2.0", into, key.Public(), policy)
		require.NoError(t, err)
		assert.Equal(t, dest, got, "the release is kept under its signed version")
		r, err := releasedir.Open(ctx, dest, key.Public(), policy, local.ImageDigest)
		require.NoError(t, err, "the download is a release directory that opens")
		assert.Equal(t, "v0.2.0", r.Version())
	}
	archives, err := local.ImageArchives(filepath.Join(dest, releasedir.NodeImageDir))
	require.NoError(t, err)
	assert.Len(t, archives, 1, "the services image came along")
}

// Attacks on a URL source, from the side of whoever controls it: each refused with its
// reason, nothing left where the release would go, and a listing that does not match the
// signature is refused before any file of the image is fetched.
func TestFetchRefuses(t *testing.T) {
	ctx := context.Background()
	key, err := release.GenerateKey()
	require.NoError(t, err)
	other, err := release.GenerateKey()
	require.NoError(t, err)
	for name, tc := range map[string]struct {
		key        *release.Signer
		tamper     func(t *testing.T, releaseDir string)
		version    string
		wantReason release.Reason
		wantErr    string
		// fetched is a file that must not have been asked for.
		notFetched string
	}{
		"another key's release": {key: other, wantReason: release.ReasonWrongKey, notFetched: releasesource.ListingFile},
		"a listing that is not the signed one": {key: key, tamper: func(t *testing.T, dir string) {
			path := filepath.Join(dir, releasedir.NodeImageDir, releasesource.ListingFile)
			data, err := os.ReadFile(path)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(path, append(data, []byte(strings.Repeat("0", 64)+"  evil\n")...), 0o644))
		}, wantReason: release.ReasonTampered, wantErr: "node image listing", notFetched: "/kubelet"},
		"a changed file": {key: key, tamper: func(t *testing.T, dir string) {
			require.NoError(t, os.WriteFile(filepath.Join(dir, releasedir.NodeImageDir, "kubelet"), []byte("evil kubelet"), 0o755))
		}, wantReason: release.ReasonTampered, wantErr: "kubelet has SHA-256"},
		"a changed services image": {key: key, tamper: func(t *testing.T, dir string) {
			require.NoError(t, os.WriteFile(filepath.Join(dir, releasedir.NodeImageDir, local.ImageArchivesDir, "services.tar"), []byte("evil"), 0o644))
		}, wantReason: release.ReasonTampered, wantErr: "services.tar has SHA-256"},
		"a missing file": {key: key, tamper: func(t *testing.T, dir string) {
			require.NoError(t, os.Remove(filepath.Join(dir, releasedir.NodeImageDir, "kubeadm")))
		}, wantErr: "404 Not Found"},
		"no such release": {key: key, version: "v9.9.9", wantErr: "404 Not Found"},
	} {
		t.Run(name, func(t *testing.T) {
			source := t.TempDir()
			publishRelease(t, source, tc.key, "v0.1.0")
			if tc.tamper != nil {
				tc.tamper(t, filepath.Join(source, "v0.1.0"))
			}
			srv := serve(t, source)
			version := "v0.1.0"
			if tc.version != "" {
				version = tc.version
			}
			into := t.TempDir()
			dest := filepath.Join(into, version)
			_, err := releasesource.Client{}.Fetch(ctx, srv.URL+"/"+version, into, key.Public(), policy)
			require.Error(t, err)
			if tc.wantReason != 0 {
				assert.Equal(t, tc.wantReason, release.ReasonOf(err), "%v", err)
			}
			assert.ErrorContains(t, err, tc.wantErr)
			assert.NoDirExists(t, dest, "nothing is left where the release would go")
			assert.NoDirExists(t, dest+".download")
			if tc.notFetched != "" {
				assert.False(t, srv.askedFor(tc.notFetched), "%s was fetched", tc.notFetched)
			}
		})
	}
}

func TestVersionsRefusesABadIndex(t *testing.T) {
	for name, index := range map[string]string{
		"not a version":  `{"releases": ["../../etc"]}`,
		"an unknown key": `{"releases": [], "evil": 1}`,
		"not JSON":       `releases`,
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			require.NoError(t, os.WriteFile(filepath.Join(dir, releasesource.IndexFile), []byte(index), 0o644))
			_, err := releasesource.Client{}.Versions(context.Background(), serve(t, dir).URL)
			assert.Error(t, err)
		})
	}
}

func TestName(t *testing.T) {
	assert.Equal(t, "v0.2.0", releasesource.Name("https://example.com/releases/v0.2.0"))
	assert.Equal(t, "v0.2.0", releasesource.Name("https://example.com/releases/v0.2.0/"))
	assert.Equal(t, "v0.2.0", releasesource.Name("https://example.com/releases/x/../v0.2.0"), "the name the requests use")
	assert.Equal(t, "releases", releasesource.Name("https://example.com/releases/v0.2.0/.."))
	assert.Equal(t, "/", releasesource.Name("https://example.com/releases/%2e%2e"))
	assert.Equal(t, "/", releasesource.Name("https://example.com"))
	assert.True(t, releasesource.IsURL("http://127.0.0.1:8080/releases"))
	assert.False(t, releasesource.IsURL("/srv/releases"))
}

// List reads a directory source and the same source served over HTTP alike.
func TestList(t *testing.T) {
	ctx := context.Background()
	key, err := release.GenerateKey()
	require.NoError(t, err)
	source := t.TempDir()
	publishRelease(t, source, key, "v0.1.0")
	publishRelease(t, source, key, "v0.2.0")
	srv := serve(t, source)
	for name, src := range map[string]string{"directory": source, "URL": srv.URL} {
		t.Run(name, func(t *testing.T) {
			listed, err := releasesource.Client{}.List(ctx, src, key.Public(), policy, local.ImageDigest)
			require.NoError(t, err)
			require.Len(t, listed, 2)
			assert.Equal(t, "v0.2.0", listed[0].Release.Version(), "newest first")
			assert.Equal(t, "v0.1.0", listed[1].Release.Version())
		})
	}
	other, err := release.GenerateKey()
	require.NoError(t, err)
	listed, err := releasesource.Client{}.List(ctx, srv.URL, other.Public(), policy, local.ImageDigest)
	require.NoError(t, err)
	for _, l := range listed {
		assert.Equal(t, release.ReasonWrongKey, release.ReasonOf(l.Err), "%v", l.Err)
	}
}
