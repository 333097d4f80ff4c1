package azure

import (
	"fmt"
	"net/netip"
	"strconv"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/authorization/armauthorization/v2"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v8"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/msi/armmsi"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v7"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/resources/armresources/v3"

	"github.com/openconstellation/constellation/internal/kube/kubeadmconfig"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/provider/azure/azuremeta"
)

// The request builders below are what the provider asks Azure to create: pure functions of
// the cluster's layout and its nodes, pinned by golden files (testdata/requests). Every
// confidential field of a VM is set here and nowhere else.

// dialPorts are the node ports the CLI dials (provider.Provider.Dialer), each reachable on
// every node through an inbound NAT rule of the load balancer: the node's slot picks its
// frontend ports (natFrontendPort). The join service is not among them: nodes join from
// inside the virtual network, and nothing outside it has a reason to reach it.
var dialPorts = []int32{provider.InitPort, provider.RecoverPort, provider.VerificationPort}

// natPortBase is the first frontend port of the NAT rules; a node in slot s has frontend port
// natPortBase + s*len(dialPorts) + k for dialPorts[k].
const natPortBase = 40000

// maxSlots is how many nodes the NAT rules' frontend ports can hold.
var maxSlots = (65535 - natPortBase) / len(dialPorts)

// natFrontendPort is the load balancer's port that reaches port of the node in slot.
func natFrontendPort(slot int, port int32) (int32, error) {
	for k, p := range dialPorts {
		if p == port {
			return int32(natPortBase + slot*len(dialPorts) + k), nil
		}
	}
	return 0, fmt.Errorf("port %d of a node is not reachable through the load balancer (reachable: %v)", port, dialPorts)
}

func natRuleName(node string, port int32) string { return node + "-" + strconv.Itoa(int(port)) }

func resourceGroupRequest(l layout) armresources.ResourceGroup {
	return armresources.ResourceGroup{Location: ptr(l.Location), Tags: l.tags(TagOwnedGroup, "true")}
}

func identityRequest(l layout) armmsi.Identity {
	return armmsi.Identity{Location: ptr(l.Location), Tags: l.tags()}
}

// roleDefinitionRequest is an identity's custom role, assignable only in the cluster's group.
func roleDefinitionRequest(l layout, k identityKind) armauthorization.RoleDefinition {
	actions := make([]*string, len(k.actions))
	for i, a := range k.actions {
		actions[i] = ptr(a)
	}
	return armauthorization.RoleDefinition{Properties: &armauthorization.RoleDefinitionProperties{
		RoleName:         ptr("Constellation " + k.name + " " + l.Cluster + " " + l.UID),
		Description:      ptr(k.description + " " + l.Cluster + " (" + l.UID + ")"),
		RoleType:         ptr("CustomRole"),
		AssignableScopes: []*string{ptr(l.groupID())},
		Permissions:      []*armauthorization.Permission{{Actions: actions}},
	}}
}

// roleAssignmentRequest gives an identity (principal) its role on the group.
func roleAssignmentRequest(l layout, k identityKind, principal string) armauthorization.RoleAssignmentCreateParameters {
	return armauthorization.RoleAssignmentCreateParameters{Properties: &armauthorization.RoleAssignmentProperties{
		RoleDefinitionID: ptr(l.roleDefinitionID(k)),
		PrincipalID:      ptr(principal),
		PrincipalType:    ptr(armauthorization.PrincipalTypeServicePrincipal),
	}}
}

// securityGroupRequest lets the Internet reach the API and the ports the CLI dials through
// the load balancer; Azure's default rules allow the virtual network and the load balancer's
// probes, and deny everything else inbound.
func securityGroupRequest(l layout) armnetwork.SecurityGroup {
	ports := []*string{ptr(strconv.Itoa(kubeadmconfig.APIServerPort))}
	for _, p := range dialPorts {
		ports = append(ports, ptr(strconv.Itoa(int(p))))
	}
	return armnetwork.SecurityGroup{
		Location: ptr(l.Location), Tags: l.tags(),
		Properties: &armnetwork.SecurityGroupPropertiesFormat{SecurityRules: []*armnetwork.SecurityRule{{
			Name: ptr("cli-and-api"),
			Properties: &armnetwork.SecurityRulePropertiesFormat{
				Description:              ptr("the Kubernetes API and the node ports the CLI dials"),
				Priority:                 ptr[int32](100),
				Direction:                ptr(armnetwork.SecurityRuleDirectionInbound),
				Access:                   ptr(armnetwork.SecurityRuleAccessAllow),
				Protocol:                 ptr(armnetwork.SecurityRuleProtocolTCP),
				SourceAddressPrefix:      ptr("Internet"),
				SourcePortRange:          ptr("*"),
				DestinationAddressPrefix: ptr("VirtualNetwork"),
				DestinationPortRanges:    ports,
			},
		}}},
	}
}

