// Package config is constellation-conf.yaml, the user's description of a cluster: its name,
// Kubernetes version, provider settings, the reference values its nodes must attest to, and
// its networks. docs/configuration.md describes every field.
//
// Parsing is strict (internal/strictyaml): unknown or miscased fields and values of the wrong
// kind are errors that name the field. Validate reports every problem at once, each as a
// *strictyaml.FieldError naming the field path and saying why, for example
//
//	provider.local.controlPlanes: must be at least 1, got 0
//
// Defaults (SetDefaults) fill only fields that are empty; fields without a default are
// required.
package config

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/openconstellation/constellation/internal/fileutil"
	"github.com/openconstellation/constellation/internal/kubeversion"
	"github.com/openconstellation/constellation/internal/registries"
	"github.com/openconstellation/constellation/internal/strictyaml"
	"github.com/openconstellation/constellation/pkg/attestation/choose"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// FileName is the name of the configuration file in a workspace.
const FileName = "constellation-conf.yaml"

// Version1 is the schema version this package reads and writes.
const Version1 = "v1"

// Defaults (docs/configuration.md, docs/local-provider.md).
const (
	// DefaultKubernetesVersion is the version of a configuration that names none.
	DefaultKubernetesVersion = kubeversion.Default
	// DefaultPodCIDR is the pod network of the cluster; the local provider gives node i the
	// i-th /24 of it.
	DefaultPodCIDR = "10.244.0.0/16"
	// DefaultServiceCIDR is the network of Kubernetes service addresses.
	DefaultServiceCIDR = "10.96.0.0/12"
)

// MaxFileSize bounds the configuration file (it is read whole).
const MaxFileSize = 1 << 20

// SupportedKubernetesVersions are the Kubernetes versions nodes can run, oldest first (the one
// list is internal/kubeversion's).
var SupportedKubernetesVersions = kubeversion.Versions()

const (
	// Service networks: kube-apiserver refuses IPv4 ranges larger than /12, and the cluster
	// DNS service takes the 10th address, so a range needs at least 16 addresses.
	minServicePrefixBits = 12
	maxServicePrefixBits = 28
)

// Config is constellation-conf.yaml.
type Config struct {
	// Version is the schema version of the file. Required; the only version is "v1".
	Version string `json:"version"`
	// Name is the cluster's name: a DNS label (at most 63 characters of lower-case letters,
	// digits and '-', starting and ending with a letter or digit). Required.
	Name string `json:"name"`
	// KubernetesVersion is the Kubernetes version the cluster runs: one of
	// SupportedKubernetesVersions (v1.34.4, v1.35.4); default v1.34.4.
	KubernetesVersion string `json:"kubernetesVersion"`
	// Provider is where the nodes run. Exactly one provider must be configured.
	Provider ProviderConfig `json:"provider"`
	// Attestation holds what nodes must prove before they are admitted. Exactly one
	// variant must be configured, and it must be the one the provider's nodes attest with.
	Attestation AttestationConfig `json:"attestation"`
	// Network holds the cluster's networks. Defaults: see NetworkConfig.
	Network NetworkConfig `json:"network"`
	// RegistryMirrors maps a registry host ("docker.io", "registry.example.com:5000") to the
	// endpoints the nodes pull its images from first, in order ("https://mirror.example.com");
	// a plain-HTTP registry is its own mirror with an http:// endpoint. Optional. Nodes get it
	// from the cluster on attested paths only (internal/registries); `apply` records changes,
	// and each node takes them at its next boot.
	RegistryMirrors registries.Mirrors `json:"registryMirrors,omitempty"`
	// Release says which releases the CLI trusts (docs/releases.md). Optional: needed to
	// boot a release (an image that is a release directory) and by `upgrade check`.
	Release ReleaseConfig `json:"release,omitzero"`
}

