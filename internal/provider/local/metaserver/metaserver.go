// Package metaserver is the local provider's instance-metadata service (the API in
// docs/local-provider.md). Like a cloud's, it identifies the asking node by its source
// address on the private network, and tells it who it is, who its peers are, where the join
// service may be and the init-secret hash. It is not trusted for anything an attacker could
// gain from: the join service is verified by attestation, and the hash only gates who may ask
// for init, in addition to the attested channel.
package metaserver

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync"

	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/pkg/strictjson"
	"github.com/openconstellation/constellation/pkg/untrusted"
)

// Node is what the metadata service knows of a node. Beyond metadata.Instance it carries the
// local platform's per-node settings: the node's pod range and its cgroup (the kubelet's
// cgroupRoot), both assigned by the provider.
type Node struct {
	Name       string       `json:"name"`
	Role       string       `json:"role"`
	IPs        []netip.Addr `json:"ips"`
	PodCIDR    netip.Prefix `json:"podCIDR"`
	CgroupRoot string       `json:"cgroupRoot"`
}

// Server serves the metadata of one cluster.
type Server struct {
	mu        sync.RWMutex
	nodes     []Node
	endpoints []string
	hash      []byte
	// apiEndpoint is host:port of the cluster's stable API server endpoint.
	apiEndpoint string
	// reports are what nodes reported about themselves this boot, by node name.
	reports map[string]Report
	// volumes is the provider's volume storage; nil: no volume API.
	volumes Volumes
}

// New returns a server for nodes, join endpoints and the init-secret hash.
func New(nodes []Node, joinEndpoints []string, initSecretHash []byte) *Server {
	return &Server{nodes: nodes, endpoints: joinEndpoints, hash: initSecretHash, reports: map[string]Report{}}
}

// SetNodes replaces the node list (nodes added or removed while serving).
func (s *Server) SetNodes(nodes []Node, joinEndpoints []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nodes, s.endpoints = nodes, joinEndpoints
}

// SetAPIEndpoint sets the cluster's stable API server endpoint (host:port): the provider's
// load balancer, which kubeadm's controlPlaneEndpoint names.
func (s *Server) SetAPIEndpoint(endpoint string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.apiEndpoint = endpoint
}

// Handler returns the HTTP API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/self", func(w http.ResponseWriter, r *http.Request) {
		n, ok := s.lookup(r.RemoteAddr)
		if !ok {
			http.Error(w, "unknown node: no instance has the address "+r.RemoteAddr, http.StatusForbidden)
			return
		}
		writeJSON(w, n)
	})
	// The other answers go to nodes only, like the rest of a cloud's metadata.
	mux.HandleFunc("GET /v1/instances", s.nodesOnly(func() any { return s.nodes }))
	mux.HandleFunc("GET /v1/join-endpoints", s.nodesOnly(func() any { return append([]string{}, s.endpoints...) }))
	mux.HandleFunc("GET /v1/api-endpoint", s.nodesOnly(func() any { return map[string]string{"endpoint": s.apiEndpoint} }))
	mux.HandleFunc("GET /v1/init-secret-hash", s.nodesOnly(func() any { return map[string]string{"hash": string(s.hash)} }))
	// A node reports its bootstrapper's phase (as a cloud's guest attributes): diagnosis for
	// the operator, never trusted for anything.
	mux.HandleFunc("PUT /v1/self/report", func(w http.ResponseWriter, r *http.Request) {
		n, ok := s.lookup(r.RemoteAddr)
		if !ok {
			http.Error(w, "unknown node: no instance has the address "+r.RemoteAddr, http.StatusForbidden)
			return
		}
		var rep Report
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxReportBody))
		if err == nil {
			err = strictjson.UnmarshalIgnoreUnknown(body, &rep)
		}
		if err != nil {
			http.Error(w, "malformed report: "+err.Error(), http.StatusBadRequest)
			return
		}
		if !metadata.ValidPhase(rep.Phase) {
			http.Error(w, "malformed report: phase must match "+metadata.PhasePattern, http.StatusBadRequest)
			return
		}
		// The detail is the node's text and reaches the operator's terminal: one bounded line
		// without control characters.
		rep.Detail = untrusted.Text(rep.Detail)
		s.mu.Lock()
		s.reports[n.Name] = rep
		s.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})
	s.volumeHandlers(mux)
	return mux
}

// Report is what a node reports about itself.
type Report struct {
	// Phase is the bootstrapper's phase, such as waiting-for-recovery.
	Phase string `json:"phase"`
	// Detail explains the phase when it needs explaining (why the TPM cannot quote, and when
	// that clears); empty otherwise.
	Detail string `json:"detail,omitempty"`
}

// MaxDetailBytes bounds a report's detail as the node sends it; the server keeps at most
// untrusted.MaxTextBytes of it, escaped.
const MaxDetailBytes = 512

// maxReportBody bounds a report's request: a phase and a detail of MaxDetailBytes, each
// byte of which JSON may escape into six.
const maxReportBody = 4 << 10

// Report returns what node last reported (zero if nothing this boot).
func (s *Server) Report(node string) Report {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.reports[node]
}

// ClearReport forgets node's report (at its boot).
func (s *Server) ClearReport(node string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.reports, node)
}

// nodesOnly answers known nodes with answer(), read under the lock.
func (s *Server) nodesOnly(answer func() any) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if _, ok := s.lookup(r.RemoteAddr); !ok {
			http.Error(w, "unknown node: no instance has the address "+r.RemoteAddr, http.StatusForbidden)
			return
		}
		s.mu.RLock()
		defer s.mu.RUnlock()
		writeJSON(w, answer())
	}
}

func (s *Server) lookup(remote string) (Node, bool) {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		return Node{}, false
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return Node{}, false
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, n := range s.nodes {
		for _, a := range n.IPs {
			if a == ip.Unmap() {
				return n, true
			}
		}
	}
	return Node{}, false
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// Instance converts a Node to the platform-independent metadata.
func (n Node) Instance() metadata.Instance {
	return metadata.Instance{Name: n.Name, Role: metadata.Role(n.Role), IPs: n.IPs}
}
