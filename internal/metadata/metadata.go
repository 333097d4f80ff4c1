// Package metadata is what a node learns from its platform before it has a cluster: who it
// is, where the join service may be, and how to recognize a legitimate init request. Clouds
// serve this from their instance-metadata services; the local provider serves it to its
// sandbox nodes. The interface is small on purpose, so every platform can implement it.
//
// Metadata is not trusted for anything security-relevant beyond what its platform vouches
// for: the join service is verified by attestation (the endpoints only say where to try),
// and the init-secret hash only gates who may ask the node to initialize, in addition to
// the attested channel.
package metadata

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"github.com/openconstellation/constellation/pkg/attestation"
)

// Role is a node's role in the cluster. It is defined with the evidence it is certified in
// (pkg/attestation), so verifiers outside this module can name it.
type Role = attestation.Role

// Roles.
const (
	ControlPlane = attestation.RoleControlPlane
	Worker       = attestation.RoleWorker
)

// Instance describes one node.
type Instance struct {
	// Name is the node's name: its hostname and Kubernetes node name.
	Name string
	// Role is the node's role.
	Role Role
	// IPs are the node's addresses, the first being the one Kubernetes advertises.
	IPs []netip.Addr
}

// Validate checks that an instance description is usable.
func (i Instance) Validate() error {
	var problems []error
	if i.Name == "" {
		problems = append(problems, errors.New("no name"))
	}
	if !i.Role.Valid() {
		problems = append(problems, fmt.Errorf("role %q, want %s or %s", i.Role, ControlPlane, Worker))
	}
	if len(i.IPs) == 0 {
		problems = append(problems, errors.New("no IP address"))
	}
	for _, ip := range i.IPs {
		if !ip.IsValid() || ip.IsUnspecified() {
			problems = append(problems, fmt.Errorf("unusable IP address %v", ip))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("instance metadata %q: %w", i.Name, errors.Join(problems...))
	}
	return nil
}

// Provider is the platform's metadata as a node sees it.
type Provider interface {
	// Self describes this node.
	Self(ctx context.Context) (Instance, error)
	// JoinEndpoints returns the join-service endpoints (host:port) to try, in order of
	// preference. Empty while no control-plane node exists.
	JoinEndpoints(ctx context.Context) ([]string, error)
	// InitSecretHash returns the bcrypt hash of the init secret the CLI holds.
	InitSecretHash(ctx context.Context) ([]byte, error)
	// APIEndpoint returns host:port of the cluster's stable Kubernetes API endpoint (the
	// platform's load balancer in front of every control plane), which becomes kubeadm's
	// controlPlaneEndpoint at init; "" if the platform has none, and then the first control
	// plane's address is the endpoint. Like the join endpoints it only says where to connect:
	// clients verify the API server's certificate.
	APIEndpoint(ctx context.Context) (string, error)
}

// Static is metadata fixed at construction: for platforms whose metadata is a file the
// provider wrote, and for tests.
type Static struct {
	Instance  Instance
	Endpoints []string
	Hash      []byte
	// API is the stable API endpoint (APIEndpoint); "" for none.
	API string

	mu sync.Mutex // guards Endpoints against SetJoinEndpoints
}

// SetJoinEndpoints replaces the endpoints while the provider is in use.
func (s *Static) SetJoinEndpoints(endpoints []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.Endpoints = endpoints
}

// Self implements Provider.
func (s *Static) Self(context.Context) (Instance, error) { return s.Instance, nil }

// JoinEndpoints implements Provider.
func (s *Static) JoinEndpoints(context.Context) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.Endpoints...), nil
}

// APIEndpoint implements Provider.
func (s *Static) APIEndpoint(context.Context) (string, error) { return s.API, nil }

// InitSecretHash implements Provider.
func (s *Static) InitSecretHash(context.Context) ([]byte, error) { return s.Hash, nil }

// Lister lists every instance of the cluster's platform: the join service uses it to learn
// the role and addresses of a node whose name the platform certified.
type Lister interface {
	Instances(ctx context.Context) ([]Instance, error)
}