// ReleaseConfig pins the release key and names where releases are found.
type ReleaseConfig struct {
	// Key is the release key the CLI pins: a PEM public key file (`make release-key` writes
	// the local one, release-key.pem.pub). A release directory is booted only if this key
	// signed it. A relative path is relative to the workspace.
	Key string `json:"key,omitempty"`
	// Source is the release source `upgrade check` lists: a directory of release
	// directories (`make release` writes _output/releases). Relative to the workspace.
	Source string `json:"source,omitempty"`
}

// KeyPath and SourcePath resolve Key and Source against dir (the workspace).
func (r ReleaseConfig) KeyPath(dir string) string    { return resolve(dir, r.Key) }
func (r ReleaseConfig) SourcePath(dir string) string { return resolve(dir, r.Source) }

func resolve(dir, p string) string {
	if p == "" || filepath.IsAbs(p) || strings.HasPrefix(p, "https://") || strings.HasPrefix(p, "http://") {
		return p // a URL (a release source or release) is not a path
	}
	return filepath.Join(dir, p)
}

// ProviderConfig maps a provider's name (the name it is registered by, RegisterProvider) to
// its block; exactly one is set. The keys are the registered providers, so this package names
// no provider: a new provider registers its rules, and its block has the shape every
// provider's has (ProviderBlock). Parsing refuses a key that names no registered provider
// (strictyaml.KeySet), as it refuses an unknown field.
type ProviderConfig map[string]*ProviderBlock

// ProviderBlock is a provider's block: the nodes it runs and the image they boot. What a
// provider allows beyond the common rules is its ProviderRules'.
type ProviderBlock struct {
	// ControlPlanes is the number of control-plane nodes: at least 1 (an odd number keeps
	// etcd's quorum efficient). Required.
	ControlPlanes int `json:"controlPlanes"`
	// Workers is the number of worker nodes: at least 0. Default 0. The provider's rules
	// bound control planes and workers together (the local provider: at most 245, the
	// addresses of the node network).
	Workers int `json:"workers"`
	// Image is the node image the nodes boot, a directory for the local provider: the files
	// local.ImageFiles names (bootstrapper, kubelet, kubeadm, containerd.toml,
	// node-config.json), measured into the node's vTPM by the PCR map of docs/attestation.md.
	// A relative path is relative to the directory of the configuration file (the
	// workspace). Required.
	Image string `json:"image"`
	// Settings are what the provider takes besides (a cloud's subscription, location and
	// machine size): its rules check them (ProviderRules.CheckSettings). Empty for the
	// local and QEMU providers.
	Settings map[string]any `json:"settings,omitempty"`
}

// AttestationConfig maps the configuration key of a variant (variant.Variant.ConfigKey:
// "qemuVTPM", "awsSEVSNP", ...) to its block; exactly one is set. The keys are the variants of
// the attestation catalog (choose.Implemented), so this package names no variant: a new variant
// is its entry in the catalog and its literal in pkg/attestation/variant. Every block has the
// same shape (VariantConfig); which of its fields a variant uses, and requires, is the
// variant's (pkg/attestation/choose), and Validate refuses a field the variant would ignore.
// Parsing refuses a key that names no variant of the catalog (strictyaml.KeySet), as it
// refuses an unknown field.
type AttestationConfig map[string]*VariantConfig

// VariantConfig is one variant's reference values (choose.Values): measurements (reference
// sets of the variant's registers), AK roots, and the variant's hardware block.
type VariantConfig = choose.Values

// AttestationFor returns the attestation block that configures variant v with vals.
func AttestationFor(v variant.Variant, vals VariantConfig) AttestationConfig {
	return AttestationConfig{v.ConfigKey(): &vals}
}

// KnownKeys returns the keys a block may have: the configuration keys of the catalog's
// variants (strictyaml.KeySet).
func (AttestationConfig) KnownKeys() []string {
	keys := make([]string, 0, len(knownVariants()))
	for _, v := range knownVariants() {
		keys = append(keys, v.ConfigKey())
	}
	return keys
}

// knownVariants are the variants a configuration may configure, in catalog order: those the
// catalog implements.
func knownVariants() []variant.Variant {
	var out []variant.Variant
	for _, e := range choose.BuiltIns() {
		out = append(out, e.Variant)
	}
	return out
}

