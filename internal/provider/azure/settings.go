package azure

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"regexp"
	"strings"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v8"
	"github.com/google/uuid"

	"github.com/openconstellation/constellation/internal/strictyaml"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// Settings are the Azure provider's settings: the block provider.azure.settings of the
// configuration (docs/azure.md "Configuration").
type Settings struct {
	// SubscriptionID is the Azure subscription the cluster's resources are billed to (a
	// GUID). Required.
	SubscriptionID string `json:"subscriptionID"`
	// ResourceGroup holds the cluster's resources; created if it does not exist (and then
	// deleted with the cluster), kept if it does. Required.
	ResourceGroup string `json:"resourceGroup"`
	// Location is the Azure region ("westeurope"). Required.
	Location string `json:"location"`
	// VMSize is every node's VM size: a confidential size of the variant's family
	// (azure-sev-snp: Standard_DC*as_v5 and the like; azure-tdx: Standard_DC*es_v5 and the
	// like). Default: DefaultVMSize of the variant.
	VMSize string `json:"vmSize,omitempty"`
	// DiskEncryption is the confidential encryption of the OS disk: VMGuestStateOnly (the
	// default: only the VM's guest state, its vTPM, is encrypted with a key bound to the
	// VM; the OS disk is dm-verity-protected and public anyway) or DiskWithVMGuestState.
	DiskEncryption string `json:"diskEncryption,omitempty"`
	// StateDiskGiB is the size of each node's state disk (LUKS2, LUN 0). Default 30.
	StateDiskGiB int32 `json:"stateDiskGiB,omitempty"`
	// SecureBoot turns UEFI Secure Boot on. Default off: the node image's UKI is not signed
	// by a key Azure's firmware trusts; what it booted is proven by measured boot instead.
	SecureBoot bool `json:"secureBoot,omitempty"`
}

// Defaults.
const (
	defaultStateDiskGiB = 30
	maxStateDiskGiB     = 4095
)

// DefaultVMSize is the VM size of a variant's nodes when the settings name none.
var DefaultVMSize = map[variant.Variant]string{
	variant.AzureSEVSNP: "Standard_DC4as_v5",
	variant.AzureTDX:    "Standard_DC4es_v5",
}

// vmSizeFamilies are the confidential VM sizes of each variant.
var vmSizeFamilies = map[variant.Variant]*regexp.Regexp{
	// AMD SEV-SNP: DCasv5, DCadsv5, ECasv5, ECadsv5 and their v6 successors.
	variant.AzureSEVSNP: regexp.MustCompile(`(?i)^Standard_[DE]C\d+a(d)?s_v[56]$`),
	// Intel TDX: DCesv5, DCedsv5, ECesv5, ECedsv5 and their v6 successors.
	variant.AzureTDX: regexp.MustCompile(`(?i)^Standard_[DE]C\d+e(d)?s_v[56]$`),
}

var (
	locationRE      = regexp.MustCompile(`^[a-z][a-z0-9]{1,40}$`)
	resourceGroupRE = regexp.MustCompile(`^[-\w._()]{1,90}$`)
)

// ParseSettings reads the settings of a configuration's provider block strictly: an unknown
// or mistyped field is an error naming it. Defaults are filled in; Check validates.
func ParseSettings(raw map[string]any) (Settings, []*strictyaml.FieldError) {
	if raw == nil {
		raw = map[string]any{}
	}
	doc, err := json.Marshal(raw)
	if err != nil {
		return Settings{}, []*strictyaml.FieldError{{Err: err}}
	}
	var s Settings
	if err := strictyaml.Unmarshal(doc, &s); err != nil {
		fes := strictyaml.FieldErrors(err)
		if len(fes) == 0 {
			fes = []*strictyaml.FieldError{{Err: err}}
		}
		return Settings{}, fes
	}
	return s.withDefaults(), nil
}

func (s Settings) withDefaults() Settings {
	if s.StateDiskGiB == 0 {
		s.StateDiskGiB = defaultStateDiskGiB
	}
	if s.DiskEncryption == "" {
		s.DiskEncryption = string(armcompute.SecurityEncryptionTypesVMGuestStateOnly)
	}
	return s
}

