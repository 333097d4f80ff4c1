package azure

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v8"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/provider/azure/azuresim"
	"github.com/openconstellation/constellation/internal/retry"
)

const testSub = "00000000-0000-0000-0000-000000000001"

var testLayout = layout{Subscription: testSub, ResourceGroup: "mini-rg", Location: "westeurope", Cluster: "mini", UID: "0123abcd"}

func testNodes() []nodeRequest {
	image := "/subscriptions/" + testSub + "/resourceGroups/images/providers/Microsoft.Compute/galleries/g/images/constellation/versions/1.0.0"
	n := func(name string, role metadata.Role, slot int) nodeRequest {
		pods, _ := podNetwork(netip.MustParsePrefix("10.244.0.0/16"), slot)
		return nodeRequest{Name: name, Role: role, Slot: slot, Image: image, VMSize: "Standard_DC4as_v5",
			Encryption: armcompute.SecurityEncryptionTypesVMGuestStateOnly, StateDiskGiB: 10, InitSecretHash: "c2VjcmV0",
			PodNetwork: pods, APIEndpoint: "203.0.113.1:6443"}
	}
	return []nodeRequest{n("control-plane-0", metadata.ControlPlane, 0), n("worker-0", metadata.Worker, 1)}
}

// simClients are the provider's clients on a simulated subscription, polling fast.
func simClients(t *testing.T, hooks azuresim.Hooks) (*clients, *azuresim.Cloud) {
	t.Helper()
	cloud := azuresim.New(testSub, hooks)
	opts := ClientOptions(cloud.Transport())
	opts.Retry.RetryDelay, opts.Retry.MaxRetryDelay = time.Millisecond, 10*time.Millisecond
	c, err := newClients(testSub, azuresim.Credential, opts)
	require.NoError(t, err)
	c.pollEvery = time.Millisecond
	c.retry = retry.Policy{Initial: time.Millisecond, Max: 10 * time.Millisecond, Factor: 2}
	return c, cloud
}

// progressLog collects the provider's progress lines.
type progressLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (p *progressLog) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.buf.Write(b)
}

func (p *progressLog) String() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.buf.String()
}

func createAll(ctx context.Context, c *clients, l layout, nodes []nodeRequest) error {
	if err := c.ensureGroup(ctx, l); err != nil {
		return err
	}
	if err := c.ensureIdentities(ctx, l); err != nil {
		return err
	}
	if err := c.ensureNetwork(ctx, l); err != nil {
		return err
	}
	if err := c.ensureLoadBalancer(ctx, l, nodes); err != nil {
		return err
	}
	for _, n := range nodes {
		if err := c.ensureNode(ctx, l, n); err != nil {
			return err
		}
	}
	return nil
}

func removeAll(ctx context.Context, c *clients, l layout, nodes []nodeRequest) error {
	for _, n := range nodes {
		if err := c.removeNode(ctx, l, n.Name); err != nil {
			return err
		}
	}
	return c.removeCluster(ctx, l)
}

func TestCreateRerunRemove(t *testing.T) {
	var mu sync.Mutex
	var started []string
	c, cloud := simClients(t, azuresim.Hooks{Started: func(_, vm string) { mu.Lock(); started = append(started, vm); mu.Unlock() }})
	var log progressLog
	ctx := provider.WithProgress(t.Context(), &log)
	nodes := testNodes()

	require.NoError(t, createAll(ctx, c, testLayout, nodes))
	assert.Contains(t, log.String(), "Azure: creating confidential VM control-plane-0 (Standard_DC4as_v5)")
	vm, ok := cloud.VM("mini-rg", "control-plane-0")
	require.True(t, ok)
	require.NoError(t, checkConfidential(vm))
	assert.Equal(t, "running", cloud.Power("mini-rg", "worker-0"))
	assert.ElementsMatch(t, []string{"control-plane-0", "worker-0"}, started)
	assert.Equal(t, 2, cloud.RoleAssignments(), "the nodes' and the volumes' identities")

	// A rerun adopts everything: no VM or disk is created again, no VM restarted.
	require.NoError(t, createAll(ctx, c, testLayout, nodes))
	assert.Equal(t, 2, cloud.Count("VirtualMachinesClient.BeginCreateOrUpdate"))
	assert.Equal(t, 2, cloud.Count("DisksClient.BeginCreateOrUpdate"))
	assert.Len(t, started, 2)

	require.NoError(t, removeAll(ctx, c, testLayout, nodes))
	assert.Empty(t, cloud.Groups(), "the group the provider created is deleted once empty")
	assert.Zero(t, cloud.RoleAssignments())
	// And removing again is no error.
	require.NoError(t, removeAll(ctx, c, testLayout, nodes))
}