// Of returns the block of variant v, or nil if it is not configured.
func (a AttestationConfig) Of(v variant.Variant) *VariantConfig {
	return a[v.ConfigKey()]
}

// variantBlock is one configured block of AttestationConfig.
type variantBlock struct {
	key     string          // YAML key under attestation
	variant variant.Variant // zero if key names no variant of the catalog
	values  *VariantConfig
}

// set returns the configured (non-null) blocks: those of known variants in catalog order,
// then any other keys, sorted.
func (a AttestationConfig) set() []variantBlock {
	var out []variantBlock
	known := map[string]bool{}
	for _, v := range knownVariants() {
		known[v.ConfigKey()] = true
		if vals := a[v.ConfigKey()]; vals != nil {
			out = append(out, variantBlock{v.ConfigKey(), v, vals})
		}
	}
	var unknown []string
	for k, vals := range a {
		if !known[k] && vals != nil {
			unknown = append(unknown, k)
		}
	}
	slices.Sort(unknown)
	for _, k := range unknown {
		out = append(out, variantBlock{key: k, values: a[k]})
	}
	return out
}

// Reference returns the configured variant with its values, or an error naming the field if
// not exactly one variant of the catalog is configured.
func (a AttestationConfig) Reference() (choose.Reference, error) {
	set := a.set()
	switch {
	case len(set) != 1:
		return choose.Reference{}, fmt.Errorf("%s: attestation: %d variants configured, want exactly one", FileName, len(set))
	case set[0].variant.IsZero():
		return choose.Reference{}, fmt.Errorf("%s: attestation.%s: %w", FileName, set[0].key, unknownVariant(set[0].key))
	}
	return choose.Reference{Variant: set[0].variant, Values: *set[0].values}, nil
}

// unknownVariant says that key names no variant of the catalog, as strictyaml says it of an
// unknown field.
func unknownVariant(key string) error {
	known := AttestationConfig{}.KnownKeys()
	for _, k := range known {
		if strings.EqualFold(k, key) {
			return fmt.Errorf("unknown attestation variant (did you mean %q?)", k)
		}
	}
	slices.Sort(known)
	return fmt.Errorf("unknown attestation variant (known: %s)", strings.Join(known, ", "))
}

// NetworkConfig holds the cluster's networks (IPv4 CIDRs, without host bits). The pod,
// service and (for the local provider) node networks must not overlap.
type NetworkConfig struct {
	// PodCIDR is the network pods get addresses from. Default 10.244.0.0/16. With the local
	// provider each node gets a /24 of it, so it must hold a /24 per node.
	PodCIDR string `json:"podCIDR"`
	// ServiceCIDR is the network of Kubernetes service addresses, a /12 to /28. Default
	// 10.96.0.0/12.
	ServiceCIDR string `json:"serviceCIDR"`
	// Outbound is how nodes and pods reach networks outside the cluster (registries, the
	// internet): "nat" (the default: through the provider's NAT, where the host can reach) or
	// "none" (nowhere). Fixed when the cluster is created.
	Outbound string `json:"outbound"`
	// HostLoopback lets nodes and pods reach services on the host's loopback (127.0.0.1:PORT)
	// at HostLoopbackAddr (the local provider: 10.0.2.2:PORT), for a registry or a database
	// you run on your machine. Default false: like a rootless container's, the cluster's
	// workloads do not reach what listens only on your loopback. Needs outbound nat.
	HostLoopback bool `json:"hostLoopback,omitempty"`
}

// Values of network.outbound.
const (
	OutboundNAT  = "nat"
	OutboundNone = "none"
)

// NAT reports whether the nodes reach outside networks through NAT (network.outbound nat, the
// default).
func (n NetworkConfig) NAT() bool { return n.Outbound != OutboundNone }

// Default returns a configuration with every default set and no provider or attestation
// variant: the base that `constellation config generate` completes.
func Default() *Config {
	c := &Config{Version: Version1}
	c.SetDefaults()
	return c
}

