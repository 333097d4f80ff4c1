//go:build vme2e

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/provider/local/cluster"
	"github.com/openconstellation/constellation/internal/statedisk"
)

// TestQEMUCluster is the slower tier (make vm-e2e, docs/qemu-provider.md "Tests"): a cluster
// of QEMU machines, one control plane and one worker. The worker joins through the join
// service; verify passes for both; a pod on the control plane reaches a pod on the worker by
// address and by Service name; the worker reboots and rejoins with its own state disk (the
// same LUKS2 volume); the cluster stops, starts and recovers; a header the host forged on the
// control plane's disk is refused, and the original recovers.
func TestQEMUCluster(t *testing.T) {
	bin, _ := buildBinaries(t)
	image := vmImage(t)
	ws := t.TempDir()
	cli := func(args ...string) string {
		t.Helper()
		start := time.Now()
		out, err := exec.Command(bin, append([]string{"-C", ws}, args...)...).CombinedOutput()
		t.Logf("constellation %s: %s", strings.Join(args, " "), time.Since(start).Round(time.Second))
		require.NoError(t, err, "constellation %s:\n%s", strings.Join(args, " "), out)
		return string(out)
	}
	var id string
	t.Cleanup(func() {
		out, err := exec.Command(bin, "-C", ws, "terminate", "--yes").CombinedOutput()
		assert.NoError(t, err, "%s", out)
		if id != "" {
			assertNoLeftovers(t, ws, id)
		}
	})

	cli("config", "generate", "qemu", "--name", "vms", "--workers", "1", "--image", image)
	cli("create")
	status, err := cluster.ReadStatus(filepath.Join(ws, "mini"))
	require.NoError(t, err)
	id = status.NetworkID
	t.Cleanup(func() { dumpConsoles(t, ws) })

	out := cli("apply", "--timeout", "30m")
	assert.Contains(t, out, "over attested TLS")
	out = cli("verify")
	assert.Contains(t, out, "2 of 2 nodes verified: cluster vms")

	assertPodsReachAcrossMachines(t, filepath.Join(ws, "constellation-admin.conf"))
	// A volume moves with its pod from one machine to the other: unplugged from the control
	// plane, plugged into the worker, opened there with the same key.
	assertVolumeOnMachine(t, ws, "control-plane-0", "worker-0")

	// The worker reboots: its TPM resets, it attests again, gets a rejoin ticket with its own
	// disk key and unlocks the same LUKS2 volume.
	disk := stateDiskOf(t, ws, "worker-0")
	before := luksUUID(t, disk)
	cli("reboot", "worker-0", "--timeout", "20m")
	assert.Equal(t, before, luksUUID(t, disk), "the worker's state disk is the same volume")
	out = cli("verify")
	assert.Contains(t, out, "2 of 2 nodes verified")

	// Every machine off, on again; the control plane gets its key from recover, the worker
	// rejoins by itself.
	cli("stop", "--timeout", "10m")
	cli("start", "--timeout", "15m")
	cli("recover", "--timeout", "30m")
	out = cli("verify")
	assert.Contains(t, out, "2 of 2 nodes verified")

	assertForgedHeaderRefused(t, bin, ws, cli)
}

