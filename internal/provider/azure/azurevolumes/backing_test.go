package azurevolumes_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/arm"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azidentity"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/csidriver"
	"github.com/openconstellation/constellation/internal/provider/azure"
	"github.com/openconstellation/constellation/internal/provider/azure/azuremeta"
	"github.com/openconstellation/constellation/internal/provider/azure/azuresim"
	"github.com/openconstellation/constellation/internal/provider/azure/azuresim/simcluster"
	"github.com/openconstellation/constellation/internal/provider/azure/azurevolumes"
)

const sub = "00000000-0000-0000-0000-000000000001"

// cluster creates a 1+1 cluster on a simulated subscription through the host half, as the
// CLI does, and returns the cloud and the cluster's UID.
func cluster(t *testing.T) (*azuresim.Cloud, string) {
	c := simcluster.New(t, sub)
	return c.Cloud, c.UID
}

func backing(t *testing.T, cloud *azuresim.Cloud, uid string) *azurevolumes.Backing {
	t.Helper()
	b, err := azurevolumes.New(azurevolumes.Config{
		Subscription: sub, ResourceGroup: "mini-rg", Location: "westeurope", UID: uid,
		Credential: azuresim.Credential, Options: azure.ClientOptions(cloud.Transport()), PollEvery: time.Millisecond,
	})
	require.NoError(t, err)
	return b
}

// dataDisks are a VM's data disks by name, with their LUNs.
func dataDisks(t *testing.T, cloud *azuresim.Cloud, vm string) map[string]int32 {
	t.Helper()
	v, ok := cloud.VM("mini-rg", vm)
	require.True(t, ok, vm)
	out := map[string]int32{}
	for _, d := range v.Properties.StorageProfile.DataDisks {
		out[*d.Name] = *d.Lun
	}
	return out
}

// A volume's life on the simulated cloud through the SDK's clients: created, attached beside
// the state disk, refused to a second node, grown, detached, deleted.
func TestVolumeLifecycle(t *testing.T) {
	cloud, uid := cluster(t)
	b := backing(t, cloud, uid)
	ctx := t.Context()
	id, other := csidriver.IDFor("pvc-1"), csidriver.IDFor("pvc-2")

	v, err := b.Create(ctx, id, 1<<30+1)
	require.NoError(t, err)
	assert.Equal(t, csidriver.Volume{ID: id, Bytes: 2 << 30}, v, "sizes round up to GiB")
	again, err := b.Create(ctx, id, 2<<30)
	require.NoError(t, err, "a retried create")
	assert.Equal(t, v, again)
	assert.Equal(t, 1, cloud.Count("DisksClient.BeginCreateOrUpdate")-2, "one disk made (and the two state disks)")
	_, err = b.Create(ctx, id, 5<<30)
	assert.ErrorIs(t, err, csidriver.ErrExists)

	require.NoError(t, b.Attach(ctx, id, "worker-0"))
	require.NoError(t, b.Attach(ctx, id, "worker-0"), "attached already")
	assert.Equal(t, map[string]int32{"worker-0-state": 0, id: 1}, dataDisks(t, cloud, "worker-0"))
	got, err := b.Get(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, "worker-0", got.AttachedTo)

	var elsewhere *csidriver.AttachedElsewhereError
	require.ErrorAs(t, b.Attach(ctx, id, "control-plane-0"), &elsewhere)
	assert.Equal(t, "worker-0", elsewhere.Node)
	assert.ErrorIs(t, b.Delete(ctx, id), csidriver.ErrAttached)

	// A second volume takes the next LUN; the first's LUN is free again once it is detached.
	_, err = b.Create(ctx, other, 1<<30)
	require.NoError(t, err)
	require.NoError(t, b.Attach(ctx, other, "worker-0"))
	assert.Equal(t, map[string]int32{"worker-0-state": 0, id: 1, other: 2}, dataDisks(t, cloud, "worker-0"))

	size, err := b.Expand(ctx, id, 3<<30)
	require.NoError(t, err)
	assert.Equal(t, int64(3<<30), size)
	size, err = b.Expand(ctx, id, 1<<30)
	require.NoError(t, err, "a smaller size is the size it has")
	assert.Equal(t, int64(3<<30), size)

	require.NoError(t, b.Detach(ctx, id, "worker-0"))
	require.NoError(t, b.Detach(ctx, id, "worker-0"), "detached already")
	assert.Equal(t, map[string]int32{"worker-0-state": 0, other: 2}, dataDisks(t, cloud, "worker-0"))
	require.NoError(t, b.Attach(ctx, id, "control-plane-0"), "free to move once detached")
	assert.Equal(t, map[string]int32{"control-plane-0-state": 0, id: 1}, dataDisks(t, cloud, "control-plane-0"))
	require.NoError(t, b.Detach(ctx, id, "control-plane-0"))

	require.NoError(t, b.Delete(ctx, id))
	require.NoError(t, b.Delete(ctx, id), "deleted already")
	_, err = b.Get(ctx, id)
	assert.ErrorIs(t, err, csidriver.ErrNotFound)
}

