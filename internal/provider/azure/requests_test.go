package azure

import (
	"bytes"
	"encoding/json"
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v8"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/provider/azure/azuremeta"
)

var update = flag.Bool("update", false, "rewrite the golden files of testdata/requests")

// TestRequestsGolden pins every request the provider sends to create a cluster: a change of
// any field, a confidential one above all, shows in the golden file's diff (go test -run
// TestRequestsGolden -update rewrites them).
func TestRequestsGolden(t *testing.T) {
	nodes := testNodes()
	requests := map[string]any{
		"resource-group":          resourceGroupRequest(testLayout),
		"identity":                identityRequest(testLayout),
		"role-definition":         roleDefinitionRequest(testLayout, nodesIdentity),
		"role-assignment":         roleAssignmentRequest(testLayout, nodesIdentity, "11111111-2222-3333-4444-555555555555"),
		"role-definition-volumes": roleDefinitionRequest(testLayout, volumesIdentity),
		"role-assignment-volumes": roleAssignmentRequest(testLayout, volumesIdentity, "66666666-7777-8888-9999-000000000000"),
		"network-security-group":  securityGroupRequest(testLayout),
		"virtual-network":         virtualNetworkRequest(testLayout),
		"public-ip":               publicIPRequest(testLayout),
		"load-balancer":           loadBalancerRequest(testLayout, nodes),
		"state-disk":              stateDiskRequest(testLayout, nodes[0]),
		"interface-control-plane": interfaceRequest(testLayout, nodes[0]),
		"interface-worker":        interfaceRequest(testLayout, nodes[1]),
		"vm-control-plane":        vmRequest(testLayout, nodes[0]),
		"vm-worker":               vmRequest(testLayout, nodes[1]),
		"route-table":             routeTableRequest(testLayout, routed(nodes)),
	}
	for name, req := range requests {
		t.Run(name, func(t *testing.T) {
			got := marshal(t, req)
			path := filepath.Join("testdata", "requests", name+".json")
			if *update {
				require.NoError(t, os.WriteFile(path, got, 0o644))
			}
			want, err := os.ReadFile(path)
			require.NoError(t, err, "no golden file: run go test -run TestRequestsGolden -update")
			assert.Equal(t, string(want), string(got))
		})
	}
}

func marshal(t *testing.T, v any) []byte {
	t.Helper()
	raw, err := json.Marshal(v)
	require.NoError(t, err)
	var out bytes.Buffer
	require.NoError(t, json.Indent(&out, raw, "", "  "))
	out.WriteByte('\n')
	return out.Bytes()
}

// TestVMRequestIsConfidential pins the confidential fields apart from the golden files: a
// VM request without them must fail here even if the golden files were rewritten.
func TestVMRequestIsConfidential(t *testing.T) {
	for _, enc := range []armcompute.SecurityEncryptionTypes{armcompute.SecurityEncryptionTypesVMGuestStateOnly, armcompute.SecurityEncryptionTypesDiskWithVMGuestState} {
		for _, n := range testNodes() {
			n.Encryption = enc
			vm := vmRequest(testLayout, n)
			require.NoError(t, checkConfidential(vm))
			sp := vm.Properties.SecurityProfile
			assert.Equal(t, armcompute.SecurityTypesConfidentialVM, *sp.SecurityType)
			assert.True(t, *sp.UefiSettings.VTpmEnabled)
			assert.Equal(t, enc, *vm.Properties.StorageProfile.OSDisk.ManagedDisk.SecurityProfile.SecurityEncryptionType)
			assert.Nil(t, vm.Properties.OSProfile, "no OS profile: nothing travels in custom data")
			assert.Nil(t, vm.Properties.UserData)
			assert.Equal(t, int32(0), *vm.Properties.StorageProfile.DataDisks[0].Lun, "the state disk is LUN 0")
		}
	}
	// And checkConfidential refuses each missing piece.
	for name, edit := range map[string]func(*armcompute.VirtualMachine){
		"trusted launch": func(vm *armcompute.VirtualMachine) {
			vm.Properties.SecurityProfile.SecurityType = ptr(armcompute.SecurityTypesTrustedLaunch)
		},
		"no security profile": func(vm *armcompute.VirtualMachine) { vm.Properties.SecurityProfile = nil },
		"no vTPM": func(vm *armcompute.VirtualMachine) {
			vm.Properties.SecurityProfile.UefiSettings.VTpmEnabled = ptr(false)
		},
		"no OS disk encryption type": func(vm *armcompute.VirtualMachine) {
			vm.Properties.StorageProfile.OSDisk.ManagedDisk.SecurityProfile = nil
		},
	} {
		vm := vmRequest(testLayout, testNodes()[0])
		edit(&vm)
		assert.Error(t, checkConfidential(vm), name)
	}
}