func virtualNetworkRequest(l layout) armnetwork.VirtualNetwork {
	return armnetwork.VirtualNetwork{
		Location: ptr(l.Location), Tags: l.tags(),
		Properties: &armnetwork.VirtualNetworkPropertiesFormat{
			AddressSpace: &armnetwork.AddressSpace{AddressPrefixes: []*string{ptr(NodeNetwork.String())}},
			Subnets: []*armnetwork.Subnet{{
				Name: ptr(l.subnet()),
				Properties: &armnetwork.SubnetPropertiesFormat{
					AddressPrefix:         ptr(NodeNetwork.String()),
					NetworkSecurityGroup:  &armnetwork.SecurityGroup{ID: ptr(l.id("Microsoft.Network/networkSecurityGroups", l.nsg()))},
					RouteTable:            &armnetwork.RouteTable{ID: ptr(l.id("Microsoft.Network/routeTables", l.routes()))},
					DefaultOutboundAccess: ptr(false),
				},
			}},
		},
	}
}

// routeTableRequest is the subnet's route table: each node's pod network to the node (whose
// interface forwards what is not its own address), so pods reach each other across nodes
// without an overlay.
func routeTableRequest(l layout, nodes []nodeRequest) armnetwork.RouteTable {
	routes := []*armnetwork.Route{}
	for _, n := range nodes {
		if !n.PodNetwork.IsValid() || !n.Address.IsValid() {
			continue
		}
		routes = append(routes, &armnetwork.Route{Name: ptr(n.Name), Properties: &armnetwork.RoutePropertiesFormat{
			AddressPrefix: ptr(n.PodNetwork.String()), NextHopType: ptr(armnetwork.RouteNextHopTypeVirtualAppliance),
			NextHopIPAddress: ptr(n.Address.String()),
		}})
	}
	return armnetwork.RouteTable{
		Location: ptr(l.Location), Tags: l.tags(),
		Properties: &armnetwork.RouteTablePropertiesFormat{DisableBgpRoutePropagation: ptr(true), Routes: routes},
	}
}

func publicIPRequest(l layout) armnetwork.PublicIPAddress {
	return armnetwork.PublicIPAddress{
		Location: ptr(l.Location), Tags: l.tags(),
		SKU: &armnetwork.PublicIPAddressSKU{Name: ptr(armnetwork.PublicIPAddressSKUNameStandard), Tier: ptr(armnetwork.PublicIPAddressSKUTierRegional)},
		Properties: &armnetwork.PublicIPAddressPropertiesFormat{
			PublicIPAllocationMethod: ptr(armnetwork.IPAllocationMethodStatic),
			PublicIPAddressVersion:   ptr(armnetwork.IPVersionIPv4),
		},
	}
}

