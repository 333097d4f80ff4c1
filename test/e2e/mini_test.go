// Package e2e holds end-to-end tests that run the constellation binary against real
// components: sandbox nodes with swtpm vTPMs, containerd, kubelet and kubeadm, built
// Kubernetes binaries and images (make kube, make images).
package e2e

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/kms"
	"github.com/openconstellation/constellation/internal/nodeimage"
	"github.com/openconstellation/constellation/internal/provider/local/cluster"
	"github.com/openconstellation/constellation/internal/state"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// repoOutput is the repository's _output folder (Kubernetes binaries and images).
func repoOutput(t testing.TB) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "_output")
}

// buildBinaries builds constellation and the bootstrapper side by side, as `make build`
// lays them out. Every test of this package starts with it: under -short they are skipped
// (they create clusters, need root and _output).
func buildBinaries(t testing.TB) (bin, bootstrapper string) {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end: builds the binaries and creates a local cluster")
	}
	dir := t.TempDir()
	out, err := exec.Command("go", "build", "-o", dir+"/",
		"github.com/openconstellation/constellation/cmd/constellation",
		"github.com/openconstellation/constellation/cmd/bootstrapper").CombinedOutput()
	require.NoError(t, err, "%s", out)
	return filepath.Join(dir, "constellation"), filepath.Join(dir, "bootstrapper")
}

// kubeDir is the Kubernetes binaries the tests' nodes use, <version>/bin per version
// ($CONSTELLATION_KUBE_DIR or _output/kube).
func kubeDir(t testing.TB) string {
	if dir := os.Getenv("CONSTELLATION_KUBE_DIR"); dir != "" {
		return dir
	}
	return filepath.Join(repoOutput(t), "kube")
}

// kubectlPath is the kubectl the tests run: the default Kubernetes version's.
func kubectlPath(t testing.TB) string {
	return filepath.Join(kubeDir(t), config.DefaultKubernetesVersion, "bin", "kubectl")
}

// miniUp runs `constellation mini up` in ws with args, fails the test if it fails, and
// removes the cluster when the test ends, checking that nothing of it is left.
func miniUp(t *testing.T, bin, ws string, args ...string) []byte {
	t.Helper()
	t.Cleanup(func() {
		out, err := exec.Command(bin, "mini", "down", "-C", ws).CombinedOutput()
		assert.NoError(t, err, "%s", out)
		assertNoLeftovers(t, ws, cluster.NetworkID(filepath.Join(ws, "mini")))
	})
	args = append([]string{"mini", "up", "-C", ws, "--kube-dir", kubeDir(t), "--images", filepath.Join(repoOutput(t), "images")}, args...)
	out, err := exec.Command(bin, args...).CombinedOutput()
	require.NoError(t, err, "%s", out)
	return out
}

func kubectl(t testing.TB, kubeconfig string, args ...string) string {
	t.Helper()
	out, err := exec.Command(kubectlPath(t), append([]string{"--kubeconfig", kubeconfig}, args...)...).CombinedOutput()
	require.NoError(t, err, "kubectl %s: %s", strings.Join(args, " "), out)
	return string(out)
}

