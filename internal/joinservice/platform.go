package joinservice

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/untrusted"
)

// Node is what the platform says about an attested peer.
type Node struct {
	Name string
	// Addresses are the node's IPs; the kubelet certificate may name only these.
	Addresses []netip.Addr
	// ControlPlane nodes may receive the control-plane CA keys.
	ControlPlane bool
}

// Platform tells the join service who an attested peer is. This is the seam to a cloud or the
// local provider: on a cloud the identity comes from the instance identity in the evidence and
// the cloud API; on the local provider from the certified AK and the provider's metadata.
type Platform interface {
	// Node returns the node that presented peer's evidence from remote, or an error when the
	// platform does not know it.
	Node(ctx context.Context, peer *attestation.Verified, remote netip.Addr) (Node, error)
}

// Directory looks nodes up by name.
type Directory interface {
	Lookup(ctx context.Context, name string) (Node, error)
}

// CertifiedNames identifies a peer by the name in its AK certificate, which the platform
// issued for that node when it created it (the local provider does, see akca). The name is
// therefore bound to the key that signed the evidence, and a node cannot claim another's.
type CertifiedNames struct {
	Directory Directory
}

// Node implements Platform.
func (c CertifiedNames) Node(ctx context.Context, peer *attestation.Verified, _ netip.Addr) (Node, error) {
	if !peer.SignerCertified || peer.SignerName == "" {
		return Node{}, errors.New("the evidence's signing key carries no platform certificate naming the node")
	}
	n, err := c.Directory.Lookup(ctx, peer.SignerName)
	if err != nil {
		return Node{}, fmt.Errorf("node %s: %w", untrusted.Quote(peer.SignerName), err)
	}
	if n.Name != peer.SignerName {
		return Node{}, fmt.Errorf("directory returned node %q for %s", n.Name, untrusted.Quote(peer.SignerName))
	}
	// The role in the certificate is the platform's word at the node's creation; the
	// directory's is its word now. A node gets control-plane keys only if both agree.
	if !peer.SignerRole.Valid() {
		return Node{}, fmt.Errorf("node %q: its AK certificate names no role", peer.SignerName)
	}
	if certifiedCP := peer.SignerRole == metadata.ControlPlane; certifiedCP != n.ControlPlane {
		return Node{}, fmt.Errorf("node %q: its AK certificate says %s, the platform lists it as control plane: %t", peer.SignerName, peer.SignerRole, n.ControlPlane)
	}
	return n, nil
}

// StaticDirectory is a fixed set of nodes, keyed by name.
type StaticDirectory map[string]Node

// Lookup implements Directory.
func (d StaticDirectory) Lookup(_ context.Context, name string) (Node, error) {
	n, ok := d[name]
	if !ok {
		return Node{}, errors.New("unknown to the platform")
	}
	return n, nil
}

// ListerDirectory looks nodes up in the platform's instance list (the local provider's
// metadata service, a cloud's instance API). It asks on every lookup: nodes are added while
// the service runs, and a join is rare enough that the request costs nothing.
type ListerDirectory struct {
	Lister metadata.Lister
}

// Lookup implements Directory.
func (d ListerDirectory) Lookup(ctx context.Context, name string) (Node, error) {
	instances, err := d.Lister.Instances(ctx)
	if err != nil {
		return Node{}, fmt.Errorf("listing the platform's instances: %w", err)
	}
	for _, inst := range instances {
		if inst.Name != name {
			continue
		}
		if err := inst.Validate(); err != nil {
			return Node{}, err
		}
		return Node{Name: inst.Name, Addresses: inst.IPs, ControlPlane: inst.Role == metadata.ControlPlane}, nil
	}
	return Node{}, errors.New("unknown to the platform")
}