func TestRemoveKeepsTheUsersGroup(t *testing.T) {
	c, cloud := simClients(t, azuresim.Hooks{})
	cloud.CreateGroup("mini-rg", "westeurope", nil)
	ctx := t.Context()
	nodes := testNodes()
	require.NoError(t, createAll(ctx, c, testLayout, nodes))
	require.NoError(t, removeAll(ctx, c, testLayout, nodes))
	assert.Equal(t, []string{"mini-rg"}, cloud.Groups())
	assert.Empty(t, cloud.Resources("mini-rg"))
}

func TestNeverAdoptsAnotherClustersResources(t *testing.T) {
	c, cloud := simClients(t, azuresim.Hooks{})
	ctx := t.Context()
	nodes := testNodes()
	other := testLayout
	other.UID = "ffff0000"
	require.NoError(t, createAll(ctx, c, other, nodes))

	err := createAll(ctx, c, testLayout, nodes)
	require.ErrorIs(t, err, ErrConflict)
	assert.Contains(t, err.Error(), `tag constellation-uid="ffff0000"`)
	err = removeAll(ctx, c, testLayout, nodes)
	require.ErrorIs(t, err, ErrConflict)
	_, ok := cloud.VM("mini-rg", "worker-0")
	assert.True(t, ok, "another cluster's VM is never deleted")
}

func TestFaults(t *testing.T) {
	testCases := map[string]struct {
		fault    azuresim.Fault
		wantKind error
		// wantCalls is how often the VM's creation is asked for.
		wantCalls int
		wantLog   string
	}{
		"throttled with Retry-After beyond the SDK's own retries": {
			fault:     azuresim.Fault{API: "VirtualMachinesClient.BeginCreateOrUpdate", Status: http.StatusTooManyRequests, Code: "TooManyRequests", RetryAfter: time.Second, Times: 2},
			wantCalls: 4, wantLog: "retrying in 1s after: Azure: create VM control-plane-0: TooManyRequests",
		},
		"an operation that fails halfway on Azure's side is retried": {
			fault:     azuresim.Fault{API: "VirtualMachinesClient.BeginCreateOrUpdate", Status: http.StatusInternalServerError, Code: "InternalServerError", Halfway: true},
			wantCalls: 3,
		},
		"capacity": {
			fault:    azuresim.Fault{API: "VirtualMachinesClient.BeginCreateOrUpdate", Status: http.StatusConflict, Code: "AllocationFailed", Halfway: true},
			wantKind: ErrCapacity, wantCalls: 3, wantLog: "VM control-plane-0 failed to provision before; asking again",
		},
		"quota": {
			fault:    azuresim.Fault{API: "VirtualMachinesClient.BeginCreateOrUpdate", Status: http.StatusConflict, Code: "QuotaExceeded"},
			wantKind: ErrQuota, wantCalls: 3,
		},
		"unsupported size": {
			fault:    azuresim.Fault{API: "VirtualMachinesClient.BeginCreateOrUpdate", Status: http.StatusConflict, Code: "SkuNotAvailable"},
			wantKind: ErrUnsupported, wantCalls: 3,
		},
		"authorization": {
			fault:    azuresim.Fault{API: "ResourceGroupsClient.Get", Status: http.StatusForbidden, Code: "AuthorizationFailed"},
			wantKind: ErrAuth, wantCalls: 2,
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			c, cloud := simClients(t, azuresim.Hooks{})
			var log progressLog
			ctx := provider.WithProgress(t.Context(), &log)
			cloud.Inject(tc.fault)
			err := createAll(ctx, c, testLayout, testNodes())
			if tc.wantKind != nil {
				require.ErrorIs(t, err, tc.wantKind)
				assert.Contains(t, err.Error(), tc.fault.Code)
				assert.Contains(t, err.Error(), hints[tc.wantKind])
				// The rerun finishes what the first run began.
				require.NoError(t, createAll(ctx, c, testLayout, testNodes()))
			} else {
				require.NoError(t, err)
			}
			// Requests to create a VM, every retry included.
			assert.Equal(t, tc.wantCalls, cloud.Count("VirtualMachinesClient.BeginCreateOrUpdate"))
			assert.Contains(t, log.String(), tc.wantLog)
			vm, ok := cloud.VM("mini-rg", "worker-0")
			require.True(t, ok)
			assert.Equal(t, "Succeeded", *vm.Properties.ProvisioningState)
		})
	}
}

