package azuresim

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	azfake "github.com/Azure/azure-sdk-for-go/sdk/azcore/fake"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v7"
)

func (c *Cloud) serveNetwork() {
	c.serveRouteTables()
	c.serveVirtualNetworks()
	c.serveSecurityGroups()
	c.servePublicIPs()
	c.serveLoadBalancers()
	c.serveInterfaces()
}

func (c *Cloud) serveVirtualNetworks() {
	s := &c.network.VirtualNetworksServer
	const typ = "Microsoft.Network/virtualNetworks"
	s.Get = func(_ context.Context, rg, name string, _ *armnetwork.VirtualNetworksClientGetOptions) (azfake.Responder[armnetwork.VirtualNetworksClientGetResponse], azfake.ErrorResponder) {
		c.mu.Lock()
		defer c.mu.Unlock()
		v, err := find(c, rg, name, func(g *group) map[string]*armnetwork.VirtualNetwork { return g.vnets })
		return respond(armnetwork.VirtualNetworksClientGetResponse{VirtualNetwork: deref(v)}, err)
	}
	s.BeginCreateOrUpdate = func(_ context.Context, rg, name string, v armnetwork.VirtualNetwork, _ *armnetwork.VirtualNetworksClientBeginCreateOrUpdateOptions) (azfake.PollerResponder[armnetwork.VirtualNetworksClientCreateOrUpdateResponse], azfake.ErrorResponder) {
		c.mu.Lock()
		defer c.mu.Unlock()
		v.ID, v.Name = ptr(c.id(rg, typ, name)), ptr(name)
		if v.Properties != nil {
			for _, sn := range v.Properties.Subnets {
				if sn.Name != nil {
					sn.ID = ptr(*v.ID + "/subnets/" + *sn.Name)
				}
				if sn.Properties != nil && sn.Properties.NetworkSecurityGroup != nil {
					if _, err := c.lookup(*sn.Properties.NetworkSecurityGroup.ID); err != nil {
						return lro(c, "VirtualNetworksClient.BeginCreateOrUpdate", armnetwork.VirtualNetworksClientCreateOrUpdateResponse{}, badRequest("InvalidResourceReference"), nil)
					}
				}
				if sn.Properties != nil && sn.Properties.RouteTable != nil {
					if _, err := c.lookup(*sn.Properties.RouteTable.ID); err != nil {
						return lro(c, "VirtualNetworksClient.BeginCreateOrUpdate", armnetwork.VirtualNetworksClientCreateOrUpdateResponse{}, badRequest("InvalidResourceReference"), nil)
					}
				}
			}
		}
		stored, err := store(c, rg, name, &v, func(g *group) map[string]*armnetwork.VirtualNetwork { return g.vnets })
		return lro(c, "VirtualNetworksClient.BeginCreateOrUpdate", armnetwork.VirtualNetworksClientCreateOrUpdateResponse{VirtualNetwork: deref(stored)}, err, nil)
	}
	s.BeginDelete = func(_ context.Context, rg, name string, _ *armnetwork.VirtualNetworksClientBeginDeleteOptions) (azfake.PollerResponder[armnetwork.VirtualNetworksClientDeleteResponse], azfake.ErrorResponder) {
		c.mu.Lock()
		defer c.mu.Unlock()
		err := c.inUse(rg, c.id(rg, typ, name))
		if err == nil {
			err = drop(c, rg, name, func(g *group) map[string]*armnetwork.VirtualNetwork { return g.vnets })
		}
		return lro(c, "VirtualNetworksClient.BeginDelete", armnetwork.VirtualNetworksClientDeleteResponse{}, err, nil)
	}
}

