package local

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/openconstellation/constellation/internal/provider/local/sandbox"
	"github.com/openconstellation/constellation/internal/strictyaml"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// Limits of a local cluster's configuration (docs/local-provider.md).
const (
	// maxConfiguredNodes: node i has address 10.42.0.(10+i) of the node network, so at most
	// this many nodes fit.
	maxConfiguredNodes = 245
	// nodePodPrefixBits is the pod network of one local node.
	nodePodPrefixBits = 24
)

// ConfigRules are the local provider's checks of a cluster configuration
// (internal/config.ProviderRules): its nodes' variant, how many nodes its node network
// holds, and how it cuts the pod network. The provider catalog registers them with the
// configuration (internal/provider/catalog).
type ConfigRules struct{}

// Variants implements config.ProviderRules: the local nodes' one variant.
func (ConfigRules) Variants() []variant.Variant { return []variant.Variant{Variant} }

// CheckSettings implements config.ProviderRules: the local provider takes no settings.
func (ConfigRules) CheckSettings(settings map[string]any, _ variant.Variant) []*strictyaml.FieldError {
	return NoSettings(settings, "local and QEMU")
}

// NoSettings refuses every setting of a provider (named for the message) that takes none.
func NoSettings(settings map[string]any, provider string) []*strictyaml.FieldError {
	var problems []*strictyaml.FieldError
	for _, k := range slices.Sorted(maps.Keys(settings)) {
		problems = append(problems, &strictyaml.FieldError{Path: k, Err: fmt.Errorf("unknown setting: the %s providers take no settings", provider)})
	}
	return problems
}

// CheckNodes implements config.ProviderRules: the node network has an address for each node.
func (ConfigRules) CheckNodes(controlPlanes, workers int) error {
	if controlPlanes >= 1 && workers >= 0 && controlPlanes+workers > maxConfiguredNodes {
		return fmt.Errorf("%d control planes and %d workers are %d nodes, more than the %d addresses of the node network %s",
			controlPlanes, workers, controlPlanes+workers, maxConfiguredNodes, sandbox.NodePrefix)
	}
	return nil
}

// CheckNetworks implements config.ProviderRules: the pod and service networks stay off the
// node network and the uplink's, and the pod network holds a /24 for each of the nodes.
func (ConfigRules) CheckNetworks(pod, svc netip.Prefix, nodes int) []*strictyaml.FieldError {
	var problems []*strictyaml.FieldError
	bad := func(path, format string, args ...any) {
		problems = append(problems, &strictyaml.FieldError{Path: path, Err: fmt.Errorf(format, args...)})
	}
	for _, n := range []struct {
		field string
		p     netip.Prefix
	}{{"network.podCIDR", pod}, {"network.serviceCIDR", svc}} {
		if n.p.IsValid() && n.p.Overlaps(sandbox.NodePrefix) {
			bad(n.field, "%s overlaps the local provider's node network %s", n.p, sandbox.NodePrefix)
		}
		if n.p.IsValid() && n.p.Overlaps(sandbox.UplinkPrefix) {
			bad(n.field, "%s overlaps the local provider's uplink network %s (NAT)", n.p, sandbox.UplinkPrefix)
		}
	}
	if pod.IsValid() && nodes > 0 {
		if pod.Bits() > nodePodPrefixBits {
			bad("network.podCIDR", "%s is smaller than the /%d each local node gets", pod, nodePodPrefixBits)
		} else if room := 1 << min(nodePodPrefixBits-pod.Bits(), 16); nodes > room {
			bad("network.podCIDR", "%s holds %d node networks (/%d), the cluster has %d nodes", pod, room, nodePodPrefixBits, nodes)
		}
	}
	return problems
}
