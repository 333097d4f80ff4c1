package azure

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v8"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v7"

	"github.com/openconstellation/constellation/internal/kube/kubeadmconfig"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/provider/azure/azuremeta"
)

// Cluster is a running Azure cluster (provider.Provider): its nodes are the VMs of its
// resource group that carry its UID.
type Cluster struct {
	clients *clients
	rec     record
	// serial are the links to the VMs' serial logs, where nodes report (console.go).
	serial *serialLogs
}

func newCluster(c *clients, r record) *Cluster {
	return &Cluster{clients: c, rec: r, serial: &serialLogs{links: map[string]serialLink{}}}
}

var _ provider.Provider = (*Cluster)(nil)

// ensureInfrastructure creates (or finds) the cluster-wide resources.
func (c *Cluster) ensureInfrastructure(ctx context.Context) error {
	l := c.rec.Layout
	if err := c.clients.ensureGroup(ctx, l); err != nil {
		return err
	}
	if err := c.clients.ensureIdentities(ctx, l); err != nil {
		return err
	}
	return c.clients.ensureNetwork(ctx, l)
}

// vmNode is a node's VM as listed.
type vmNode struct {
	vm   armcompute.VirtualMachine
	spec nodeRequest
}

// vms lists the cluster's VMs: those of its group with its UID.
func (c *Cluster) vms(ctx context.Context) ([]vmNode, error) {
	var out []vmNode
	l := c.rec.Layout
	err := c.clients.call(ctx, "list the VMs of "+l.ResourceGroup, func(ctx context.Context) error {
		out = nil
		pager := c.clients.vms.NewListPager(l.ResourceGroup, nil)
		for pager.More() {
			page, err := pager.NextPage(ctx)
			if err != nil {
				return err
			}
			for _, vm := range page.Value {
				if vm == nil || tag(vm.Tags, azuremeta.TagUID) != l.UID {
					continue
				}
				out = append(out, vmNode{vm: *vm, spec: c.requestOf(*vm)})
			}
		}
		return nil
	})
	if isNotFound(err) {
		return nil, nil
	}
	slices.SortFunc(out, func(a, b vmNode) int { return strings.Compare(a.spec.Name, b.spec.Name) })
	return out, err
}

// requestOf is the request of an existing node, from its VM (its tags and image) and the
// record.
func (c *Cluster) requestOf(vm armcompute.VirtualMachine) nodeRequest {
	tags := vm.Tags
	slot, _ := strconv.Atoi(tag(tags, tagSlot))
	spec := provider.NodeSpec{Name: tag(tags, azuremeta.TagNode), Role: metadata.Role(tag(tags, azuremeta.TagRole))}
	if p := vm.Properties; p != nil && p.StorageProfile != nil && p.StorageProfile.ImageReference != nil && p.StorageProfile.ImageReference.ID != nil {
		spec.Image = *p.StorageProfile.ImageReference.ID
		// Azure may answer a resource ID in another case (tagImage).
		for _, asked := range []string{tag(tags, tagImage), c.rec.Image} {
			if strings.EqualFold(spec.Image, asked) {
				spec.Image = asked
				break
			}
		}
	}
	n := c.request(spec, slot)
	n.PodNetwork, _ = netip.ParsePrefix(tag(tags, azuremeta.TagPodNetwork))
	n.APIEndpoint = tag(tags, azuremeta.TagAPIEndpoint)
	return n
}

// request is the VM request of node spec in slot; its pod network and the API endpoint are
// the caller's to fill in. Its image is the spec's (an upgrade's replacement boots the
// release's), else the cluster's.
func (c *Cluster) request(spec provider.NodeSpec, slot int) nodeRequest {
	s := c.rec.Settings
	image := spec.Image
	if image == "" {
		image = c.rec.Image
	}
	return nodeRequest{
		Name: spec.Name, Role: spec.Role, Slot: slot, Image: image, VMSize: s.vmSize(c.rec.Variant),
		Encryption: armcompute.SecurityEncryptionTypes(s.DiskEncryption), SecureBoot: s.SecureBoot,
		StateDiskGiB: s.StateDiskGiB, InitSecretHash: c.rec.InitSecretHash,
	}
}

