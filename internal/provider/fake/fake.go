// Package fake is a platform that runs nothing: provider.Platform and provider.Provider in
// memory, for tests of the CLI's side of the provider seam. Its nodes exist only as entries
// in a list; nothing boots, so nothing ever joins, attests or answers on a port.
//
// It is also the smallest example of what a provider implements (docs/providers.md): a test
// registers it with catalog.Register, as the catalog's builtins register real providers.
package fake

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/openconstellation/constellation/internal/attestation/akca"
	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/strictyaml"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// Name is the fake provider's name.
const Name = "fake"

// Variant is the variant the fake's nodes would attest with.
var Variant = variant.QEMUVTPM

// Platform is the fake provider. Its clusters live in memory, one per workspace. The zero
// value is not usable: use New.
type Platform struct {
	mu       sync.Mutex
	clusters map[string]*Cluster
}

var (
	_ provider.Platform = (*Platform)(nil)
	_ provider.Provider = (*Cluster)(nil)
)

// New returns a fake provider without clusters.
func New() *Platform { return &Platform{clusters: map[string]*Cluster{}} }

// Name implements provider.Platform.
func (*Platform) Name() string { return Name }

// ConfigRules implements provider.Platform: the fake accepts any node counts and networks.
func (*Platform) ConfigRules() config.ProviderRules { return rules{} }

// Folder implements provider.Platform: the fake keeps no files.
func (*Platform) Folder(string) string { return "" }

// ReferenceValues implements provider.Platform: a fake node would measure nothing but its
// image's name, into PCR 11 (the first byte repeated to a SHA-256 digest); PCRs 0-14 are
// enforced, the others read zero, as a qemu-vtpm reference set requires.
func (*Platform) ReferenceValues(image string) (provider.ReferenceValues, error) {
	if image == "" {
		return provider.ReferenceValues{}, errors.New("no image")
	}
	m := measurements.M{}
	for i := uint32(0); i <= 14; i++ {
		m[i] = measurements.Measurement{Expected: make([]byte, 32)}
	}
	for i := range m[11].Expected {
		m[11].Expected[i] = image[0]
	}
	return provider.ReferenceValues{Measurements: m, Components: map[uint32][]string{11: {image}}}, nil
}

// Create implements provider.Platform: the nodes are listed as running, with addresses from
// 192.0.2.0/24 (TEST-NET-1), and the init secret is fixed per workspace.
func (p *Platform) Create(_ context.Context, req provider.CreateRequest) (provider.Provider, error) {
	if req.UnexpectedWorkerBootstrapper != "" {
		return nil, errors.New("the fake provider boots no images, so no unexpected one either")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.clusters[req.Workspace]; ok {
		return nil, fmt.Errorf("%s has a fake cluster", req.Workspace)
	}
	// The roots a real platform certifies its nodes' AKs with; no node ever gets a key of it.
	ca, err := akca.New("fake AK CA", time.Now(), time.Hour)
	if err != nil {
		return nil, err
	}
	caPEM, _, err := ca.PEM()
	if err != nil {
		return nil, err
	}
	c := &Cluster{Secret: []byte("init secret of " + req.Workspace), akRoots: caPEM}
	for i, n := range req.Nodes {
		c.nodes = append(c.nodes, provider.Node{
			NodeSpec: n, IPs: []netip.Addr{netip.AddrFrom4([4]byte{192, 0, 2, byte(10 + i)})},
			State: provider.Running, Boots: 1, BootedAt: time.Now(),
		})
	}
	p.clusters[req.Workspace] = c
	return c, nil
}

// Open implements provider.Platform.
func (p *Platform) Open(workspace string) (provider.Provider, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c, ok := p.clusters[workspace]
	if !ok {
		return nil, fmt.Errorf("no fake cluster in %s: %w", workspace, provider.ErrNotRunning)
	}
	return c, nil
}

// InitSecret implements provider.Platform.
func (p *Platform) InitSecret(workspace string) ([]byte, error) {
	c, err := p.Open(workspace)
	if err != nil {
		return nil, err
	}
	return c.(*Cluster).Secret, nil
}

// Remove implements provider.Platform.
func (p *Platform) Remove(_ context.Context, workspace string) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c, ok := p.clusters[workspace]
	if !ok {
		return 0, nil
	}
	delete(p.clusters, workspace)
	return len(c.nodes), nil
}

