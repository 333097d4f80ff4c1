package azure

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v8"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v7"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/resources/armresources/v3"

	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/provider/azure/azuremeta"
)

// The order of the calls that create and remove a cluster's resources. Every step is
// idempotent: a rerun after a killed command finds what the first run created (by name) and
// adopts it if it carries the cluster's UID; a resource of the same name that carries another
// UID, or none, is never adopted or deleted (ErrConflict).

// ensureGroup makes sure the cluster's resource group exists: one the user created is used
// as it is (and kept by removal); one the provider creates is tagged as its own.
func (c *clients) ensureGroup(ctx context.Context, l layout) error {
	what := "create resource group " + l.ResourceGroup
	g, found, err := get(ctx, c, "read resource group "+l.ResourceGroup, func(ctx context.Context) (armresources.ResourceGroupsClientGetResponse, error) {
		return c.groups.Get(ctx, l.ResourceGroup, nil)
	})
	if err != nil {
		return err
	}
	if found {
		if g.Location != nil && !strings.EqualFold(*g.Location, l.Location) {
			return &Error{What: what, Kind: ErrConflict, Err: fmt.Errorf("the group exists in location %s, the configuration says %s", *g.Location, l.Location)}
		}
		return nil
	}
	provider.Progressf(ctx, "Azure: creating resource group %s in %s", l.ResourceGroup, l.Location)
	return c.call(ctx, what, func(ctx context.Context) error {
		_, err := c.groups.CreateOrUpdate(ctx, l.ResourceGroup, resourceGroupRequest(l), nil)
		return err
	})
}

// ensureIdentities creates the cluster's identities, each with its role and the role's
// assignment.
func (c *clients) ensureIdentities(ctx context.Context, l layout) error {
	for _, k := range identities {
		if err := c.ensureIdentity(ctx, l, k); err != nil {
			return err
		}
	}
	return nil
}

// ensureIdentity creates an identity, its role and the role's assignment.
func (c *clients) ensureIdentity(ctx context.Context, l layout, k identityKind) error {
	var principal string
	what := "create managed identity " + l.identity(k)
	if err := c.owned(ctx, l, what, func(ctx context.Context) (map[string]*string, error) {
		r, err := c.identities.Get(ctx, l.ResourceGroup, l.identity(k), nil)
		return r.Tags, err
	}); err != nil {
		return err
	}
	if err := c.call(ctx, what, func(ctx context.Context) error {
		res, err := c.identities.CreateOrUpdate(ctx, l.ResourceGroup, l.identity(k), identityRequest(l), nil)
		if err == nil && res.Properties != nil && res.Properties.PrincipalID != nil {
			principal = *res.Properties.PrincipalID
		}
		return err
	}); err != nil {
		return err
	}
	if principal == "" {
		return &Error{What: what, Err: errors.New("the identity has no principal")}
	}
	if err := c.call(ctx, "create "+k.who+" role", func(ctx context.Context) error {
		_, err := c.roleDefinitions.CreateOrUpdate(ctx, l.groupID(), l.roleDefinitionName(k), roleDefinitionRequest(l, k), nil)
		return err
	}); err != nil {
		return err
	}
	return c.call(ctx, "assign "+k.who+" role to "+l.identity(k), func(ctx context.Context) error {
		_, err := c.roleAssignments.Create(ctx, l.groupID(), l.roleAssignmentName(k), roleAssignmentRequest(l, k, principal), nil)
		var re *azcore.ResponseError
		if errors.As(err, &re) && re.StatusCode == http.StatusConflict && re.ErrorCode == "RoleAssignmentExists" {
			return nil
		}
		// A new identity's principal takes a while to replicate into Azure AD: the
		// assignment is refused until then, so it is waited for.
		if errors.As(err, &re) && re.ErrorCode == "PrincipalNotFound" {
			return &Error{What: "assign " + k.who + " role", Status: http.StatusServiceUnavailable, Err: err}
		}
		return err
	})
}

