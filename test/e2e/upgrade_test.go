package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/secure-systems-lab/go-securesystemslib/dsse"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/clusterrecord"
	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/kubeversion"
	"github.com/openconstellation/constellation/internal/nodeimage"
	"github.com/openconstellation/constellation/internal/provider/local"
	"github.com/openconstellation/constellation/internal/release"
	"github.com/openconstellation/constellation/internal/release/releasedir"
	"github.com/openconstellation/constellation/internal/state"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// releases is the release tooling of the upgrade tests: cmd/release, the key it made, and the
// source it writes releases into.
type releases struct {
	t                         testing.TB
	bin, key, source, imgsDir string
}

func newReleases(t testing.TB) *releases {
	t.Helper()
	dir := t.TempDir()
	out, err := exec.Command("go", "build", "-o", dir+"/", "github.com/openconstellation/constellation/cmd/release").CombinedOutput()
	require.NoError(t, err, "%s", out)
	r := &releases{t: t, bin: filepath.Join(dir, "release"), key: filepath.Join(dir, "release-key.pem"), source: t.TempDir(),
		imgsDir: filepath.Join(repoOutput(t), "images")}
	r.run("keygen", r.key)
	return r
}

func (r *releases) run(args ...string) string {
	r.t.Helper()
	out, err := exec.Command(r.bin, args...).CombinedOutput()
	require.NoError(r.t, err, "release %s: %s", strings.Join(args, " "), out)
	return string(out)
}

// create makes release version of the base image into the source, signed by the pinned key,
// upgrading from the images in from.
func (r *releases) create(base, version string, from ...string) string {
	r.t.Helper()
	args := []string{"create", "--key", r.key, "--version", version, "--source", r.source, "--base-image", base, "--images", r.imgsDir}
	for _, f := range from {
		args = append(args, "--from", f)
	}
	r.run(args...)
	return filepath.Join(r.source, version)
}

func (r *releases) signer() *release.Signer {
	r.t.Helper()
	data, err := os.ReadFile(r.key)
	require.NoError(r.t, err)
	s, err := release.ParseSigner(data)
	require.NoError(r.t, err)
	return s
}

// resign copies release version to a directory of its own (named by the version: a release
// is opened only under its signed version), lets edit change its manifest, and signs it with
// s, without the checks release.Sign makes: what a careless or compromised release process
// could publish with the pinned key. name says what the copy is, for the test's log.
func (r *releases) resign(version, name string, s *release.Signer, edit func(m map[string]any)) string {
	r.t.Helper()
	dst := filepath.Join(r.t.TempDir(), version)
	r.t.Logf("%s: %s", name, dst)
	require.NoError(r.t, os.CopyFS(dst, os.DirFS(filepath.Join(r.source, version))))
	data, err := os.ReadFile(filepath.Join(dst, releasedir.EnvelopeFile))
	require.NoError(r.t, err)
	var env dsse.Envelope
	require.NoError(r.t, json.Unmarshal(data, &env))
	payload, err := env.DecodeB64Payload()
	require.NoError(r.t, err)
	var st map[string]any
	require.NoError(r.t, json.Unmarshal(payload, &st))
	edit(st["predicate"].(map[string]any))
	payload, err = json.Marshal(st)
	require.NoError(r.t, err)
	es, err := dsse.NewEnvelopeSigner(s)
	require.NoError(r.t, err)
	signed, err := es.SignPayload(context.Background(), env.PayloadType, payload)
	require.NoError(r.t, err)
	data, err = json.Marshal(signed)
	require.NoError(r.t, err)
	require.NoError(r.t, os.WriteFile(filepath.Join(dst, releasedir.EnvelopeFile), data, 0o644))
	return dst
}

// firstSet returns the first reference set's measurements of a manifest's first reference.
func firstSet(m map[string]any) map[string]any {
	refs := m["references"].([]any)
	sets := refs[0].(map[string]any)["measurements"].([]any)
	return sets[0].(map[string]any)["measurements"].(map[string]any)
}

