package cli

import (
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/provider/local/cluster"
	"github.com/openconstellation/constellation/internal/state"
)

// platformOf returns the platform that runs the workspace's cluster: the one seam between
// the CLI and a platform (provider.Provider). Only creating a cluster is platform-specific
// (createCluster); everything after it goes through this interface and the state file.
func platformOf(workspace string, st *state.State) (provider.Provider, error) {
	switch st.Provider {
	case state.ProviderLocal:
		exe, err := os.Executable()
		if err != nil {
			return nil, err
		}
		return &cluster.Local{Dir: filepath.Join(workspace, miniDir), Exe: exe}, nil
	default:
		return nil, fmt.Errorf("%s: provider %q is not supported by this CLI", state.FileName, st.Provider)
	}
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
