package azuremeta

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/arm"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v8"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v7"

	"github.com/openconstellation/constellation/internal/metadata"
)

// Lister lists the cluster's instances from Resource Manager: the VMs of the cluster's
// resource group that carry its UID, with the role and node name of their tags and the
// private addresses of their network interfaces. The nodes' identity may read exactly these
// (the host half's role, internal/provider/azure).
type Lister struct {
	ResourceGroup, UID string

	vms        *armcompute.VirtualMachinesClient
	interfaces *armnetwork.InterfacesClient
}

var _ metadata.Lister = (*Lister)(nil)

// NewLister returns the lister of the cluster uid in group of subscription, calling Resource
// Manager with cred (a node: its managed identity) and opts (nil: Azure's public cloud).
func NewLister(subscription, group, uid string, cred azcore.TokenCredential, opts *arm.ClientOptions) (*Lister, error) {
	if subscription == "" || group == "" || uid == "" {
		return nil, fmt.Errorf("listing the cluster's instances needs its subscription, group and UID (got %q, %q, %q)", subscription, group, uid)
	}
	vms, err := armcompute.NewVirtualMachinesClient(subscription, cred, opts)
	if err != nil {
		return nil, err
	}
	interfaces, err := armnetwork.NewInterfacesClient(subscription, cred, opts)
	if err != nil {
		return nil, err
	}
	return &Lister{ResourceGroup: group, UID: uid, vms: vms, interfaces: interfaces}, nil
}

// Instances implements metadata.Lister.
func (l *Lister) Instances(ctx context.Context) ([]metadata.Instance, error) {
	addrs, err := l.addresses(ctx)
	if err != nil {
		return nil, err
	}
	var out []metadata.Instance
	pager := l.vms.NewListPager(l.ResourceGroup, nil)
	for pager.More() {
		page, err := pager.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("listing the VMs of %s: %w", l.ResourceGroup, err)
		}
		for _, vm := range page.Value {
			if vm == nil || tag(vm.Tags, TagUID) != l.UID || vm.Properties == nil || vm.Properties.NetworkProfile == nil {
				continue
			}
			inst := metadata.Instance{Name: tag(vm.Tags, TagNode), Role: metadata.Role(tag(vm.Tags, TagRole))}
			for _, nic := range vm.Properties.NetworkProfile.NetworkInterfaces {
				if nic != nil && nic.ID != nil {
					inst.IPs = append(inst.IPs, addrs[strings.ToLower(*nic.ID)]...)
				}
			}
			if inst.Validate() == nil {
				out = append(out, inst)
			}
		}
	}
	slices.SortFunc(out, func(a, b metadata.Instance) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// addresses maps the group's network interfaces (by lower-case ID) to their private
// addresses.
func (l *Lister) addresses(ctx context.Context) (map[string][]netip.Addr, error) {
	out := map[string][]netip.Addr{}
	pager := l.interfaces.NewListPager(l.ResourceGroup, nil)
	for pager.More() {
		page, err := pager.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("listing the network interfaces of %s: %w", l.ResourceGroup, err)
		}
		for _, nic := range page.Value {
			if nic == nil || nic.ID == nil || nic.Properties == nil || tag(nic.Tags, TagUID) != l.UID {
				continue
			}
			for _, ipc := range nic.Properties.IPConfigurations {
				if ipc == nil || ipc.Properties == nil || ipc.Properties.PrivateIPAddress == nil {
					continue
				}
				if ip, err := netip.ParseAddr(*ipc.Properties.PrivateIPAddress); err == nil {
					out[strings.ToLower(*nic.ID)] = append(out[strings.ToLower(*nic.ID)], ip)
				}
			}
		}
	}
	return out, nil
}

func tag(tags map[string]*string, key string) string {
	if v := tags[key]; v != nil {
		return *v
	}
	return ""
}