// useRelease points the workspace's configuration at image (a release or node image
// directory, relative to ws or absolute), pinning key, with the Kubernetes version the
// image's node-config.json names (unchanged if it names none).
func useRelease(t testing.TB, ws, key, source, image string) {
	t.Helper()
	path := filepath.Join(ws, config.FileName)
	conf, err := config.Load(path)
	require.NoError(t, err)
	conf.Release = config.ReleaseConfig{Key: key, Source: source}
	conf.Provider.Block().Image = image
	dir := image
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(ws, dir)
	}
	if _, err := os.Stat(filepath.Join(dir, releasedir.NodeImageDir)); err == nil {
		dir = filepath.Join(dir, releasedir.NodeImageDir)
	}
	if data, err := os.ReadFile(filepath.Join(dir, local.NodeConfigFile)); err == nil {
		if nc, err := local.ParseNodeConfig(data); err == nil {
			conf.KubernetesVersion = nc.KubernetesVersion
		}
	}
	require.NoError(t, config.Write(path, conf, true))
}

// useURL points the workspace's configuration at a release source and a release by URL.
func useURL(t testing.TB, ws, source, image string) {
	t.Helper()
	path := filepath.Join(ws, config.FileName)
	conf, err := config.Load(path)
	require.NoError(t, err)
	conf.Release.Source = source
	conf.Provider.Block().Image = image
	require.NoError(t, config.Write(path, conf, true))
}

// layOutImage lays out the default node image of Kubernetes version, as config generate
// does, and returns its directory.
func layOutImage(t testing.TB, bin, version string) string {
	t.Helper()
	ws := t.TempDir()
	out, err := exec.Command(bin, "config", "generate", "local", "-C", ws, "--kubernetes-version", version,
		"--kube-dir", kubeDir(t), "--images", filepath.Join(repoOutput(t), "images")).CombinedOutput()
	require.NoError(t, err, "%s", out)
	conf, err := config.Load(filepath.Join(ws, config.FileName))
	require.NoError(t, err)
	return conf.Provider.Block().ImagePath(ws)
}

// clusterSets are the names of the reference sets the cluster admits by, and those of the
// workspace's configuration.
func (d *dayTwo) clusterSets() (inCluster, inConfig []string) {
	d.t.Helper()
	data := kubectl(d.t, d.kubeconfig, "-n", clusterrecord.Namespace, "get", "configmap", clusterrecord.AttestationConfigMapName,
		"-o", "jsonpath={.data.reference-sets\\.json}")
	sets, err := measurements.DecodeReferenceSets([]byte(data), variant.QEMUVTPM)
	require.NoError(d.t, err)
	for _, s := range sets {
		inCluster = append(inCluster, s.Name)
	}
	conf, err := config.Load(filepath.Join(d.ws, config.FileName))
	require.NoError(d.t, err)
	for _, s := range conf.Attestation.Of(variant.QEMUVTPM).Measurements {
		inConfig = append(inConfig, s.Name)
	}
	return inCluster, inConfig
}

func (d *dayTwo) nodeNames() []string {
	d.t.Helper()
	st, err := state.Load(filepath.Join(d.ws, state.FileName))
	require.NoError(d.t, err)
	var names []string
	for _, n := range st.Nodes {
		names = append(names, n.Name)
	}
	slices.Sort(names)
	return names
}

func (d *dayTwo) runErr(args ...string) (string, error) {
	d.t.Helper()
	out, err := exec.Command(d.bin, append(args, "-C", d.ws)...).CombinedOutput()
	return string(out), err
}

