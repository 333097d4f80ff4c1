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
// service; verify passes for both; a pod on the worker reaches the API server through the
// cluster's Service network; the worker reboots and rejoins with its own state disk (the
// same LUKS2 volume); the cluster stops, starts and recovers.
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

	out := cli("apply")
	assert.Contains(t, out, "over attested TLS")
	out = cli("verify")
	assert.Contains(t, out, "2 of 2 nodes verified: cluster vms")

	// A pod on the control plane reaches a pod on the worker, by its address and through
	// its Service's DNS name: the bridge routes each machine's pod range to it, CoreDNS
	// answers.
	kubeconfig := filepath.Join(ws, "constellation-admin.conf")
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
}

// luksUUID is the UUID of the LUKS2 volume on a machine's state disk.
func luksUUID(t *testing.T, disk string) string {
	t.Helper()
	f, err := os.Open(disk)
	require.NoError(t, err)
	defer f.Close()
	h, err := statedisk.ParseLUKS2Header(f)
	require.NoError(t, err)
	return h.UUID
}
