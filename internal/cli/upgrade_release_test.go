package cli

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/nodeimage"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/provider/azure"
	"github.com/openconstellation/constellation/internal/provider/local"
	"github.com/openconstellation/constellation/internal/provider/local/cluster"
	localplatform "github.com/openconstellation/constellation/internal/provider/local/platform"
	"github.com/openconstellation/constellation/internal/release"
	"github.com/openconstellation/constellation/internal/release/publish"
	"github.com/openconstellation/constellation/internal/release/releasedir"
	"github.com/openconstellation/constellation/internal/release/releasesource"
	"github.com/openconstellation/constellation/internal/state"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/verify"
)

// releaseBench is a workspace whose configuration (config generate local) boots a small
// development image, a release key it pins, and a release source: what `make up`, `make
// release-key` and `make release` leave, with node images of placeholder files (the release
// code measures and digests files; nothing boots them).
type releaseBench struct {
	t                           *testing.T
	ws, base, imagesDir, source string
	key                         *release.Signer
}

func newReleaseBench(t *testing.T) *releaseBench {
	t.Helper()
	b := &releaseBench{t: t, ws: t.TempDir(), base: filepath.Join(t.TempDir(), "image"), imagesDir: t.TempDir(), source: t.TempDir()}
	require.NoError(t, os.MkdirAll(b.base, 0o755))
	for _, name := range local.ImageFiles() {
		require.NoError(t, os.WriteFile(filepath.Join(b.base, name), []byte("development "+name), 0o755))
	}
	nc, err := local.NodeConfig{KubernetesVersion: config.DefaultKubernetesVersion, Provider: "local", ServicesImage: "localhost/constellation/services:dev"}.Marshal()
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(b.base, local.NodeConfigFile), nc, 0o644))
	require.NoError(t, os.MkdirAll(filepath.Join(b.imagesDir, "bin"), 0o755))
	for _, name := range nodeimage.ServiceBinaries {
		require.NoError(t, os.WriteFile(filepath.Join(b.imagesDir, "bin", name), []byte("binary "+name), 0o755))
	}
	b.key, err = release.GenerateKey()
	require.NoError(t, err)
	pub, err := b.key.Public().MarshalPEM()
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(b.ws, "release-key.pem.pub"), pub, 0o644))

	out, err := run(t, "-C", b.ws, "config", "generate", "local", "--image", b.base)
	require.NoError(t, err, out)
	b.edit(func(c *config.Config) { c.Release = config.ReleaseConfig{Key: "release-key.pem.pub", Source: b.source} })
	return b
}

// edit changes the workspace's configuration.
func (b *releaseBench) edit(f func(*config.Config)) {
	b.t.Helper()
	path := filepath.Join(b.ws, config.FileName)
	c, err := config.Load(path)
	require.NoError(b.t, err)
	f(c)
	require.NoError(b.t, config.Write(path, c, true))
}

func (b *releaseBench) conf() *config.Config {
	b.t.Helper()
	c, err := config.Load(filepath.Join(b.ws, config.FileName))
	require.NoError(b.t, err)
	return c
}

// publish makes release version in the source, as make release does, upgrading from the
// images (release directories or node images) in from.
func (b *releaseBench) publish(version string, from ...string) string {
	b.t.Helper()
	dir, err := publish.Publish(context.Background(), publish.Options{Source: b.source, Version: version, BaseImage: b.base,
		ImagesDir: b.imagesDir, Platform: localplatform.Platform{}, Signer: b.key, From: from})
	require.NoError(b.t, err)
	return dir
}

