package cli

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/state"
)

// Every target names the node whose evidence it must return, so verify can refuse another
// node's evidence at that address.
func TestVerifyTargets(t *testing.T) {
	st := &state.State{Nodes: []state.Node{
		{Name: "control-plane-0", IPs: []netip.Addr{netip.MustParseAddr("10.42.0.10")}},
		{Name: "worker-0", IPs: []netip.Addr{netip.MustParseAddr("10.42.0.11")}},
	}}
	for name, tc := range map[string]struct {
		opts    verifyOptions
		want    []verifyTarget
		wantErr string
	}{
		"every node": {want: []verifyTarget{
			{Node: "control-plane-0", Endpoint: "10.42.0.10:30081"}, {Node: "worker-0", Endpoint: "10.42.0.11:30081"},
		}},
		"one node":                     {opts: verifyOptions{nodes: []string{"worker-0"}}, want: []verifyTarget{{Node: "worker-0", Endpoint: "10.42.0.11:30081"}}},
		"unknown node":                 {opts: verifyOptions{nodes: []string{"worker-9"}}, wantErr: "--node worker-9: no such node"},
		"endpoint of a node":           {opts: verifyOptions{endpoint: "10.42.0.11:30081"}, want: []verifyTarget{{Node: "worker-0", Endpoint: "10.42.0.11:30081"}}},
		"endpoint named by --node":     {opts: verifyOptions{endpoint: "127.0.0.1:30090", nodes: []string{"worker-0"}}, want: []verifyTarget{{Node: "worker-0", Endpoint: "127.0.0.1:30090"}}},
		"endpoint of no node":          {opts: verifyOptions{endpoint: "127.0.0.1:30090"}, wantErr: "name the node the endpoint must answer for with --node"},
		"endpoint with two nodes":      {opts: verifyOptions{endpoint: "127.0.0.1:30090", nodes: []string{"worker-0", "control-plane-0"}}, wantErr: "at most one --node"},
		"endpoint with unknown --node": {opts: verifyOptions{endpoint: "127.0.0.1:30090", nodes: []string{"worker-9"}}, wantErr: "no such node"},
		"endpoint without port":        {opts: verifyOptions{endpoint: "10.42.0.11"}, wantErr: "missing port"},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := verifyTargets(st, tc.opts)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}
