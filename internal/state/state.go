// Package state is constellation-state.yaml: what the CLI knows about the cluster it created
// in a workspace (provider, nodes, endpoints, and once initialized the cluster ID and the
// measurement salt). Nothing in it is secret: the master secret lives in its own file
// (kms.WriteMasterSecretFile, constellation-mastersecret.json, mode 0600).
//
// The file is read strictly (internal/strictyaml) and validated; it is written atomically,
// so a crash leaves the old state or the new one.
package state

import (
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/fileutil"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/statedisk"
	"github.com/openconstellation/constellation/internal/strictyaml"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// FileName is the name of the state file in a workspace.
const FileName = "constellation-state.yaml"

// Version1 is the schema version this package reads and writes.
const Version1 = "v1"

// MaxFileSize bounds the state file (it is read whole).
const MaxFileSize = 1 << 20

// Sizes of the initialized cluster's identifiers.
const (
	ClusterIDSize       = 32
	MeasurementSaltSize = 32
)

// ProviderLocal is the local provider: the one a state file may always name.
const ProviderLocal = "local"

// knownProvider reports whether name is a provider a state file may name: local, or one
// whose configuration rules are registered (the provider catalog, internal/provider/catalog,
// registers every provider it knows), and lists them all.
func knownProvider(name string) (bool, string) {
	names := config.RegisteredProviders()
	if !slices.Contains(names, ProviderLocal) {
		names = append(names, ProviderLocal)
		slices.Sort(names)
	}
	return slices.Contains(names, name), strings.Join(names, ", ")
}

// Phase is how far the cluster got.
type Phase string

// Phases, in order.
const (
	// Created: the provider created the nodes; the cluster is not initialized.
	Created Phase = "created"
	// Initialized: the first control plane accepted the init request; the cluster ID is known.
	Initialized Phase = "initialized"
)

// State is constellation-state.yaml.
type State struct {
	// Version is the schema version: v1.
	Version string `json:"version"`
	// Name is the cluster's name (from the configuration), a DNS label.
	Name string `json:"name"`
	// Provider created the nodes: the name of a registered provider (local).
	Provider string `json:"provider"`
	// Phase is created or initialized.
	Phase Phase `json:"phase"`
	// CreatedAt is when the provider created the nodes.
	CreatedAt time.Time `json:"createdAt"`
	// InitializedAt is when initialization succeeded; set exactly when Phase is initialized.
	InitializedAt time.Time `json:"initializedAt,omitzero"`
	// InitEndpoint is host:port of the bootstrapper init service the CLI initializes the
	// cluster through (on the first control plane).
	InitEndpoint string `json:"initEndpoint"`
	// APIServerEndpoint is host:port where the CLI reaches the Kubernetes API server.
	// Optional.
	APIServerEndpoint string `json:"apiServerEndpoint,omitempty"`
	// Nodes are the nodes the provider created, control planes first.
	Nodes []Node `json:"nodes"`
	// ClusterID identifies the initialized cluster (hex, 32 bytes): HKDF of the measurement
	// secret and salt (docs/design.md "2.3 Cluster ID"); nodes extend it into PCR 15. Set
	// exactly when Phase is initialized.
	ClusterID HexBytes `json:"clusterID,omitempty"`
	// MeasurementSalt is the salt sent at init (hex, 32 bytes). Not secret: with the master
	// secret it determines the cluster ID. Set exactly when Phase is initialized.
	MeasurementSalt HexBytes `json:"measurementSalt,omitempty"`
	// Release is the version of the signed release every node boots, once apply booted one
	// (docs/releases.md); empty while the nodes boot an image that is not a release. An
	// upgrade refuses an older release than this one unless --allow-downgrade.
	Release string `json:"release,omitempty"`
	// Removed are the nodes removed from the cluster (scaled down). Their names are never
	// given to a new node: the platform no longer lists them, and the join service refuses
	// them from then on.
	Removed []RemovedNode `json:"removed,omitempty"`
}

// RemovedNode is a node that was removed from the cluster.
type RemovedNode struct {
	Name      string        `json:"name"`
	Role      metadata.Role `json:"role"`
	RemovedAt time.Time     `json:"removedAt"`
}

// Node is one node of the cluster.
type Node struct {
	// Name is the node's hostname and Kubernetes node name (a DNS subdomain).
	Name string `json:"name"`
	// Role is control-plane or worker.
	Role metadata.Role `json:"role"`
	// IPs are the node's addresses, the first being the one Kubernetes advertises.
	IPs []netip.Addr `json:"ips"`
	// Unexpected marks a node created for tests that is not expected to be admitted (it
	// boots another image); it does not count towards the configured node counts.
	Unexpected bool `json:"unexpected,omitempty"`
	// Disk is the node's state disk (lower-case UUID), copied from the cluster's disk-owner
	// record (internal/diskowner) while the cluster runs. `constellation recover` sends a
	// control plane only the key of this disk: the cluster's records are down with the
	// cluster. Never replaced silently by another disk (see the CLI's disk records).
	Disk string `json:"disk,omitempty"`
}

// HexBytes is binary data written as a hex string.
type HexBytes []byte

// MarshalText encodes b as lower-case hex.
func (b HexBytes) MarshalText() ([]byte, error) { return []byte(hex.EncodeToString(b)), nil }

// UnmarshalText decodes hex.
func (b *HexBytes) UnmarshalText(text []byte) error {
	out, err := hex.DecodeString(string(text))
	if err != nil {
		return fmt.Errorf("not hex: %w", err)
	}
	*b = out
	return nil
}

// Parse decodes a state file strictly. It does not validate it.
func Parse(data []byte) (*State, error) {
	if len(data) > MaxFileSize {
		return nil, fmt.Errorf("state has %d bytes, more than the limit of %d", len(data), MaxFileSize)
	}
	var s State
	if err := strictyaml.Unmarshal(data, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// ErrNoState is wrapped by Load's error when the workspace has no state file.
var ErrNoState = errors.New("no cluster state")

// Load reads, parses and validates the state file at path. A missing file gives an error
// wrapping ErrNoState and os.ErrNotExist.
func Load(path string) (*State, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s does not exist (no cluster was created in this workspace): %w", ErrNoState, path, err)
	}
	if err != nil {
		return nil, fmt.Errorf("reading cluster state: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("reading cluster state %s: %w", path, err)
	}
	s, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("cluster state %s is malformed:\n%w", path, err)
	}
	if err := s.Validate(); err != nil {
		return nil, fmt.Errorf("cluster state %s is invalid:\n%w", path, err)
	}
	return s, nil
}

const header = "# Constellation cluster state (schema %s), written by the CLI. Not secret; do not edit.\n"

// Marshal encodes s as YAML with a header comment.
func (s *State) Marshal() ([]byte, error) {
	body, err := strictyaml.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("encoding cluster state: %w", err)
	}
	return append(fmt.Appendf(nil, header, s.Version), body...), nil
}

// Write validates s and writes it to path atomically, replacing the previous state.
func Write(path string, s *State) error {
	if err := s.Validate(); err != nil {
		return fmt.Errorf("refusing to write an invalid cluster state:\n%w", err)
	}
	data, err := s.Marshal()
	if err != nil {
		return err
	}
	if err := fileutil.WriteAtomic(path, data, 0o644); err != nil {
		return fmt.Errorf("writing cluster state: %w", err)
	}
	return nil
}

// ClusterIDMarker is the value of the cluster-ID register of variant v that every node of
// this initialized cluster shows (docs/design.md "2.4 The initialized marker (PCR 15)"): what
// `constellation verify` compares a node's evidence with.
func (s *State) ClusterIDMarker(v variant.Variant) ([]byte, error) {
	if s.Phase != Initialized || len(s.ClusterID) != ClusterIDSize {
		return nil, fmt.Errorf("cluster %q is not initialized", s.Name)
	}
	if _, ok := v.ClusterIDRegister(); !ok {
		return nil, fmt.Errorf("variant %q has no cluster-ID register", v)
	}
	return v.ClusterIDMarker(s.ClusterID), nil
}

// ControlPlanes returns the control-plane nodes, in order.
func (s *State) ControlPlanes() []Node {
	var out []Node
	for _, n := range s.Nodes {
		if n.Role == metadata.ControlPlane {
			out = append(out, n)
		}
	}
	return out
}

// Validate checks every field and reports every problem (errors.Join of
// *strictyaml.FieldError), or nil. The checks, in the order their problems are reported:
//
//  1. the cluster's own fields: version, name, provider, creation time, endpoints;
//  2. the nodes: names, roles, addresses and disks, each unique, and a control plane;
//  3. the removed nodes: names never reused;
//  4. the phase and the fields only an initialized cluster has.
func (s *State) Validate() error {
	var p problems
	s.checkCluster(&p)
	names := s.checkNodes(&p)
	s.checkRemoved(&p, names)
	s.checkPhase(&p)
	return errors.Join(p...)
}

// problems collects the *strictyaml.FieldError of every problem Validate finds.
type problems []error

func (p *problems) bad(path, format string, args ...any) {
	*p = append(*p, &strictyaml.FieldError{Path: path, Err: fmt.Errorf(format, args...)})
}

func (s *State) checkCluster(p *problems) {
	switch s.Version {
	case Version1:
	case "":
		p.bad("version", "missing (this CLI reads %s)", Version1)
	default:
		p.bad("version", "%q is not supported (this CLI reads %s)", s.Version, Version1)
	}
	if s.Name == "" {
		p.bad("name", "missing")
	} else if errs := validation.IsDNS1123Label(s.Name); len(errs) > 0 {
		p.bad("name", "%q is not a DNS label: %v", s.Name, errs)
	}
	if ok, known := knownProvider(s.Provider); !ok {
		p.bad("provider", "%q is not a provider (known: %s)", s.Provider, known)
	}
	if s.CreatedAt.IsZero() {
		p.bad("createdAt", "missing")
	}
	if err := checkEndpoint(s.InitEndpoint); err != nil {
		p.bad("initEndpoint", "%w", err)
	}
	if s.APIServerEndpoint != "" {
		if err := checkEndpoint(s.APIServerEndpoint); err != nil {
			p.bad("apiServerEndpoint", "%w", err)
		}
	}
}

// nodesSeen is what the nodes before the one checked claimed: names, addresses and disks
// belong to one node each.
type nodesSeen struct {
	names map[string]int // name -> index
	ips   map[netip.Addr]string
	disks map[string]int
}

// checkNodes checks every node and returns the index of each valid name.
func (s *State) checkNodes(p *problems) map[string]int {
	if len(s.Nodes) == 0 {
		p.bad("nodes", "no nodes")
	}
	seen := nodesSeen{names: map[string]int{}, ips: map[netip.Addr]string{}, disks: map[string]int{}}
	controlPlanes := 0
	for i, n := range s.Nodes {
		if n.Role == metadata.ControlPlane {
			controlPlanes++
		}
		s.checkNode(p, i, n, &seen)
	}
	if len(s.Nodes) > 0 && controlPlanes == 0 {
		p.bad("nodes", "no control-plane node")
	}
	return seen.names
}

func (s *State) checkNode(p *problems, i int, n Node, seen *nodesSeen) {
	path := fmt.Sprintf("nodes[%d]", i)
	if n.Name == "" {
		p.bad(path+".name", "missing")
	} else if errs := validation.IsDNS1123Subdomain(n.Name); len(errs) > 0 {
		p.bad(path+".name", "%q is not a DNS name: %v", n.Name, errs)
	} else if first, dup := seen.names[n.Name]; dup {
		p.bad(path+".name", "%q is also the name of nodes[%d]", n.Name, first)
	} else {
		seen.names[n.Name] = i
	}
	if n.Role != metadata.ControlPlane && !n.Role.Valid() {
		p.bad(path+".role", "%q is not a role (known: %s, %s)", n.Role, metadata.ControlPlane, metadata.Worker)
	}
	if len(n.IPs) == 0 {
		p.bad(path+".ips", "no IP address")
	}
	for j, ip := range n.IPs {
		switch other, dup := seen.ips[ip]; {
		case !ip.IsValid() || ip.IsUnspecified():
			p.bad(fmt.Sprintf("%s.ips[%d]", path, j), "unusable address %v", ip)
		case dup:
			p.bad(fmt.Sprintf("%s.ips[%d]", path, j), "%s is also an address of %s", ip, other)
		default:
			seen.ips[ip] = n.Name
		}
	}
	if n.Disk == "" {
		return
	}
	switch j, dup := seen.disks[n.Disk]; {
	case !statedisk.ValidUUID(n.Disk):
		p.bad(path+".disk", "%q is not a lower-case UUID", n.Disk)
	case dup:
		// A disk belongs to one node: its key goes to that node only.
		p.bad(path+".disk", "%s is also the disk of nodes[%d]", n.Disk, j)
	case s.Phase != Initialized:
		p.bad(path+".disk", "set, but the cluster is not initialized (phase %s)", s.Phase)
	default:
		seen.disks[n.Disk] = i
	}
}

// checkRemoved checks the removed nodes; names maps the current nodes' names to their index.
func (s *State) checkRemoved(p *problems, names map[string]int) {
	for i, r := range s.Removed {
		path := fmt.Sprintf("removed[%d]", i)
		if errs := validation.IsDNS1123Subdomain(r.Name); len(errs) > 0 {
			p.bad(path+".name", "%q is not a DNS name: %v", r.Name, errs)
		} else if j, dup := names[r.Name]; dup {
			p.bad(path+".name", "%q is also the name of nodes[%d]: a removed node's name is never reused", r.Name, j)
		}
		if !r.Role.Valid() {
			p.bad(path+".role", "%q is not a role (known: %s, %s)", r.Role, metadata.ControlPlane, metadata.Worker)
		}
		if r.RemovedAt.IsZero() {
			p.bad(path+".removedAt", "missing")
		}
	}
}

func (s *State) checkPhase(p *problems) {
	switch s.Phase {
	case Created:
		for _, f := range []struct {
			path string
			set  bool
		}{{"initializedAt", !s.InitializedAt.IsZero()}, {"clusterID", s.ClusterID != nil}, {"measurementSalt", s.MeasurementSalt != nil}} {
			if f.set {
				p.bad(f.path, "set, but the cluster is not initialized (phase %s)", Created)
			}
		}
	case Initialized:
		if s.InitializedAt.IsZero() {
			p.bad("initializedAt", "missing (the cluster is initialized)")
		} else if s.InitializedAt.Before(s.CreatedAt) {
			p.bad("initializedAt", "%s is before createdAt %s", s.InitializedAt.Format(time.RFC3339), s.CreatedAt.Format(time.RFC3339))
		}
		if len(s.ClusterID) != ClusterIDSize {
			p.bad("clusterID", "has %d bytes, want %d", len(s.ClusterID), ClusterIDSize)
		}
		if len(s.MeasurementSalt) != MeasurementSaltSize {
			p.bad("measurementSalt", "has %d bytes, want %d", len(s.MeasurementSalt), MeasurementSaltSize)
		}
	case "":
		p.bad("phase", "missing (%s or %s)", Created, Initialized)
	default:
		p.bad("phase", "%q is not a phase (known: %s, %s)", s.Phase, Created, Initialized)
	}
}

// checkEndpoint checks a host:port.
func checkEndpoint(s string) error {
	if s == "" {
		return errors.New("missing")
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Errorf("%q is not host:port: %w", s, err)
	}
	if host == "" {
		return fmt.Errorf("%q has no host", s)
	}
	if _, err := netip.ParseAddr(host); err != nil {
		if errs := validation.IsDNS1123Subdomain(host); len(errs) > 0 {
			return fmt.Errorf("%q: host is neither an IP address nor a DNS name", s)
		}
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return fmt.Errorf("%q: port %q is not a number from 1 to 65535", s, port)
	}
	return nil
}