// TestMiniUp creates a local cluster of one control plane, two workers and one node booting a
// different bootstrapper, checks it end to end, and removes it without leftovers.
func TestMiniUp(t *testing.T) {
	bin, bootstrapper := buildBinaries(t)
	ws := t.TempDir()
	images := filepath.Join(repoOutput(t), "images")
	// The other node's bootstrapper differs from the image's by a few bytes: it still runs,
	// but it measures differently (PCR 11).
	other := filepath.Join(t.TempDir(), "bootstrapper")
	data, err := os.ReadFile(bootstrapper)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(other, append(data, []byte("another build")...), 0o755))

	down := func() []byte {
		out, err := exec.Command(bin, "mini", "down", "-C", ws).CombinedOutput()
		assert.NoError(t, err, "%s", out)
		return out
	}
	start := time.Now()
	out := miniUp(t, bin, ws, "--workers", "2", "--extra-worker-bootstrapper", other)
	t.Logf("mini up took %s:\n%s", time.Since(start), phases(out))
	id := cluster.NetworkID(filepath.Join(ws, "mini"))
	assert.Contains(t, string(out), "over attested TLS")
	assert.Contains(t, string(out), "kubeadm init done")
	assert.Contains(t, string(out), "join, key and verification services and the volume driver's controller ready")

	// The workspace has the cluster's files: configuration (generated, with the image's
	// reference values), state with the cluster ID, master secret, admin kubeconfig.
	conf, err := config.Load(filepath.Join(ws, config.FileName))
	require.NoError(t, err)
	require.NotNil(t, conf.Attestation.Of(variant.QEMUVTPM))
	st, err := state.Load(filepath.Join(ws, state.FileName))
	require.NoError(t, err)
	assert.Equal(t, state.Initialized, st.Phase)
	assert.Contains(t, string(out), fmt.Sprintf("ID %x", []byte(st.ClusterID)))
	_, err = kms.ReadMasterSecretFile(filepath.Join(ws, "constellation-mastersecret.json"))
	require.NoError(t, err)

	// The admitted nodes are exactly the three of the image; all Ready.
	kubeconfig := filepath.Join(ws, "constellation-admin.conf")
	admitted := []string{"control-plane-0", "worker-0", "worker-1"}
	assert.ElementsMatch(t, admitted, readyNodes(t, kubeconfig))

	// The node with the other bootstrapper was rejected by the join service (PCR 11 does
	// not match), got no key (its storage was never unlocked), and mini up reported it.
	assert.Regexp(t, `not admitted  worker-other \(10\.42\.0\.13\): the join service rejected it \d+ time\(s\), last: measurement-mismatch: .*PCR 11`, string(out))
	joinLog := kubectl(t, kubeconfig, "-n", "kube-system", "logs", "-l", "app.kubernetes.io/name=constellation-join-service", "--tail=-1")
	assert.Regexp(t, `"msg":"admission rejected".*"peer":"10\.42\.0\.13".*"reason":"measurement-mismatch"`, joinLog)
	assert.NotRegexp(t, `"msg":"admission accepted".*"peer":"10\.42\.0\.13"`, joinLog, "no ticket (and so no key) for the other node")
	assert.Regexp(t, `"msg":"admission accepted".*"node":"worker-0"`, joinLog)
	otherState := filepath.Join(ws, "mini", "nodes", "worker-other", "state")
	_, err = os.Stat(filepath.Join(otherState, "initialized"))
	assert.True(t, os.IsNotExist(err), "the other node's storage was never unlocked with a released key")
	assert.Equal(t, 0, regularFiles(t, filepath.Join(otherState, "cipher")), "nothing but gocryptfs' own header was written into the other node's storage")

	// Pods on different workers reach each other: a server on worker-0 from a locally
	// built image, a client on worker-1, by pod address and through a Service by DNS name.
	helloPodsTalk(t, kubeconfig, images)

	// constellation verify: fresh evidence of every admitted node matches the reference
	// values and carries this cluster's ID; the other node cannot be verified.
	out, err = exec.Command(bin, "verify", "-C", ws, "-o", "json", "--node", strings.Join(admitted, ",")).CombinedOutput()
	require.NoError(t, err, "%s", out)
	var reports []struct {
		Node     string
		Verified bool
		Result   struct {
			ReferenceSet string
			Signer       struct {
				Certified bool
				Name      string
			}
			ClusterID struct {
				ClusterID string
				Match     bool
			}
		}
	}
	require.NoError(t, json.Unmarshal(out, &reports), "%s", out)
	require.Len(t, reports, 3)
	for _, r := range reports {
		assert.True(t, r.Verified, r.Node)
		assert.True(t, r.Result.Signer.Certified, r.Node)
		assert.Equal(t, r.Node, r.Result.Signer.Name, "the AK is certified for the node it answers for")
		assert.True(t, r.Result.ClusterID.Match, r.Node)
		assert.Equal(t, fmt.Sprintf("%x", []byte(st.ClusterID)), r.Result.ClusterID.ClusterID)
		assert.Equal(t, conf.Attestation.Of(variant.QEMUVTPM).Measurements[0].Name, r.Result.ReferenceSet)
	}
	// No verification service runs there (the node never joined): --wait 0 fails at once
	// instead of asking again for a minute.
	out, err = exec.Command(bin, "verify", "-C", ws, "--node", "worker-other", "--wait", "0").CombinedOutput()
	require.Error(t, err, "%s", out)
	assert.Contains(t, string(out), "FAIL  worker-other")

	// The pod network and kube-proxy work: CoreDNS reaches the API server through its
	// service address and becomes ready.
	kubectl(t, kubeconfig, "-n", "kube-system", "wait", "--for=condition=Available", "deployment/coredns", "--timeout=120s")

	// A second mini up refuses and changes nothing.
	out, err = exec.Command(bin, "mini", "up", "-C", ws, "--workers", "0", "--kube-dir", kubeDir(t), "--images", images).CombinedOutput()
	require.Error(t, err)
	assert.Contains(t, string(out), "already up")

	// The nodes' state reaches the disk only encrypted: no key, certificate or etcd file
	// in plaintext below the nodes' backing folders, and a secret the cluster holds (the
	// admin kubeconfig's key, in control-plane-0's /etc/kubernetes/admin.conf) nowhere in the
	// nodes' folders, logs and /var/log layers included.
	secrets := adminClientKey(t, kubeconfig)
	for _, n := range admitted {
		assertEncrypted(t, filepath.Join(ws, "mini", "nodes", n, "state"))
		assertNowhere(t, filepath.Join(ws, "mini", "nodes", n), secrets...)
	}

	down()
	_, err = os.Stat(filepath.Join(ws, "mini"))
	assert.True(t, os.IsNotExist(err), "mini down removes the cluster's folder")
	left, err := os.ReadDir(ws)
	require.NoError(t, err)
	assert.Empty(t, left, "mini down removes the files of the cluster, and the configuration it generated")
	assertNoLeftovers(t, ws, id)
}