func (c *Cloud) serveRouteTables() {
	s := &c.network.RouteTablesServer
	const typ = "Microsoft.Network/routeTables"
	tbl := func(g *group) map[string]*armnetwork.RouteTable { return g.routeTables }
	s.Get = func(_ context.Context, rg, name string, _ *armnetwork.RouteTablesClientGetOptions) (azfake.Responder[armnetwork.RouteTablesClientGetResponse], azfake.ErrorResponder) {
		c.mu.Lock()
		defer c.mu.Unlock()
		v, err := find(c, rg, name, tbl)
		return respond(armnetwork.RouteTablesClientGetResponse{RouteTable: deref(v)}, err)
	}
	s.BeginCreateOrUpdate = func(_ context.Context, rg, name string, v armnetwork.RouteTable, _ *armnetwork.RouteTablesClientBeginCreateOrUpdateOptions) (azfake.PollerResponder[armnetwork.RouteTablesClientCreateOrUpdateResponse], azfake.ErrorResponder) {
		c.mu.Lock()
		defer c.mu.Unlock()
		v.ID, v.Name = ptr(c.id(rg, typ, name)), ptr(name)
		if v.Properties != nil {
			seen := map[string]bool{}
			for _, r := range v.Properties.Routes {
				if r.Name == nil || r.Properties == nil || r.Properties.AddressPrefix == nil || seen[*r.Properties.AddressPrefix] {
					return lro(c, "RouteTablesClient.BeginCreateOrUpdate", armnetwork.RouteTablesClientCreateOrUpdateResponse{}, badRequest("InvalidRoute"), nil)
				}
				seen[*r.Properties.AddressPrefix] = true
				r.ID = ptr(*v.ID + "/routes/" + *r.Name)
			}
		}
		stored, err := store(c, rg, name, &v, tbl)
		return lro(c, "RouteTablesClient.BeginCreateOrUpdate", armnetwork.RouteTablesClientCreateOrUpdateResponse{RouteTable: deref(stored)}, err, nil)
	}
	s.BeginDelete = func(_ context.Context, rg, name string, _ *armnetwork.RouteTablesClientBeginDeleteOptions) (azfake.PollerResponder[armnetwork.RouteTablesClientDeleteResponse], azfake.ErrorResponder) {
		c.mu.Lock()
		defer c.mu.Unlock()
		err := c.inUse(rg, c.id(rg, typ, name))
		if err == nil {
			err = drop(c, rg, name, tbl)
		}
		return lro(c, "RouteTablesClient.BeginDelete", armnetwork.RouteTablesClientDeleteResponse{}, err, nil)
	}
}

// RouteTable returns a route table as Azure stores it.
func (c *Cloud) RouteTable(rg, name string) (armnetwork.RouteTable, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, err := find(c, rg, name, func(g *group) map[string]*armnetwork.RouteTable { return g.routeTables })
	if err != nil {
		return armnetwork.RouteTable{}, false
	}
	return *v, true
}

func (c *Cloud) serveSecurityGroups() {
	s := &c.network.SecurityGroupsServer
	const typ = "Microsoft.Network/networkSecurityGroups"
	tbl := func(g *group) map[string]*armnetwork.SecurityGroup { return g.nsgs }
	s.Get = func(_ context.Context, rg, name string, _ *armnetwork.SecurityGroupsClientGetOptions) (azfake.Responder[armnetwork.SecurityGroupsClientGetResponse], azfake.ErrorResponder) {
		c.mu.Lock()
		defer c.mu.Unlock()
		v, err := find(c, rg, name, tbl)
		return respond(armnetwork.SecurityGroupsClientGetResponse{SecurityGroup: deref(v)}, err)
	}
	s.BeginCreateOrUpdate = func(_ context.Context, rg, name string, v armnetwork.SecurityGroup, _ *armnetwork.SecurityGroupsClientBeginCreateOrUpdateOptions) (azfake.PollerResponder[armnetwork.SecurityGroupsClientCreateOrUpdateResponse], azfake.ErrorResponder) {
		c.mu.Lock()
		defer c.mu.Unlock()
		v.ID, v.Name = ptr(c.id(rg, typ, name)), ptr(name)
		stored, err := store(c, rg, name, &v, tbl)
		return lro(c, "SecurityGroupsClient.BeginCreateOrUpdate", armnetwork.SecurityGroupsClientCreateOrUpdateResponse{SecurityGroup: deref(stored)}, err, nil)
	}
	s.BeginDelete = func(_ context.Context, rg, name string, _ *armnetwork.SecurityGroupsClientBeginDeleteOptions) (azfake.PollerResponder[armnetwork.SecurityGroupsClientDeleteResponse], azfake.ErrorResponder) {
		c.mu.Lock()
		defer c.mu.Unlock()
		err := c.inUse(rg, c.id(rg, typ, name))
		if err == nil {
			err = drop(c, rg, name, tbl)
		}
		return lro(c, "SecurityGroupsClient.BeginDelete", armnetwork.SecurityGroupsClientDeleteResponse{}, err, nil)
	}
}