// initialized records an initialized cluster in the workspace, as init leaves it: control-plane-0
// booting image, the release it runs (empty: a development image), and an API server (on
// loopback) that answers for its nodes, every kubelet at the configuration's version.
func (b *releaseBench) initialized(image, runs string) {
	b.t.Helper()
	now := time.Now().UTC()
	st := &state.State{
		Version: state.Version1, Name: "demo", Provider: state.ProviderLocal, Phase: state.Initialized,
		CreatedAt: now, InitializedAt: now, InitEndpoint: "10.42.0.10:9000",
		ClusterID: bytes.Repeat([]byte{1}, 32), MeasurementSalt: bytes.Repeat([]byte{2}, 32), Release: runs,
		Nodes: []state.Node{{Name: "control-plane-0", Role: metadata.ControlPlane, IPs: []netip.Addr{netip.MustParseAddr("10.42.0.10")}}},
	}
	require.NoError(b.t, state.Write(filepath.Join(b.ws, state.FileName), st))
	// The platform's record of the machines (the local provider's spec, read while it is
	// stopped): which image each boots.
	spec := cluster.Spec{Dir: localplatform.Platform{}.Folder(b.ws), Nodes: []cluster.NodeSpec{{NodeSpec: provider.NodeSpec{Name: "control-plane-0", Role: metadata.ControlPlane, Image: image}}}}
	data, err := json.Marshal(spec)
	require.NoError(b.t, err)
	require.NoError(b.t, os.MkdirAll(spec.Dir, 0o700))
	require.NoError(b.t, os.WriteFile(filepath.Join(spec.Dir, cluster.SpecFile), data, 0o600))

	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/nodes" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"kind":"NodeList","apiVersion":"v1","items":[{"metadata":{"name":"control-plane-0"},"status":{"nodeInfo":{"kubeletVersion":%q}}}]}`, config.DefaultKubernetesVersion)
	}))
	b.t.Cleanup(api.Close)
	kubeconfig := fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: %s\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\nusers:\n- name: u\n  user: {}\ncurrent-context: c\n", api.URL)
	require.NoError(b.t, os.WriteFile(filepath.Join(b.ws, AdminConfFile), []byte(kubeconfig), 0o600))
}

// runsRelease makes the configuration's reference sets the release's, as apply leaves them
// once every node boots it.
func (b *releaseBench) runsRelease(dir string) {
	b.t.Helper()
	r, err := releasedir.Open(context.Background(), dir, b.key.Public(), release.Policy{}, local.ImageDigest)
	require.NoError(b.t, err)
	ref, ok := r.Reference(variant.QEMUVTPM)
	require.True(b.t, ok)
	b.edit(func(c *config.Config) {
		c.Attestation.Of(variant.QEMUVTPM).Measurements = measurements.ReferenceSets(ref.Measurements)
	})
	b.initialized(r.NodeImage(), r.Version())
}

func (b *releaseBench) check(source string) string {
	b.t.Helper()
	var out bytes.Buffer
	require.NoError(b.t, upgradeCheck(context.Background(), &out, b.ws, source))
	b.t.Logf("upgrade check:\n%s", out.String())
	return out.String()
}

// serveMirror serves dir over HTTP with an index of every release directory in it.
func serveMirror(t *testing.T, dir string) string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	idx := releasesource.Index{Releases: []string{}}
	for _, e := range entries {
		if releasedir.IsRelease(filepath.Join(dir, e.Name())) {
			idx.Releases = append(idx.Releases, e.Name())
		}
	}
	data, err := json.Marshal(idx)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, releasesource.IndexFile), data, 0o644))
	srv := httptest.NewServer(http.FileServer(http.Dir(dir)))
	t.Cleanup(srv.Close)
	return srv.URL
}

// A source (a directory, or a mirror serving it) whose v0.3.0 is the genuine, correctly
// signed v0.2.0: upgrade check shows v0.3.0 refused, naming both versions, and never as an
// available release; v0.2.0 is listed once, under its own name.
func TestUpgradeCheckRefusesAReplay(t *testing.T) {
	b := newReleaseBench(t)
	genuine := b.publish("v0.2.0", b.base)
	require.NoError(t, os.CopyFS(filepath.Join(b.source, "v0.3.0"), os.DirFS(genuine)))
	url := serveMirror(t, b.source)
	for name, source := range map[string]string{"directory": b.source, "URL": url} {
		t.Run(name, func(t *testing.T) {
			out := b.check(source)
			assert.Regexp(t, `(?m)^v0\.3\.0\s+-\s+refused: .*v0\.3\.0.*signed as v0\.2\.0`, out)
			assert.Len(t, regexp.MustCompile(`(?m)^v0\.2\.0\s+\S+\s+allowed`).FindAllString(out, -1), 1, "v0.2.0 is available once")
			assert.NotRegexp(t, `(?m)^v0\.3\.0\s+\S+\s+allowed`, out)
		})
	}
}