// TestUpgrade moves a local cluster (1 control plane, 1 worker) from its development image to
// signed release v0.1.0 (the CLI killed in the middle, the rerun finishing) and on to v0.2.0
// (whose PCR 12 differs, and whose Kubernetes is the next minor), through apply, after every
// attack of a release is refused with nothing changed; a release whose nodes fail attestation
// stops after its first node and leaves the cluster as it was; a downgrade is refused. While
// the cluster moves to v0.2.0, the API and a Service (3 replicas, a PodDisruptionBudget) are
// polled from outside and must answer every request.
func TestUpgrade(t *testing.T) {
	bin, _ := buildBinaries(t)
	ws := t.TempDir()
	d := &dayTwo{t: t, bin: bin, ws: ws, kubeconfig: filepath.Join(ws, "constellation-admin.conf")}
	out := miniUp(t, bin, ws, "--workers", "1")
	t.Logf("mini up:\n%s", phases(out))
	d.requireHealthy("control-plane-0", "worker-0")

	// v0.1.0 runs the cluster's Kubernetes version, v0.2.0 the next minor.
	const kubeNext = "v1.35.4"
	require.NotEqual(t, config.DefaultKubernetesVersion, kubeNext)
	kubectl(t, d.kubeconfig, "create", "configmap", "survivor", "--from-literal=written=before")
	// The README's application with its data on an encrypted volume of the default
	// StorageClass: every roll replaces the node it runs on, and the volume moves with it.
	app := deployVolumeApp(t, d.kubeconfig, filepath.Join(repoOutput(t), "images"), "app", "", "")
	const appData = "written before the upgrades"
	app.put(appData)

	r := newReleases(t)
	base, baseNext := filepath.Join(ws, "mini", "image"), layOutImage(t, bin, kubeNext)
	v1 := r.create(base, "v0.1.0", base)
	v2 := r.create(baseNext, "v0.2.0", v1)
	pub := r.key + ".pub"
	m1, m2 := releaseValues(t, v1), releaseValues(t, v2)
	assert.NotEqual(t, m1[local.PCRNodeConfig], m2[local.PCRNodeConfig], "release v0.2.0 measures differently")

	// The release source served over HTTP, as a release server would.
	served := httptest.NewServer(http.FileServer(http.Dir(r.source)))
	t.Cleanup(served.Close)

	t.Run("upgrade check lists the releases", func(t *testing.T) {
		d := d.on(t)
		useRelease(t, ws, pub, r.source, "mini/image")
		for _, args := range [][]string{{"upgrade", "check"}, {"upgrade", "check", "--source", served.URL}} {
			out := d.run(args...)
			t.Logf("%s", out)
			// v0.2.0 upgrades from v0.1.0 only: its nodes would refuse the development
			// image's join services, so it is refused until the cluster runs v0.1.0.
			assert.Regexp(t, `v0\.2\.0\s+v1\.35\.4\s+refused: release v0\.2\.0's nodes would not trust the join services of the running cluster`, out)
			assert.Regexp(t, `v0\.1\.0\s+v1\.34\.4\s+allowed: upgrade`, out)
		}
	})

	t.Run("attacks are refused before anything changes", func(t *testing.T) {
		d := d.on(t)
		other, err := release.GenerateKey()
		require.NoError(t, err)
		tamperedImage := r.resign("v0.2.0", "tampered-image", r.signer(), func(map[string]any) {})
		require.NoError(t, os.WriteFile(filepath.Join(tamperedImage, releasedir.NodeImageDir, "node-config.json"), []byte(`{"evil":true}`), 0o644))
		tamperedEnvelope := r.resign("v0.2.0", "tampered-envelope", r.signer(), func(map[string]any) {})
		flipPayloadByte(t, filepath.Join(tamperedEnvelope, releasedir.EnvelopeFile))
		replayed := filepath.Join(t.TempDir(), "v0.3.0")
		require.NoError(t, os.CopyFS(replayed, os.DirFS(v2)))
		for name, tc := range map[string]struct {
			image, want string
		}{
			"a plain node image (unsigned)": {image: filepath.Join(v2, releasedir.NodeImageDir), want: "unsigned release"},
			"another key's signature":       {image: r.resign("v0.2.0", "other-key", other, func(map[string]any) {}), want: "not signed by the pinned release key"},
			"a tampered measurement":        {image: tamperedEnvelope, want: "tampered"},
			"a tampered node image":         {image: tamperedImage, want: "tampered"},
			"an unenforced register": {image: r.resign("v0.2.0", "unenforced", r.signer(), func(m map[string]any) {
				firstSet(m)["4"].(map[string]any)["warnOnly"] = true
			}), want: "leaves an image register unenforced"},
			"a genuine release replayed under a newer name": {image: replayed, want: `published as "v0.3.0", but signed as v0.2.0`},
			"a release whose nodes do not trust the running join services (no FROM)": {
				image: r.create(base, "v0.1.0-nofrom"), want: "would not trust the join services of the running cluster"},
		} {
			t.Run(name, func(t *testing.T) {
				d := d.on(t)
				beforeCluster, beforeConfig := d.clusterSets()
				nodes := d.nodeNames()
				useRelease(t, ws, pub, r.source, tc.image)
				out, err := d.runErr("apply")
				t.Logf("%s", out)
				require.Error(t, err)
				assert.Contains(t, out, tc.want)
				afterCluster, afterConfig := d.clusterSets()
				assert.Equal(t, beforeCluster, afterCluster, "the cluster's reference sets are unchanged")
				assert.Equal(t, beforeConfig, afterConfig, "the configuration's reference sets are unchanged")
				assert.Equal(t, nodes, d.nodeNames(), "no node was added or removed")
			})
		}
	})

	t.Run("development image to v0.1.0, the CLI killed after the first replacement", func(t *testing.T) {
		d := d.on(t)
		useRelease(t, ws, pub, r.source, v1)
		// Killed between the replacement's attestation and the old control plane's removal:
		// the cluster has one control plane more than configured, and the rerun must remove
		// the old one, not its replacement.
		killed := d.killAt(`^\s*\[\s*[0-9.]+s\] verified\s+control-plane-1 `, "apply")
		assert.Contains(t, killed, "upgrade from an image that is not a release to release v0.1.0")
		out := d.run("apply")
		t.Logf("%s", out)
		assert.Contains(t, out, "upgraded: every node boots release v0.1.0")
		d.requireHealthy("control-plane-1", "worker-1")
		d.requireConsistent("control-plane-1")
		inCluster, inConfig := d.clusterSets()
		assert.Equal(t, []string{"v0.1.0"}, inCluster)
		assert.Equal(t, []string{"v0.1.0"}, inConfig)
		app.requireData(appData)
		assert.Equal(t, "worker-1", app.node(), "the application moved to the replacement worker")
		requireMovableVolume(t, d.kubeconfig, ws, "app-data", "worker-1", appData)
	})

	t.Run("v0.1.0 to v0.2.0 with no failed request", func(t *testing.T) {
		d := d.on(t)
		port := helloService(t, d.kubeconfig, filepath.Join(repoOutput(t), "images"), "NodePort")
		// From the source's URL: apply fetches the release into the workspace, checking it.
		useRelease(t, ws, pub, r.source, v2)
		useURL(t, ws, served.URL, served.URL+"/v0.2.0")
		p := startPollers(t, d.kubeconfig, "hello", "through the node ports, as a load balancer's client", askNodePort(t, ws, port))
		out := d.run("apply")
		t.Logf("%s", out)
		p.requireNoFailures(t)
		assert.Contains(t, out, "upgrade from v0.1.0 to release v0.2.0 (Kubernetes v1.35.4")
		assert.DirExists(t, filepath.Join(ws, "releases", "v0.2.0", releasedir.NodeImageDir), "fetched into the workspace")
		d.requireHealthy("control-plane-2", "worker-2")
		requireKubernetes(t, d.kubeconfig, kubeNext)
		assert.Contains(t, d.run("status"), "release v0.2.0, Kubernetes "+kubeNext+")", "status names the release and the version")
		inCluster, inConfig := d.clusterSets()
		assert.Equal(t, []string{"v0.2.0"}, inCluster)
		assert.Equal(t, []string{"v0.2.0"}, inConfig)
		out = d.run("apply")
		assert.Contains(t, out, "nothing to apply", "applying again changes nothing")
		app.requireData(appData)
		assert.Equal(t, "worker-2", app.node(), "the application moved to the replacement worker")
	})

	t.Run("a downgrade is refused", func(t *testing.T) {
		d := d.on(t)
		useRelease(t, ws, pub, r.source, v1)
		out, err := d.runErr("apply")
		t.Logf("%s", out)
		require.Error(t, err)
		assert.Contains(t, out, "release is a downgrade")
		assert.Contains(t, out, "--allow-downgrade")
	})

	t.Run("a release whose nodes fail attestation stops after its first node", func(t *testing.T) {
		d := d.on(t)
		// Signed by the pinned key, every register enforced, its image intact: but PCR 11
		// is not what the image measures.
		r.create(baseNext, "v0.3.0-rc.0", v2)
		bad := r.resign("v0.3.0-rc.0", "bad-v0.3.0-rc.0", r.signer(), func(m map[string]any) {
			firstSet(m)["11"].(map[string]any)["expected"] = strings.Repeat("ab", 32)
		})
		useRelease(t, ws, pub, r.source, bad)
		out, err := d.runErr("apply")
		t.Logf("%s", out)
		require.Error(t, err)
		assert.Contains(t, out, "measurement-mismatch")
		// The join services refused the new node (not the node them), 3 times in a row: apply
		// stops then, not at its 10-minute bound (docs/upgrades.md "Failure is safe").
		assert.Regexp(t, `the join service refused control-plane-\d+ \([0-9.]+\) \d+ time\(s\) in a row on attestation: measurement-mismatch`, out)
		assert.Contains(t, out, "the cluster still runs on its old nodes")
		d.requireHealthy("control-plane-2", "worker-2")
		inCluster, inConfig := d.clusterSets()
		assert.Equal(t, []string{"v0.2.0"}, inCluster, "the release's set was retired again")
		assert.Equal(t, []string{"v0.2.0"}, inConfig)
		// Back to what the nodes boot: v0.2.0 as fetched from its URL (a node's image is
		// where it is; the copy fetched earlier is opened, and so checked, again).
		useRelease(t, ws, pub, r.source, v2)
		useURL(t, ws, served.URL, served.URL+"/v0.2.0")
		out = d.run("apply")
		assert.Contains(t, out, "nothing to apply")
	})
}