// vmSize is the nodes' VM size for variant v.
func (s Settings) vmSize(v variant.Variant) string {
	if s.VMSize != "" {
		return s.VMSize
	}
	return DefaultVMSize[v]
}

// Check reports every problem of the settings for nodes of variant v (zero: not known yet),
// each naming its field.
func (s Settings) Check(v variant.Variant) []*strictyaml.FieldError {
	var problems []*strictyaml.FieldError
	bad := func(field, format string, args ...any) {
		problems = append(problems, &strictyaml.FieldError{Path: field, Err: fmt.Errorf(format, args...)})
	}
	if _, err := uuid.Parse(s.SubscriptionID); err != nil {
		bad("subscriptionID", "%q is not a subscription ID (a GUID: az account show --query id)", s.SubscriptionID)
	}
	if !resourceGroupRE.MatchString(s.ResourceGroup) || strings.HasSuffix(s.ResourceGroup, ".") {
		bad("resourceGroup", "%q is not a resource group name (1 to 90 letters, digits, '-', '_', '.', '(' or ')', not ending in '.')", s.ResourceGroup)
	}
	if !locationRE.MatchString(s.Location) {
		bad("location", "%q is not an Azure location name (lower case, like westeurope: az account list-locations --query [].name)", s.Location)
	}
	if family, ok := vmSizeFamilies[v]; ok && !family.MatchString(s.vmSize(v)) {
		bad("vmSize", "%q is not a confidential VM size of %s (for example %s)", s.vmSize(v), v, DefaultVMSize[v])
	}
	switch armcompute.SecurityEncryptionTypes(s.DiskEncryption) {
	case armcompute.SecurityEncryptionTypesVMGuestStateOnly, armcompute.SecurityEncryptionTypesDiskWithVMGuestState:
	default:
		bad("diskEncryption", "%q: want %s or %s", s.DiskEncryption, armcompute.SecurityEncryptionTypesVMGuestStateOnly, armcompute.SecurityEncryptionTypesDiskWithVMGuestState)
	}
	if s.StateDiskGiB < 1 || s.StateDiskGiB > maxStateDiskGiB {
		bad("stateDiskGiB", "%d: want 1 to %d", s.StateDiskGiB, maxStateDiskGiB)
	}
	return problems
}

// ConfigRules are the Azure provider's checks of a configuration.
type ConfigRules struct{}

// Variants implements config.ProviderRules: SEV-SNP confidential VMs by default, or TDX.
func (ConfigRules) Variants() []variant.Variant {
	return []variant.Variant{variant.AzureSEVSNP, variant.AzureTDX}
}

// CheckNodes implements config.ProviderRules: every node has its slot of NAT ports.
func (ConfigRules) CheckNodes(controlPlanes, workers int) error {
	if controlPlanes+workers > maxSlots {
		return fmt.Errorf("%d nodes are more than the %d the load balancer's NAT ports hold", controlPlanes+workers, maxSlots)
	}
	return nil
}

// CheckNetworks implements config.ProviderRules: the pod and service networks stay off the
// nodes' virtual network, and the pod network holds a /24 for each node (podNetwork).
func (ConfigRules) CheckNetworks(pod, svc netip.Prefix, nodes int) []*strictyaml.FieldError {
	var problems []*strictyaml.FieldError
	for _, n := range []struct {
		field string
		p     netip.Prefix
	}{{"network.podCIDR", pod}, {"network.serviceCIDR", svc}} {
		if n.p.IsValid() && n.p.Overlaps(NodeNetwork) {
			problems = append(problems, &strictyaml.FieldError{Path: n.field, Err: fmt.Errorf("%s overlaps the Azure provider's node network %s", n.p, NodeNetwork)})
		}
	}
	if pod.IsValid() && nodes > 0 {
		if _, err := podNetwork(pod, nodes-1); err != nil {
			problems = append(problems, &strictyaml.FieldError{Path: "network.podCIDR", Err: fmt.Errorf("%w: the cluster has %d nodes", err, nodes)})
		}
	}
	return problems
}

// CheckSettings implements config.ProviderRules.
func (ConfigRules) CheckSettings(raw map[string]any, v variant.Variant) []*strictyaml.FieldError {
	s, problems := ParseSettings(raw)
	if len(problems) > 0 {
		return problems
	}
	return s.Check(v)
}