// TestVMRequestMatchesAzureExample cross-checks the confidential fields against Azure's
// published REST example of a confidential VM: every field of the example's confidential
// part is in our request at the same place, and securityType and vTpmEnabled are equal.
func TestVMRequestMatchesAzureExample(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "confidential-vm-example.json"))
	require.NoError(t, err)
	var example struct {
		Parameters map[string]any `json:"parameters"`
	}
	require.NoError(t, json.Unmarshal(raw, &example))
	var ours map[string]any
	require.NoError(t, json.Unmarshal(marshal(t, vmRequest(testLayout, testNodes()[0])), &ours))

	examplePaths, ourPaths := leaves(example.Parameters, ""), leaves(ours, "")
	for _, p := range sortedKeys(examplePaths) {
		if !strings.Contains(p, "security") && !strings.Contains(p, "uefi") {
			continue
		}
		assert.Contains(t, ourPaths, p, "the example sets %s", p)
	}
	for _, p := range []string{"properties.securityProfile.securityType", "properties.securityProfile.uefiSettings.vTpmEnabled"} {
		assert.Equal(t, examplePaths[p], ourPaths[p], p)
	}
}

// leaves flattens a JSON object into its leaf paths and values.
func leaves(v any, prefix string) map[string]any {
	out := map[string]any{}
	if m, ok := v.(map[string]any); ok {
		for k, child := range m {
			p := k
			if prefix != "" {
				p = prefix + "." + k
			}
			for lp, lv := range leaves(child, p) {
				out[lp] = lv
			}
		}
		return out
	}
	out[prefix] = v
	return out
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// routed are nodes with the addresses their interfaces got.
func routed(nodes []nodeRequest) []nodeRequest {
	out := slices.Clone(nodes)
	for i := range out {
		out[i].Address = netip.AddrFrom4([4]byte{10, 9, 0, byte(4 + i)})
	}
	return out
}

func TestPodNetwork(t *testing.T) {
	pods := netip.MustParsePrefix("10.244.0.0/16")
	for slot, want := range map[int]string{0: "10.244.0.0/24", 1: "10.244.1.0/24", 255: "10.244.255.0/24"} {
		got, err := podNetwork(pods, slot)
		require.NoError(t, err)
		assert.Equal(t, want, got.String())
	}
	_, err := podNetwork(pods, 256)
	assert.ErrorContains(t, err, "pod network 10.244.0.0/16 holds 256 node networks (/24), not one for slot 256")
	_, err = podNetwork(netip.MustParsePrefix("10.244.0.0/25"), 0)
	assert.ErrorContains(t, err, "want an IPv4 prefix of at most /24")
	got, err := podNetwork(netip.MustParsePrefix("10.0.0.0/8"), 4369)
	require.NoError(t, err)
	assert.Equal(t, "10.17.17.0/24", got.String())
}

// TestOnlyTheCLIsPortsAreExposed: the security group and the load balancer open the API and
// the ports the CLI dials, nothing else; the join service stays inside the virtual network.
func TestOnlyTheCLIsPortsAreExposed(t *testing.T) {
	var ports []string
	for _, p := range securityGroupRequest(testLayout).Properties.SecurityRules[0].Properties.DestinationPortRanges {
		ports = append(ports, *p)
	}
	assert.Equal(t, []string{"6443", "9000", "9999", "30081"}, ports)
	lb := loadBalancerRequest(testLayout, testNodes())
	for _, r := range lb.Properties.InboundNatRules {
		assert.NotEqual(t, int32(30090), *r.Properties.BackendPort, *r.Name)
	}
	_, err := natFrontendPort(0, 30090)
	assert.ErrorContains(t, err, "port 30090 of a node is not reachable through the load balancer")
}

// Only the control planes, where the volume driver's controller runs, may change disks; no
// identity may do more than its role names, and the nodes' writes nothing.
func TestIdentitiesAreLeastPrivilege(t *testing.T) {
	nodes := testNodes()
	ids := func(n nodeRequest) []string {
		var out []string
		for id := range vmRequest(testLayout, n).Identity.UserAssignedIdentities {
			out = append(out, id[strings.LastIndex(id, "/")+1:])
		}
		return out
	}
	assert.ElementsMatch(t, []string{"mini-nodes", "mini-volumes"}, ids(nodes[0]), "control plane")
	assert.ElementsMatch(t, []string{"mini-nodes"}, ids(nodes[1]), "worker")
	assert.NotContains(t, vmRequest(testLayout, nodes[1]).Tags, azuremeta.TagVolumesIdentity)

	for _, a := range nodesIdentity.actions {
		assert.True(t, strings.HasSuffix(a, "/read"), "the nodes' role reads only: %s", a)
	}
	for _, a := range volumesIdentity.actions {
		assert.True(t, strings.HasPrefix(a, "Microsoft.Compute/disks/") || strings.HasPrefix(a, "Microsoft.Compute/virtualMachines/"), a)
		assert.NotContains(t, a, "*", "no wildcard")
	}
	for _, k := range identities {
		def := roleDefinitionRequest(testLayout, k)
		require.Len(t, def.Properties.AssignableScopes, 1)
		assert.Equal(t, testLayout.groupID(), *def.Properties.AssignableScopes[0], "assignable in the cluster's group only")
	}
	assert.NotEqual(t, testLayout.roleDefinitionName(nodesIdentity), testLayout.roleDefinitionName(volumesIdentity))
	assert.NotEqual(t, testLayout.roleAssignmentName(nodesIdentity), testLayout.roleAssignmentName(volumesIdentity))
}