func TestErrorText(t *testing.T) {
	err := explain("create VM worker-0", errors.New("dial tcp: lookup management.azure.com: no such host"))
	assert.True(t, strings.HasPrefix(err.Error(), "Azure: create VM worker-0: dial tcp"), err.Error())
}

// TestRefusesANonConfidentialImpostor: someone with write access to the group replaces a
// node's VM with a VM of the same name and tags that is not confidential (its memory and
// vTPM open to the host). A rerun of create must refuse it, not adopt it as the node.
func TestRefusesANonConfidentialImpostor(t *testing.T) {
	c, cloud := simClients(t, azuresim.Hooks{})
	ctx := t.Context()
	nodes := testNodes()
	require.NoError(t, createAll(ctx, c, testLayout, nodes))

	require.NoError(t, c.removeVM(ctx, testLayout, "worker-0"))
	require.NoError(t, c.ensureLoadBalancer(ctx, testLayout, nodes))
	impostor := vmRequest(testLayout, nodes[1])
	impostor.Properties.SecurityProfile = &armcompute.SecurityProfile{SecurityType: ptr(armcompute.SecurityTypesTrustedLaunch),
		UefiSettings: &armcompute.UefiSettings{VTpmEnabled: ptr(true)}}
	_, err := put(ctx, c, "the impostor", func(ctx context.Context) (*runtime.Poller[armcompute.VirtualMachinesClientCreateOrUpdateResponse], error) {
		if _, err := c.interfaces.BeginCreateOrUpdate(ctx, testLayout.ResourceGroup, testLayout.nic("worker-0"), interfaceRequest(testLayout, nodes[1]), nil); err != nil {
			return nil, err
		}
		return c.vms.BeginCreateOrUpdate(ctx, testLayout.ResourceGroup, "worker-0", impostor, nil)
	})
	require.NoError(t, err)

	err = createAll(ctx, c, testLayout, nodes)
	require.ErrorIs(t, err, ErrConflict)
	assert.ErrorContains(t, err, "create VM worker-0: an Azure resource is in the way: the VM is not a confidential VM")
	vm, _ := cloud.VM("mini-rg", "worker-0")
	assert.Equal(t, armcompute.SecurityTypesTrustedLaunch, *vm.Properties.SecurityProfile.SecurityType, "left for the user to look at")
}

// TestRemoveWhenAResourceGoesMeanwhile: a resource deleted by someone else while the
// provider's delete runs (the operation ends in 404), or before it begins, is removed: the
// removal goes on.
func TestRemoveWhenAResourceGoesMeanwhile(t *testing.T) {
	c, cloud := simClients(t, azuresim.Hooks{})
	ctx := t.Context()
	nodes := testNodes()
	require.NoError(t, createAll(ctx, c, testLayout, nodes))
	// Someone deletes the control plane before the provider gets to it, and the worker while
	// the provider's delete runs.
	_, err := put(ctx, c, "the other's delete", func(ctx context.Context) (*runtime.Poller[armcompute.VirtualMachinesClientDeleteResponse], error) {
		return c.vms.BeginDelete(ctx, testLayout.ResourceGroup, "control-plane-0", nil)
	})
	require.NoError(t, err)
	cloud.Inject(azuresim.Fault{API: "VirtualMachinesClient.BeginDelete", Status: http.StatusNotFound, Code: "ResourceNotFound", Halfway: true})
	require.NoError(t, removeAll(ctx, c, testLayout, nodes))
	assert.Empty(t, cloud.Groups())
}

// TestSlowOperationsSayWhatTheyWaitFor: an operation that takes its time is reported at
// least every 5 s.
func TestSlowOperationsSayWhatTheyWaitFor(t *testing.T) {
	if testing.Short() {
		t.Skip("waits 7 s of real time")
	}
	c, cloud := simClients(t, azuresim.Hooks{})
	c.pollEvery = time.Second
	var log progressLog
	ctx := provider.WithProgress(t.Context(), &log)
	cloud.Inject(azuresim.Fault{API: "VirtualMachinesClient.BeginCreateOrUpdate", Polls: 6})
	start := time.Now()
	require.NoError(t, createAll(ctx, c, testLayout, testNodes()))
	took := time.Since(start)
	assert.GreaterOrEqual(t, took, 6*time.Second)
	assert.Contains(t, log.String(), "Azure: waiting to create VM control-plane-0 (5s)")
	lines := strings.Count(log.String(), "Azure: waiting to create VM control-plane-0")
	assert.GreaterOrEqual(t, lines, 1)
	assert.LessOrEqual(t, lines, int(took/(4*time.Second)), "a line per 5 s, not per poll (%s)", took)
}
