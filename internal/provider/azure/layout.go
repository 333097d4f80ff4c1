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

func (l layout) vnet() string     { return l.Cluster + "-vnet" }
func (l layout) subnet() string   { return "nodes" }
func (l layout) nsg() string      { return l.Cluster + "-nsg" }
func (l layout) publicIP() string { return l.Cluster + "-ip" }
func (l layout) lb() string       { return l.Cluster + "-lb" }
func (l layout) identity() string { return l.Cluster + "-nodes" }
func (l layout) routes() string   { return l.Cluster + "-routes" }

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

// roleDefinitionName and roleAssignmentName are the GUIDs of the nodes' role and its
// assignment: Azure names both by GUID, so they are derived from the cluster's UID to be found
// again by a rerun.
func (l layout) roleDefinitionName() string {
	return uuid.NewSHA1(uuid.NameSpaceURL, []byte("constellation:"+l.UID+":role")).String()
}

func (l layout) roleAssignmentName() string {
	return uuid.NewSHA1(uuid.NameSpaceURL, []byte("constellation:"+l.UID+":assignment")).String()
}

func (l layout) roleDefinitionID() string {
	return l.groupID() + "/providers/Microsoft.Authorization/roleDefinitions/" + l.roleDefinitionName()
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