// CreateNodes implements provider.Provider: each new node gets the smallest free slot, the
// load balancer the NAT rules of every node, then each node its disk, interface and VM. A
// node that exists already is kept as it is.
func (c *Cluster) CreateNodes(ctx context.Context, specs []provider.NodeSpec) ([]provider.Node, error) {
	existing, err := c.vms(ctx)
	if err != nil {
		return nil, err
	}
	all := make([]nodeRequest, 0, len(existing)+len(specs))
	used := map[int]bool{}
	have := map[string]bool{}
	for _, n := range existing {
		all = append(all, n.spec)
		used[n.spec.Slot] = true
		have[n.spec.Name] = true
	}
	endpoints, err := c.Endpoints(ctx)
	if err != nil {
		return nil, err
	}
	var fresh []nodeRequest
	for _, spec := range specs {
		if have[spec.Name] {
			continue
		}
		if spec.Unexpected {
			return nil, fmt.Errorf("node %s: the Azure provider cannot boot a node of another image", spec.Name)
		}
		if spec.Image != "" {
			if err := checkImage(spec.Image); err != nil {
				return nil, fmt.Errorf("node %s: %w", spec.Name, err)
			}
		}
		slot := 0
		for used[slot] {
			slot++
		}
		if slot >= maxSlots {
			return nil, fmt.Errorf("node %s: the load balancer's NAT ports hold %d nodes", spec.Name, maxSlots)
		}
		used[slot] = true
		n := c.request(spec, slot)
		if n.PodNetwork, err = podNetwork(c.rec.PodNetwork, slot); err != nil {
			return nil, fmt.Errorf("node %s: %w", spec.Name, err)
		}
		n.APIEndpoint = endpoints.ClusterAPIServer
		all, fresh = append(all, n), append(fresh, n)
	}
	if err := c.clients.ensureLoadBalancer(ctx, c.rec.Layout, all); err != nil {
		return nil, err
	}
	for _, n := range fresh {
		if err := c.clients.ensureNode(ctx, c.rec.Layout, n); err != nil {
			return nil, err
		}
	}
	nodes, err := c.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	if err := c.ensureRoutes(ctx, all, nodes); err != nil {
		return nil, err
	}
	var out []provider.Node
	for _, n := range nodes {
		if slices.ContainsFunc(specs, func(s provider.NodeSpec) bool { return s.Name == n.Name }) {
			out = append(out, n)
		}
	}
	return out, nil
}

// ensureRoutes puts the route table with the pod network of every node in reqs that has an
// address (nodes: the listed nodes).
func (c *Cluster) ensureRoutes(ctx context.Context, reqs []nodeRequest, nodes []provider.Node) error {
	addr := map[string]netip.Addr{}
	for _, n := range nodes {
		if len(n.IPs) > 0 {
			addr[n.Name] = n.IPs[0]
		}
	}
	var routed []nodeRequest
	for _, r := range reqs {
		if a, ok := addr[r.Name]; ok {
			r.Address = a
			routed = append(routed, r)
		}
	}
	return c.clients.ensureRoutes(ctx, c.rec.Layout, routed)
}

// Nodes implements provider.Provider: the cluster's VMs, their power state and address. It
// costs two listings and one state read per node: Resource Manager's read limits are per
// subscription, and the CLI asks while it waits.
func (c *Cluster) Nodes(ctx context.Context) ([]provider.Node, error) {
	vms, err := c.vms(ctx)
	if err != nil {
		return nil, err
	}
	addrs, err := c.addresses(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]provider.Node, 0, len(vms))
	for _, v := range vms {
		n := provider.Node{NodeSpec: provider.NodeSpec{Name: v.spec.Name, Role: v.spec.Role, Image: v.spec.Image}}
		if n.State, n.Detail, err = c.state(ctx, v); err != nil {
			return nil, err
		}
		if n.State == provider.Running {
			// What the node reported is diagnosis: a log that cannot be read is said, not
			// an error of the listing.
			switch r, ok, err := c.lastReport(ctx, v); {
			case err != nil:
				n.Detail = err.Error()
			case ok:
				n.Reported, n.ReportedDetail, n.BootedAt = r.Phase, r.Detail, r.Boot
			}
		}
		if ip, ok := addrs[v.spec.Name]; ok {
			n.IPs = []netip.Addr{ip}
		}
		out = append(out, n)
	}
	return out, nil
}

// addresses are the private addresses of the cluster's nodes, by node, from one listing of
// the group's network interfaces.
func (c *Cluster) addresses(ctx context.Context) (map[string]netip.Addr, error) {
	l := c.rec.Layout
	out := map[string]netip.Addr{}
	err := c.clients.call(ctx, "list the network interfaces of "+l.ResourceGroup, func(ctx context.Context) error {
		clear(out)
		pager := c.clients.interfaces.NewListPager(l.ResourceGroup, nil)
		for pager.More() {
			page, err := pager.NextPage(ctx)
			if err != nil {
				return err
			}
			for _, nic := range page.Value {
				if nic == nil || nic.Properties == nil || tag(nic.Tags, azuremeta.TagUID) != l.UID {
					continue
				}
				for _, ipc := range nic.Properties.IPConfigurations {
					if ipc == nil || ipc.Properties == nil || ipc.Properties.PrivateIPAddress == nil {
						continue
					}
					if ip, err := netip.ParseAddr(*ipc.Properties.PrivateIPAddress); err == nil {
						out[tag(nic.Tags, azuremeta.TagNode)] = ip
						break
					}
				}
			}
		}
		return nil
	})
	if isNotFound(err) {
		return out, nil
	}
	return out, err
}