// SetDefaults fills the empty fields that have defaults: kubernetesVersion,
// network.podCIDR, network.serviceCIDR and network.outbound.
func (c *Config) SetDefaults() {
	if c.KubernetesVersion == "" {
		c.KubernetesVersion = DefaultKubernetesVersion
	}
	if c.Network.PodCIDR == "" {
		c.Network.PodCIDR = DefaultPodCIDR
	}
	if c.Network.ServiceCIDR == "" {
		c.Network.ServiceCIDR = DefaultServiceCIDR
	}
	if c.Network.Outbound == "" {
		c.Network.Outbound = OutboundNAT
	}
}

// Parse decodes a configuration strictly and fills its defaults. It does not validate it.
func Parse(data []byte) (*Config, error) {
	if len(data) > MaxFileSize {
		return nil, fmt.Errorf("configuration has %d bytes, more than the limit of %d", len(data), MaxFileSize)
	}
	var c Config
	if err := strictyaml.Unmarshal(data, &c); err != nil {
		return nil, err
	}
	c.SetDefaults()
	return &c, nil
}

// Load reads, parses and validates the configuration file at path. A missing file is an
// error wrapping os.ErrNotExist.
func Load(path string) (*Config, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("no configuration file %s (create one with 'constellation config generate local'): %w", path, err)
	}
	if err != nil {
		return nil, fmt.Errorf("reading configuration: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("reading configuration %s: %w", path, err)
	}
	c, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("configuration %s:\n%w", path, err)
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("configuration %s is invalid:\n%w", path, err)
	}
	return c, nil
}

// header starts every written configuration file.
const header = `# Constellation cluster configuration (schema %s).
# Every field, its default and its rules: docs/configuration.md.
`

// Marshal encodes c as YAML, fields in documentation order, with a header comment.
func (c *Config) Marshal() ([]byte, error) {
	body, err := strictyaml.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("encoding configuration: %w", err)
	}
	return append(fmt.Appendf(nil, header, c.Version), body...), nil
}

// Write validates c and writes it to path atomically. Unless overwrite is set, an existing
// file is never replaced (the error wraps os.ErrExist).
func Write(path string, c *Config, overwrite bool) error {
	if err := c.Validate(); err != nil {
		return fmt.Errorf("refusing to write an invalid configuration:\n%w", err)
	}
	data, err := c.Marshal()
	if err != nil {
		return err
	}
	if overwrite {
		err = fileutil.WriteAtomic(path, data, 0o644)
	} else {
		err = fileutil.CreateAtomic(path, data, 0o644)
	}
	if err != nil {
		return fmt.Errorf("writing configuration: %w", err)
	}
	return nil
}

// ImagePath returns the node image, a relative Image resolved against dir (the directory
// holding the configuration file).
func (l *ProviderBlock) ImagePath(dir string) string { return resolve(dir, l.Image) }

// Variant returns the attestation variant configured, or the zero Variant if none or
// several are, or the one block names no variant of the catalog.
func (a AttestationConfig) Variant() variant.Variant {
	if set := a.set(); len(set) == 1 {
		return set[0].variant
	}
	return variant.Variant{}
}

// ReferenceSetName names the reference-value set of an image by its measurements, so a new
// image's set never takes an old one's name: prefix and the first 12 hex digits of the
// SHA-256 of the expected values in register order.
func ReferenceSetName(prefix string, m measurements.M) string {
	h := sha256.New()
	for _, i := range m.Indices() {
		fmt.Fprintf(h, "%d:%x;", i, m[i].Expected)
	}
	return prefix + hex.EncodeToString(h.Sum(nil))[:12]
}