// assertPodsReachAcrossMachines: a pod on the control plane reaches a pod on the worker, by
// its address and through its Service's DNS name: the bridge routes each machine's pod range
// to it, CoreDNS answers.
func assertPodsReachAcrossMachines(t *testing.T, kubeconfig string) {
	t.Helper()
	images := filepath.Join(repoOutput(t), "images")
	// The worker has just joined: under TCG its first pod (CNI, sandbox, probe) takes
	// minutes, not the sandbox tests' two.
	helloPodWithin(t, kubeconfig, images, "worker-0", 10*time.Minute)
	applyManifest(t, kubeconfig, `apiVersion: v1
kind: Service
metadata: {name: hello, namespace: default}
spec:
  selector: {app: hello}
  ports: [{port: 8080, targetPort: 8080}]
`)
	podIP := strings.TrimSpace(kubectl(t, kubeconfig, "get", "pod", "hello-server", "-o", "jsonpath={.status.podIP}"))
	applyManifest(t, kubeconfig, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: hello-client, namespace: default}
spec:
  nodeName: control-plane-0
  restartPolicy: Never
  tolerations: [{key: node-role.kubernetes.io/control-plane, operator: Exists, effect: NoSchedule}]
  containers:
  - name: hello
    image: %s
    imagePullPolicy: Never
    args: [get, "http://%s:8080/", "http://hello.default.svc.cluster.local:8080/"]
`, helloRef(t, images), podIP))
	waitPodSucceeded(t, kubeconfig, "hello-client", 5*time.Minute)
	logs := kubectl(t, kubeconfig, "logs", "hello-client")
	assert.Contains(t, logs, "hello.default.svc.cluster.local:8080/: hello from hello-server")
}

// assertForgedHeaderRefused: while the machines are off, the host replaces the control
// plane's LUKS2 header with one of its own making: the same UUID, marked initialized, without
// integrity, under a key it knows. The node refuses it, naming what differs, and says so;
// recover ends at once. The header restored, the node (which looks again every 30 s)
// recovers with the same disk: nothing of it was used or lost.
func assertForgedHeaderRefused(t *testing.T, bin, ws string, cli func(args ...string) string) {
	t.Helper()
	cli("stop", "--timeout", "10m")
	restore := replaceHeaderOffline(t, stateDiskOf(t, ws, "control-plane-0"))
	cli("start", "--timeout", "15m")
	start := time.Now()
	refused, err := exec.Command(bin, "-C", ws, "recover", "--timeout", "20m").CombinedOutput()
	t.Logf("constellation recover (header replaced): %s", time.Since(start).Round(time.Second))
	require.Error(t, err, "recover of a control plane whose header was replaced:\n%s", refused)
	assert.Contains(t, string(refused), "control-plane-0 refuses its state disk")
	assert.Contains(t, string(refused), "segment 0 has no integrity protection")
	restore()
	cli("recover", "--timeout", "20m")
	out := cli("verify")
	assert.Contains(t, out, "2 of 2 nodes verified")
}

// replaceHeaderOffline is a host's attack on a stopped machine's state disk: its LUKS2
// header area (up to the data segment) replaced by a header the host made with cryptsetup,
// with the disk's UUID and the initialized marker, no integrity and a key of its own.
// restore puts the original back.
func replaceHeaderOffline(t *testing.T, disk string) (restore func()) {
	t.Helper()
	f, err := os.OpenFile(disk, os.O_RDWR, 0)
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	hdr, err := statedisk.ParseLUKS2Header(f)
	require.NoError(t, err)
	original := make([]byte, hdr.DataOffset)
	_, err = f.ReadAt(original, 0)
	require.NoError(t, err)

	dir := t.TempDir()
	forged, keyFile := filepath.Join(dir, "forged.img"), filepath.Join(dir, "key")
	require.NoError(t, os.WriteFile(keyFile, []byte("the host's own key"), 0o600))
	require.NoError(t, os.WriteFile(forged, nil, 0o600))
	require.NoError(t, os.Truncate(forged, int64(hdr.DataOffset)+4<<20))
	run := func(stdin string, args ...string) {
		cmd := exec.Command("cryptsetup", args...)
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "cryptsetup %s: %s", strings.Join(args, " "), out)
	}
	// The node's KDF settings, so the header parses and what is refused is its policy.
	run("", "luksFormat", "--type", "luks2", "--batch-mode", "--uuid", hdr.UUID, "--sector-size", "4096",
		"--pbkdf", "argon2id", "--pbkdf-memory", "32768", "--pbkdf-force-iterations", "4", "--pbkdf-parallel", "1",
		"--key-file", keyFile, forged)
	run(fmt.Sprintf(`{"type":%q,"keyslots":[]}`, statedisk.MarkerTokenType), "token", "import", "--json-file", "-", forged)
	replacement, err := os.ReadFile(forged)
	require.NoError(t, err)
	write := func(b []byte) {
		_, err := f.WriteAt(b, 0)
		require.NoError(t, err)
		require.NoError(t, f.Sync())
	}
	write(replacement[:hdr.DataOffset])
	return func() { write(original) }
}
