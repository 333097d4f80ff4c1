package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/kubeversion"
	"github.com/openconstellation/constellation/internal/nodeimage"
	"github.com/openconstellation/constellation/internal/provider/local"
)

// TestKubernetesV135 creates a cluster of one control plane and one worker at Kubernetes
// v1.35.4 (not the default): the node image is v1.35.4's, both nodes' kubelets and the API
// server report v1.35.4, the control plane, kube-proxy and CoreDNS run the images kubeadm
// v1.35.4 deploys, no node holds an image of another Kubernetes version, and `constellation
// verify` passes.
func TestKubernetesV135(t *testing.T) {
	const version = "v1.35.4"
	require.NotEqual(t, config.DefaultKubernetesVersion, version, "the test is of a version other than the default")
	release, err := kubeversion.Lookup(version)
	require.NoError(t, err)
	bin, _ := buildBinaries(t)
	ws := t.TempDir()
	miniUp(t, bin, ws, "--workers", "1", "--kubernetes-version", version)
	kubeconfig := filepath.Join(ws, "constellation-admin.conf")

	conf, err := config.Load(filepath.Join(ws, config.FileName))
	require.NoError(t, err)
	assert.Equal(t, version, conf.KubernetesVersion)
	data, err := os.ReadFile(filepath.Join(conf.Provider.Block().ImagePath(ws), local.NodeConfigFile))
	require.NoError(t, err)
	nodeConfig, err := local.ParseNodeConfig(data)
	require.NoError(t, err)
	assert.Equal(t, version, nodeConfig.KubernetesVersion, "the node image is the version's")

	assert.ElementsMatch(t, []string{"control-plane-0", "worker-0"}, readyNodes(t, kubeconfig))
	var server struct {
		ServerVersion struct{ GitVersion string }
	}
	require.NoError(t, json.Unmarshal([]byte(kubectl(t, kubeconfig, "version", "-o", "json")), &server))
	assert.Equal(t, version, server.ServerVersion.GitVersion, "API server")

	nodes := nodeVersions(t, kubeconfig)
	require.Len(t, nodes, 2)
	for _, n := range nodes {
		assert.Equal(t, version, n.kubelet, "kubelet of %s", n.name)
		for _, img := range n.images {
			if strings.HasPrefix(img, nodeimage.Registry+"/") {
				assert.Contains(t, nodeimage.ReleaseRefs(release), img, "%s holds only %s's images", n.name, version)
			}
		}
	}
	// The control plane's static pods, kube-proxy and CoreDNS run the images kubeadm v1.35.4
	// deploys. The static pods appear in the API as mirror pods, which the kubelet creates on
	// its own schedule: `mini up` may return before the last of them, so wait for them.
	kubectlBin := kubectlPath(t)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		pods := kubectlQuiet(kubectlBin, kubeconfig, "-n", "kube-system", "get", "pods", "-o", "jsonpath={range .items[*]}{.spec.containers[*].image}{\"\\n\"}{end}")
		for _, ref := range nodeimage.ReleaseRefs(release) {
			if !strings.Contains(ref, "/pause:") {
				assert.Contains(c, pods, ref)
			}
		}
	}, time.Minute, time.Second)

	out, err := exec.Command(bin, "verify", "-C", ws).CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "OK    control-plane-0")
	assert.Contains(t, string(out), "OK    worker-0")
	assert.Contains(t, string(out), "2 of 2 nodes verified")
}

// nodeVersion is what a node's status reports of its Kubernetes software.
type nodeVersion struct {
	name, kubelet string
	images        []string
}

// nodeVersions returns each node's kubelet version and the image refs its kubelet reports.
func nodeVersions(t *testing.T, kubeconfig string) []nodeVersion {
	t.Helper()
	var list struct {
		Items []struct {
			Metadata struct{ Name string }
			Status   struct {
				NodeInfo struct{ KubeletVersion string }
				Images   []struct{ Names []string }
			}
		}
	}
	require.NoError(t, json.Unmarshal([]byte(kubectl(t, kubeconfig, "get", "nodes", "-o", "json")), &list))
	var nodes []nodeVersion
	for _, n := range list.Items {
		v := nodeVersion{name: n.Metadata.Name, kubelet: n.Status.NodeInfo.KubeletVersion}
		for _, img := range n.Status.Images {
			v.images = append(v.images, img.Names...)
		}
		nodes = append(nodes, v)
	}
	return nodes
}