// Validate checks every field and reports every problem (errors.Join of
// *strictyaml.FieldError, in field order), or nil. The configured provider's rules (its
// variant, node limit and networks) must be registered (RegisterProvider: the CLI's provider
// catalog registers them): a configuration whose provider has no rules in this program is
// refused, never checked by half.
func (c *Config) Validate() error {
	v := &validator{}
	switch c.Version {
	case Version1:
	case "":
		v.bad("version", "missing (this CLI reads %s)", Version1)
	default:
		v.bad("version", "%q is not supported (this CLI reads %s)", c.Version, Version1)
	}
	switch {
	case c.Name == "":
		v.bad("name", "missing (a DNS label, for example %q)", "my-cluster")
	default:
		if errs := validation.IsDNS1123Label(c.Name); len(errs) > 0 {
			v.bad("name", "%q is not a DNS label: %s", c.Name, strings.Join(errs, "; "))
		}
	}
	if !slices.Contains(SupportedKubernetesVersions, c.KubernetesVersion) {
		v.bad("kubernetesVersion", "%q is not supported (supported: %s)", c.KubernetesVersion, strings.Join(SupportedKubernetesVersions, ", "))
	}

	// The provider's own rules (the CLI registers every provider it supports through its
	// catalog). Without them the configuration cannot be checked whole: it is refused.
	name := c.Provider.Name()
	rules := registeredRules(name)
	switch set := c.Provider.set(); {
	case len(set) == 0:
		v.bad("provider", "no provider configured (supported: %s)", registeredList())
	case len(set) > 1:
		v.bad("provider", "%s are configured: configure exactly one provider", strings.Join(set, " and "))
	case rules == nil:
		v.bad("provider."+name, "this program has no rules for provider %q (registered: %s), so it cannot check the configuration", name, registeredList())
	default:
		validateProviderBlock(v, "provider."+name, c.Provider[name], rules, c.Attestation.Variant())
	}

	c.validateAttestation(v, name, rules)

	pod := v.prefix("network.podCIDR", c.Network.PodCIDR)
	svc := v.prefix("network.serviceCIDR", c.Network.ServiceCIDR)
	if svc.IsValid() && (svc.Bits() < minServicePrefixBits || svc.Bits() > maxServicePrefixBits) {
		v.bad("network.serviceCIDR", "%s: prefix length must be %d to %d, got %d", svc, minServicePrefixBits, maxServicePrefixBits, svc.Bits())
	}
	if pod.IsValid() && svc.IsValid() && pod.Overlaps(svc) {
		v.bad("network", "podCIDR %s and serviceCIDR %s overlap", pod, svc)
	}
	if err := c.RegistryMirrors.Validate(); err != nil {
		v.add("registryMirrors", err)
	}
	switch c.Network.Outbound {
	case OutboundNAT, "": // "": the default, in a configuration built in Go
	case OutboundNone:
		if c.Network.HostLoopback {
			v.bad("network.hostLoopback", "needs network.outbound %s (it is %s)", OutboundNAT, OutboundNone)
		}
	default:
		v.bad("network.outbound", "%q: want %s or %s", c.Network.Outbound, OutboundNAT, OutboundNone)
	}
	if rules != nil {
		for _, fe := range rules.CheckNetworks(pod, svc, c.Provider.nodes()) {
			v.add(fe.Path, fe.Err)
		}
	}
	return v.err()
}

// validateProviderBlock checks the block at path by the rules every provider shares, then by
// the provider's own.
func validateProviderBlock(v *validator, path string, b *ProviderBlock, rules ProviderRules, vt variant.Variant) {
	if b.ControlPlanes < 1 {
		v.bad(path+".controlPlanes", "must be at least 1, got %d", b.ControlPlanes)
	}
	if b.Workers < 0 {
		v.bad(path+".workers", "must be at least 0, got %d", b.Workers)
	}
	if err := rules.CheckNodes(b.ControlPlanes, b.Workers); err != nil {
		v.add(path, err)
	}
	if b.Image == "" {
		v.bad(path+".image", "missing (the node image directory, holding %s)", "bootstrapper, kubelet, kubeadm, containerd.toml, node-config.json")
	}
	for _, fe := range rules.CheckSettings(b.Settings, vt) {
		v.add(path+".settings."+fe.Path, fe.Err)
	}
}

