package cli

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/state"
)

// planScaleCase is one case of TestPlanScale.
type planScaleCase struct {
	nodes         []state.Node
	removed       []state.RemovedNode
	cp, workers   int
	prefer        []string // apply --remove
	outdated      []string // nodes booting another image than the configured
	wantAdd       []string
	wantRemove    []string
	wantErrSubstr string
}

// planScaleCases are the cases of TestPlanScale.
func planScaleCases() map[string]planScaleCase {
	node := func(name string, role metadata.Role, i byte) state.Node {
		return state.Node{Name: name, Role: role, IPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 42, 0, 10 + i})}}
	}
	base := []state.Node{
		node("control-plane-0", metadata.ControlPlane, 0),
		node("worker-0", metadata.Worker, 1),
		node("worker-1", metadata.Worker, 2),
	}
	threeCPs := append(append([]state.Node{}, base...), node("control-plane-1", metadata.ControlPlane, 4), node("control-plane-2", metadata.ControlPlane, 5))
	other := node("worker-other", metadata.Worker, 3)
	other.Unexpected = true

	return map[string]planScaleCase{
		"as configured": {nodes: base, cp: 1, workers: 2},
		"unexpected nodes do not count": {
			nodes: append(append([]state.Node{}, base...), other), cp: 1, workers: 2,
		},
		"add a worker": {nodes: base, cp: 1, workers: 3, wantAdd: []string{"worker-2"}},
		"names of removed nodes are never reused": {
			nodes: base, cp: 1, workers: 4,
			removed: []state.RemovedNode{{Name: "worker-2", Role: metadata.Worker}, {Name: "worker-5", Role: metadata.Worker}},
			wantAdd: []string{"worker-6", "worker-7"},
		},
		"remove the newest workers first": {nodes: base, cp: 1, workers: 0, wantRemove: []string{"worker-1", "worker-0"}},
		"grow the control planes":         {nodes: base, cp: 3, workers: 2, wantAdd: []string{"control-plane-1", "control-plane-2"}},
		"shrink the control planes, newest first": {
			nodes: threeCPs, cp: 1, workers: 2, wantRemove: []string{"control-plane-2", "control-plane-1"},
		},
		"--remove control-plane-0 first, then the newest": {
			nodes: threeCPs, cp: 1, workers: 2, prefer: []string{"control-plane-0"}, wantRemove: []string{"control-plane-0", "control-plane-2"},
		},
		"--remove in the order named, across roles": {
			nodes: threeCPs, cp: 1, workers: 0, prefer: []string{"worker-0", "control-plane-1", "control-plane-0"},
			wantRemove: []string{"control-plane-1", "control-plane-0", "worker-0", "worker-1"},
		},
		"--remove of a newer node than the newest": {
			nodes: append(append([]state.Node{}, threeCPs...), node("control-plane-10", metadata.ControlPlane, 6)), cp: 3, workers: 2,
			prefer: []string{"control-plane-1"}, wantRemove: []string{"control-plane-1"},
		},
		"an interrupted upgrade: the outdated node goes, not its newer replacement": {
			nodes: append(append([]state.Node{}, base...), node("control-plane-1", metadata.ControlPlane, 6)), cp: 1, workers: 2,
			outdated: []string{"control-plane-0", "worker-0", "worker-1"}, wantRemove: []string{"control-plane-0"},
		},
		"--remove before outdated nodes": {
			nodes: threeCPs, cp: 1, workers: 2, prefer: []string{"control-plane-2"}, outdated: []string{"control-plane-0"},
			wantRemove: []string{"control-plane-2", "control-plane-0"},
		},
		"--remove of a node apply keeps": {
			nodes: threeCPs, cp: 2, workers: 2, prefer: []string{"control-plane-0", "control-plane-1"},
			wantErrSubstr: "--remove names 2 control-plane node(s), but constellation-conf.yaml removes 1 of them",
		},
		"--remove without a scale-down": {
			nodes: base, cp: 1, workers: 2, prefer: []string{"worker-0"},
			wantErrSubstr: "--remove names 1 worker node(s), but constellation-conf.yaml removes 0 of them",
		},
		"--remove of an unknown node": {nodes: base, cp: 1, workers: 1, prefer: []string{"worker-9"}, wantErrSubstr: "--remove worker-9: no such node"},
		"--remove twice":              {nodes: base, cp: 1, workers: 0, prefer: []string{"worker-0", "worker-0"}, wantErrSubstr: "--remove worker-0: named twice"},
		"both ways at once":           {nodes: base, cp: 2, workers: 1, wantAdd: []string{"control-plane-1"}, wantRemove: []string{"worker-1"}},
		"no control plane":            {nodes: base, cp: 0, workers: 2, wantErrSubstr: "at least one control plane"},
	}
}

func TestPlanScale(t *testing.T) {
	for name, tc := range planScaleCases() {
		t.Run(name, func(t *testing.T) {
			conf := &config.Config{Provider: config.ProviderFor(state.ProviderLocal, config.ProviderBlock{ControlPlanes: tc.cp, Workers: tc.workers, Image: "/image"})}
			st := &state.State{Nodes: tc.nodes, Removed: tc.removed}
			plan, err := planScale(conf, st, conf.Provider.Block().ImagePath("/workspace"), tc.prefer, tc.outdated)
			if tc.wantErrSubstr != "" {
				require.ErrorContains(t, err, tc.wantErrSubstr)
				return
			}
			require.NoError(t, err)
			var add, remove []string
			for _, a := range plan.add {
				add = append(add, a.Name)
				assert.Equal(t, "/image", a.Image)
			}
			for _, r := range plan.remove {
				remove = append(remove, r.Name)
			}
			assert.Equal(t, tc.wantAdd, add)
			assert.Equal(t, tc.wantRemove, remove)
			assert.Equal(t, len(tc.wantAdd) == 0 && len(tc.wantRemove) == 0, plan.empty())
		})
	}
}

func TestOnlyControlPlane(t *testing.T) {
	n := func(name string, role metadata.Role) state.Node { return state.Node{Name: name, Role: role} }
	one := &state.State{Nodes: []state.Node{n("control-plane-0", metadata.ControlPlane), n("worker-0", metadata.Worker)}}
	two := &state.State{Nodes: []state.Node{n("control-plane-0", metadata.ControlPlane), n("control-plane-3", metadata.ControlPlane), n("worker-0", metadata.Worker)}}
	testCases := map[string]struct {
		st   *state.State
		node string
		want bool
	}{
		"the only control plane":         {one, "control-plane-0", true},
		"a worker":                       {one, "worker-0", false},
		"one of two control planes":      {two, "control-plane-0", false},
		"the other of two":               {two, "control-plane-3", false},
		"a node the state does not know": {one, "control-plane-9", false},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, onlyControlPlane(tc.st, tc.node))
		})
	}
}
