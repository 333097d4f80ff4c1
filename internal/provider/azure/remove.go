package azure

import (
	"context"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v8"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v7"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/resources/armresources/v3"

	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/provider/azure/azuremeta"
)

// removeNode deletes a node's VM, network interface and state disk.
func (c *clients) removeNode(ctx context.Context, l layout, name string) error {
	if err := c.removeVM(ctx, l, name); err != nil {
		return err
	}
	return c.removeDisk(ctx, l, name)
}

// removeVM deletes a node's VM (its OS disk and network interface with it), then its network
// interface if it outlived it (an interrupted creation or removal). Resources of the name
// that are not the cluster's are left alone (ErrConflict).
func (c *clients) removeVM(ctx context.Context, l layout, name string) error {
	vm := "delete VM " + name
	if err := c.owned(ctx, l, vm, func(ctx context.Context) (map[string]*string, error) {
		r, err := c.vms.Get(ctx, l.ResourceGroup, name, nil)
		return r.Tags, err
	}); err != nil {
		return err
	}
	provider.Progressf(ctx, "Azure: deleting VM %s", name)
	if err := remove(ctx, c, vm, func(ctx context.Context) (*runtime.Poller[armcompute.VirtualMachinesClientDeleteResponse], error) {
		return c.vms.BeginDelete(ctx, l.ResourceGroup, name, nil)
	}); err != nil {
		return err
	}
	nic := "delete network interface " + l.nic(name)
	if err := c.owned(ctx, l, nic, func(ctx context.Context) (map[string]*string, error) {
		r, err := c.interfaces.Get(ctx, l.ResourceGroup, l.nic(name), nil)
		return r.Tags, err
	}); err != nil {
		return err
	}
	return remove(ctx, c, nic, func(ctx context.Context) (*runtime.Poller[armnetwork.InterfacesClientDeleteResponse], error) {
		return c.interfaces.BeginDelete(ctx, l.ResourceGroup, l.nic(name), nil)
	})
}

// removeDisk deletes a node's state disk: the node's encrypted state, gone with the node.
func (c *clients) removeDisk(ctx context.Context, l layout, name string) error {
	disk := "delete disk " + l.stateDisk(name)
	if err := c.owned(ctx, l, disk, func(ctx context.Context) (map[string]*string, error) {
		r, err := c.disks.Get(ctx, l.ResourceGroup, l.stateDisk(name), nil)
		return r.Tags, err
	}); err != nil {
		return err
	}
	provider.Progressf(ctx, "Azure: deleting %s's state disk", name)
	return remove(ctx, c, disk, func(ctx context.Context) (*runtime.Poller[armcompute.DisksClientDeleteResponse], error) {
		return c.disks.BeginDelete(ctx, l.ResourceGroup, l.stateDisk(name), nil)
	})
}

// removeCluster deletes the cluster-wide resources, after its nodes (removeNode), in the
// reverse order of their creation, and the resource group if the provider created it and
// nothing else is left in it.
func (c *clients) removeCluster(ctx context.Context, l layout) error {
	steps := []struct {
		what  string
		owner func(context.Context) (map[string]*string, error)
		del   func(context.Context) error
	}{
		{"delete load balancer " + l.lb(), func(ctx context.Context) (map[string]*string, error) {
			r, err := c.loadBalancers.Get(ctx, l.ResourceGroup, l.lb(), nil)
			return r.Tags, err
		}, func(ctx context.Context) error {
			return remove(ctx, c, "delete load balancer "+l.lb(), func(ctx context.Context) (*runtime.Poller[armnetwork.LoadBalancersClientDeleteResponse], error) {
				return c.loadBalancers.BeginDelete(ctx, l.ResourceGroup, l.lb(), nil)
			})
		}},
		{"delete public address " + l.publicIP(), func(ctx context.Context) (map[string]*string, error) {
			r, err := c.publicIPs.Get(ctx, l.ResourceGroup, l.publicIP(), nil)
			return r.Tags, err
		}, func(ctx context.Context) error {
			return remove(ctx, c, "delete public address "+l.publicIP(), func(ctx context.Context) (*runtime.Poller[armnetwork.PublicIPAddressesClientDeleteResponse], error) {
				return c.publicIPs.BeginDelete(ctx, l.ResourceGroup, l.publicIP(), nil)
			})
		}},
		{"delete virtual network " + l.vnet(), func(ctx context.Context) (map[string]*string, error) {
			r, err := c.vnets.Get(ctx, l.ResourceGroup, l.vnet(), nil)
			return r.Tags, err
		}, func(ctx context.Context) error {
			return remove(ctx, c, "delete virtual network "+l.vnet(), func(ctx context.Context) (*runtime.Poller[armnetwork.VirtualNetworksClientDeleteResponse], error) {
				return c.vnets.BeginDelete(ctx, l.ResourceGroup, l.vnet(), nil)
			})
		}},
		{"delete route table " + l.routes(), func(ctx context.Context) (map[string]*string, error) {
			r, err := c.routeTables.Get(ctx, l.ResourceGroup, l.routes(), nil)
			return r.Tags, err
		}, func(ctx context.Context) error {
			return remove(ctx, c, "delete route table "+l.routes(), func(ctx context.Context) (*runtime.Poller[armnetwork.RouteTablesClientDeleteResponse], error) {
				return c.routeTables.BeginDelete(ctx, l.ResourceGroup, l.routes(), nil)
			})
		}},
		{"delete network security group " + l.nsg(), func(ctx context.Context) (map[string]*string, error) {
			r, err := c.securityGroups.Get(ctx, l.ResourceGroup, l.nsg(), nil)
			return r.Tags, err
		}, func(ctx context.Context) error {
			return remove(ctx, c, "delete network security group "+l.nsg(), func(ctx context.Context) (*runtime.Poller[armnetwork.SecurityGroupsClientDeleteResponse], error) {
				return c.securityGroups.BeginDelete(ctx, l.ResourceGroup, l.nsg(), nil)
			})
		}},
	}
	for _, s := range steps {
		if err := c.owned(ctx, l, s.what, s.owner); err != nil {
			return err
		}
		provider.Progressf(ctx, "Azure: %s", s.what)
		if err := s.del(ctx); err != nil {
			return err
		}
	}
	if err := c.removeIdentities(ctx, l); err != nil {
		return err
	}
	return c.removeGroup(ctx, l)
}