// validateAttestation checks that every block names a variant of the catalog, that exactly
// one is configured, that it is the one the provider's nodes attest with (when the provider is
// known), and each configured block by its variant's rules.
func (c *Config) validateAttestation(v *validator, provider string, rules ProviderRules) {
	set := c.Attestation.set()
	var known []variantBlock
	for _, b := range set {
		if b.variant.IsZero() {
			// Parse refuses these already; a configuration built in Go is checked alike.
			v.add("attestation."+b.key, unknownVariant(b.key))
			continue
		}
		known = append(known, b)
	}
	switch {
	case len(set) == 0 && rules == nil:
		v.bad("attestation", "no attestation variant configured")
	case len(set) == 0:
		v.bad("attestation", "no attestation variant configured (the %s provider's nodes attest with %s)", provider, variantKeys(rules.Variants()))
	case len(set) > 1:
		keys := make([]string, len(set))
		for i, b := range set {
			keys[i] = b.key
		}
		v.bad("attestation", "%s are configured: configure exactly one variant", strings.Join(keys, " and "))
	case rules != nil && len(known) == 1 && !slices.Contains(rules.Variants(), known[0].variant):
		v.bad("attestation."+known[0].key, "variant %s does not match the provider's nodes, which attest with %s", known[0].variant, variantKeys(rules.Variants()))
	}
	for _, b := range known {
		path := "attestation." + b.key
		validateReferenceSets(v, path+".measurements", b.values.Measurements, b.variant)
		for _, fe := range choose.ValidateValues(b.variant, *b.values) {
			v.add(path+"."+fe.Field, fe.Err)
		}
	}
}

// variantKeys names variants for messages: "attestation.qemuVTPM", or a list of them.
func variantKeys(vs []variant.Variant) string {
	keys := make([]string, len(vs))
	for i, v := range vs {
		keys[i] = fmt.Sprintf("%s (attestation.%s)", v, v.ConfigKey())
	}
	return strings.Join(keys, " or ")
}

func validateReferenceSets(v *validator, path string, sets measurements.ReferenceSets, vt variant.Variant) {
	if len(sets) == 0 {
		v.bad(path, "at least one reference-value set is required")
		return
	}
	seen := map[string]int{}
	for i, set := range sets {
		p := fmt.Sprintf("%s[%d]", path, i)
		switch first, dup := seen[set.Name]; {
		case set.Name == "":
			v.bad(p+".name", "missing")
		case dup:
			v.bad(p+".name", "%q is also the name of set %d", set.Name, first)
		default:
			seen[set.Name] = i
		}
		mp := p + ".measurements"
		if err := set.Measurements.Validate(vt); err != nil {
			// One problem per line, each naming the set: unwrap the joined errors of Validate.
			errs := []error{err}
			if multi, ok := err.(interface{ Unwrap() []error }); ok {
				errs = multi.Unwrap()
			}
			for _, e := range errs {
				v.add(mp, fmt.Errorf("set %q: %w", set.Name, e))
			}
		}
	}
}

// validator collects field problems.
type validator struct{ problems []error }

func (v *validator) add(path string, err error) {
	v.problems = append(v.problems, &strictyaml.FieldError{Path: path, Err: err})
}

func (v *validator) bad(path, format string, args ...any) {
	v.add(path, fmt.Errorf(format, args...))
}

// prefix parses an IPv4 network without host bits; an invalid one is reported and returned
// as the zero Prefix.
func (v *validator) prefix(path, s string) netip.Prefix {
	if s == "" {
		v.bad(path, "missing")
		return netip.Prefix{}
	}
	p, err := netip.ParsePrefix(s)
	switch {
	case err != nil:
		v.add(path, fmt.Errorf("not a CIDR: %w", err))
	case !p.Addr().Is4():
		v.bad(path, "%s is not an IPv4 network (nodes have IPv4 addresses only)", s)
	case p != p.Masked():
		v.bad(path, "%s has host bits set (the network is %s)", s, p.Masked())
	default:
		return p
	}
	return netip.Prefix{}
}

func (v *validator) err() error { return errors.Join(v.problems...) }