func (c *Cloud) servePublicIPs() {
	s := &c.network.PublicIPAddressesServer
	const typ = "Microsoft.Network/publicIPAddresses"
	tbl := func(g *group) map[string]*armnetwork.PublicIPAddress { return g.publicIPs }
	s.Get = func(_ context.Context, rg, name string, _ *armnetwork.PublicIPAddressesClientGetOptions) (azfake.Responder[armnetwork.PublicIPAddressesClientGetResponse], azfake.ErrorResponder) {
		c.mu.Lock()
		defer c.mu.Unlock()
		v, err := find(c, rg, name, tbl)
		return respond(armnetwork.PublicIPAddressesClientGetResponse{PublicIPAddress: deref(v)}, err)
	}
	s.BeginCreateOrUpdate = func(_ context.Context, rg, name string, v armnetwork.PublicIPAddress, _ *armnetwork.PublicIPAddressesClientBeginCreateOrUpdateOptions) (azfake.PollerResponder[armnetwork.PublicIPAddressesClientCreateOrUpdateResponse], azfake.ErrorResponder) {
		c.mu.Lock()
		defer c.mu.Unlock()
		v.ID, v.Name = ptr(c.id(rg, typ, name)), ptr(name)
		if v.Properties == nil {
			v.Properties = &armnetwork.PublicIPAddressPropertiesFormat{}
		}
		if old, err := find(c, rg, name, tbl); err == nil && old.Properties != nil {
			v.Properties.IPAddress = old.Properties.IPAddress // a static address stays
		} else {
			v.Properties.IPAddress = ptr(c.publicAddress())
		}
		stored, err := store(c, rg, name, &v, tbl)
		return lro(c, "PublicIPAddressesClient.BeginCreateOrUpdate", armnetwork.PublicIPAddressesClientCreateOrUpdateResponse{PublicIPAddress: deref(stored)}, err, nil)
	}
	s.BeginDelete = func(_ context.Context, rg, name string, _ *armnetwork.PublicIPAddressesClientBeginDeleteOptions) (azfake.PollerResponder[armnetwork.PublicIPAddressesClientDeleteResponse], azfake.ErrorResponder) {
		c.mu.Lock()
		defer c.mu.Unlock()
		err := c.inUse(rg, c.id(rg, typ, name))
		if err == nil {
			err = drop(c, rg, name, tbl)
		}
		return lro(c, "PublicIPAddressesClient.BeginDelete", armnetwork.PublicIPAddressesClientDeleteResponse{}, err, nil)
	}
}

func (c *Cloud) serveLoadBalancers() {
	s := &c.network.LoadBalancersServer
	const typ = "Microsoft.Network/loadBalancers"
	tbl := func(g *group) map[string]*armnetwork.LoadBalancer { return g.lbs }
	s.Get = func(_ context.Context, rg, name string, _ *armnetwork.LoadBalancersClientGetOptions) (azfake.Responder[armnetwork.LoadBalancersClientGetResponse], azfake.ErrorResponder) {
		c.mu.Lock()
		defer c.mu.Unlock()
		v, err := find(c, rg, name, tbl)
		return respond(armnetwork.LoadBalancersClientGetResponse{LoadBalancer: deref(v)}, err)
	}
	s.BeginCreateOrUpdate = func(_ context.Context, rg, name string, v armnetwork.LoadBalancer, _ *armnetwork.LoadBalancersClientBeginCreateOrUpdateOptions) (azfake.PollerResponder[armnetwork.LoadBalancersClientCreateOrUpdateResponse], azfake.ErrorResponder) {
		c.mu.Lock()
		defer c.mu.Unlock()
		v.ID, v.Name = ptr(c.id(rg, typ, name)), ptr(name)
		if err := c.checkLoadBalancer(&v); err != nil {
			return lro(c, "LoadBalancersClient.BeginCreateOrUpdate", armnetwork.LoadBalancersClientCreateOrUpdateResponse{}, err, nil)
		}
		stored, err := store(c, rg, name, &v, tbl)
		return lro(c, "LoadBalancersClient.BeginCreateOrUpdate", armnetwork.LoadBalancersClientCreateOrUpdateResponse{LoadBalancer: deref(stored)}, err, nil)
	}
	s.BeginDelete = func(_ context.Context, rg, name string, _ *armnetwork.LoadBalancersClientBeginDeleteOptions) (azfake.PollerResponder[armnetwork.LoadBalancersClientDeleteResponse], azfake.ErrorResponder) {
		c.mu.Lock()
		defer c.mu.Unlock()
		err := c.inUse(rg, c.id(rg, typ, name))
		if err == nil {
			err = drop(c, rg, name, tbl)
		}
		return lro(c, "LoadBalancersClient.BeginDelete", armnetwork.LoadBalancersClientDeleteResponse{}, err, nil)
	}
}