// loadBalancerRequest is the cluster's standard load balancer: its public address is the
// stable API endpoint (a rule to every control plane whose API server answers the probe), the
// nodes' outbound address (an outbound rule: the subnet has no default outbound access), and,
// through one NAT rule per node and dialed port, how the CLI reaches each node.
func loadBalancerRequest(l layout, nodes []nodeRequest) armnetwork.LoadBalancer {
	frontend := &armnetwork.SubResource{ID: ptr(l.lbPart("frontendIPConfigurations", lbFrontend))}
	var nat []*armnetwork.InboundNatRule
	for _, n := range nodes {
		for _, port := range dialPorts {
			fp, _ := natFrontendPort(n.Slot, port) // every dial port has one
			nat = append(nat, &armnetwork.InboundNatRule{Name: ptr(natRuleName(n.Name, port)), Properties: &armnetwork.InboundNatRulePropertiesFormat{
				FrontendIPConfiguration: frontend, Protocol: ptr(armnetwork.TransportProtocolTCP),
				FrontendPort: ptr(fp), BackendPort: ptr(port), EnableTCPReset: ptr(true), IdleTimeoutInMinutes: ptr[int32](30),
			}})
		}
	}
	return armnetwork.LoadBalancer{
		Location: ptr(l.Location), Tags: l.tags(),
		SKU: &armnetwork.LoadBalancerSKU{Name: ptr(armnetwork.LoadBalancerSKUNameStandard), Tier: ptr(armnetwork.LoadBalancerSKUTierRegional)},
		Properties: &armnetwork.LoadBalancerPropertiesFormat{
			FrontendIPConfigurations: []*armnetwork.FrontendIPConfiguration{{Name: ptr(lbFrontend), Properties: &armnetwork.FrontendIPConfigurationPropertiesFormat{
				PublicIPAddress: &armnetwork.PublicIPAddress{ID: ptr(l.id("Microsoft.Network/publicIPAddresses", l.publicIP()))},
			}}},
			BackendAddressPools: []*armnetwork.BackendAddressPool{{Name: ptr(lbPoolControlPlanes)}, {Name: ptr(lbPoolNodes)}},
			Probes: []*armnetwork.Probe{{Name: ptr(lbProbeAPI), Properties: &armnetwork.ProbePropertiesFormat{
				Protocol: ptr(armnetwork.ProbeProtocolHTTPS), Port: ptr[int32](kubeadmconfig.APIServerPort), RequestPath: ptr("/readyz"),
				IntervalInSeconds: ptr[int32](5), ProbeThreshold: ptr[int32](2),
			}}},
			LoadBalancingRules: []*armnetwork.LoadBalancingRule{{Name: ptr("kube-apiserver"), Properties: &armnetwork.LoadBalancingRulePropertiesFormat{
				FrontendIPConfiguration: frontend,
				BackendAddressPool:      &armnetwork.SubResource{ID: ptr(l.lbPart("backendAddressPools", lbPoolControlPlanes))},
				Probe:                   &armnetwork.SubResource{ID: ptr(l.lbPart("probes", lbProbeAPI))},
				Protocol:                ptr(armnetwork.TransportProtocolTCP), FrontendPort: ptr[int32](kubeadmconfig.APIServerPort), BackendPort: ptr[int32](kubeadmconfig.APIServerPort),
				EnableTCPReset: ptr(true), IdleTimeoutInMinutes: ptr[int32](30), DisableOutboundSnat: ptr(true),
			}}},
			OutboundRules: []*armnetwork.OutboundRule{{Name: ptr("egress"), Properties: &armnetwork.OutboundRulePropertiesFormat{
				FrontendIPConfigurations: []*armnetwork.SubResource{frontend},
				BackendAddressPool:       &armnetwork.SubResource{ID: ptr(l.lbPart("backendAddressPools", lbPoolNodes))},
				Protocol:                 ptr(armnetwork.LoadBalancerOutboundRuleProtocolAll),
				EnableTCPReset:           ptr(true), IdleTimeoutInMinutes: ptr[int32](15),
			}}},
			InboundNatRules: nat,
		},
	}
}

// nodeRequest is one node's VM as the provider creates it.
type nodeRequest struct {
	Name string
	Role metadata.Role
	// Slot picks the node's NAT frontend ports (natFrontendPort): the smallest slot no other
	// node of the cluster holds when it is created.
	Slot int
	// Image is the resource ID of the gallery image version the node boots.
	Image  string
	VMSize string
	// Encryption is the OS disk's confidential encryption (VMGuestStateOnly or
	// DiskWithVMGuestState).
	Encryption armcompute.SecurityEncryptionTypes
	// SecureBoot turns UEFI Secure Boot on: only for an image whose boot chain Azure's
	// firmware trusts (docs/azure.md).
	SecureBoot   bool
	StateDiskGiB int32
	// InitSecretHash is set on control planes (azuremeta.TagInitSecretHash).
	InitSecretHash string
	// PodNetwork is the node's pod network (podNetwork of its slot); APIEndpoint the
	// cluster's API endpoint (host:port). Both reach the node as tags.
	PodNetwork  netip.Prefix
	APIEndpoint string
	// Address is the node's private address, once its interface has one (routes).
	Address netip.Addr
}