// Cluster is one fake cluster: a list of nodes.
type Cluster struct {
	// Secret is the init secret.
	Secret []byte

	akRoots []byte
	mu      sync.Mutex
	nodes   []provider.Node
}

// CreateNodes implements provider.Provider.
func (c *Cluster) CreateNodes(_ context.Context, specs []provider.NodeSpec) ([]provider.Node, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []provider.Node
	for _, s := range specs {
		n := provider.Node{NodeSpec: s, IPs: []netip.Addr{netip.AddrFrom4([4]byte{192, 0, 2, byte(10 + len(c.nodes))})}, State: provider.Running, Boots: 1}
		c.nodes = append(c.nodes, n)
		out = append(out, n)
	}
	return out, nil
}

// Nodes implements provider.Provider.
func (c *Cluster) Nodes(context.Context) ([]provider.Node, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.nodes), nil
}

// RebootNode implements provider.Provider.
func (c *Cluster) RebootNode(_ context.Context, name string) error {
	return c.node(name, func(n *provider.Node) { n.Boots++; n.State = provider.Running })
}

// ShutdownNode implements provider.NodeShutdowner: the node is Stopped until RebootNode.
func (c *Cluster) ShutdownNode(_ context.Context, name string) error {
	return c.node(name, func(n *provider.Node) { n.State = provider.Stopped })
}

// DeleteNode implements provider.Provider.
func (c *Cluster) DeleteNode(_ context.Context, name string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := slices.IndexFunc(c.nodes, func(n provider.Node) bool { return n.Name == name })
	if i < 0 {
		return fmt.Errorf("%s: %w", name, provider.ErrNoNode)
	}
	c.nodes = slices.Delete(c.nodes, i, i+1)
	return nil
}

func (c *Cluster) node(name string, f func(*provider.Node)) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range c.nodes {
		if c.nodes[i].Name == name {
			f(&c.nodes[i])
			return nil
		}
	}
	return fmt.Errorf("%s: %w", name, provider.ErrNoNode)
}

// Stop implements provider.Provider.
func (c *Cluster) Stop(context.Context) error { return c.setAll(provider.Stopped) }

// Start implements provider.Provider.
func (c *Cluster) Start(context.Context) error { return c.setAll(provider.Running) }

func (c *Cluster) setAll(s provider.NodeState) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range c.nodes {
		c.nodes[i].State = s
	}
	return nil
}

// Endpoints implements provider.Provider: an address nothing listens on.
func (c *Cluster) Endpoints(context.Context) (provider.Endpoints, error) {
	return provider.Endpoints{APIServer: "192.0.2.1:6443"}, nil
}

// Dialer implements provider.Provider: nothing answers.
func (c *Cluster) Dialer() func(context.Context, string) (net.Conn, error) {
	return func(_ context.Context, addr string) (net.Conn, error) {
		return nil, fmt.Errorf("dialing %s: the fake provider runs nothing", addr)
	}
}

// Destroy implements provider.Provider.
func (c *Cluster) Destroy(context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nodes = nil
	return nil
}

// Attestation implements provider.Provider: the roots of the cluster's AK CA, which
// certifies nothing (no node runs).
func (c *Cluster) Attestation(context.Context) (provider.Attestation, error) {
	return provider.Attestation{Variant: Variant, AKRootsPEM: c.akRoots}, nil
}

// rules are the fake's configuration rules: only its variant.
type rules struct{}

func (rules) Variants() []variant.Variant                                            { return []variant.Variant{Variant} }
func (rules) CheckSettings(map[string]any, variant.Variant) []*strictyaml.FieldError { return nil }
func (rules) CheckNodes(int, int) error                                              { return nil }
func (rules) CheckNetworks(netip.Prefix, netip.Prefix, int) []*strictyaml.FieldError { return nil }
