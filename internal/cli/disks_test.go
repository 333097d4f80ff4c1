package cli

import (
	"bytes"
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/openconstellation/constellation/internal/bootstrapper/bootstraptest"
	"github.com/openconstellation/constellation/internal/diskowner"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/state"
)

// The state file takes the cluster's records, as written by the join service and init; a
// later record that disagrees changes nothing in the file and is reported.
func TestRefreshDisks(t *testing.T) {
	ctx := context.Background()
	keys := bootstraptest.NewClusterKeys(t)
	ws := t.TempDir()
	path := filepath.Join(ws, state.FileName)
	st := recoveryState(keys, [2]string{"control-plane-0", ""})
	st.Nodes[1].Disk = ""
	require.NoError(t, state.Write(path, st))

	client := fake.NewClientset()
	require.NoError(t, diskowner.EnsureNamespace(ctx, client))
	owners := diskowner.Store{Client: client}
	for disk, node := range map[string]string{someDisk: "control-plane-0", diskOfWorker: "worker-0", diskOfCP1: "worker-9"} {
		_, err := owners.Claim(ctx, disk, node)
		require.NoError(t, err)
	}
	report, err := refreshDisks(ctx, ws, st, client)
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"control-plane-0: " + someDisk, "worker-0: " + diskOfWorker}, report.Recorded)
	assert.Empty(t, report.Problems, "a removed node's record is no problem")
	loaded, err := state.Load(path)
	require.NoError(t, err)
	assert.Equal(t, someDisk, loaded.Nodes[0].Disk)
	assert.Equal(t, diskOfWorker, loaded.Nodes[1].Disk)
	written, err := os.ReadFile(path)
	require.NoError(t, err)

	// control-plane-0 joins again with another disk (its first record stays): the file
	// keeps the recorded disk, and says so.
	_, err = owners.Claim(ctx, "c0ffee00-0000-4000-8000-0000000000aa", "control-plane-0")
	require.NoError(t, err)
	report, err = refreshDisks(ctx, ws, loaded, client)
	require.NoError(t, err)
	assert.False(t, report.Changed())
	require.Len(t, report.Problems, 1)
	assert.Contains(t, report.Problems[0], "control-plane-0: the cluster records other disks for this node too")
	after, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, written, after, "the state file is not rewritten")
	var out bytes.Buffer
	printDiskReport(&out, report)
	assert.Contains(t, out.String(), "WARNING: disk records: control-plane-0: the cluster records other disks")

	// An administrator deletes the old disk's record (the join service cannot): the one
	// disk left for the node replaces the recorded one, loudly.
	require.NoError(t, client.CoreV1().ConfigMaps(diskowner.Namespace).Delete(ctx, "disk-"+someDisk, metav1.DeleteOptions{}))
	report, err = refreshDisks(ctx, ws, loaded, client)
	require.NoError(t, err)
	require.Len(t, report.Replaced, 1)
	out.Reset()
	printDiskReport(&out, report)
	assert.Contains(t, out.String(), "WARNING: disk record replaced: control-plane-0: disk changed from "+someDisk+" to c0ffee00-0000-4000-8000-0000000000aa")
	loaded, err = state.Load(path)
	require.NoError(t, err)
	assert.Equal(t, "c0ffee00-0000-4000-8000-0000000000aa", loaded.Nodes[0].Disk)
}

// Re-listing the platform's nodes (apply) keeps each node's recorded disk.
func TestRecordNodesKeepsDisks(t *testing.T) {
	keys := bootstraptest.NewClusterKeys(t)
	st := recoveryState(keys, [2]string{"control-plane-0", someDisk})
	recordNodes(st, []provider.Node{
		{NodeSpec: provider.NodeSpec{Name: "control-plane-0", Role: metadata.ControlPlane}, IPs: []netip.Addr{netip.MustParseAddr("10.42.0.10")}},
		{NodeSpec: provider.NodeSpec{Name: "worker-0", Role: metadata.Worker}, IPs: []netip.Addr{netip.MustParseAddr("10.42.0.50")}},
		{NodeSpec: provider.NodeSpec{Name: "worker-1", Role: metadata.Worker}, IPs: []netip.Addr{netip.MustParseAddr("10.42.0.51")}},
	})
	require.Len(t, st.Nodes, 3)
	assert.Equal(t, someDisk, st.Nodes[0].Disk)
	assert.Equal(t, diskOfWorker, st.Nodes[1].Disk)
	assert.Empty(t, st.Nodes[2].Disk, "a new node has no disk until the cluster records one")
}

