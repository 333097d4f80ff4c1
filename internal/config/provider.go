package config

import (
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/openconstellation/constellation/internal/strictyaml"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// ProviderRules are the checks of a configuration that depend on its provider: the variants
// its nodes attest with, how many nodes it can run, which networks it reserves or how it
// cuts them, and its own settings. Each provider implements them in its own package (the local provider:
// internal/provider/local.ConfigRules), and the provider catalog registers them
// (internal/provider/catalog): this package names no provider's code.
type ProviderRules interface {
	// Variants are the attestation variants the provider's nodes can attest with (a cloud
	// offers SEV-SNP and TDX machines, say); the first is the default. The configuration
	// holds one of them.
	Variants() []variant.Variant
	// CheckNodes says what is wrong with the node counts as a whole (reported at
	// provider.<name>), or nil. Each count alone was checked already.
	CheckNodes(controlPlanes, workers int) error
	// CheckNetworks reports what is wrong with the pod and service networks for a cluster of
	// nodes nodes, as errors naming network.podCIDR or network.serviceCIDR. A network that
	// did not parse is the zero Prefix.
	CheckNetworks(pod, svc netip.Prefix, nodes int) []*strictyaml.FieldError
	// CheckSettings reports what is wrong with the provider block's settings
	// (ProviderBlock.Settings), as errors naming their field below it ("location"); a
	// provider that takes none refuses any. v is the configured variant (zero if none is).
	CheckSettings(settings map[string]any, v variant.Variant) []*strictyaml.FieldError
}

var (
	providersMu sync.RWMutex
	providers   = map[string]ProviderRules{}
)

// RegisterProvider makes name a key of the provider block (provider.<name>: Parse refuses any
// other) and Validate check the configurations of provider name by rules. The provider
// catalog calls it for every provider it registers; a program without the catalog registers
// them itself (Parse refuses a file, and Validate a configuration, whose provider has no
// rules).
func RegisterProvider(name string, rules ProviderRules) {
	providersMu.Lock()
	defer providersMu.Unlock()
	providers[name] = rules
}

// RegisteredProviders returns the names of the providers with registered rules, sorted.
func RegisteredProviders() []string {
	providersMu.RLock()
	defer providersMu.RUnlock()
	names := make([]string, 0, len(providers))
	for n := range providers {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

func registeredRules(name string) ProviderRules {
	providersMu.RLock()
	defer providersMu.RUnlock()
	return providers[name]
}

// registeredList names the registered providers for messages, "none" if there are none.
func registeredList() string {
	if names := RegisteredProviders(); len(names) > 0 {
		return strings.Join(names, ", ")
	}
	return "none"
}

// ProviderFor returns the provider block that configures provider name with b.
func ProviderFor(name string, b ProviderBlock) ProviderConfig {
	return ProviderConfig{name: &b}
}

// KnownKeys returns the keys a provider block may have: the registered providers
// (strictyaml.KeySet).
func (ProviderConfig) KnownKeys() []string { return RegisteredProviders() }

// set returns the names of the configured (non-null) blocks, sorted.
func (p ProviderConfig) set() []string {
	var names []string
	for name, b := range p {
		if b != nil {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// Name returns the name of the configured provider (the key of its block: "local"), or "" if
// not exactly one is configured.
func (p ProviderConfig) Name() string {
	if set := p.set(); len(set) == 1 {
		return set[0]
	}
	return ""
}

// Block returns the configured provider's block, or nil if not exactly one is configured:
// the nodes and image the CLI creates, whatever the provider.
func (p ProviderConfig) Block() *ProviderBlock {
	return p[p.Name()]
}

// nodes is the number of nodes the provider block asks for.
func (p ProviderConfig) nodes() int {
	if b := p.Block(); b != nil {
		return b.ControlPlanes + b.Workers
	}
	return 0
}
