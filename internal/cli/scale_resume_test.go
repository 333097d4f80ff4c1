package cli

import (
	"context"
	"net/netip"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/openconstellation/constellation/internal/diskowner"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/state"
)

// machinesPlatform is a platform of machines by name, recording what it is asked.
type machinesPlatform struct {
	provider.Provider
	machines map[string]metadata.Role
	created  []string
	deleted  []string
}

func addrOf(name string) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 42, 0, byte(10 + len(name) + int(name[len(name)-1]-'0')*20)})
}

func (p *machinesPlatform) Nodes(context.Context) ([]provider.Node, error) {
	var out []provider.Node
	for _, name := range sortedKeys(p.machines) {
		out = append(out, provider.Node{NodeSpec: provider.NodeSpec{Name: name, Role: p.machines[name]}, IPs: []netip.Addr{addrOf(name)}, State: provider.Running})
	}
	return out, nil
}

func (p *machinesPlatform) CreateNodes(_ context.Context, specs []provider.NodeSpec) ([]provider.Node, error) {
	for _, s := range specs {
		p.machines[s.Name] = s.Role
		p.created = append(p.created, s.Name)
	}
	return nil, nil
}

func (p *machinesPlatform) DeleteNode(_ context.Context, name string) error {
	if _, ok := p.machines[name]; !ok {
		return provider.ErrNoNode
	}
	delete(p.machines, name)
	p.deleted = append(p.deleted, name)
	return nil
}

// What an apply killed at each step leaves, as the state file and the platform say it, and
// what the next apply's first step (syncWithPlatform) makes of it: every machine known to the
// state file, every node of the state file a machine, and the removals finished.
func TestApplyResumesAfterKill(t *testing.T) {
	node := func(name string, role metadata.Role) state.Node {
		return state.Node{Name: name, Role: role, IPs: []netip.Addr{addrOf(name)}}
	}
	cp0, w0, w1 := node("control-plane-0", metadata.ControlPlane), node("worker-0", metadata.Worker), node("worker-1", metadata.Worker)
	testCases := map[string]struct {
		stateNodes  []state.Node
		removed     []string
		machines    []string
		kubeNodes   []string // Node objects in Kubernetes
		wantNodes   []string
		wantRemoved []string
		wantDeleted []string // machines the platform was asked to delete
	}{
		"nothing interrupted": {
			stateNodes: []state.Node{cp0, w0}, machines: []string{"control-plane-0", "worker-0"}, kubeNodes: []string{"control-plane-0", "worker-0"},
			wantNodes: []string{"control-plane-0", "worker-0"},
		},
		"killed while the platform created a node: adopted": {
			stateNodes: []state.Node{cp0, w0}, machines: []string{"control-plane-0", "worker-0", "worker-1"}, kubeNodes: []string{"control-plane-0", "worker-0"},
			wantNodes: []string{"control-plane-0", "worker-0", "worker-1"},
		},
		"killed after the machine was deleted: the removal is finished": {
			stateNodes: []state.Node{cp0, w0, w1}, machines: []string{"control-plane-0", "worker-0"}, kubeNodes: []string{"control-plane-0", "worker-0", "worker-1"},
			wantNodes: []string{"control-plane-0", "worker-0"}, wantRemoved: []string{"worker-1"},
		},
		"killed after the Node object was deleted, before the machine": {
			// The next apply's plan removes worker-1 again (it is still in the state file);
			// syncWithPlatform leaves it to that.
			stateNodes: []state.Node{cp0, w0, w1}, machines: []string{"control-plane-0", "worker-0", "worker-1"}, kubeNodes: []string{"control-plane-0", "worker-0"},
			wantNodes: []string{"control-plane-0", "worker-0", "worker-1"},
		},
		"a removed node's machine is back": {
			stateNodes: []state.Node{cp0, w0}, removed: []string{"worker-1"}, machines: []string{"control-plane-0", "worker-0", "worker-1"}, kubeNodes: []string{"control-plane-0", "worker-0"},
			wantNodes: []string{"control-plane-0", "worker-0"}, wantRemoved: []string{"worker-1"}, wantDeleted: []string{"worker-1"},
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			ws := t.TempDir()
			now := time.Now().UTC()
			st := &state.State{
				Version: state.Version1, Name: "demo", Provider: state.ProviderLocal, Phase: state.Initialized,
				CreatedAt: now, InitializedAt: now, InitEndpoint: "10.42.0.10:9000",
				ClusterID: make([]byte, 32), MeasurementSalt: make([]byte, 32), Nodes: tc.stateNodes,
			}
			for _, r := range tc.removed {
				st.Removed = append(st.Removed, state.RemovedNode{Name: r, Role: metadata.Worker, RemovedAt: now})
			}
			statePath := filepath.Join(ws, state.FileName)
			require.NoError(t, state.Write(statePath, st))
			platform := &machinesPlatform{machines: map[string]metadata.Role{}}
			for _, m := range tc.machines {
				platform.machines[m] = metadata.Worker
			}
			client := fake.NewClientset()
			for _, n := range tc.kubeNodes {
				_, err := client.CoreV1().Nodes().Create(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{})
				require.NoError(t, err)
			}
			out := &lockedBuffer{}
			tm := newPhaseTimer(out)
			r := &reconciler{out: out, t: tm, prog: newProgress(tm), client: client, platform: platform, st: st, statePath: statePath,
				o: scaleOptions{drainTimeout: 10 * time.Second}}
			require.NoError(t, r.syncWithPlatform(t.Context()), out.String())

			loaded, err := state.Load(statePath)
			require.NoError(t, err)
			var nodes, removed []string
			for _, n := range loaded.Nodes {
				nodes = append(nodes, n.Name)
			}
			for _, n := range loaded.Removed {
				removed = append(removed, n.Name)
			}
			assert.ElementsMatch(t, tc.wantNodes, nodes, "state file's nodes\n%s", out)
			assert.ElementsMatch(t, tc.wantRemoved, removed, "state file's removed nodes")
			assert.ElementsMatch(t, tc.wantNodes, sortedKeys(platform.machines), "the platform's machines are the state file's nodes")
			assert.ElementsMatch(t, tc.wantDeleted, platform.deleted)
			for _, rm := range tc.wantRemoved {
				if slices.Contains(tc.removed, rm) {
					continue
				}
				_, err := client.CoreV1().Nodes().Get(t.Context(), rm, metav1.GetOptions{})
				assert.Error(t, err, "%s's Node object is deleted", rm)
				_, err = client.CoreV1().ConfigMaps(diskowner.Namespace).Get(t.Context(), diskowner.RemovedObjectName(rm), metav1.GetOptions{})
				assert.NoError(t, err, "%s's removal is recorded in the cluster", rm)
			}
		})
	}
}

