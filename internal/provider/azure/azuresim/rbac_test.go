package azuresim

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
)

// The action of a request is the one Azure's roles name: a wrong mapping would let a role
// pass or fail for the wrong reason.
func TestOperation(t *testing.T) {
	const g = "/subscriptions/s/resourceGroups/rg"
	for _, tc := range []struct{ method, path, want string }{
		{http.MethodGet, g + "/providers/Microsoft.Compute/virtualMachines", "Microsoft.Compute/virtualMachines/read"},
		{http.MethodGet, g + "/providers/Microsoft.Compute/virtualMachines/vm", "Microsoft.Compute/virtualMachines/read"},
		{http.MethodPut, g + "/providers/Microsoft.Compute/disks/d", "Microsoft.Compute/disks/write"},
		{http.MethodPatch, g + "/providers/Microsoft.Compute/virtualMachines/vm", "Microsoft.Compute/virtualMachines/write"},
		{http.MethodDelete, g + "/providers/Microsoft.Compute/disks/d", "Microsoft.Compute/disks/delete"},
		{http.MethodPost, g + "/providers/Microsoft.Compute/virtualMachines/vm/start", "Microsoft.Compute/virtualMachines/start/action"},
		{http.MethodGet, g + "/providers/Microsoft.Network/loadBalancers/lb/inboundNatRules/r", "Microsoft.Network/loadBalancers/inboundNatRules/read"},
		{http.MethodGet, g, "Microsoft.Resources/subscriptions/resourceGroups/read"},
	} {
		assert.Equal(t, tc.want, operation(tc.method, tc.path), "%s %s", tc.method, tc.path)
	}
}

func TestRoleAllows(t *testing.T) {
	role := &roleDef{actions: []string{"Microsoft.Compute/disks/*", "Microsoft.Compute/virtualMachines/read"}, notActions: []string{"Microsoft.Compute/disks/delete"}}
	assert.True(t, role.allows("Microsoft.Compute/disks/write"))
	assert.True(t, role.allows("microsoft.compute/virtualmachines/read"), "case-insensitive")
	assert.False(t, role.allows("Microsoft.Compute/disks/delete"), "not-actions win")
	assert.False(t, role.allows("Microsoft.Compute/virtualMachines/write"))
	assert.False(t, role.allows("Microsoft.Compute/disksX/write"))
}