// What the controller is asked comes from Kubernetes (a node name, a volume id). None of it
// makes the backing touch what is not the cluster's.
func TestTouchesOnlyTheClustersDisksAndVMs(t *testing.T) {
	cloud, uid := cluster(t)
	ctx := t.Context()
	b := backing(t, cloud, uid)
	id := csidriver.IDFor("pvc-1")
	_, err := b.Create(ctx, id, 1<<30)
	require.NoError(t, err)

	// Another cluster's controller in the same group (another UID) sees no volume of its own.
	stranger := backing(t, cloud, "ffffffff")
	_, err = stranger.Get(ctx, id)
	assert.ErrorContains(t, err, "is not this cluster's volume")
	assert.Error(t, stranger.Delete(ctx, id))
	assert.Error(t, stranger.Attach(ctx, id, "worker-0"))
	_, err = b.Get(ctx, id)
	assert.NoError(t, err, "the volume is still there")

	// A state disk is no volume, even by name: there is no such volume to delete.
	require.NoError(t, b.Delete(ctx, "worker-0-state"))
	assert.NotContains(t, cloud.Calls(), "DisksClient.BeginDelete")
	assert.Contains(t, dataDisks(t, cloud, "worker-0"), "worker-0-state")

	assert.ErrorIs(t, b.Attach(ctx, id, "nobody"), csidriver.ErrNodeNotFound)
	assert.NoError(t, b.Detach(ctx, id, "nobody"), "nothing is attached to a VM that does not exist")
	assert.ErrorContains(t, b.Attach(ctx, "../../other", "worker-0"), "not a volume id")
}

func TestNewRefusesAnIncompleteConfig(t *testing.T) {
	_, err := azurevolumes.New(azurevolumes.Config{Subscription: sub, ResourceGroup: "rg", Location: "westeurope"})
	assert.ErrorContains(t, err, "cluster UID are required")
}

// Another cluster's controller cannot use this cluster's VMs for its own volumes.
func TestRefusesAnotherClustersVM(t *testing.T) {
	cloud, _ := cluster(t)
	stranger := backing(t, cloud, "ffffffff")
	id := csidriver.IDFor("pvc-x")
	_, err := stranger.Create(t.Context(), id, 1<<30)
	require.NoError(t, err)
	err = stranger.Attach(t.Context(), id, "worker-0")
	assert.ErrorIs(t, err, csidriver.ErrNodeNotFound)
	assert.ErrorContains(t, err, "the VM of that name is not this cluster's")
	assert.NotContains(t, dataDisks(t, cloud, "worker-0"), id)
}