// checkLoadBalancer gives the load balancer's parts their IDs and checks its references:
// the frontend's public address exists; rules name parts of this load balancer; no frontend
// port is used twice.
func (c *Cloud) checkLoadBalancer(lb *armnetwork.LoadBalancer) *apiError {
	p := lb.Properties
	if p == nil {
		return nil
	}
	parts := map[string]bool{}
	setID := func(kind string, name *string, id **string) {
		if name != nil {
			*id = ptr(*lb.ID + "/" + kind + "/" + *name)
			parts[strings.ToLower(**id)] = true
		}
	}
	for _, f := range p.FrontendIPConfigurations {
		setID("frontendIPConfigurations", f.Name, &f.ID)
		if f.Properties != nil && f.Properties.PublicIPAddress != nil {
			if _, err := c.lookup(*f.Properties.PublicIPAddress.ID); err != nil {
				return badRequest("InvalidResourceReference")
			}
		}
	}
	for _, b := range p.BackendAddressPools {
		setID("backendAddressPools", b.Name, &b.ID)
	}
	for _, pr := range p.Probes {
		setID("probes", pr.Name, &pr.ID)
	}
	refOK := func(r *armnetwork.SubResource) bool { return r == nil || r.ID == nil || parts[strings.ToLower(*r.ID)] }
	ports := map[int32]bool{}
	for _, r := range p.LoadBalancingRules {
		setID("loadBalancingRules", r.Name, &r.ID)
		if r.Properties == nil || !refOK(r.Properties.FrontendIPConfiguration) || !refOK(r.Properties.BackendAddressPool) || !refOK(r.Properties.Probe) {
			return badRequest("InvalidResourceReference")
		}
		if ports[*r.Properties.FrontendPort] {
			return badRequest("LoadBalancerRulesWithSameFrontendPort")
		}
		ports[*r.Properties.FrontendPort] = true
	}
	for _, r := range p.InboundNatRules {
		setID("inboundNatRules", r.Name, &r.ID)
		if r.Properties == nil || !refOK(r.Properties.FrontendIPConfiguration) {
			return badRequest("InvalidResourceReference")
		}
		if ports[*r.Properties.FrontendPort] {
			return badRequest("InboundNatRulesWithSameFrontendPort")
		}
		ports[*r.Properties.FrontendPort] = true
	}
	for _, r := range p.OutboundRules {
		setID("outboundRules", r.Name, &r.ID)
		if r.Properties == nil || !refOK(r.Properties.BackendAddressPool) {
			return badRequest("InvalidResourceReference")
		}
	}
	return nil
}

