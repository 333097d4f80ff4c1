package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/cli"
	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/provider/azure"
	"github.com/openconstellation/constellation/internal/provider/azure/azuresim/simnodes"
	"github.com/openconstellation/constellation/internal/provider/catalog"
	"github.com/openconstellation/constellation/internal/provider/local/cluster"
	"github.com/openconstellation/constellation/internal/state"
)

// TestAzureSimulated runs the CLI's flow on an Azure configuration against the simulated
// cloud (azuresim), with a sandbox node behind each VM (simnodes): the Azure provider's host
// half creates the resource group, network, load balancer and VMs; the VMs' nodes boot; the
// CLI initializes the first control plane through its NAT rule on the load balancer's public
// address, waits for the cluster through the API rule, scales it up, reboots a node, scales
// it down, stops, starts and recovers it, verifies every node, refuses an image that is no
// release, stops an upgrade whose gallery version holds another image, upgrades it to a signed
// release whose Azure image its VMs then boot, and removes it all. The CLI runs in this process, its
// catalog's Azure provider pointed at the simulated cloud; the sandbox's provider process is
// the built binary.
func TestAzureSimulated(t *testing.T) {
	bin, _ := buildBinaries(t)
	ws := t.TempDir()
	images := filepath.Join(repoOutput(t), "images")
	out, err := exec.Command(bin, "-C", ws, "config", "generate", "local", "--name", "azsim", "--workers", "1",
		"--kube-dir", kubeDir(t), "--images", images).CombinedOutput()
	require.NoError(t, err, "%s", out)

	const subscription = "00000000-0000-0000-0000-0000000000ab"
	image := "/subscriptions/" + subscription + "/resourceGroups/images/providers/Microsoft.Compute/galleries/g/images/node/versions/1.0.0"

	// Release v0.2.0, upgrading from the cluster's image, names its image in Azure's gallery
	// (version 2.0.0), signed with the rest. The simulated gallery keeps no disk: the
	// digest names the one a real upload would record.
	releases := newReleases(t)
	releaseImage := strings.Replace(image, "1.0.0", "2.0.0", 1)
	releases.run("create", "--key", releases.key, "--version", "v0.2.0", "--source", releases.source,
		"--base-image", filepath.Join(ws, "node-image"), "--images", images, "--from", filepath.Join(ws, "node-image"),
		"--cloud-image", fmt.Sprintf("azure=%s@sha256:%x", releaseImage, sha256.Sum256([]byte("the disk of gallery version 2.0.0"))))
	releaseDir := filepath.Join(releases.source, "v0.2.0")

	machines := filepath.Join(t.TempDir(), "machines")
	m := simnodes.New(t, simnodes.Options{Subscription: subscription, Exe: bin, Dir: machines, ImagesDir: images,
		Images: map[string]string{image: filepath.Join(ws, "node-image"), releaseImage: filepath.Join(releaseDir, "node-image")}})
	catalog.Register(m.Platform())
	t.Cleanup(func() { catalog.Register(azure.Platform{}) })

	// The user's configuration, with Azure's provider block instead of the sandbox's: the
	// reference values stay the sandbox image's, whose nodes stand in for the VMs.
	confPath := filepath.Join(ws, config.FileName)
	conf, err := config.Load(confPath)
	require.NoError(t, err)
	conf.Provider = config.ProviderFor(azure.Name, config.ProviderBlock{ControlPlanes: 1, Workers: 1, Image: image, Settings: map[string]any{
		"subscriptionID": subscription, "resourceGroup": "azsim", "location": "westeurope", "vmSize": "Standard_DC4as_v5",
	}})
	require.NoError(t, config.Write(confPath, conf, true))

	run := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Minute)
		defer cancel()
		cmd := cli.NewRootCmd()
		var b bytes.Buffer
		cmd.SetOut(&b)
		cmd.SetErr(&b)
		cmd.SetArgs(append([]string{"-C", ws}, args...))
		err := cmd.ExecuteContext(ctx)
		t.Logf("constellation %v:\n%s", args, b.String())
		return b.String(), err
	}
	t.Cleanup(func() {
		_, _ = run("terminate", "--yes")
		assertNoLeftovers(t, machines, cluster.NetworkID(machines))
	})

	out2, err := run("apply")
	require.NoError(t, err, out2)
	assert.Contains(t, out2, "over attested TLS")
	assert.Contains(t, out2, "all ready")
	st, err := state.Load(filepath.Join(ws, state.FileName))
	require.NoError(t, err)
	assert.Equal(t, state.Initialized, st.Phase)
	assert.Equal(t, azure.Name, st.Provider)
	vm, ok := m.Cloud.VM("azsim", "control-plane-0")
	require.True(t, ok, "the node is an Azure VM")
	assert.NotNil(t, vm.Properties.SecurityProfile)

	kubeconfig := filepath.Join(ws, "constellation-admin.conf")
	assert.Equal(t, "control-plane-0 worker-0", kubectl(t, kubeconfig, "get", "nodes", "-o", "jsonpath={.items[*].metadata.name}"),
		"kubectl reaches the API server through the load balancer's rule")

	// Scale up: a VM, its node boots and joins.
	setCounts(t, ws, 1, 2)
	out2, err = run("apply")
	require.NoError(t, err, out2)
	assert.Contains(t, out2, "+ worker-1")
	_, ok = m.Cloud.VM("azsim", "worker-1")
	assert.True(t, ok)

	// A reboot restarts the VM; its node reboots and rejoins.
	out2, err = run("reboot", "worker-0")
	require.NoError(t, err, out2)
	assert.Contains(t, out2, "worker-0 (Ready by a fresh kubelet heartbeat")

	// Scale down: the node leaves Kubernetes, then its VM and disk go.
	setCounts(t, ws, 1, 1)
	out2, err = run("apply")
	require.NoError(t, err, out2)
	_, ok = m.Cloud.VM("azsim", "worker-1")
	assert.False(t, ok, "the removed node's VM is deleted")
	assert.Equal(t, "control-plane-0 worker-0", kubectl(t, kubeconfig, "get", "nodes", "-o", "jsonpath={.items[*].metadata.name}"))

	// Stop deallocates the VMs (their nodes shut down) and start boots them again; the control
	// plane reports on its serial console that it waits for recovery, which the host half
	// reads through boot diagnostics, and recover unlocks it through its NAT rule.
	kubectl(t, kubeconfig, "create", "configmap", "before-stop", "--from-literal=k=v")
	out2, err = run("stop")
	require.NoError(t, err, out2)
	assert.Equal(t, "deallocated", m.Cloud.Power("azsim", "control-plane-0"))
	out2, err = run("start")
	require.NoError(t, err, out2)
	prov, err := m.Platform().Open(ws)
	require.NoError(t, err)
	nodes, err := prov.Nodes(t.Context())
	require.NoError(t, err)
	for _, n := range nodes {
		// Its serial log still ends with its report before the stop: that is not this boot's.
		assert.False(t, metadata.InCluster(n.Reported), "%s reports %q right after start", n.Name, n.Reported)
	}
	require.Eventually(t, func() bool {
		nodes, err := prov.Nodes(t.Context())
		return err == nil && slices.ContainsFunc(nodes, func(n provider.Node) bool {
			return n.Name == "control-plane-0" && n.Reported == metadata.PhaseWaitingForRecovery
		})
	}, 3*time.Minute, time.Second, "the control plane reports that it waits for recovery")
	out2, err = run("recover")
	require.NoError(t, err, out2)
	assert.Equal(t, "v", kubectl(t, kubeconfig, "get", "configmap", "before-stop", "-o", "jsonpath={.data.k}"), "the cluster's data outlived the stop")

	out2, err = run("verify")
	require.NoError(t, err, out2)
	assert.Contains(t, out2, "2 of 2 nodes verified")

	// Another image that is no release: apply refuses to replace the nodes and changes
	// nothing.
	conf, err = config.Load(confPath)
	require.NoError(t, err)
	conf.Provider.Block().Image = strings.Replace(image, "1.0.0", "1.1.0", 1)
	require.NoError(t, config.Write(confPath, conf, true))
	before := m.Cloud.Calls()
	out2, err = run("apply")
	require.ErrorContains(t, err, "replacing nodes needs a signed release", out2)
	for _, call := range m.Cloud.Calls()[len(before):] {
		assert.NotContains(t, call, "Begin", "a refused upgrade changes nothing")
	}

	// Whoever can write the gallery stores the running image's disk under the release's
	// version. The replacement boots it and joins (during the roll the cluster admits the
	// old image too), but it does not match the release's own reference set: the roll stops,
	// the replacement is removed and the release's set retired.
	useRelease(t, ws, releases.key+".pub", releases.source, releaseDir)
	m.SetImage(releaseImage, filepath.Join(ws, "node-image"))
	out2, err = run("apply")
	require.ErrorContains(t, err, "not one of release v0.2.0: its image is not what the release signed", out2)
	assert.ErrorContains(t, err, "the cluster still runs on its old nodes")
	assert.Equal(t, "control-plane-0 worker-0", kubectl(t, kubeconfig, "get", "nodes", "-o", "jsonpath={.items[*].metadata.name}"))
	_, ok = m.Cloud.VM("azsim", "control-plane-1")
	assert.False(t, ok, "the impostor's VM is deleted")
	conf, err = config.Load(confPath)
	require.NoError(t, err)
	for _, set := range conf.Attestation.Of(conf.Attestation.Variant()).Measurements {
		assert.NotEqual(t, "v0.2.0", set.Name, "the release's set is retired again")
	}
	st, err = state.Load(filepath.Join(ws, state.FileName))
	require.NoError(t, err)
	assert.Empty(t, st.Release)

	// The release's own disk under its version: each node is replaced by a VM booting it,
	// which attests against the release's reference set before the old VM is drained and
	// deleted.
	m.SetImage(releaseImage, filepath.Join(releaseDir, "node-image"))
	out2, err = run("apply")
	require.NoError(t, err, out2)
	assert.Contains(t, out2, "upgraded: every node boots release v0.2.0")
	names := strings.Fields(kubectl(t, kubeconfig, "get", "nodes", "-o", "jsonpath={.items[*].metadata.name}"))
	assert.Len(t, names, 2)
	for _, name := range names {
		assert.NotContains(t, []string{"control-plane-0", "worker-0"}, name, "the old nodes are replaced")
		vm, ok := m.Cloud.VM("azsim", name)
		if assert.True(t, ok, name) {
			assert.Equal(t, releaseImage, *vm.Properties.StorageProfile.ImageReference.ID, "%s boots the release's Azure image", name)
		}
	}
	for _, old := range []string{"control-plane-0", "worker-0"} {
		_, ok := m.Cloud.VM("azsim", old)
		assert.False(t, ok, "%s's VM is deleted", old)
	}
	assert.Equal(t, "v", kubectl(t, kubeconfig, "get", "configmap", "before-stop", "-o", "jsonpath={.data.k}"), "the cluster's data outlived the upgrade")
	st, err = state.Load(filepath.Join(ws, state.FileName))
	require.NoError(t, err)
	assert.Equal(t, "v0.2.0", st.Release)
	out2, err = run("verify")
	require.NoError(t, err, out2)
	assert.Contains(t, out2, "2 of 2 nodes verified")
	out2, err = run("apply")
	require.NoError(t, err, out2)
	assert.NotContains(t, out2, "replacing", "a second apply has nothing to replace")

	out2, err = run("terminate", "--yes")
	require.NoError(t, err, out2)
	assert.Empty(t, m.Cloud.Groups(), "every resource is gone")
}