// Resource Manager's failures reach the driver as errors, and its retry finishes the work:
// throttling is retried by the SDK; an update that fails half way is an error, and the
// retry attaches the disk once.
func TestAttachSurvivesFaults(t *testing.T) {
	cloud, uid := cluster(t)
	b := backing(t, cloud, uid)
	ctx := t.Context()
	id := csidriver.IDFor("pvc-1")
	_, err := b.Create(ctx, id, 1<<30)
	require.NoError(t, err)

	cloud.Inject(azuresim.Fault{API: "VirtualMachinesClient.Get", Status: 429, Code: "TooManyRequests", RetryAfter: time.Millisecond})
	cloud.Inject(azuresim.Fault{API: "VirtualMachinesClient.BeginUpdate", Status: 500, Code: "InternalExecutionError", Halfway: true})
	err = b.Attach(ctx, id, "worker-0")
	assert.ErrorContains(t, err, "InternalExecutionError")
	require.NoError(t, b.Attach(ctx, id, "worker-0"), "the driver's retry")
	assert.Equal(t, map[string]int32{"worker-0-state": 0, id: 1}, dataDisks(t, cloud, "worker-0"))

	cloud.Inject(azuresim.Fault{API: "DisksClient.BeginCreateOrUpdate", Status: 409, Code: "OperationNotAllowed"})
	_, err = b.Create(ctx, csidriver.IDFor("pvc-2"), 1<<30)
	assert.ErrorContains(t, err, "creating its disk")
}

// The controller on a control plane finds its cluster through IMDS: the VM's subscription,
// group, location and the cluster's UID tag.
func TestClusterBacking(t *testing.T) {
	cloud, _ := cluster(t)
	// The controller on the control plane reads its VM's IMDS (the simulated cloud's, from the
	// state the host half made).
	c := azurevolumes.NewClusterBacking(cloud.ServeIMDS(t, "mini-rg", "control-plane-0"))
	// Its token is the volumes' identity's, from the VM's IMDS: the role the host half gave
	// that identity must allow all the controller does.
	c.Options = azure.ClientOptions(cloud.TransportFrom("mini-rg", "control-plane-0"))
	id := csidriver.IDFor("pvc-1")
	_, err := c.Create(t.Context(), id, 1<<30)
	require.NoError(t, err)
	require.NoError(t, c.Attach(t.Context(), id, "worker-0"))
	v, err := c.Get(t.Context(), id)
	require.NoError(t, err)
	assert.Equal(t, "worker-0", v.AttachedTo)

	// The worker's IMDS lists the volume at the first volume LUN: where its node half
	// (azurenode) looks for the volume's device.
	assert.Equal(t, []azuremeta.DataDisk{{Name: "worker-0-state", LUN: azuremeta.StateLUN}, {Name: id, LUN: azuremeta.FirstVolumeLUN}}, instance(t, cloud, "worker-0").DataDisks)

	// A VM of no cluster: its IMDS names no cluster UID.
	noCluster := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = fmt.Fprintf(w, `{"compute":{"name":"control-plane-0","subscriptionId":%q,"resourceGroupName":"mini-rg","location":"westeurope"}}`, sub)
	}))
	t.Cleanup(noCluster.Close)
	stray := azurevolumes.NewClusterBacking(noCluster.URL)
	stray.Credential, stray.Options = azuresim.Credential, azure.ClientOptions(cloud.Transport())
	_, err = stray.Get(t.Context(), id)
	assert.ErrorContains(t, err, "VM control-plane-0 carries no constellation-uid tag")
}