// readyNodes lists the cluster's nodes whose Ready condition is true.
func readyNodes(t *testing.T, kubeconfig string) []string {
	t.Helper()
	var list struct {
		Items []struct {
			Metadata struct{ Name string }
			Status   struct {
				Conditions []struct{ Type, Status string }
			}
		}
	}
	require.NoError(t, json.Unmarshal([]byte(kubectl(t, kubeconfig, "get", "nodes", "-o", "json")), &list))
	var ready []string
	for _, n := range list.Items {
		for _, c := range n.Status.Conditions {
			if c.Type == "Ready" && c.Status == "True" {
				ready = append(ready, n.Metadata.Name)
			}
		}
	}
	return ready
}

// helloPodsTalk runs the hello server on worker-0 and its client on worker-1.
func helloPodsTalk(t *testing.T, kubeconfig, images string) {
	t.Helper()
	helloImage := helloRef(t, images)
	helloPod(t, kubeconfig, images, "worker-0")
	applyManifest(t, kubeconfig, `apiVersion: v1
kind: Service
metadata: {name: hello, namespace: default}
spec:
  selector: {app: hello}
  ports: [{port: 8080, targetPort: 8080}]
`)
	podIP := strings.TrimSpace(kubectl(t, kubeconfig, "get", "pod", "hello-server", "-o", "jsonpath={.status.podIP}"))
	require.Regexp(t, `^10\.244\.`, podIP, "the server has an address of worker-0's pod range")

	client := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: hello-client, namespace: default}
spec:
  nodeName: worker-1
  restartPolicy: Never
  containers:
  - name: hello
    image: %s
    imagePullPolicy: Never
    args: [get, "http://%s:8080/", "http://hello.default.svc.cluster.local:8080/"]