// ensureNetwork creates the security group, the virtual network and the public address.
func (c *clients) ensureNetwork(ctx context.Context, l layout) error {
	nsg := "create network security group " + l.nsg()
	if err := c.owned(ctx, l, nsg, func(ctx context.Context) (map[string]*string, error) {
		r, err := c.securityGroups.Get(ctx, l.ResourceGroup, l.nsg(), nil)
		return r.Tags, err
	}); err != nil {
		return err
	}
	provider.Progressf(ctx, "Azure: %s", nsg)
	if _, err := put(ctx, c, nsg, func(ctx context.Context) (*runtime.Poller[armnetwork.SecurityGroupsClientCreateOrUpdateResponse], error) {
		return c.securityGroups.BeginCreateOrUpdate(ctx, l.ResourceGroup, l.nsg(), securityGroupRequest(l), nil)
	}); err != nil {
		return err
	}
	routes := "create route table " + l.routes()
	table, found, err := get(ctx, c, routes, func(ctx context.Context) (armnetwork.RouteTablesClientGetResponse, error) {
		return c.routeTables.Get(ctx, l.ResourceGroup, l.routes(), nil)
	})
	switch {
	case err != nil:
		return err
	case found && tag(table.Tags, azuremeta.TagUID) != l.UID:
		return &Error{What: routes, Kind: ErrConflict, Err: fmt.Errorf("a resource of that name exists that is not cluster %s's (tag %s=%q)", l.UID, azuremeta.TagUID, tag(table.Tags, azuremeta.TagUID))}
	case !found:
		// Created empty once: its routes are the nodes' (ensureRoutes), which a rerun keeps.
		provider.Progressf(ctx, "Azure: %s", routes)
		if err := c.putRoutes(ctx, l, nil); err != nil {
			return err
		}
	}
	vnet := "create virtual network " + l.vnet()
	if err := c.owned(ctx, l, vnet, func(ctx context.Context) (map[string]*string, error) {
		r, err := c.vnets.Get(ctx, l.ResourceGroup, l.vnet(), nil)
		return r.Tags, err
	}); err != nil {
		return err
	}
	provider.Progressf(ctx, "Azure: %s", vnet)
	if _, err := put(ctx, c, vnet, func(ctx context.Context) (*runtime.Poller[armnetwork.VirtualNetworksClientCreateOrUpdateResponse], error) {
		return c.vnets.BeginCreateOrUpdate(ctx, l.ResourceGroup, l.vnet(), virtualNetworkRequest(l), nil)
	}); err != nil {
		return err
	}
	ip := "create public address " + l.publicIP()
	if err := c.owned(ctx, l, ip, func(ctx context.Context) (map[string]*string, error) {
		r, err := c.publicIPs.Get(ctx, l.ResourceGroup, l.publicIP(), nil)
		return r.Tags, err
	}); err != nil {
		return err
	}
	provider.Progressf(ctx, "Azure: %s", ip)
	_, err = put(ctx, c, ip, func(ctx context.Context) (*runtime.Poller[armnetwork.PublicIPAddressesClientCreateOrUpdateResponse], error) {
		return c.publicIPs.BeginCreateOrUpdate(ctx, l.ResourceGroup, l.publicIP(), publicIPRequest(l), nil)
	})
	return err
}

// ensureRoutes puts the route table with the pod networks of nodes (every node of the
// cluster with an address: a PUT replaces the routes).
func (c *clients) ensureRoutes(ctx context.Context, l layout, nodes []nodeRequest) error {
	if err := c.owned(ctx, l, "update route table "+l.routes(), func(ctx context.Context) (map[string]*string, error) {
		r, err := c.routeTables.Get(ctx, l.ResourceGroup, l.routes(), nil)
		return r.Tags, err
	}); err != nil {
		return err
	}
	return c.putRoutes(ctx, l, nodes)
}

func (c *clients) putRoutes(ctx context.Context, l layout, nodes []nodeRequest) error {
	_, err := put(ctx, c, "update route table "+l.routes(), func(ctx context.Context) (*runtime.Poller[armnetwork.RouteTablesClientCreateOrUpdateResponse], error) {
		return c.routeTables.BeginCreateOrUpdate(ctx, l.ResourceGroup, l.routes(), routeTableRequest(l, nodes), nil)
	})
	return err
}

// owned refuses to go on if the resource that read returns the tags of exists and is not the
// cluster's: a PUT would take over another cluster's (or the user's) resource.
func (c *clients) owned(ctx context.Context, l layout, what string, read func(context.Context) (map[string]*string, error)) error {
	tags, found, err := get(ctx, c, what, read)
	if err != nil || !found {
		return err
	}
	if got := tag(tags, azuremeta.TagUID); got != l.UID {
		return &Error{What: what, Kind: ErrConflict, Err: fmt.Errorf("a resource of that name exists that is not cluster %s's (tag %s=%q)", l.UID, azuremeta.TagUID, got)}
	}
	return nil
}

// ensureLoadBalancer puts the load balancer with the NAT rules of nodes: every node of the
// cluster, existing and new (a PUT replaces the rules).
func (c *clients) ensureLoadBalancer(ctx context.Context, l layout, nodes []nodeRequest) error {
	what := "create load balancer " + l.lb()
	if err := c.owned(ctx, l, what, func(ctx context.Context) (map[string]*string, error) {
		r, err := c.loadBalancers.Get(ctx, l.ResourceGroup, l.lb(), nil)
		return r.Tags, err
	}); err != nil {
		return err
	}
	provider.Progressf(ctx, "Azure: %s (%d nodes)", what, len(nodes))
	_, err := put(ctx, c, what, func(ctx context.Context) (*runtime.Poller[armnetwork.LoadBalancersClientCreateOrUpdateResponse], error) {
		return c.loadBalancers.BeginCreateOrUpdate(ctx, l.ResourceGroup, l.lb(), loadBalancerRequest(l, nodes), nil)
	})
	return err
}