// A fetched release is kept in the workspace under its name; a copy there that is another
// release (written by a CLI that did not compare names, or by anyone who can write the
// workspace) is refused when read, never trusted because it is in the cache: apply fetches
// the release again, and refuses it if the source replays too.
func TestFetchedReleaseCacheIsCheckedAgainstItsName(t *testing.T) {
	ctx := context.Background()
	b := newReleaseBench(t)
	v2 := b.publish("v0.2.0", b.base)
	cached := filepath.Join(b.ws, fetchedReleases, "v0.3.0")
	require.NoError(t, os.CopyFS(cached, os.DirFS(v2)), "the poisoned cache")

	t.Run("the source serves the genuine v0.3.0", func(t *testing.T) {
		b.publish("v0.3.0", b.base)
		url := serveMirror(t, b.source)
		b.edit(func(c *config.Config) { c.Provider.Block().Image = url + "/v0.3.0" })
		image, rel, err := configuredImage(ctx, b.ws, b.conf(), "", false)
		require.NoError(t, err)
		assert.Equal(t, "v0.3.0", rel.Version(), "the cached v0.2.0 was not trusted")
		assert.Equal(t, filepath.Join(cached, releasedir.NodeImageDir), image)
	})
	require.NoError(t, os.RemoveAll(cached))
	require.NoError(t, os.CopyFS(cached, os.DirFS(v2)), "poisoned again")

	t.Run("the source replays v0.2.0 too", func(t *testing.T) {
		mirror := t.TempDir()
		require.NoError(t, os.CopyFS(filepath.Join(mirror, "v0.3.0"), os.DirFS(v2)))
		b.edit(func(c *config.Config) { c.Provider.Block().Image = serveMirror(t, mirror) + "/v0.3.0" })
		_, _, err := configuredImage(ctx, b.ws, b.conf(), "", false)
		require.Error(t, err)
		assert.Equal(t, release.ReasonMisnamed, release.ReasonOf(err), "%v", err)
		assert.ErrorContains(t, err, "v0.3.0")
		assert.ErrorContains(t, err, "signed as v0.2.0")
	})

	t.Run("a release URL that leaves the releases folder", func(t *testing.T) {
		root := t.TempDir()
		require.NoError(t, os.CopyFS(root, os.DirFS(v2)), "a genuine release where .. leads")
		url := httptest.NewServer(http.FileServer(http.Dir(root)))
		t.Cleanup(url.Close)
		b.edit(func(c *config.Config) { c.Provider.Block().Image = url.URL + "/releases/.." })
		_, _, err := configuredImage(ctx, b.ws, b.conf(), "", false)
		require.Error(t, err)
		assert.ErrorContains(t, err, "not a release version")
		assert.FileExists(t, filepath.Join(b.ws, config.FileName), "the workspace is intact")
	})
}

// The first release made without FROM (its nodes trust only their own image's join services)
// is refused by upgrade check and by apply before anything changes, naming the FROM it needs:
// its first node could never join the running cluster. A release made with FROM is allowed.
func TestUpgradeRefusesAReleaseThatDoesNotTrustTheRunningJoinServices(t *testing.T) {
	t.Run("from a development image", func(t *testing.T) {
		b := newReleaseBench(t)
		b.initialized(b.base, "")
		b.publish("v0.1.0")
		b.publish("v0.1.1", b.base)
		out := b.check("")
		assert.Regexp(t, `(?m)^v0\.1\.0\s+\S+\s+refused: .*join services.*FROM=`+regexp.QuoteMeta(b.base), out)
		assert.Regexp(t, `(?m)^v0\.1\.1\s+\S+\s+allowed: upgrade`, out)
	})
	t.Run("from a release", func(t *testing.T) {
		b := newReleaseBench(t)
		v1 := b.publish("v0.1.0", b.base)
		b.runsRelease(v1)
		b.publish("v0.2.0")
		b.publish("v0.2.1", v1)
		url := serveMirror(t, b.source)
		for _, source := range []string{"", url} {
			out := b.check(source)
			assert.Regexp(t, `(?m)^v0\.2\.0\s+\S+\s+refused: .*join services.*FROM=v0\.1\.0`, out)
			assert.Regexp(t, `(?m)^v0\.2\.1\s+\S+\s+allowed: upgrade`, out)
			assert.Regexp(t, `(?m)^v0\.1\.0\s+\S+\s+running`, out)
		}
	})
	t.Run("apply refuses before anything changes", func(t *testing.T) {
		b := newReleaseBench(t)
		b.initialized(b.base, "")
		bad := b.publish("v0.1.0")
		b.edit(func(c *config.Config) { c.Provider.Block().Image = bad })
		st, err := state.Load(filepath.Join(b.ws, state.FileName))
		require.NoError(t, err)
		var out bytes.Buffer
		err = reconcile(context.Background(), &out, newPhaseTimer(&out), b.ws, b.conf(), st, scaleOptions{})
		require.Error(t, err)
		assert.Contains(t, err.Error(), "join services")
		assert.Contains(t, err.Error(), "FROM="+b.base)
		after, err := state.Load(filepath.Join(b.ws, state.FileName))
		require.NoError(t, err)
		assert.Equal(t, st, after, "the state is unchanged")
		assert.True(t, strings.HasPrefix(b.conf().Attestation.Of(variant.QEMUVTPM).Measurements[0].Name, "local-"), "the configuration's sets are unchanged")
	})
}