`, helloImage, podIP)
	applyManifest(t, kubeconfig, client)
	kubectl(t, kubeconfig, "wait", "--for=jsonpath={.status.phase}=Succeeded", "pod/hello-client", "--timeout=120s")
	logs := kubectl(t, kubeconfig, "logs", "hello-client")
	assert.Contains(t, logs, fmt.Sprintf("http://%s:8080/: hello from hello-server", podIP))
	assert.Contains(t, logs, "http://hello.default.svc.cluster.local:8080/: hello from hello-server")
}

// helloRef is the image reference of the hello workload of the node images in images.
func helloRef(t testing.TB, images string) string {
	t.Helper()
	index, err := nodeimage.ReadIndex(images)
	require.NoError(t, err)
	hello, err := index.Find(nodeimage.HelloRepo)
	require.NoError(t, err)
	return hello.Ref
}

func applyManifest(t testing.TB, kubeconfig, manifest string) {
	t.Helper()
	cmd := exec.Command(kubectlPath(t), "--kubeconfig", kubeconfig, "apply", "-f", "-")
	cmd.Stdin = strings.NewReader(manifest)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "kubectl apply: %s", out)
}

// regularFiles counts the files below dir other than gocryptfs' header.
func regularFiles(t *testing.T, dir string) int {
	t.Helper()
	n := 0
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		// gocryptfs.conf and gocryptfs.diriv: the fresh storage's header (random key).
		if d.Type().IsRegular() && d.Name() != "gocryptfs.conf" && d.Name() != "gocryptfs.diriv" {
			n++
		}
		return nil
	})
	require.NoError(t, err)
	return n
}

func assertEncrypted(t *testing.T, stateDir string) {
	t.Helper()
	files := 0
	err := filepath.WalkDir(stateDir, func(path string, d fs.DirEntry, err error) error {
		require.NoError(t, err)
		// gocryptfs encrypts names: none of the node's plaintext names may appear.
		switch d.Name() {
		case "etcd", "member", "wal", "snap", "pki", "kubelet", "kubernetes", "ca.key", "admin.conf", "var", "lib", "etc", "var-lib", "upper":
			t.Errorf("plaintext name %s in the state storage", path)
		}
		if !d.Type().IsRegular() {
			return nil // sockets and FIFOs of the node are encrypted names only
		}
		files++
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		for _, marker := range [][]byte{[]byte("-----BEGIN"), []byte("PRIVATE KEY"), []byte("kubernetes"), []byte("apiVersion")} {
			if bytes.Contains(data, marker) {
				t.Errorf("plaintext %q in %s", marker, path)
			}
		}
		return nil
	})
	require.NoError(t, err)
	// A worker's persistent files (kubeconfigs, certificates, kubeadm's kubelet files) and
	// gocryptfs' own (a diriv per directory, the configuration): about 20.
	assert.Greater(t, files, 12, "the state storage holds the node's files (encrypted)")
}

// adminClientKey returns the admin kubeconfig's client key as kubeadm writes it into the
// control plane's admin.conf (base64 of the PEM) and the first line of the PEM's body.
func adminClientKey(t *testing.T, kubeconfig string) [][]byte {
	t.Helper()
	data, err := os.ReadFile(kubeconfig)
	require.NoError(t, err)
	m := regexp.MustCompile(`client-key-data: (\S+)`).FindSubmatch(data)
	require.NotNil(t, m, "client-key-data in %s", kubeconfig)
	pem, err := base64.StdEncoding.DecodeString(string(m[1]))
	require.NoError(t, err)
	lines := strings.Split(string(pem), "\n")
	require.Greater(t, len(lines), 2)
	require.Greater(t, len(lines[1]), 40, "a line of the key's body")
	return [][]byte{m[1], []byte(lines[1])}
}

// assertNowhere checks that no file below dir contains any of secrets.
func assertNowhere(t *testing.T, dir string, secrets ...[]byte) {
	t.Helper()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		require.NoError(t, err)
		if !d.Type().IsRegular() {
			return nil
		}
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		for _, s := range secrets {
			if bytes.Contains(data, s) {
				t.Errorf("a cluster secret in the clear in %s", path)
			}
		}
		return nil
	})
	require.NoError(t, err)
}

// assertNoLeftovers checks that nothing of cluster id remains: processes, namespaces,
// cgroups, mounts.
func assertNoLeftovers(t *testing.T, ws, id string) {
	t.Helper()
	assert.Empty(t, processesMentioning(t, ws), "processes")
	netns, _ := os.ReadDir("/run/netns")
	for _, e := range netns {
		assert.NotContains(t, e.Name(), "cmini-"+id, "network namespace")
	}
	links, _ := os.ReadDir("/sys/class/net")
	for _, l := range links {
		assert.NotContains(t, l.Name(), id, "network interface")
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	require.NoError(t, err)
	assert.NotContains(t, string(mounts), ws, "mounts")
	_ = filepath.WalkDir("/sys/fs/cgroup", func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		if strings.Contains(d.Name(), "cmini-"+id) {
			t.Errorf("cgroup %s left", path)
			return fs.SkipDir
		}
		if strings.Count(path, "/") > 6 {
			return fs.SkipDir
		}
		return nil
	})
}

func phases(out []byte) string {
	var b strings.Builder
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "[") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

func processesMentioning(t *testing.T, s string) []string {
	t.Helper()
	var found []string
	entries, err := os.ReadDir("/proc")
	require.NoError(t, err)
	for _, e := range entries {
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(cmdline), s) {
			found = append(found, e.Name()+": "+strings.ReplaceAll(string(cmdline), "\x00", " "))
		}
	}
	return found
}
