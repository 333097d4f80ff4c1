package cli

import (
	"fmt"
	"net"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

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

// pacedTimeout is a command's bound: its --timeout when given, else its default times the
// pace of the workspace's platform (provider.Paced: machines under emulation), said once on
// standard error so that the user knows how long it may wait.
func pacedTimeout(cmd *cobra.Command, workspace string, timeout time.Duration) time.Duration {
	if cmd.Flags().Changed("timeout") {
		return timeout
	}
	st, err := state.Load(filepath.Join(workspace, state.FileName))
	if err != nil {
		return timeout
	}
	p, err := providerOf(st)
	if err != nil {
		return timeout
	}
	paced, ok := p.(provider.Paced)
	if !ok {
		return timeout
	}
	f := paced.TimeoutFactor(workspace)
	if f <= 1 {
		return timeout
	}
	scaled := timeout * time.Duration(f)
	fmt.Fprintf(cmd.ErrOrStderr(), "the %s platform's machines are emulated: waiting up to %s, %d times the default (--timeout sets another bound)\n", p.Name(), scaled, f)
	return scaled
}
