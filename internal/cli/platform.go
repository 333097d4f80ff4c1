package cli

import (
	"fmt"
	"net"
	"path/filepath"

	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/provider/catalog"
	"github.com/openconstellation/constellation/internal/state"
)

// platformOf returns the platform that runs the workspace's cluster: the one seam between
// the CLI and a platform (provider.Provider), opened by the provider the state file names
// (internal/provider/catalog). Everything after creating the cluster goes through this
// interface and the state file.
func platformOf(workspace string, st *state.State) (provider.Provider, error) {
	p, err := providerOf(st)
	if err != nil {
		return nil, err
	}
	return p.Open(workspace)
}

// providerOf returns the provider that created the state's cluster.
func providerOf(st *state.State) (provider.Platform, error) {
	p, err := catalog.Lookup(st.Provider)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", state.FileName, err)
	}
	return p, nil
}

// loadState reads the workspace's state file and its platform.
func loadState(workspace string) (*state.State, provider.Provider, error) {
	st, err := state.Load(filepath.Join(workspace, state.FileName))
	if err != nil {
		return nil, nil, err
	}
	p, err := platformOf(workspace, st)
	if err != nil {
		return nil, nil, err
	}
	return st, p, nil
}

// recordNodes makes the state's node list the platform's: the state file is the one record of
// the cluster's nodes and endpoints the CLI works from. A node keeps its recorded disk: the
// platform does not know it (and is not asked: recover trusts only the cluster's records).
func recordNodes(st *state.State, nodes []provider.Node) {
	disks := map[string]string{}
	for _, n := range st.Nodes {
		disks[n.Name] = n.Disk
	}
	st.Nodes = st.Nodes[:0]
	for _, n := range nodes {
		st.Nodes = append(st.Nodes, state.Node{Name: n.Name, Role: n.Role, IPs: n.IPs, Unexpected: n.Unexpected, Disk: disks[n.Name]})
	}
}

// nodeEndpoint is host:port of a node's service port.
func nodeEndpoint(n state.Node, port int) string {
	return net.JoinHostPort(n.IPs[0].String(), fmt.Sprint(port))
}