// An apply killed after the platform created a node, before it was recorded: the next apply
// does not ask the platform for it again (the platform refuses an existing name).
func TestCreateNodesAsksOnlyForMissing(t *testing.T) {
	ws := t.TempDir()
	now := time.Now().UTC()
	st := &state.State{
		Version: state.Version1, Name: "demo", Provider: state.ProviderLocal, Phase: state.Initialized,
		CreatedAt: now, InitializedAt: now, InitEndpoint: "10.42.0.10:9000", ClusterID: make([]byte, 32), MeasurementSalt: make([]byte, 32),
		Nodes: []state.Node{{Name: "control-plane-0", Role: metadata.ControlPlane, IPs: []netip.Addr{addrOf("control-plane-0")}}},
	}
	statePath := filepath.Join(ws, state.FileName)
	platform := &machinesPlatform{machines: map[string]metadata.Role{"control-plane-0": metadata.ControlPlane, "worker-0": metadata.Worker}}
	out := &lockedBuffer{}
	tm := newPhaseTimer(out)
	r := &reconciler{out: out, t: tm, prog: newProgress(tm), platform: platform, st: st, statePath: statePath}
	require.NoError(t, r.createNodes(t.Context(), []provider.NodeSpec{{Name: "worker-0", Role: metadata.Worker}, {Name: "worker-1", Role: metadata.Worker}}))
	assert.Equal(t, []string{"worker-1"}, platform.created)
	loaded, err := state.Load(statePath)
	require.NoError(t, err)
	assert.Len(t, loaded.Nodes, 3)
}
