package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/state"
)

// scalePlan is what apply changes in an initialized cluster's nodes.
type scalePlan struct {
	add    []provider.NodeSpec
	remove []state.Node
	// have and want count control planes and workers.
	haveCP, haveW, wantCP, wantW int
}

func (p scalePlan) empty() bool { return len(p.add) == 0 && len(p.remove) == 0 }

// planScale compares the state's nodes with the configured counts. New nodes get names that
// were never used in the cluster (a removed node's identity stays refused); removal takes the
// newest nodes of a role first, and never the first control plane (the cluster's
// controlPlaneEndpoint names it).
func planScale(conf *config.Config, st *state.State, workspace string) (scalePlan, error) {
	lc := conf.Provider.Local
	if lc == nil {
		return scalePlan{}, fmt.Errorf("%s: provider.local: the only provider is local", config.FileName)
	}
	image := lc.ImagePath(workspace)
	p := scalePlan{wantCP: lc.ControlPlanes, wantW: lc.Workers}
	byRole := map[metadata.Role][]state.Node{}
	for _, n := range st.Nodes {
		if !n.Unexpected {
			byRole[n.Role] = append(byRole[n.Role], n)
		}
	}
	p.haveCP, p.haveW = len(byRole[metadata.ControlPlane]), len(byRole[metadata.Worker])
	if p.wantCP < 1 {
		return p, fmt.Errorf("%s: provider.local.controlPlanes: a cluster needs at least one control plane", config.FileName)
	}
	for _, r := range []struct {
		role   metadata.Role
		prefix string
		want   int
	}{{metadata.ControlPlane, "control-plane-", p.wantCP}, {metadata.Worker, "worker-", p.wantW}} {
		have := byRole[r.role]
		next := nextIndex(st, r.prefix)
		for i := len(have); i < r.want; i++ {
			p.add = append(p.add, provider.NodeSpec{Name: fmt.Sprintf("%s%d", r.prefix, next), Role: r.role, Image: image})
			next++
		}
		if len(have) > r.want {
			// Newest first: the highest index.
			slices.SortFunc(have, func(a, b state.Node) int { return suffix(b.Name, r.prefix) - suffix(a.Name, r.prefix) })
			p.remove = append(p.remove, have[:len(have)-r.want]...)
		}
	}
	return p, nil
}

// nextIndex is one more than the highest index of any node, present or removed, named
// prefix<index>.
func nextIndex(st *state.State, prefix string) int {
	next := 0
	for _, n := range st.Nodes {
		next = max(next, suffix(n.Name, prefix)+1)
	}
	for _, n := range st.Removed {
		next = max(next, suffix(n.Name, prefix)+1)
	}
	return next
}

func suffix(name, prefix string) int {
	s, ok := strings.CutPrefix(name, prefix)
	if !ok {
		return -1
	}
	i, err := strconv.Atoi(s)
	if err != nil {
		return -1
	}
	return i
}

func (p scalePlan) print(out io.Writer) {
	fmt.Fprintf(out, "apply: the cluster has %d control plane(s) and %d worker(s); %s wants %d and %d:\n", p.haveCP, p.haveW, config.FileName, p.wantCP, p.wantW)
	for _, a := range p.add {
		fmt.Fprintf(out, "  + %s (new %s: created by the platform, admitted by the join service after attestation)\n", a.Name, a.Role)
	}
	for _, r := range p.remove {
		what := "drained, deleted from Kubernetes and the platform, refused from then on"
		if r.Role == metadata.ControlPlane {
			what = "etcd member removed (only if quorum holds), " + what
		}
		fmt.Fprintf(out, "  - %s (%s: %s)\n", r.Name, r.Role, what)
	}
}

// scaleOptions bound the waits of scaling.
type scaleOptions struct {
	drainTimeout time.Duration
}

// reconcile brings an initialized cluster's node counts to the configuration's: it says what
// it changes, then adds nodes (they join through the join service) and removes nodes.
func reconcile(ctx context.Context, out io.Writer, t *phaseTimer, workspace string, conf *config.Config, st *state.State, o scaleOptions) error {
	plan, err := planScale(conf, st, workspace)
	if err != nil {
		return err
	}
	restConfig, err := newKubeConfig(filepath.Join(workspace, AdminConfFile))
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		return err
	}
	if plan.empty() {
		fmt.Fprintf(out, "cluster %s (ID %x) has %d control plane(s) and %d worker(s), as configured: nothing to apply\n", st.Name, []byte(st.ClusterID), plan.haveCP, plan.haveW)
		return recordDisks(ctx, out, workspace, st, client)
	}
	plan.print(out)
	platform, err := platformOf(workspace, st)
	if err != nil {
		return err
	}
	statePath := filepath.Join(workspace, state.FileName)
	if len(plan.add) > 0 {
		created, err := platform.CreateNodes(ctx, plan.add)
		// Record what the platform made, even half-way: the state file is the record.
		if nodes, lerr := platform.Nodes(ctx); lerr == nil {
			recordNodes(st, nodes)
			if werr := state.Write(statePath, st); werr != nil {
				return errors.Join(err, werr)
			}
		}
		if err != nil {
			return err
		}
		want := map[string]bool{}
		for _, n := range created {
			want[n.Name] = true
		}
		t.phase("create", fmt.Sprintf("%d node(s) booting", len(created)))
		if err := waitNodesReady(ctx, out, t, client, st.Nodes, want); err != nil {
			return err
		}
	}
	for _, n := range plan.remove {
		if err := removeNode(ctx, out, t, client, restConfig, platform, n, o); err != nil {
			return fmt.Errorf("removing %s: %w", n.Name, err)
		}
		st.Removed = append(st.Removed, state.RemovedNode{Name: n.Name, Role: n.Role, RemovedAt: time.Now().UTC()})
		st.Nodes = slices.DeleteFunc(st.Nodes, func(s state.Node) bool { return s.Name == n.Name })
		if err := state.Write(statePath, st); err != nil {
			return err
		}
	}
	fmt.Fprintf(out, "applied: %d control plane(s) and %d worker(s)\n", plan.wantCP, plan.wantW)
	return recordDisks(ctx, out, workspace, st, client)
}

// recordDisks is apply's refresh of the disk records, once every node it added is Ready (and
// on every apply, so an apply that failed to record is repaired by the next).
func recordDisks(ctx context.Context, out io.Writer, workspace string, st *state.State, client kubernetes.Interface) error {
	report, err := refreshDisks(ctx, workspace, st, client)
	if err != nil {
		return fmt.Errorf("recording the nodes' disks (recover needs them; apply again to retry): %w", err)
	}
	printDiskReport(out, report)
	return nil
}