// requireKubernetes checks that the whole cluster runs Kubernetes version: the API server,
// kubeadm's cluster configuration, every kubelet, kube-proxy and CoreDNS.
func requireKubernetes(t *testing.T, kubeconfig, version string) {
	t.Helper()
	release, err := kubeversion.Lookup(version)
	require.NoError(t, err)
	var server struct {
		ServerVersion struct{ GitVersion string }
	}
	require.NoError(t, json.Unmarshal([]byte(kubectl(t, kubeconfig, "version", "-o", "json")), &server))
	assert.Equal(t, version, server.ServerVersion.GitVersion, "API server")
	cluster := kubectl(t, kubeconfig, "-n", "kube-system", "get", "configmap", "kubeadm-config", "-o", "jsonpath={.data.ClusterConfiguration}")
	assert.Contains(t, cluster, "kubernetesVersion: "+version, "kubeadm's cluster configuration")
	for _, n := range nodeVersions(t, kubeconfig) {
		assert.Equal(t, version, n.kubelet, "kubelet of %s", n.name)
	}
	pods := kubectl(t, kubeconfig, "-n", "kube-system", "get", "pods", "-o", "jsonpath={range .items[*]}{.spec.containers[*].image}{\"\\n\"}{end}")
	for _, ref := range nodeimage.ReleaseRefs(release) {
		if !strings.Contains(ref, "/pause:") {
			assert.Contains(t, pods, ref)
		}
	}
}