func (c *Cloud) serveInterfaces() {
	s := &c.network.InterfacesServer
	const typ = "Microsoft.Network/networkInterfaces"
	tbl := func(g *group) map[string]*armnetwork.Interface { return g.nics }
	s.Get = func(_ context.Context, rg, name string, _ *armnetwork.InterfacesClientGetOptions) (azfake.Responder[armnetwork.InterfacesClientGetResponse], azfake.ErrorResponder) {
		c.mu.Lock()
		defer c.mu.Unlock()
		v, err := find(c, rg, name, tbl)
		return respond(armnetwork.InterfacesClientGetResponse{Interface: deref(v)}, err)
	}
	s.NewListPager = func(rg string, _ *armnetwork.InterfacesClientListOptions) (resp azfake.PagerResponder[armnetwork.InterfacesClientListResponse]) {
		c.mu.Lock()
		defer c.mu.Unlock()
		g, err := c.groupOf(rg)
		if err != nil {
			resp.AddResponseError(err.status, err.code)
			return
		}
		// Two pages, as Azure splits long lists: the pager must follow the link.
		var list []*armnetwork.Interface
		for _, n := range g.nics {
			list = append(list, clone(n))
		}
		half := len(list) / 2
		resp.AddPage(http.StatusOK, armnetwork.InterfacesClientListResponse{InterfaceListResult: armnetwork.InterfaceListResult{Value: list[:half]}}, nil)
		resp.AddPage(http.StatusOK, armnetwork.InterfacesClientListResponse{InterfaceListResult: armnetwork.InterfaceListResult{Value: list[half:]}}, nil)
		return
	}
	s.BeginCreateOrUpdate = func(_ context.Context, rg, name string, v armnetwork.Interface, _ *armnetwork.InterfacesClientBeginCreateOrUpdateOptions) (azfake.PollerResponder[armnetwork.InterfacesClientCreateOrUpdateResponse], azfake.ErrorResponder) {
		c.mu.Lock()
		defer c.mu.Unlock()
		v.ID, v.Name = ptr(c.id(rg, typ, name)), ptr(name)
		old, _ := find(c, rg, name, tbl)
		if err := c.checkInterface(&v, old); err != nil {
			return lro(c, "InterfacesClient.BeginCreateOrUpdate", armnetwork.InterfacesClientCreateOrUpdateResponse{}, err, nil)
		}
		stored, err := store(c, rg, name, &v, tbl)
		return lro(c, "InterfacesClient.BeginCreateOrUpdate", armnetwork.InterfacesClientCreateOrUpdateResponse{Interface: deref(stored)}, err, nil)
	}
	s.BeginDelete = func(_ context.Context, rg, name string, _ *armnetwork.InterfacesClientBeginDeleteOptions) (azfake.PollerResponder[armnetwork.InterfacesClientDeleteResponse], azfake.ErrorResponder) {
		c.mu.Lock()
		defer c.mu.Unlock()
		err := c.inUse(rg, c.id(rg, typ, name))
		if err == nil {
			err = drop(c, rg, name, tbl)
		}
		return lro(c, "InterfacesClient.BeginDelete", armnetwork.InterfacesClientDeleteResponse{}, err, nil)
	}
}

// checkInterface checks the interface's references (its subnet, the load balancer's pools
// and NAT rules) and gives it its private address: the one it had, or the subnet's next.
func (c *Cloud) checkInterface(nic *armnetwork.Interface, old *armnetwork.Interface) *apiError {
	if nic.Properties == nil || len(nic.Properties.IPConfigurations) == 0 {
		return badRequest("NetworkInterfaceMustHaveIpConfiguration")
	}
	for i, ipc := range nic.Properties.IPConfigurations {
		if ipc.Properties == nil || ipc.Properties.Subnet == nil || ipc.Properties.Subnet.ID == nil {
			return badRequest("InvalidResourceReference")
		}
		if !c.childExists(*ipc.Properties.Subnet.ID) {
			return badRequest("InvalidResourceReference")
		}
		for _, p := range ipc.Properties.LoadBalancerBackendAddressPools {
			if p.ID == nil || !c.childExists(*p.ID) {
				return badRequest("InvalidResourceReference")
			}
		}
		for _, r := range ipc.Properties.LoadBalancerInboundNatRules {
			if r.ID == nil || !c.childExists(*r.ID) {
				return badRequest("InvalidResourceReference")
			}
		}
		if ipc.Name != nil {
			ipc.ID = ptr(*nic.ID + "/ipConfigurations/" + *ipc.Name)
		}
		if old != nil && old.Properties != nil && i < len(old.Properties.IPConfigurations) && old.Properties.IPConfigurations[i].Properties != nil {
			ipc.Properties.PrivateIPAddress = old.Properties.IPConfigurations[i].Properties.PrivateIPAddress
		} else {
			c.nextIP++
			ipc.Properties.PrivateIPAddress = ptr(fmt.Sprintf("10.9.%d.%d", (3+c.nextIP)/256, (3+c.nextIP)%256))
		}
	}
	if old != nil && old.Properties != nil {
		nic.Properties.VirtualMachine = old.Properties.VirtualMachine
	}
	return nil
}