// A release whose node image is another release's (re-signed under a new version: its
// measured node configuration still names the old release) is refused before anything
// changes: the image must say the release's version, Kubernetes version and services.
func TestUpgradeCheckRefusesAnImageOfAnotherRelease(t *testing.T) {
	b := newReleaseBench(t)
	b.initialized(b.base, "")
	v1 := b.publish("v0.1.0", b.base)
	r, err := releasedir.Open(context.Background(), v1, b.key.Public(), release.Policy{}, local.ImageDigest)
	require.NoError(t, err)
	resigned := filepath.Join(b.source, "v0.1.1")
	require.NoError(t, os.CopyFS(filepath.Join(resigned, releasedir.NodeImageDir), os.DirFS(r.NodeImage())))
	m := r.Manifest()
	m.Version = "v0.1.1"
	m.References[0].Measurements[0].Name = "v0.1.1"
	require.NoError(t, releasedir.Write(context.Background(), resigned, m, b.key, local.ImageDigest))
	out := b.check("")
	assert.Regexp(t, `(?m)^v0\.1\.1\s+\S+\s+refused: .*its node image names release "v0\.1\.0", its manifest "v0\.1\.1"`, out)
	assert.Regexp(t, `(?m)^v0\.1\.0\s+\S+\s+allowed: upgrade`, out)
}

// On a cloud, a release's nodes boot the image the release names for it (release.CloudImage):
// configuredImage resolves a release to that image, checked whole as on the sandbox, and
// refuses a release that names none before anything changes.
func TestConfiguredImageOnACloudIsTheReleasesCloudImage(t *testing.T) {
	b := newReleaseBench(t)
	const ref = "/subscriptions/s/resourceGroups/images/providers/Microsoft.Compute/galleries/g/images/node/versions/0.2.0"
	onAzure := func(image string) *config.Config {
		c := b.conf()
		block := *c.Provider.Block()
		block.Image = image
		c.Provider = config.ProviderFor(azure.Name, block)
		return c
	}

	sandboxOnly := b.publish("v0.1.0", b.base)
	_, _, err := configuredImage(t.Context(), b.ws, onAzure(sandboxOnly), "", false)
	assert.Equal(t, release.ReasonNoCloudImage, release.ReasonOf(err), "%v", err)
	assert.ErrorContains(t, err, "release v0.1.0 names no image for provider azure (it names images for: none)")

	azureImage := release.CloudImage{Provider: azure.Name, Ref: ref, Digest: "sha256:" + strings.Repeat("ab", 32)}
	dir, err := publish.Publish(t.Context(), publish.Options{Source: b.source, Version: "v0.2.0", BaseImage: b.base,
		ImagesDir: b.imagesDir, Platform: localplatform.Platform{}, Signer: b.key, From: []string{b.base}, CloudImages: []release.CloudImage{azureImage}})
	require.NoError(t, err)
	image, rel, err := configuredImage(t.Context(), b.ws, onAzure(dir), "", false)
	require.NoError(t, err)
	assert.Equal(t, ref, image, "Azure's nodes boot the gallery image version the release signed")
	assert.Equal(t, "v0.2.0", rel.Version())
	// The sandbox boots the release's node image itself.
	image, _, err = configuredImage(t.Context(), b.ws, b.conf(), "", false)
	require.NoError(t, err)
	assert.Equal(t, b.base, image, "a plain node image is booted as it is")
	b.edit(func(c *config.Config) { c.Provider.Block().Image = dir })
	image, _, err = configuredImage(t.Context(), b.ws, b.conf(), "", false)
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(dir, releasedir.NodeImageDir), image)

	// QEMU machines boot neither a release's node image nor a cloud's image: no release can
	// name what they boot, whatever it carries.
	onQEMU := b.conf()
	block := *onQEMU.Provider.Block()
	block.Image = dir
	onQEMU.Provider = config.ProviderFor("qemu", block)
	_, _, err = configuredImage(t.Context(), b.ws, onQEMU, "", false)
	assert.ErrorContains(t, err, "provider qemu boots no release images")
	onQEMU.Provider.Block().Image = b.base
	image, _, err = configuredImage(t.Context(), b.ws, onQEMU, "", false)
	require.NoError(t, err, "a plain image is booted as it is")
	assert.Equal(t, b.base, image)

	// The node image beside the release is still checked: its files are what the cloud image
	// is made from, and what the pre-checks read.
	require.NoError(t, os.WriteFile(filepath.Join(dir, releasedir.NodeImageDir, local.NodeConfigFile), []byte("{}"), 0o644))
	_, _, err = configuredImage(t.Context(), b.ws, onAzure(dir), "", false)
	assert.Equal(t, release.ReasonTampered, release.ReasonOf(err), "%v", err)
}

