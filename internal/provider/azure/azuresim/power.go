package azuresim

import (
	"context"
	"strings"

	azfake "github.com/Azure/azure-sdk-for-go/sdk/azcore/fake"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v8"
)

// serveVMPower serves a VM's instance view and its power operations.
func (c *Cloud) serveVMPower() {
	s := &c.compute.VirtualMachinesServer
	s.InstanceView = func(_ context.Context, rg, name string, _ *armcompute.VirtualMachinesClientInstanceViewOptions) (azfake.Responder[armcompute.VirtualMachinesClientInstanceViewResponse], azfake.ErrorResponder) {
		c.mu.Lock()
		defer c.mu.Unlock()
		v, err := find(c, rg, name, func(g *group) map[string]*vm { return g.vms })
		if err != nil {
			return respond(armcompute.VirtualMachinesClientInstanceViewResponse{}, err)
		}
		g, _ := c.groupOf(rg)
		power := g.vms[key(name)].power
		view := armcompute.VirtualMachineInstanceView{Statuses: []*armcompute.InstanceViewStatus{
			{Code: ptr("ProvisioningState/" + strings.ToLower(deref(v.Properties.ProvisioningState)))},
			{Code: ptr("PowerState/" + power)},
		}}
		return respond(armcompute.VirtualMachinesClientInstanceViewResponse{VirtualMachineInstanceView: view}, nil)
	}
	s.BeginRestart = func(_ context.Context, rg, name string, _ *armcompute.VirtualMachinesClientBeginRestartOptions) (azfake.PollerResponder[armcompute.VirtualMachinesClientRestartResponse], azfake.ErrorResponder) {
		c.mu.Lock()
		defer c.mu.Unlock()
		err := c.power(rg, name, func(v *vm) *apiError {
			if v.power != "running" {
				return conflict("OperationNotAllowed") // Azure restarts running VMs only
			}
			c.stopped(rg, name)
			c.started(rg, name)
			return nil
		})
		return lro(c, "VirtualMachinesClient.BeginRestart", armcompute.VirtualMachinesClientRestartResponse{}, err, nil)
	}
	s.BeginDeallocate = func(_ context.Context, rg, name string, _ *armcompute.VirtualMachinesClientBeginDeallocateOptions) (azfake.PollerResponder[armcompute.VirtualMachinesClientDeallocateResponse], azfake.ErrorResponder) {
		c.mu.Lock()
		defer c.mu.Unlock()
		err := c.power(rg, name, func(v *vm) *apiError {
			if v.power == "running" {
				c.stopped(rg, name)
			}
			v.power = "deallocated"
			return nil
		})
		return lro(c, "VirtualMachinesClient.BeginDeallocate", armcompute.VirtualMachinesClientDeallocateResponse{}, err, nil)
	}
	s.BeginStart = func(_ context.Context, rg, name string, _ *armcompute.VirtualMachinesClientBeginStartOptions) (azfake.PollerResponder[armcompute.VirtualMachinesClientStartResponse], azfake.ErrorResponder) {
		c.mu.Lock()
		defer c.mu.Unlock()
		err := c.power(rg, name, func(v *vm) *apiError {
			if v.power != "running" {
				c.started(rg, name)
			}
			v.power = "running"
			return nil
		})
		return lro(c, "VirtualMachinesClient.BeginStart", armcompute.VirtualMachinesClientStartResponse{}, err, nil)
	}
}

// power applies op to VM name. Called with c.mu held.
func (c *Cloud) power(rg, name string, op func(*vm) *apiError) *apiError {
	g, err := c.groupOf(rg)
	if err != nil {
		return err
	}
	v, ok := g.vms[key(name)]
	if !ok {
		return notFound("ResourceNotFound")
	}
	return op(v)
}

// Power returns the power state of VM name ("running", "deallocated", ...), "" if it does not
// exist.
func (c *Cloud) Power(rg, name string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if g, err := c.groupOf(rg); err == nil && g.vms[key(name)] != nil {
		return g.vms[key(name)].power
	}
	return ""
}

// VM returns VM name as Azure stores it.
func (c *Cloud) VM(rg, name string) (armcompute.VirtualMachine, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, err := find(c, rg, name, func(g *group) map[string]*vm { return g.vms })
	if err != nil {
		return armcompute.VirtualMachine{}, false
	}
	return v.VirtualMachine, true
}