func (n nodeRequest) tags(l layout) map[string]*string {
	t := l.tags(azuremeta.TagRole, string(n.Role), azuremeta.TagNode, n.Name, tagSlot, strconv.Itoa(n.Slot),
		azuremeta.TagPodNetwork, n.PodNetwork.String(), azuremeta.TagAPIEndpoint, n.APIEndpoint)
	if n.Role == metadata.ControlPlane && n.InitSecretHash != "" {
		t[azuremeta.TagInitSecretHash] = ptr(n.InitSecretHash)
	}
	return t
}

// vmTags are a node's VM's tags: the node's, and which of the VM's identities is whose (a VM
// with two must name the one it asks a token for).
func (n nodeRequest) vmTags(l layout) map[string]*string {
	t := n.tags(l)
	if len(n.Image) <= maxTagValue {
		t[tagImage] = ptr(n.Image)
	}
	t[azuremeta.TagNodesIdentity] = ptr(l.identity(nodesIdentity))
	if n.Role == metadata.ControlPlane {
		t[azuremeta.TagVolumesIdentity] = ptr(l.identity(volumesIdentity))
	}
	return t
}

// identities are the managed identities a node's VM carries: the nodes', and on a control
// plane the volumes' too.
func (n nodeRequest) identities(l layout) map[string]*armcompute.UserAssignedIdentitiesValue {
	out := map[string]*armcompute.UserAssignedIdentitiesValue{}
	for _, k := range identities {
		if !k.controlPlanesOnly || n.Role == metadata.ControlPlane {
			out[l.id("Microsoft.ManagedIdentity/userAssignedIdentities", l.identity(k))] = &armcompute.UserAssignedIdentitiesValue{}
		}
	}
	return out
}

// tagSlot records a node's slot on its VM and NIC, so a rerun and later scaling know it.
const tagSlot = "constellation-slot"

// tagImage records on a VM the image it was asked to boot, as the CLI named it. Azure treats
// resource IDs without regard to case and may answer a VM's image reference in another case
// than it was given (hashicorp/terraform-provider-azurerm#18723), while an upgrade compares
// images exactly: a replacement whose image came back in another case would look stale and be
// replaced again. An ID longer than a tag holds (maxTagValue) is not recorded; the VM's own
// reference is read then.
const tagImage = "constellation-image"

// maxTagValue is the longest value of a tag Azure stores.
const maxTagValue = 256

// stateDiskRequest is a node's empty state disk: LUN 0 of its VM, which the node formats as
// LUKS2 with a key only an attested node gets.
func stateDiskRequest(l layout, n nodeRequest) armcompute.Disk {
	return armcompute.Disk{
		Location: ptr(l.Location), Tags: n.tags(l),
		SKU: &armcompute.DiskSKU{Name: ptr(armcompute.DiskStorageAccountTypesPremiumLRS)},
		Properties: &armcompute.DiskProperties{
			CreationData: &armcompute.CreationData{CreateOption: ptr(armcompute.DiskCreateOptionEmpty)},
			DiskSizeGB:   ptr(n.StateDiskGiB),
		},
	}
}