// Before a release is recorded or any other set retired, every node must measure what one of
// the release's own sets says, whatever set the verifier matched it by: a replacement a
// killed apply left unverified, a node a scale-up added, a cluster created from the release.
// On a cloud that is what ties the disk behind the release's image to the release.
func TestEveryNodeIsVerifiedAsTheReleasesBeforeItIsRecorded(t *testing.T) {
	b := newReleaseBench(t)
	dir := b.publish("v0.2.0", b.base)
	rel, err := releasedir.Open(t.Context(), dir, b.key.Public(), release.Policy{}, local.ImageDigest)
	require.NoError(t, err)
	conf := b.conf()
	v := conf.Attestation.Variant()
	ref, ok := rel.Reference(v)
	require.True(t, ok)
	base, err := localplatform.Platform{}.ReferenceValues(b.base)
	require.NoError(t, err)
	registers := func(m measurements.M) []verify.Register {
		var out []verify.Register
		for _, i := range m.Indices() {
			out = append(out, verify.Register{Index: i, Value: hex.EncodeToString(m[i].Expected)})
		}
		return out
	}
	ofRelease := registers(ref.Measurements[0].Measurements)
	old := registers(base.Measurements)

	for name, tc := range map[string]struct {
		measured map[string][]verify.Register
		verified []string // by this apply already
		wantErr  string
		asked    []string
	}{
		"every node the release's": {
			measured: map[string][]verify.Register{"control-plane-1": ofRelease, "worker-1": ofRelease},
			asked:    []string{"control-plane-1", "worker-1"},
		},
		// Matched by the old image's set, which the cluster admits during a roll.
		"a node of the old image under the release's name": {
			measured: map[string][]verify.Register{"control-plane-1": ofRelease, "worker-1": old},
			wantErr:  "release v0.2.0 is not recorded and no reference set retired: worker-1 matched reference set \"old\", not one of release v0.2.0",
		},
		"nodes this apply verified are not asked again": {
			measured: map[string][]verify.Register{"worker-1": ofRelease},
			verified: []string{"control-plane-1"},
			asked:    []string{"worker-1"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			var asked []string
			out := &lockedBuffer{}
			tm := newPhaseTimer(out)
			st := &state.State{Nodes: []state.Node{
				{Name: "control-plane-1", Role: metadata.ControlPlane, IPs: []netip.Addr{netip.MustParseAddr("10.42.0.11")}},
				{Name: "worker-1", Role: metadata.Worker, IPs: []netip.Addr{netip.MustParseAddr("10.42.0.12")}},
				{Name: "worker-other", Role: metadata.Worker, Unexpected: true, IPs: []netip.Addr{netip.MustParseAddr("10.42.0.13")}},
			}}
			u := &upgrade{reconciler: &reconciler{out: out, t: tm, prog: newProgress(tm), st: st}, conf: conf, release: rel,
				verified: tc.verified, verifyNode: func(_ context.Context, node, _ string) (*verify.Result, error) {
					asked = append(asked, node)
					return &verify.Result{Claims: verify.Claims{ReferenceSet: "old", Registers: tc.measured[node]}}, nil
				}}
			err := u.verifyAllRelease(t.Context())
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.asked, asked, "an unexpected node is not the release's to verify")
		})
	}
}
