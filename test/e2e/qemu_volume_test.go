//go:build vme2e

package e2e

import (
	"bytes"
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

// assertVolumeOnMachine: a pod's encrypted volume on a machine. The provider plugs the
// volume's file into the machine as a disk; the node formats it as LUKS2 with integrity
// under the volume's key and mounts it; what the pod stores reaches the host only as
// ciphertext under the pinned header. The pod deleted, the disk is unplugged and the
// attachment released; a new pod on the same claim, on node second, reads what the first one
// stored (on another machine: the volume moved with its pod).
func assertVolumeOnMachine(t *testing.T, ws, first, second string) {
	t.Helper()
	kubeconfig := filepath.Join(ws, "constellation-admin.conf")
	images := filepath.Join(repoOutput(t), "images")
	applyManifest(t, kubeconfig, `apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: machine-data, namespace: default}
spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 64Mi}}}
`)
	// A node selector, not nodeName: the claim's class binds at the first consumer's
	// scheduling, which nodeName skips.
	pod := func(node string) string {
		return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: volume-server, namespace: default}
spec:
  nodeSelector: {kubernetes.io/hostname: %s}
  terminationGracePeriodSeconds: 5
  tolerations: [{key: node-role.kubernetes.io/control-plane, operator: Exists, effect: NoSchedule}]
  containers:
  - name: app
    image: %s
    imagePullPolicy: Never
    ports: [{containerPort: 8080}]
    env: [{name: DATA_DIR, value: /data}]
    readinessProbe: {httpGet: {port: 8080, path: /}, periodSeconds: 2}
    volumeMounts: [{name: data, mountPath: /data}]
  volumes: [{name: data, persistentVolumeClaim: {claimName: machine-data}}]
`, node, helloRef(t, images))
	}
	// The API server's proxy reaches the pod from the machine; what goes through it is the
	// same HTTP the application serves.
	const dataPath = "/api/v1/namespaces/default/pods/volume-server:8080/proxy/data"
	secret := fmt.Sprintf("kept on an encrypted volume at %d", time.Now().UnixNano())

	start := time.Now()
	applyManifest(t, kubeconfig, pod(first))
	kubectl(t, kubeconfig, "wait", "--for=condition=Ready", "pod/volume-server", "--timeout=10m")
	t.Logf("a pod with a new volume is Ready after %s (attach, plug, LUKS2 format with integrity, mount)", time.Since(start).Round(time.Second))
	body := filepath.Join(t.TempDir(), "body")
	require.NoError(t, os.WriteFile(body, []byte(secret), 0o600))
	kubectl(t, kubeconfig, "replace", "--raw", dataPath, "-f", body)
	assert.Equal(t, secret, kubectl(t, kubeconfig, "get", "--raw", dataPath))

	// The host's view of the volume: LUKS2 under the pinned header, no plaintext.
	id := strings.TrimSpace(kubectl(t, kubeconfig, "get", "pv", strings.TrimSpace(kubectl(t, kubeconfig, "get", "pvc", "machine-data", "-o", "jsonpath={.spec.volumeName}")), "-o", "jsonpath={.spec.csi.volumeHandle}"))
	file := filepath.Join(ws, "mini", cluster.VolumesDir, id+".img")
	f, err := os.Open(file)
	require.NoError(t, err)
	hdr, err := statedisk.ParseLUKS2Header(f)
	f.Close()
	require.NoError(t, err, "the volume's header is the pinned one")
	assert.True(t, hdr.Initialized)
	// The page cache of the machine may hold the write: sync it through the pod's deletion
	// (unmount, close) before looking for the plaintext.
	start = time.Now()
	kubectl(t, kubeconfig, "delete", "pod", "volume-server", "--wait", "--timeout=5m")
	waitNoVolumeAttachment(t, kubeconfig, 5*time.Minute)
	t.Logf("deleted, unstaged and detached (disk unplugged) after %s", time.Since(start).Round(time.Second))
	raw, err := os.ReadFile(file)
	require.NoError(t, err)
	assert.False(t, bytes.Contains(raw, []byte("kept on an encrypted volume")), "the pod's data in the clear in the volume's file")

	start = time.Now()
	applyManifest(t, kubeconfig, pod(second))
	kubectl(t, kubeconfig, "wait", "--for=condition=Ready", "pod/volume-server", "--timeout=10m")
	t.Logf("a new pod on the same claim, on %s, is Ready after %s", second, time.Since(start).Round(time.Second))
	assert.Equal(t, secret, kubectl(t, kubeconfig, "get", "--raw", dataPath), "the volume kept what the first pod stored")
	kubectl(t, kubeconfig, "delete", "pod", "volume-server", "--wait", "--timeout=5m")
	waitNoVolumeAttachment(t, kubeconfig, 5*time.Minute)
}

// waitNoVolumeAttachment waits until the cluster has no VolumeAttachment: every volume
// detached (ControllerUnpublishVolume done).
func waitNoVolumeAttachment(t *testing.T, kubeconfig string, timeout time.Duration) {
	t.Helper()
	bin := kubectlPath(t)
	deadline := time.Now().Add(timeout)
	for {
		out, err := exec.Command(bin, "--kubeconfig", kubeconfig, "get", "volumeattachments", "-o", "name").CombinedOutput()
		if err == nil && strings.TrimSpace(string(out)) == "" {
			return
		}
		if time.Now().After(deadline) {
			require.Failf(t, "volume still attached", "after %s: %s %v", timeout, out, err)
		}
		time.Sleep(2 * time.Second)
	}
}
