package azuresim

import (
	"context"
	"net/http"
	"strings"

	azfake "github.com/Azure/azure-sdk-for-go/sdk/azcore/fake"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/resources/armresources/v3"
)

func (c *Cloud) serveResources() {
	s := &c.resources.ResourceGroupsServer
	s.Get = func(_ context.Context, name string, _ *armresources.ResourceGroupsClientGetOptions) (azfake.Responder[armresources.ResourceGroupsClientGetResponse], azfake.ErrorResponder) {
		c.mu.Lock()
		defer c.mu.Unlock()
		g, err := c.groupOf(name)
		if err != nil {
			return respond(armresources.ResourceGroupsClientGetResponse{}, err)
		}
		return respond(armresources.ResourceGroupsClientGetResponse{ResourceGroup: g.rg}, nil)
	}
	s.CreateOrUpdate = func(_ context.Context, name string, rg armresources.ResourceGroup, _ *armresources.ResourceGroupsClientCreateOrUpdateOptions) (azfake.Responder[armresources.ResourceGroupsClientCreateOrUpdateResponse], azfake.ErrorResponder) {
		c.mu.Lock()
		defer c.mu.Unlock()
		if rg.Location == nil || *rg.Location == "" {
			return respond(armresources.ResourceGroupsClientCreateOrUpdateResponse{}, badRequest("LocationRequired"))
		}
		rg.ID = ptr(c.groupID(name))
		rg.Properties = &armresources.ResourceGroupProperties{ProvisioningState: ptr("Succeeded")}
		if g, ok := c.groups[key(name)]; ok {
			if !strings.EqualFold(*g.rg.Location, *rg.Location) {
				return respond(armresources.ResourceGroupsClientCreateOrUpdateResponse{}, conflict("InvalidResourceGroupLocation"))
			}
			g.rg = rg
			g.rg.Name = ptr(name)
		} else {
			c.groups[key(name)] = newGroup(name, rg)
		}
		return respond(armresources.ResourceGroupsClientCreateOrUpdateResponse{ResourceGroup: c.groups[key(name)].rg}, nil)
	}
	s.BeginDelete = func(_ context.Context, name string, _ *armresources.ResourceGroupsClientBeginDeleteOptions) (azfake.PollerResponder[armresources.ResourceGroupsClientDeleteResponse], azfake.ErrorResponder) {
		c.mu.Lock()
		defer c.mu.Unlock()
		g, err := c.groupOf(name)
		if err == nil {
			for vm := range g.vms {
				c.stopped(name, vm)
			}
			delete(c.groups, key(name))
		}
		return lro(c, "ResourceGroupsClient.BeginDelete", armresources.ResourceGroupsClientDeleteResponse{}, err, nil)
	}
	c.resources.Server.NewListByResourceGroupPager = func(name string, _ *armresources.ClientListByResourceGroupOptions) (resp azfake.PagerResponder[armresources.ClientListByResourceGroupResponse]) {
		c.mu.Lock()
		defer c.mu.Unlock()
		g, err := c.groupOf(name)
		if err != nil {
			resp.AddResponseError(err.status, err.code)
			return
		}
		resp.AddPage(http.StatusOK, armresources.ClientListByResourceGroupResponse{ResourceListResult: armresources.ResourceListResult{Value: g.resources(c.groupID(name))}}, nil)
		return
	}
}

// Groups returns the names of the subscription's resource groups.
func (c *Cloud) Groups() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, g := range c.groups {
		out = append(out, *g.rg.Name)
	}
	return out
}

// Resources returns the IDs of the resources in group (nil if it does not exist).
func (c *Cloud) Resources(groupName string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	g, ok := c.groups[key(groupName)]
	if !ok {
		return nil
	}
	var out []string
	for _, r := range g.resources(c.groupID(groupName)) {
		out = append(out, *r.ID)
	}
	return out
}

// CreateGroup creates a resource group as a user would, outside the provider.
func (c *Cloud) CreateGroup(name, location string, tags map[string]*string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.groups[key(name)] = newGroup(name, armresources.ResourceGroup{ID: ptr(c.groupID(name)), Location: ptr(location), Tags: tags})
}