// interfaceRequest is a node's network interface: an address in the subnet, the load
// balancer's pools (every node for outbound traffic; control planes for the API) and its NAT
// rules; it forwards packets not addressed to it (its pods').
func interfaceRequest(l layout, n nodeRequest) armnetwork.Interface {
	pools := []*armnetwork.BackendAddressPool{{ID: ptr(l.lbPart("backendAddressPools", lbPoolNodes))}}
	if n.Role == metadata.ControlPlane {
		pools = append(pools, &armnetwork.BackendAddressPool{ID: ptr(l.lbPart("backendAddressPools", lbPoolControlPlanes))})
	}
	var nat []*armnetwork.InboundNatRule
	for _, port := range dialPorts {
		nat = append(nat, &armnetwork.InboundNatRule{ID: ptr(l.lbPart("inboundNatRules", natRuleName(n.Name, port)))})
	}
	return armnetwork.Interface{
		Location: ptr(l.Location), Tags: n.tags(l),
		Properties: &armnetwork.InterfacePropertiesFormat{EnableIPForwarding: ptr(true), IPConfigurations: []*armnetwork.InterfaceIPConfiguration{{
			Name: ptr("primary"),
			Properties: &armnetwork.InterfaceIPConfigurationPropertiesFormat{
				Primary:                         ptr(true),
				Subnet:                          &armnetwork.Subnet{ID: ptr(l.subnetID())},
				PrivateIPAllocationMethod:       ptr(armnetwork.IPAllocationMethodDynamic),
				PrivateIPAddressVersion:         ptr(armnetwork.IPVersionIPv4),
				LoadBalancerBackendAddressPools: pools,
				LoadBalancerInboundNatRules:     nat,
			},
		}}},
	}
}

// vmRequest is a node's confidential VM. The image is specialized (it has no provisioning
// agent and takes no OS profile: nothing of the node's configuration travels in Azure's
// custom or user data, which the host sees and nothing measures). The VM runs with the
// nodes' identity, boots with a vTPM, and its state disk is LUN 0.
func vmRequest(l layout, n nodeRequest) armcompute.VirtualMachine {
	return armcompute.VirtualMachine{
		Location: ptr(l.Location), Tags: n.vmTags(l),
		Identity: &armcompute.VirtualMachineIdentity{
			Type:                   ptr(armcompute.ResourceIdentityTypeUserAssigned),
			UserAssignedIdentities: n.identities(l),
		},
		Properties: &armcompute.VirtualMachineProperties{
			HardwareProfile: &armcompute.HardwareProfile{VMSize: ptr(armcompute.VirtualMachineSizeTypes(n.VMSize))},
			SecurityProfile: &armcompute.SecurityProfile{
				SecurityType: ptr(armcompute.SecurityTypesConfidentialVM),
				UefiSettings: &armcompute.UefiSettings{SecureBootEnabled: ptr(n.SecureBoot), VTpmEnabled: ptr(true)},
			},
			StorageProfile: &armcompute.StorageProfile{
				ImageReference: &armcompute.ImageReference{ID: ptr(n.Image)},
				OSDisk: &armcompute.OSDisk{
					Name:         ptr(l.osDisk(n.Name)),
					OSType:       ptr(armcompute.OperatingSystemTypesLinux),
					CreateOption: ptr(armcompute.DiskCreateOptionTypesFromImage),
					Caching:      ptr(armcompute.CachingTypesReadOnly),
					DeleteOption: ptr(armcompute.DiskDeleteOptionTypesDelete),
					ManagedDisk: &armcompute.ManagedDiskParameters{
						StorageAccountType: ptr(armcompute.StorageAccountTypesPremiumLRS),
						SecurityProfile:    &armcompute.VMDiskSecurityProfile{SecurityEncryptionType: ptr(n.Encryption)},
					},
				},
				DataDisks: []*armcompute.DataDisk{{
					Lun:          ptr[int32](azuremeta.StateLUN),
					CreateOption: ptr(armcompute.DiskCreateOptionTypesAttach),
					Caching:      ptr(armcompute.CachingTypesNone),
					DeleteOption: ptr(armcompute.DiskDeleteOptionTypesDetach),
					ManagedDisk:  &armcompute.ManagedDiskParameters{ID: ptr(l.id("Microsoft.Compute/disks", l.stateDisk(n.Name)))},
				}},
			},
			NetworkProfile: &armcompute.NetworkProfile{NetworkInterfaces: []*armcompute.NetworkInterfaceReference{{
				ID:         ptr(l.id("Microsoft.Network/networkInterfaces", l.nic(n.Name))),
				Properties: &armcompute.NetworkInterfaceReferenceProperties{Primary: ptr(true), DeleteOption: ptr(armcompute.DeleteOptionsDelete)},
			}}},
			DiagnosticsProfile: &armcompute.DiagnosticsProfile{BootDiagnostics: &armcompute.BootDiagnostics{Enabled: ptr(true)}},
		},
	}
}