// removeIdentities deletes the cluster's identities, each after its role assignment and role.
func (c *clients) removeIdentities(ctx context.Context, l layout) error {
	for _, k := range identities {
		if err := c.removeIdentity(ctx, l, k); err != nil {
			return err
		}
	}
	return nil
}

// removeIdentity deletes an identity's role assignment, its role and the identity.
func (c *clients) removeIdentity(ctx context.Context, l layout, k identityKind) error {
	if err := c.call(ctx, "delete "+k.who+" role assignment", func(ctx context.Context) error {
		_, err := c.roleAssignments.Delete(ctx, l.groupID(), l.roleAssignmentName(k), nil)
		if isNotFound(err) {
			return nil
		}
		return err
	}); err != nil {
		return err
	}
	if err := c.call(ctx, "delete "+k.who+" role", func(ctx context.Context) error {
		_, err := c.roleDefinitions.Delete(ctx, l.groupID(), l.roleDefinitionName(k), nil)
		if isNotFound(err) {
			return nil
		}
		return err
	}); err != nil {
		return err
	}
	what := "delete managed identity " + l.identity(k)
	if err := c.owned(ctx, l, what, func(ctx context.Context) (map[string]*string, error) {
		r, err := c.identities.Get(ctx, l.ResourceGroup, l.identity(k), nil)
		return r.Tags, err
	}); err != nil {
		return err
	}
	return c.call(ctx, what, func(ctx context.Context) error {
		_, err := c.identities.Delete(ctx, l.ResourceGroup, l.identity(k), nil)
		if isNotFound(err) {
			return nil
		}
		return err
	})
}

// removeGroup deletes the resource group if the provider created it for this cluster and it
// holds nothing else now: a group the user made, or one with resources the provider did not
// create, is kept.
func (c *clients) removeGroup(ctx context.Context, l layout) error {
	g, found, err := get(ctx, c, "read resource group "+l.ResourceGroup, func(ctx context.Context) (armresources.ResourceGroupsClientGetResponse, error) {
		return c.groups.Get(ctx, l.ResourceGroup, nil)
	})
	if err != nil || !found || tag(g.Tags, TagOwnedGroup) != "true" || tag(g.Tags, azuremeta.TagUID) != l.UID {
		return err
	}
	var left []string
	if err := c.call(ctx, "list resource group "+l.ResourceGroup, func(ctx context.Context) error {
		left = nil
		pager := c.resources.NewListByResourceGroupPager(l.ResourceGroup, nil)
		for pager.More() {
			page, err := pager.NextPage(ctx)
			if err != nil {
				return err
			}
			for _, r := range page.Value {
				if r.Name != nil {
					left = append(left, *r.Name)
				}
			}
		}
		return nil
	}); err != nil {
		return err
	}
	if len(left) > 0 {
		provider.Progressf(ctx, "Azure: keeping resource group %s: it holds resources the cluster did not create: %v", l.ResourceGroup, left)
		return nil
	}
	provider.Progressf(ctx, "Azure: deleting resource group %s", l.ResourceGroup)
	return remove(ctx, c, "delete resource group "+l.ResourceGroup, func(ctx context.Context) (*runtime.Poller[armresources.ResourceGroupsClientDeleteResponse], error) {
		return c.groups.BeginDelete(ctx, l.ResourceGroup, nil)
	})
}
