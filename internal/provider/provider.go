// Package provider is the one seam between the CLI and a platform that runs a cluster's
// nodes: it creates, lists, reboots and deletes nodes, stops and starts the whole cluster,
// and tells the CLI where the cluster's endpoints are and how to reach them.
//
// The CLI depends only on this interface and Platform (platform.go), the part that creates
// a cluster; the local sandbox provider (internal/provider/local/platform and
// internal/provider/local/cluster) implements them today, clouds later, each registered in
// internal/provider/catalog (docs/providers.md). Nothing here is trusted
// for security: what a node runs is proven by its attestation, never by what the provider
// says. The provider's view is what a cloud console shows: which machines exist, whether they
// run, and what the machine reported about itself (a cloud's guest attributes or serial
// console), for diagnosis.
package provider

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"time"

	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// NodeSpec is a node to create.
type NodeSpec struct {
	// Name is the node's name (hostname and Kubernetes node name). Names are never reused
	// within a cluster: a removed node's identity stays refused.
	Name string `json:"name"`
	// Role is control-plane or worker.
	Role metadata.Role `json:"role"`
	// Image is the node image to boot (local provider: a node image directory).
	Image string `json:"image"`
	// KubernetesVersions are further Kubernetes versions whose container images the node can
	// run besides its image's own: a node of an upgrade's release joins a cluster that still
	// runs the previous version (its control plane at first, kube-proxy and CoreDNS until
	// every node runs the new one). A cloud's node pulls them from a registry; the local
	// provider imports them at each boot.
	KubernetesVersions []string `json:"kubernetesVersions,omitempty"`
	// Unexpected marks a node that is not expected to be admitted (tests: a node booting an
	// image that differs from the reference values); the CLI reports it instead of waiting.
	Unexpected bool `json:"unexpected,omitempty"`
}

// NodeState is the platform's view of a node.
type NodeState string

// Node states.
const (
	// Booting: the machine was started and its bootstrapper has not reported yet.
	Booting NodeState = "booting"
	// Running: the machine runs (see Node.Reported for what its bootstrapper says).
	Running NodeState = "running"
	// Rebooting: the platform is restarting the machine (asked for, or after a failure).
	Rebooting NodeState = "rebooting"
	// Stopped: the machine is off; its disks are kept.
	Stopped NodeState = "stopped"
	// Failed: the machine could not be started; Node.Detail says why.
	Failed NodeState = "failed"
)

// Node is one node as the platform sees it.
type Node struct {
	NodeSpec
	// IPs are the node's addresses, the first being the one Kubernetes advertises.
	IPs   []netip.Addr `json:"ips"`
	State NodeState    `json:"state"`
	// Reported is the last phase the node's bootstrapper reported through the platform's
	// metadata (for example waiting-for-recovery); empty if it reported nothing this boot.
	Reported string `json:"reported,omitempty"`
	// ReportedDetail is the bootstrapper's explanation of Reported, when it gave one (for
	// example why its TPM cannot quote); escaped, one line.
	ReportedDetail string `json:"reportedDetail,omitempty"`
	// Detail explains State (for example why the machine was rebooted or failed).
	Detail string `json:"detail,omitempty"`
	// Boots counts the machine's boots (1 after creation); BootedAt is the last one.
	Boots    int       `json:"boots"`
	BootedAt time.Time `json:"bootedAt,omitzero"`
	// Events are the platform's recent events of the node (newest last), such as a reboot
	// after the bootstrapper died.
	Events []Event `json:"events,omitempty"`
}

// Event is something the platform did to or saw of a node.
type Event struct {
	Time    time.Time `json:"time"`
	Message string    `json:"message"`
}

// Endpoints are where the CLI reaches the cluster.
type Endpoints struct {
	// APIServer is host:port of the Kubernetes API server as reachable from the CLI's host.
	APIServer string `json:"apiServer"`
	// ClusterAPIServer is host:port of the cluster's stable API endpoint as its nodes reach
	// it (a load balancer in front of every control plane: kubeadm's controlPlaneEndpoint);
	// "" if the platform has none. For messages: the CLI dials APIServer.
	ClusterAPIServer string `json:"clusterAPIServer,omitempty"`
}

// Ports on a node that the CLI dials (through Provider.Dialer).
const (
	InitPort         = 9000
	RecoverPort      = 9999
	VerificationPort = 30081
	JoinPort         = 30090
)

// Provider is a platform running one cluster's nodes.
type Provider interface {
	// CreateNodes creates and boots nodes. It returns once the platform started them (their
	// bootstrappers run), not when they joined.
	CreateNodes(ctx context.Context, nodes []NodeSpec) ([]Node, error)
	// Nodes lists the cluster's nodes.
	Nodes(ctx context.Context) ([]Node, error)
	// RebootNode restarts a node as a machine restarts: its TPM resets, the platform
	// measures its image again, and its bootstrapper starts fresh; its disk is kept.
	RebootNode(ctx context.Context, name string) error
	// DeleteNode removes a node and its disk. The platform no longer lists it, so the join
	// service refuses it from then on.
	DeleteNode(ctx context.Context, name string) error
	// Stop turns every node off and keeps their disks; Start turns them on again.
	Stop(ctx context.Context) error
	Start(ctx context.Context) error
	// Endpoints tells where the CLI reaches the cluster.
	Endpoints(ctx context.Context) (Endpoints, error)
	// Dialer connects to an address of the cluster's nodes (a node IP and port) from the
	// CLI's host.
	Dialer() func(ctx context.Context, addr string) (net.Conn, error)
	// Destroy removes the cluster: every node, disk, process and network of it.
	Destroy(ctx context.Context) error
	// Attestation says how the platform's nodes attest: the variant their images issue, and
	// the roots that certify their attestation keys. The CLI adds the configured reference
	// values and records the result in the cluster (pkg/attestation/choose.Reference).
	Attestation(ctx context.Context) (Attestation, error)
}

// Attestation is what a platform states about its nodes' evidence.
type Attestation struct {
	Variant variant.Variant
	// AKRootsPEM are the CA certificates that certify the nodes' attestation keys; empty if
	// the platform certifies none (the variant then authenticates keys another way, or not).
	AKRootsPEM []byte
}

// ErrNotRunning is wrapped by a Provider's errors when the cluster is stopped (or its
// platform side is gone), so the CLI can say "start it first".
var ErrNotRunning = errors.New("the cluster is not running")

// ErrNoNode is wrapped when a named node does not exist.
var ErrNoNode = errors.New("no such node")
