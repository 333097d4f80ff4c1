package azure

import (
	"fmt"
	"net/netip"

	"github.com/google/uuid"

	"github.com/openconstellation/constellation/internal/provider/azure/azuremeta"
)

// Tags the provider sets besides azuremeta's.
const (
	// TagOwnedGroup marks a resource group the provider created (and so may delete once it
	// is empty); a group the user created is kept.
	TagOwnedGroup = "constellation-owned-group"
)

// nodePodBits is the size of a node's pod network: node slot s gets the s-th of the pod
// network's /24s (podNetwork), routed to it by the cluster's route table.
const nodePodBits = 24

// podNetwork is the pod network of the node in slot: the slot-th /nodePodBits of pods.
func podNetwork(pods netip.Prefix, slot int) (netip.Prefix, error) {
	if !pods.IsValid() || !pods.Addr().Is4() || pods.Bits() > nodePodBits {
		return netip.Prefix{}, fmt.Errorf("pod network %s: want an IPv4 prefix of at most /%d", pods, nodePodBits)
	}
	if room := 1 << min(nodePodBits-pods.Bits(), 20); slot < 0 || slot >= room {
		return netip.Prefix{}, fmt.Errorf("pod network %s holds %d node networks (/%d), not one for slot %d", pods, room, nodePodBits, slot)
	}
	a := pods.Masked().Addr().As4()
	base := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	base += uint32(slot) << (32 - nodePodBits)
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(base >> 24), byte(base >> 16), byte(base >> 8), byte(base)}), nodePodBits), nil
}

// NodeNetwork is the address range of the cluster's virtual network and its one subnet: the
// nodes' addresses. The configuration's pod and service networks must stay off it
// (ConfigRules.CheckNetworks).
var NodeNetwork = netip.MustParsePrefix("10.9.0.0/16")

// layout names every resource of one cluster: where it lives and what it is called. Names
// are derived from the cluster's name so that a rerun of a killed command finds what the
// first run created; the UID tag tells the cluster's resources from another's of the same
// name.
type layout struct {
	Subscription  string
	ResourceGroup string
	Location      string
	// Cluster is the cluster's name (a DNS label); UID its unique ID.
	Cluster, UID string
}

func (l layout) groupID() string {
	return fmt.Sprintf("/subscriptions/%s/resourceGroups/%s", l.Subscription, l.ResourceGroup)
}

// id is the resource ID of a resource of type typ ("Microsoft.Network/virtualNetworks") in
// the cluster's group.
func (l layout) id(typ, name string) string {
	return fmt.Sprintf("%s/providers/%s/%s", l.groupID(), typ, name)
}

func (l layout) vnet() string                   { return l.Cluster + "-vnet" }
func (l layout) subnet() string                 { return "nodes" }
func (l layout) nsg() string                    { return l.Cluster + "-nsg" }
func (l layout) publicIP() string               { return l.Cluster + "-ip" }
func (l layout) lb() string                     { return l.Cluster + "-lb" }
func (l layout) identity(k identityKind) string { return l.Cluster + "-" + k.name }
func (l layout) routes() string                 { return l.Cluster + "-routes" }

// Per-node resources are named after the node: names are never reused within a cluster.
func (l layout) nic(node string) string       { return node + "-nic" }
func (l layout) stateDisk(node string) string { return node + "-state" }
func (l layout) osDisk(node string) string    { return node + "-os" }

func (l layout) subnetID() string {
	return l.id("Microsoft.Network/virtualNetworks", l.vnet()) + "/subnets/" + l.subnet()
}

func (l layout) lbPart(kind, name string) string {
	return l.id("Microsoft.Network/loadBalancers", l.lb()) + "/" + kind + "/" + name
}

// Load balancer parts.
const (
	lbFrontend          = "public"
	lbPoolControlPlanes = "control-planes"
	lbPoolNodes         = "nodes"
	lbProbeAPI          = "kube-apiserver"
)

// identityKind is one of the cluster's managed identities and its custom role.
type identityKind struct {
	// name is the identity's name after the cluster's ("mini-nodes"), and what the role's
	// and the assignment's GUIDs are derived from.
	name string
	// who says whose identity it is, in messages.
	who string
	// actions are all the role allows, in the cluster's group only.
	actions []string
	// description is the role's.
	description string
	// controlPlanesOnly: only the control planes' VMs carry the identity.
	controlPlanesOnly bool
}

var (
	// nodesIdentity is every node's: read the cluster's VMs and network interfaces (the join
	// service lists the nodes, a node finds its peers), the load balancer and its public
	// address (a node finds the API endpoint). Nothing writes.
	nodesIdentity = identityKind{name: "nodes", who: "the nodes'", description: "Read the VMs and network of Constellation cluster", actions: []string{
		"Microsoft.Compute/virtualMachines/read",
		"Microsoft.Network/networkInterfaces/read",
		"Microsoft.Network/loadBalancers/read",
		"Microsoft.Network/publicIPAddresses/read",
	}}
	// volumesIdentity is the volume driver's controller's, on the control planes only: make,
	// grow and delete the volumes' disks, and attach them to the VMs (a PATCH of a VM's data
	// disks needs the VM's write right; Azure has none narrower).
	volumesIdentity = identityKind{name: "volumes", who: "the volumes'", description: "Manage the volume disks of Constellation cluster", controlPlanesOnly: true, actions: []string{
		"Microsoft.Compute/disks/read",
		"Microsoft.Compute/disks/write",
		"Microsoft.Compute/disks/delete",
		"Microsoft.Compute/virtualMachines/read",
		"Microsoft.Compute/virtualMachines/write",
	}}
	// identities are the cluster's identities, in the order they are made.
	identities = []identityKind{nodesIdentity, volumesIdentity}
)

// roleDefinitionName and roleAssignmentName are the GUIDs of an identity's role and its
// assignment: Azure names both by GUID, so they are derived from the cluster's UID to be found
// again by a rerun (the nodes' from the names of the first release, which had only them).
func (l layout) roleDefinitionName(k identityKind) string {
	return uuid.NewSHA1(uuid.NameSpaceURL, []byte("constellation:"+l.UID+":"+k.seed()+"role")).String()
}

func (l layout) roleAssignmentName(k identityKind) string {
	return uuid.NewSHA1(uuid.NameSpaceURL, []byte("constellation:"+l.UID+":"+k.seed()+"assignment")).String()
}

func (k identityKind) seed() string {
	if k.name == nodesIdentity.name {
		return ""
	}
	return k.name + "-"
}

func (l layout) roleDefinitionID(k identityKind) string {
	return l.groupID() + "/providers/Microsoft.Authorization/roleDefinitions/" + l.roleDefinitionName(k)
}

// tags are the tags of every resource of the cluster (of none: an image upload's group).
func (l layout) tags(extra ...string) map[string]*string {
	t := map[string]*string{}
	if l.UID != "" {
		t[azuremeta.TagUID] = ptr(l.UID)
	}
	for i := 0; i+1 < len(extra); i += 2 {
		t[extra[i]] = ptr(extra[i+1])
	}
	return t
}

func ptr[T any](v T) *T { return &v }