// ensureNode creates a node's state disk, network interface and VM. A VM that exists is
// adopted if it is the cluster's node of that name and confidential; its disk is never
// recreated (it holds the node's encrypted state).
func (c *clients) ensureNode(ctx context.Context, l layout, n nodeRequest) error {
	vm, found, err := get(ctx, c, "read VM "+n.Name, func(ctx context.Context) (armcompute.VirtualMachinesClientGetResponse, error) {
		return c.vms.Get(ctx, l.ResourceGroup, n.Name, nil)
	})
	if err != nil {
		return err
	}
	if found {
		if err := adoptVM(l, n.Name, vm.VirtualMachine); err != nil {
			return err
		}
		// A VM whose provisioning failed (no capacity, say) is put again: Azure retries
		// its provisioning. Any other is the node, created before.
		if p := vm.Properties; p == nil || p.ProvisioningState == nil || !strings.EqualFold(*p.ProvisioningState, "Failed") {
			return nil
		}
		provider.Progressf(ctx, "Azure: VM %s failed to provision before; asking again", n.Name)
	}
	disk, found, err := get(ctx, c, "read disk "+l.stateDisk(n.Name), func(ctx context.Context) (armcompute.DisksClientGetResponse, error) {
		return c.disks.Get(ctx, l.ResourceGroup, l.stateDisk(n.Name), nil)
	})
	if err != nil {
		return err
	}
	if found && tag(disk.Tags, azuremeta.TagUID) != l.UID {
		return &Error{What: "create disk " + l.stateDisk(n.Name), Kind: ErrConflict, Err: fmt.Errorf("a disk of that name exists that is not cluster %s's (tag %s=%q)", l.UID, azuremeta.TagUID, tag(disk.Tags, azuremeta.TagUID))}
	}
	// A disk of the cluster's is the node's state from an interrupted run: kept, never
	// recreated.
	if !found {
		provider.Progressf(ctx, "Azure: creating %s's state disk (%d GiB)", n.Name, n.StateDiskGiB)
		if _, err := put(ctx, c, "create disk "+l.stateDisk(n.Name), func(ctx context.Context) (*runtime.Poller[armcompute.DisksClientCreateOrUpdateResponse], error) {
			return c.disks.BeginCreateOrUpdate(ctx, l.ResourceGroup, l.stateDisk(n.Name), stateDiskRequest(l, n), nil)
		}); err != nil {
			return err
		}
	}
	provider.Progressf(ctx, "Azure: creating %s's network interface", n.Name)
	if _, err := put(ctx, c, "create network interface "+l.nic(n.Name), func(ctx context.Context) (*runtime.Poller[armnetwork.InterfacesClientCreateOrUpdateResponse], error) {
		return c.interfaces.BeginCreateOrUpdate(ctx, l.ResourceGroup, l.nic(n.Name), interfaceRequest(l, n), nil)
	}); err != nil {
		return err
	}
	provider.Progressf(ctx, "Azure: creating confidential VM %s (%s)", n.Name, n.VMSize)
	_, err = put(ctx, c, "create VM "+n.Name, func(ctx context.Context) (*runtime.Poller[armcompute.VirtualMachinesClientCreateOrUpdateResponse], error) {
		return c.vms.BeginCreateOrUpdate(ctx, l.ResourceGroup, n.Name, vmRequest(l, n), nil)
	})
	return err
}

// adoptVM checks that an existing VM is the cluster's node name, and confidential.
func adoptVM(l layout, name string, vm armcompute.VirtualMachine) error {
	what := "create VM " + name
	if got := tag(vm.Tags, azuremeta.TagUID); got != l.UID {
		return &Error{What: what, Kind: ErrConflict, Err: fmt.Errorf("a VM of that name exists that is not cluster %s's (tag %s=%q)", l.UID, azuremeta.TagUID, got)}
	}
	if err := checkConfidential(vm); err != nil {
		return &Error{What: what, Kind: ErrConflict, Err: err}
	}
	return nil
}

// checkConfidential refuses a VM that is not a confidential VM with a vTPM: the cluster's
// nodes must never run on anything else, whoever created the VM.
func checkConfidential(vm armcompute.VirtualMachine) error {
	p := vm.Properties
	switch {
	case p == nil || p.SecurityProfile == nil || p.SecurityProfile.SecurityType == nil ||
		*p.SecurityProfile.SecurityType != armcompute.SecurityTypesConfidentialVM:
		return errors.New("the VM is not a confidential VM")
	case p.SecurityProfile.UefiSettings == nil || p.SecurityProfile.UefiSettings.VTpmEnabled == nil || !*p.SecurityProfile.UefiSettings.VTpmEnabled:
		return errors.New("the VM has no vTPM")
	case p.StorageProfile == nil || p.StorageProfile.OSDisk == nil || p.StorageProfile.OSDisk.ManagedDisk == nil ||
		p.StorageProfile.OSDisk.ManagedDisk.SecurityProfile == nil || p.StorageProfile.OSDisk.ManagedDisk.SecurityProfile.SecurityEncryptionType == nil:
		return errors.New("the VM's OS disk has no confidential encryption type")
	}
	return nil
}

func tag(tags map[string]*string, key string) string {
	if v := tags[key]; v != nil {
		return *v
	}
	return ""
}