// releaseValues are the measurements the release in dir signed for qemu-vtpm.
func releaseValues(t *testing.T, dir string) measurements.M {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, releasedir.EnvelopeFile))
	require.NoError(t, err)
	var env dsse.Envelope
	require.NoError(t, json.Unmarshal(data, &env))
	payload, err := env.DecodeB64Payload()
	require.NoError(t, err)
	var st struct{ Predicate release.Manifest }
	require.NoError(t, json.Unmarshal(payload, &st))
	for _, ref := range st.Predicate.References {
		if ref.Variant == variant.QEMUVTPM {
			return ref.Measurements[0].Measurements
		}
	}
	t.Fatalf("release %s has no qemu-vtpm reference", dir)
	return nil
}

// flipPayloadByte changes one byte of the signed payload of the envelope at path (a
// measurement's digit, as an attacker editing the file would), keeping it valid base64.
func flipPayloadByte(t *testing.T, path string) {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	var env dsse.Envelope
	require.NoError(t, json.Unmarshal(data, &env))
	payload, err := env.DecodeB64Payload()
	require.NoError(t, err)
	i := strings.Index(string(payload), `"expected":"`) + len(`"expected":"`)
	require.Greater(t, i, len(`"expected":"`))
	if payload[i] == '0' {
		payload[i] = '1'
	} else {
		payload[i] = '0'
	}
	env.Payload = base64.StdEncoding.EncodeToString(payload)
	data, err = json.Marshal(env)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, data, 0o644))
}
