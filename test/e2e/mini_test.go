// Package e2e holds end-to-end tests that run the constellation binary against real
// components: sandbox nodes with swtpm vTPMs, containerd, kubelet and kubeadm, built
// Kubernetes binaries and images (make kube, make images).
package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/kms"
	"github.com/openconstellation/constellation/internal/provider/local/cluster"
	"github.com/openconstellation/constellation/internal/state"
)

// repoOutput is the repository's _output folder (Kubernetes binaries and images).
func repoOutput(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "_output")
}

// buildBinaries builds constellation and the bootstrapper side by side, as `make build`
// lays them out.
func buildBinaries(t *testing.T) (bin, bootstrapper string) {
	t.Helper()
	dir := t.TempDir()
	out, err := exec.Command("go", "build", "-o", dir+"/",
		"github.com/openconstellation/constellation/cmd/constellation",
		"github.com/openconstellation/constellation/cmd/bootstrapper").CombinedOutput()
	require.NoError(t, err, "%s", out)
	return filepath.Join(dir, "constellation"), filepath.Join(dir, "bootstrapper")
}

func kubectl(t *testing.T, kubeconfig string, args ...string) string {
	t.Helper()
	out, err := exec.Command(filepath.Join(repoOutput(t), "kube", "bin", "kubectl"), append([]string{"--kubeconfig", kubeconfig}, args...)...).CombinedOutput()
	require.NoError(t, err, "kubectl %s: %s", strings.Join(args, " "), out)
	return string(out)
}

// TestMiniUp creates a local cluster, checks it, and removes it without leftovers.
func TestMiniUp(t *testing.T) {
	bin, _ := buildBinaries(t)
	ws := t.TempDir()
	kubeBin := filepath.Join(repoOutput(t), "kube", "bin")
	if dir := os.Getenv("CONSTELLATION_KUBE_BIN"); dir != "" {
		kubeBin = dir
	}
	images := filepath.Join(repoOutput(t), "images")
	down := func() []byte {
		out, err := exec.Command(bin, "mini", "down", "-C", ws).CombinedOutput()
		assert.NoError(t, err, "%s", out)
		return out
	}
	var id string
	t.Cleanup(func() {
		down()
		if id != "" {
			assertNoLeftovers(t, ws, id)
		}
	})

	start := time.Now()
	out, err := exec.Command(bin, "mini", "up", "-C", ws, "--workers", "0", "--kube-bin", kubeBin, "--images", images).CombinedOutput()
	require.NoError(t, err, "%s", out)
	t.Logf("mini up took %s:\n%s", time.Since(start), phases(out))
	status, err := cluster.ReadStatus(filepath.Join(ws, "mini"))
	require.NoError(t, err)
	id = status.NetworkID
	assert.Contains(t, string(out), "over attested TLS")
	assert.Contains(t, string(out), "kubeadm init done")

	// The workspace has the cluster's files: configuration (generated, with the image's
	// reference values), state with the cluster ID, master secret, admin kubeconfig.
	conf, err := config.Load(filepath.Join(ws, config.FileName))
	require.NoError(t, err)
	require.NotNil(t, conf.Attestation.QEMUVTPM)
	st, err := state.Load(filepath.Join(ws, state.FileName))
	require.NoError(t, err)
	assert.Equal(t, state.Initialized, st.Phase)
	assert.Contains(t, string(out), fmt.Sprintf("ID %x", []byte(st.ClusterID)))
	_, err = kms.ReadMasterSecretFile(filepath.Join(ws, "constellation-mastersecret.json"))
	require.NoError(t, err)

	kubeconfig := filepath.Join(ws, "constellation-admin.conf")
	nodes := kubectl(t, kubeconfig, "get", "nodes", "-o", "json")
	var list struct {
		Items []struct {
			Metadata struct{ Name string }
		}
	}
	require.NoError(t, json.Unmarshal([]byte(nodes), &list))
	require.Len(t, list.Items, 1)
	assert.Equal(t, "control-plane-0", list.Items[0].Metadata.Name)

	// The pod network and kube-proxy work: CoreDNS reaches the API server through its
	// service address and becomes ready.
	kubectl(t, kubeconfig, "-n", "kube-system", "wait", "--for=condition=Available", "deployment/coredns", "--timeout=120s")

	// A second mini up refuses and changes nothing.
	out, err = exec.Command(bin, "mini", "up", "-C", ws, "--workers", "0", "--kube-bin", kubeBin, "--images", images).CombinedOutput()
	require.Error(t, err)
	assert.Contains(t, string(out), "already up")

	// The node's state reaches the disk only encrypted: no key, certificate or etcd file
	// in plaintext below the node's backing folder (logs excepted: they are the console).
	assertEncrypted(t, filepath.Join(ws, "mini", "nodes", "control-plane-0", "state"))

	down()
	_, err = os.Stat(filepath.Join(ws, "mini"))
	assert.True(t, os.IsNotExist(err), "mini down removes the cluster's folder")
	left, err := os.ReadDir(ws)
	require.NoError(t, err)
	assert.Empty(t, left, "mini down removes the files of the cluster, and the configuration it generated")
	assertNoLeftovers(t, ws, id)
}

func assertEncrypted(t *testing.T, stateDir string) {
	t.Helper()
	files := 0
	err := filepath.WalkDir(stateDir, func(path string, d fs.DirEntry, err error) error {
		require.NoError(t, err)
		// gocryptfs encrypts names: none of the node's plaintext names may appear.
		switch d.Name() {
		case "etcd", "member", "wal", "snap", "pki", "kubelet", "kubernetes", "ca.key", "admin.conf", "var-lib", "etc", "upper":
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
	assert.Greater(t, files, 20, "the state storage holds the node's files (encrypted)")
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
