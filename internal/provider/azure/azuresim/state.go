package azuresim

import (
	"fmt"
	"net/http"
	"strings"

	azfake "github.com/Azure/azure-sdk-for-go/sdk/azcore/fake"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v8"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/msi/armmsi"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v7"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/resources/armresources/v3"
)

// group is a resource group and what is in it, by lower-case name.
type group struct {
	rg          armresources.ResourceGroup
	vnets       map[string]*armnetwork.VirtualNetwork
	nsgs        map[string]*armnetwork.SecurityGroup
	publicIPs   map[string]*armnetwork.PublicIPAddress
	lbs         map[string]*armnetwork.LoadBalancer
	nics        map[string]*armnetwork.Interface
	disks       map[string]*armcompute.Disk
	vms         map[string]*vm
	identities  map[string]*armmsi.Identity
	galleries   map[string]*gallery
	routeTables map[string]*armnetwork.RouteTable
}

// vm is a VM and its power state ("running", "stopped", "deallocated").
type vm struct {
	armcompute.VirtualMachine
	power string
}

func newGroup(name string, rg armresources.ResourceGroup) *group {
	rg.Name = ptr(name)
	return &group{
		rg:    rg,
		vnets: map[string]*armnetwork.VirtualNetwork{}, nsgs: map[string]*armnetwork.SecurityGroup{},
		publicIPs: map[string]*armnetwork.PublicIPAddress{}, lbs: map[string]*armnetwork.LoadBalancer{},
		nics: map[string]*armnetwork.Interface{}, disks: map[string]*armcompute.Disk{}, vms: map[string]*vm{},
		identities: map[string]*armmsi.Identity{}, galleries: map[string]*gallery{},
		routeTables: map[string]*armnetwork.RouteTable{},
	}
}

// resources lists the group's resources as Resource Manager lists them.
func (g *group) resources(prefix string) []*armresources.GenericResourceExpanded {
	var out []*armresources.GenericResourceExpanded
	add := func(typ string, names []string) {
		for _, n := range names {
			out = append(out, &armresources.GenericResourceExpanded{Name: ptr(n), Type: ptr(typ), ID: ptr(prefix + "/providers/" + typ + "/" + n)})
		}
	}
	add("Microsoft.Network/virtualNetworks", keys(g.vnets))
	add("Microsoft.Network/networkSecurityGroups", keys(g.nsgs))
	add("Microsoft.Network/publicIPAddresses", keys(g.publicIPs))
	add("Microsoft.Network/loadBalancers", keys(g.lbs))
	add("Microsoft.Network/networkInterfaces", keys(g.nics))
	add("Microsoft.Compute/disks", keys(g.disks))
	add("Microsoft.Compute/virtualMachines", keys(g.vms))
	add("Microsoft.ManagedIdentity/userAssignedIdentities", keys(g.identities))
	add("Microsoft.Compute/galleries", keys(g.galleries))
	add("Microsoft.Network/routeTables", keys(g.routeTables))
	return out
}

func keys[T any](m map[string]T) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

func ptr[T any](v T) *T { return &v }

func key(name string) string { return strings.ToLower(name) }

// errNotFound and the like are Azure's answers.
type apiError struct {
	status int
	code   string
}

func (e *apiError) Error() string { return fmt.Sprintf("%d %s", e.status, e.code) }

func notFound(code string) *apiError { return &apiError{http.StatusNotFound, code} }
func conflict(code string) *apiError { return &apiError{http.StatusConflict, code} }
func badRequest(code string) *apiError {
	return &apiError{http.StatusBadRequest, code}
}

// groupOf returns the group name, or Azure's error for a missing one. Called with c.mu held.
func (c *Cloud) groupOf(name string) (*group, *apiError) {
	g, ok := c.groups[key(name)]
	if !ok {
		return nil, notFound("ResourceGroupNotFound")
	}
	return g, nil
}

func (c *Cloud) groupID(name string) string {
	return "/subscriptions/" + c.Subscription + "/resourceGroups/" + name
}

func (c *Cloud) id(groupName, typ, name string) string {
	return c.groupID(groupName) + "/providers/" + typ + "/" + name
}

// ref parses a resource ID of the subscription into its group, type and name (and the
// rest, for a child resource).
func (c *Cloud) ref(id string) (groupName, typ, name, rest string, ok bool) {
	parts := strings.Split(strings.TrimPrefix(id, "/"), "/")
	if len(parts) < 8 || !strings.EqualFold(parts[0], "subscriptions") || parts[1] != c.Subscription ||
		!strings.EqualFold(parts[2], "resourceGroups") || !strings.EqualFold(parts[4], "providers") {
		return "", "", "", "", false
	}
	return parts[3], parts[5] + "/" + parts[6], parts[7], strings.Join(parts[8:], "/"), true
}

// respond turns a handler's outcome into the fakes' responders: 200 OK or Azure's error.
func respond[T any](out T, err *apiError) (resp azfake.Responder[T], errResp azfake.ErrorResponder) {
	return respondWith(http.StatusOK, out, err)
}

// respondWith answers success with status (201 Created where Azure says so).
func respondWith[T any](status int, out T, err *apiError) (resp azfake.Responder[T], errResp azfake.ErrorResponder) {
	if err != nil {
		errResp.SetResponseError(err.status, err.code)
		return
	}
	resp.SetResponse(status, out, nil)
	return
}

// lro answers a long-running operation: accepted, polled once, then done; or failed
// halfway if a fault of api says so (failed, if not nil, then marks what the operation
// changed as failed, as Azure leaves a resource whose provisioning failed). Called with c.mu
// held; the state change happened.
func lro[T any](c *Cloud, api string, out T, err *apiError, failed func()) (resp azfake.PollerResponder[T], errResp azfake.ErrorResponder) {
	if err != nil {
		errResp.SetResponseError(err.status, err.code)
		return
	}
	// Azure accepts most creations with 201 Created (disks: 202), a VM's update with 200 OK
	// (and its provisioning state "Updating"), other operations with 202 Accepted; the SDK
	// refuses any other status.
	accepted := http.StatusAccepted
	switch {
	case api == "VirtualMachinesClient.BeginUpdate":
		accepted = http.StatusOK
	case strings.Contains(api, "Create") && api != "DisksClient.BeginCreateOrUpdate":
		accepted = http.StatusCreated
	}
	resp.AddNonTerminalResponse(accepted, nil)
	for range c.takeSlow(api) {
		resp.AddNonTerminalResponse(accepted, nil)
	}
	if f := c.takeFault(api, true); f != nil {
		resp.SetTerminalError(f.Status, f.Code)
		if failed != nil {
			failed()
		}
		return
	}
	resp.SetTerminalResponse(http.StatusOK, out, nil)
	return
}