// TestOnlyControlPlanesManageVolumes attacks the volumes' disks from a worker: its VM carries
// no volumes' identity (its IMDS refuses a token of it), and the nodes' identity it carries
// may not make, attach or delete disks. The control planes' volumes' identity reaches nothing
// outside the cluster's group.
func TestOnlyControlPlanesManageVolumes(t *testing.T) {
	cloud, uid := cluster(t)
	ctx := t.Context()
	fromWorker := azure.ClientOptions(cloud.TransportFrom("mini-rg", "worker-0"))
	fromControlPlane := azure.ClientOptions(cloud.TransportFrom("mini-rg", "control-plane-0"))
	worker, controlPlane := instance(t, cloud, "worker-0"), instance(t, cloud, "control-plane-0")
	id := csidriver.IDFor("pvc-1")

	// The controller's own wiring, on a worker.
	onWorker := azurevolumes.NewClusterBacking(cloud.ServeIMDS(t, "mini-rg", "worker-0"))
	onWorker.Options = fromWorker
	_, err := onWorker.Create(ctx, id, 1<<30)
	assert.ErrorContains(t, err, "tag constellation-volumes-identity")

	// A token of the volumes' identity, asked for by its resource ID.
	volumesID := "/subscriptions/" + sub + "/resourceGroups/mini-rg/providers/Microsoft.ManagedIdentity/userAssignedIdentities/" + controlPlane.Tags[azuremeta.TagVolumesIdentity]
	stolen, err := azidentity.NewManagedIdentityCredential(&azidentity.ManagedIdentityCredentialOptions{ClientOptions: fromWorker.ClientOptions, ID: azidentity.ResourceID(volumesID)})
	require.NoError(t, err)
	_, err = stolen.GetToken(ctx, policy.TokenRequestOptions{Scopes: []string{"https://management.azure.com/.default"}})
	assert.ErrorContains(t, err, "the requested identity isn't assigned to this resource")

	// The volumes' storage with the nodes' identity the worker carries.
	made := backingAs(t, "mini-rg", uid, controlPlane, azuremeta.TagVolumesIdentity, fromControlPlane)
	_, err = made.Create(ctx, id, 1<<30)
	require.NoError(t, err, "the control plane's controller")
	asWorker := backingAs(t, "mini-rg", uid, worker, azuremeta.TagNodesIdentity, fromWorker)
	_, err = asWorker.Create(ctx, csidriver.IDFor("pvc-2"), 1<<30)
	assert.ErrorContains(t, err, "AuthorizationFailed", "make a disk")
	assert.ErrorContains(t, asWorker.Attach(ctx, id, "worker-0"), "AuthorizationFailed", "attach a volume to itself")
	assert.ErrorContains(t, asWorker.Delete(ctx, id), "AuthorizationFailed", "delete a volume")
	_, err = made.Get(ctx, id)
	assert.NoError(t, err, "the volume is still there")
	assert.Equal(t, map[string]int32{"worker-0-state": 0}, dataDisks(t, cloud, "worker-0"))

	// The volumes' identity in another group of the subscription.
	cloud.CreateGroup("other-rg", "westeurope", nil)
	elsewhere := backingAs(t, "other-rg", uid, controlPlane, azuremeta.TagVolumesIdentity, fromControlPlane)
	_, err = elsewhere.Create(ctx, id, 1<<30)
	assert.ErrorContains(t, err, "AuthorizationFailed", "outside the cluster's group")
}

// instance is what VM name's IMDS says of it.
func instance(t *testing.T, cloud *azuresim.Cloud, name string) azuremeta.Instance {
	t.Helper()
	inst, err := (azuremeta.IMDS{BaseURL: cloud.ServeIMDS(t, "mini-rg", name)}).ClusterInstance(t.Context())
	require.NoError(t, err)
	return inst
}

// backingAs is the volumes' storage of group rg with the managed identity tag names on VM
// inst, its tokens asked for through opts.
func backingAs(t *testing.T, rg, uid string, inst azuremeta.Instance, tag string, opts *arm.ClientOptions) *azurevolumes.Backing {
	t.Helper()
	cred, err := azuremeta.ManagedIdentity(inst, tag, opts)
	require.NoError(t, err)
	b, err := azurevolumes.New(azurevolumes.Config{
		Subscription: sub, ResourceGroup: rg, Location: "westeurope", UID: uid,
		Credential: cred, Options: opts, PollEvery: time.Millisecond,
	})
	require.NoError(t, err)
	return b
}
