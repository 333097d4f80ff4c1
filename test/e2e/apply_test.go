package e2e

import (
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/provider/local/cluster"
	"github.com/openconstellation/constellation/internal/provider/local/sandbox"
	"github.com/openconstellation/constellation/internal/registries"
	"github.com/openconstellation/constellation/internal/state"
)

// TestCreateApplyTerminate walks the CLI's step-by-step flow on one control plane: generate
// the configuration (default node image), create the nodes, apply (init), apply again
// (as configured: nothing to do), verify, terminate. The configuration lets the cluster reach
// the host's loopback (network.hostLoopback) and names a registry there as the mirror of
// example.com (registryMirrors): a pod of an image that exists only in that registry is
// pulled through the mirror (imagePullPolicy Always) and fetches from a server on the host's
// loopback, both through the NAT.
func TestCreateApplyTerminate(t *testing.T) {
	bin, _ := buildBinaries(t)
	ws := t.TempDir()
	images := filepath.Join(repoOutput(t), "images")
	cli := func(args ...string) (string, error) {
		out, err := exec.Command(bin, append([]string{"-C", ws}, args...)...).CombinedOutput()
		return string(out), err
	}
	var id string
	t.Cleanup(func() {
		_, _ = cli("terminate", "--yes")
		if id != "" {
			assertNoLeftovers(t, ws, id)
		}
	})

	out, err := cli("config", "generate", "local", "--name", "demo", "--workers", "0", "--kube-dir", kubeDir(t), "--images", images)
	require.NoError(t, err, out)
	assert.Contains(t, out, "Laid out the default node image")
	conf, err := config.Load(filepath.Join(ws, config.FileName))
	require.NoError(t, err)
	assert.Equal(t, "node-image", conf.Provider.Block().Image, "the image lives in the workspace")
	assert.Equal(t, config.OutboundNAT, conf.Network.Outbound, "NAT is the default")
	conf.Network.HostLoopback = true
	// A registry on the host's loopback holding the user's image, which no node has.
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(reg.Close)
	_, regPort, err := net.SplitHostPort(reg.Listener.Addr().String())
	require.NoError(t, err)
	img, err := tarball.ImageFromPath(userImage(t, images), nil)
	require.NoError(t, err)
	pushed, err := name.ParseReference("127.0.0.1:" + regPort + "/user/hello:v1")
	require.NoError(t, err)
	require.NoError(t, remote.Write(pushed, img))
	conf.RegistryMirrors = registries.Mirrors{"example.com": {"http://" + net.JoinHostPort(sandbox.UplinkGateway.String(), regPort)}}
	require.NoError(t, config.Write(filepath.Join(ws, config.FileName), conf, true))

	out, err = cli("apply", "--help")
	require.NoError(t, err, out)

	// verify before anything exists names what is missing.
	out, err = cli("verify")
	require.Error(t, err)
	assert.Contains(t, out, state.FileName)

	out, err = cli("create", "--images", images)
	require.NoError(t, err, out)
	status, err := cluster.ReadStatus(filepath.Join(ws, "mini"))
	require.NoError(t, err)
	id = status.NetworkID
	st, err := state.Load(filepath.Join(ws, state.FileName))
	require.NoError(t, err)
	assert.Equal(t, state.Created, st.Phase)
	assert.Equal(t, "demo", st.Name)

	// A second create refuses: the workspace has a cluster.
	out, err = cli("create", "--images", images)
	require.Error(t, err)
	assert.Contains(t, out, "already has a cluster")

	out, err = cli("apply", "--images", images)
	require.NoError(t, err, out)
	assert.Contains(t, out, "over attested TLS")
	assert.Contains(t, out, "all ready")
	st, err = state.Load(filepath.Join(ws, state.FileName))
	require.NoError(t, err)
	assert.Equal(t, state.Initialized, st.Phase)

	out, err = cli("apply", "--images", images)
	require.NoError(t, err, out)
	assert.Contains(t, out, "as configured: nothing to apply")

	// A pod of example.com/user/hello:v1, pulled from the mirror, reaches a server on the
	// host's loopback at the uplink's gateway: through the node, the bridge namespace's NAT
	// and slirp4netns.
	host := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "the host answers") }))
	t.Cleanup(host.Close)
	_, port, err := net.SplitHostPort(host.Listener.Addr().String())
	require.NoError(t, err)
	kubeconfig := filepath.Join(ws, "constellation-admin.conf")
	applyManifest(t, kubeconfig, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: reach-host, namespace: default}
spec:
  restartPolicy: Never
  tolerations: [{key: node-role.kubernetes.io/control-plane, operator: Exists, effect: NoSchedule}]
  containers:
  - name: get
    image: %s
    imagePullPolicy: Always
    command: [/hello, get, "http://%s/"]
`, userImageRef, net.JoinHostPort(sandbox.UplinkGateway.String(), port)))
	waitPodSucceeded(t, kubeconfig, "reach-host", 2*time.Minute)
	assert.Contains(t, kubectl(t, kubeconfig, "logs", "reach-host"), "the host answers")

	out, err = cli("verify")
	require.NoError(t, err, out)
	assert.Contains(t, out, "OK    control-plane-0")
	assert.Contains(t, out, "1 of 1 nodes verified: cluster demo")

	out, err = cli("terminate")
	require.Error(t, err, "terminate asks for confirmation")
	assert.Contains(t, out, "--yes")
	out, err = cli("terminate", "--yes")
	require.NoError(t, err, out)
	left, err := os.ReadDir(ws)
	require.NoError(t, err)
	var names []string
	for _, e := range left {
		names = append(names, e.Name())
	}
	assert.ElementsMatch(t, []string{config.FileName, "node-image"}, names, "terminate keeps the configuration and its image: %s", strings.Join(names, ", "))
	assertNoLeftovers(t, ws, id)
}

// waitPodSucceeded waits until pod has run to completion, and otherwise fails the test with
// what the cluster says about the pod (its events name a failed pull).
func waitPodSucceeded(t *testing.T, kubeconfig, pod string, timeout time.Duration) {
	t.Helper()
	bin := kubectlPath(t)
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		switch kubectlQuiet(bin, kubeconfig, "get", "pod", pod, "-o", "jsonpath={.status.phase}") {
		case "Succeeded":
			return
		case "Failed":
			deadline = time.Now()
		}
		time.Sleep(time.Second)
	}
	describe, _ := exec.Command(bin, "--kubeconfig", kubeconfig, "describe", "pod", pod).CombinedOutput()
	logs, _ := exec.Command(bin, "--kubeconfig", kubeconfig, "logs", pod).CombinedOutput()
	t.Fatalf("pod %s did not succeed within %v:\n%s\nlogs:\n%s", pod, timeout, describe, logs)
}