// stop and reboot say which control planes recover will refuse, even when the records cannot
// be read (here: no node runs, no admin kubeconfig).
func TestRefreshBeforeShutdownWarns(t *testing.T) {
	keys := bootstraptest.NewClusterKeys(t)
	ws := t.TempDir()
	st := recoveryState(keys, [2]string{"control-plane-0", ""}, [2]string{"control-plane-1", diskOfCP1})
	require.NoError(t, state.Write(filepath.Join(ws, state.FileName), st))
	stopped := recoveringPlatform{nodes: []provider.Node{{NodeSpec: provider.NodeSpec{Name: "control-plane-0"}, State: provider.Stopped}}}
	var out bytes.Buffer
	refreshDisksBeforeShutdown(context.Background(), &out, ws, st, stopped)
	assert.Contains(t, out.String(), "WARNING: could not refresh the disk records from the cluster: no admin kubeconfig (constellation-admin.conf)")
	assert.Contains(t, out.String(), "WARNING: no disk recorded for control-plane-0: recover will refuse them unless told their disks (--disk NODE=UUID)\n")
	assert.NotContains(t, out.String(), "control-plane-1", "its disk is recorded")

	// With the admin kubeconfig, but no node running: the cluster is not asked.
	require.NoError(t, os.WriteFile(filepath.Join(ws, AdminConfFile), []byte("not even a kubeconfig"), 0o600))
	out.Reset()
	refreshDisksBeforeShutdown(context.Background(), &out, ws, st, stopped)
	assert.Equal(t, "WARNING: no disk recorded for control-plane-0: recover will refuse them unless told their disks (--disk NODE=UUID)\n", out.String())

	out.Reset()
	st.Phase, st.ClusterID, st.MeasurementSalt = state.Created, nil, nil
	refreshDisksBeforeShutdown(context.Background(), &out, ws, st, stopped)
	assert.Empty(t, out.String(), "nothing to recover in a cluster that was never initialized")
}

// status writes the state file now: a refresh must not replace what another command wrote
// since this one read the file (an apply's new node, here).
func TestRefreshDisksDoesNotUndoAnotherCommand(t *testing.T) {
	ctx := context.Background()
	keys := bootstraptest.NewClusterKeys(t)
	ws := t.TempDir()
	path := filepath.Join(ws, state.FileName)
	st := recoveryState(keys, [2]string{"control-plane-0", ""})
	require.NoError(t, state.Write(path, st))
	client := fake.NewClientset()
	_, err := diskowner.Store{Client: client}.Claim(ctx, someDisk, "control-plane-0")
	require.NoError(t, err)

	// Meanwhile apply added worker-1.
	applied, err := state.Load(path)
	require.NoError(t, err)
	applied.Nodes = append(applied.Nodes, state.Node{Name: "worker-1", Role: metadata.Worker, IPs: []netip.Addr{netip.MustParseAddr("10.42.0.51")}})
	require.NoError(t, state.Write(path, applied))

	report, err := refreshDisks(ctx, ws, st, client)
	require.ErrorContains(t, err, "changed while this command ran")
	assert.True(t, report.Changed())
	loaded, err := state.Load(path)
	require.NoError(t, err)
	assert.Len(t, loaded.Nodes, 3, "apply's node is still there")
	assert.Empty(t, loaded.Nodes[0].Disk)

	// The next command, reading the file afresh, records the disk.
	_, err = refreshDisks(ctx, ws, loaded, client)
	require.NoError(t, err)
	loaded, err = state.Load(path)
	require.NoError(t, err)
	assert.Equal(t, someDisk, loaded.Nodes[0].Disk)
	assert.Len(t, loaded.Nodes, 3)
}