// state is a VM's state from its provisioning and power state.
func (c *Cluster) state(ctx context.Context, v vmNode) (provider.NodeState, string, error) {
	if p := v.vm.Properties; p != nil && p.ProvisioningState != nil && strings.EqualFold(*p.ProvisioningState, "Failed") {
		return provider.Failed, "Azure could not provision the VM; rerun the command to ask again", nil
	}
	var view armcompute.VirtualMachineInstanceView
	if err := c.clients.call(ctx, "read the state of VM "+v.spec.Name, func(ctx context.Context) error {
		res, err := c.clients.vms.InstanceView(ctx, c.rec.Layout.ResourceGroup, v.spec.Name, nil)
		view = res.VirtualMachineInstanceView
		return err
	}); err != nil {
		return "", "", err
	}
	for _, s := range view.Statuses {
		if s == nil || s.Code == nil {
			continue
		}
		switch power, ok := strings.CutPrefix(*s.Code, "PowerState/"); {
		case !ok:
		case power == "running":
			return provider.Running, "", nil
		case power == "starting":
			return provider.Booting, "", nil
		case power == "stopped", power == "deallocated", power == "stopping", power == "deallocating":
			return provider.Stopped, "VM " + power, nil
		}
	}
	return provider.Booting, "", nil
}

// RebootNode implements provider.Provider: Azure restarts a running VM (its vTPM resets:
// the node measures its boot again); a stopped one is started.
func (c *Cluster) RebootNode(ctx context.Context, name string) error {
	v, err := c.node(ctx, name)
	if err != nil {
		return err
	}
	rg := c.rec.Layout.ResourceGroup
	if state, _, err := c.state(ctx, v); err != nil {
		return err
	} else if state == provider.Stopped {
		return c.start(ctx, v)
	}
	if err := c.markBoot(ctx, v); err != nil {
		return err
	}
	provider.Progressf(ctx, "Azure: restarting VM %s", name)
	_, err = put(ctx, c.clients, "restart VM "+name, func(ctx context.Context) (*runtime.Poller[armcompute.VirtualMachinesClientRestartResponse], error) {
		return c.clients.vms.BeginRestart(ctx, rg, name, nil)
	})
	return err
}

func (c *Cluster) start(ctx context.Context, v vmNode) error {
	if err := c.markBoot(ctx, v); err != nil {
		return err
	}
	name := v.spec.Name
	provider.Progressf(ctx, "Azure: starting VM %s", name)
	_, err := put(ctx, c.clients, "start VM "+name, func(ctx context.Context) (*runtime.Poller[armcompute.VirtualMachinesClientStartResponse], error) {
		return c.clients.vms.BeginStart(ctx, c.rec.Layout.ResourceGroup, name, nil)
	})
	return err
}

// node finds the cluster's node name.
func (c *Cluster) node(ctx context.Context, name string) (vmNode, error) {
	vms, err := c.vms(ctx)
	if err != nil {
		return vmNode{}, err
	}
	for _, v := range vms {
		if v.spec.Name == name {
			return v, nil
		}
	}
	return vmNode{}, fmt.Errorf("node %s: %w", name, provider.ErrNoNode)
}

// DeleteNode implements provider.Provider: the node's VM (and interface), then its NAT
// rules, then its state disk.
func (c *Cluster) DeleteNode(ctx context.Context, name string) error {
	if _, err := c.node(ctx, name); err != nil {
		return err
	}
	l := c.rec.Layout
	if err := c.clients.removeVM(ctx, l, name); err != nil {
		return err
	}
	rest, err := c.vms(ctx)
	if err != nil {
		return err
	}
	var keep []nodeRequest
	for _, v := range rest {
		keep = append(keep, v.spec)
	}
	if err := c.clients.ensureLoadBalancer(ctx, l, keep); err != nil {
		return err
	}
	nodes, err := c.Nodes(ctx)
	if err != nil {
		return err
	}
	if err := c.ensureRoutes(ctx, keep, nodes); err != nil {
		return err
	}
	return c.clients.removeDisk(ctx, l, name)
}

// Stop implements provider.Provider: every VM is deallocated (Azure stops billing its
// compute); its disks stay.
func (c *Cluster) Stop(ctx context.Context) error {
	vms, err := c.vms(ctx)
	if err != nil {
		return err
	}
	for _, v := range vms {
		provider.Progressf(ctx, "Azure: deallocating VM %s", v.spec.Name)
		if _, err := put(ctx, c.clients, "deallocate VM "+v.spec.Name, func(ctx context.Context) (*runtime.Poller[armcompute.VirtualMachinesClientDeallocateResponse], error) {
			return c.clients.vms.BeginDeallocate(ctx, c.rec.Layout.ResourceGroup, v.spec.Name, nil)
		}); err != nil {
			return err
		}
	}
	return nil
}

// Start implements provider.Provider.
func (c *Cluster) Start(ctx context.Context) error {
	vms, err := c.vms(ctx)
	if err != nil {
		return err
	}
	for _, v := range vms {
		if err := c.start(ctx, v); err != nil {
			return err
		}
	}
	return nil
}

// publicAddress is the load balancer's public address.
func (c *Cluster) publicAddress(ctx context.Context) (netip.Addr, error) {
	l := c.rec.Layout
	ip, found, err := get(ctx, c.clients, "read public address "+l.publicIP(), func(ctx context.Context) (armnetwork.PublicIPAddressesClientGetResponse, error) {
		return c.clients.publicIPs.Get(ctx, l.ResourceGroup, l.publicIP(), nil)
	})
	if err != nil {
		return netip.Addr{}, err
	}
	if !found || ip.Properties == nil || ip.Properties.IPAddress == nil {
		return netip.Addr{}, fmt.Errorf("the cluster's public address %s has no address: %w", l.publicIP(), provider.ErrNotRunning)
	}
	return netip.ParseAddr(*ip.Properties.IPAddress)
}

// Endpoints implements provider.Provider: the load balancer's public address is the API's
// stable endpoint, for the CLI and the nodes alike.
func (c *Cluster) Endpoints(ctx context.Context) (provider.Endpoints, error) {
	ip, err := c.publicAddress(ctx)
	if err != nil {
		return provider.Endpoints{}, err
	}
	api := net.JoinHostPort(ip.String(), strconv.Itoa(kubeadmconfig.APIServerPort))
	return provider.Endpoints{APIServer: api, ClusterAPIServer: api}, nil
}

// Dialer implements provider.Provider: a node's port is reached through its NAT rule on the
// load balancer's public address.
func (c *Cluster) Dialer() func(ctx context.Context, addr string) (net.Conn, error) {
	return func(ctx context.Context, addr string) (net.Conn, error) {
		target, err := c.natAddress(ctx, addr)
		if err != nil {
			return nil, err
		}
		var d net.Dialer
		return d.DialContext(ctx, "tcp", target)
	}
}

// natAddress is the public address and port that reaches addr, a node's address and port.
func (c *Cluster) natAddress(ctx context.Context, addr string) (string, error) {
	host, portText, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	port, err := strconv.ParseInt(portText, 10, 32)
	if err != nil {
		return "", fmt.Errorf("port of %s: %w", addr, err)
	}
	vms, err := c.vms(ctx)
	if err != nil {
		return "", err
	}
	addrs, err := c.addresses(ctx)
	if err != nil {
		return "", err
	}
	for _, v := range vms {
		if ip, ok := addrs[v.spec.Name]; !ok || ip.String() != host {
			continue
		}
		front, err := natFrontendPort(v.spec.Slot, int32(port))
		if err != nil {
			return "", err
		}
		public, err := c.publicAddress(ctx)
		if err != nil {
			return "", err
		}
		return net.JoinHostPort(public.String(), strconv.Itoa(int(front))), nil
	}
	return "", fmt.Errorf("no node of the cluster has address %s: %w", host, provider.ErrNoNode)
}

// Destroy implements provider.Provider.
func (c *Cluster) Destroy(ctx context.Context) error {
	vms, err := c.vms(ctx)
	if err != nil {
		return err
	}
	l := c.rec.Layout
	for _, v := range vms {
		if err := c.clients.removeNode(ctx, l, v.spec.Name); err != nil {
			return err
		}
	}
	return c.clients.removeCluster(ctx, l)
}

// Attestation implements provider.Provider: the configured variant; Azure's vTPM AK is
// bound to the hardware report (the HCL report), not certified by a CA.
func (c *Cluster) Attestation(context.Context) (provider.Attestation, error) {
	if c.rec.Variant.IsZero() {
		return provider.Attestation{}, errors.New("the Azure cluster's record names no variant")
	}
	return provider.Attestation{Variant: c.rec.Variant}, nil
}
