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
	"k8s.io/client-go/rest"

	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/retry"
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
// nodes named in prefer first (apply --remove), then those in outdated (booting another image
// than the configured: an upgrade would replace them anyway, and an upgrade interrupted after
// its replacement joined resumes by removing the old node, not the new one), then the newest
// nodes of a role. Any node may go, control-plane-0 included: the cluster's API endpoint is
// the platform's load balancer, not a node.
func planScale(conf *config.Config, st *state.State, image string, prefer, outdated []string) (scalePlan, error) {
	lc := conf.Provider.Block()
	if lc == nil {
		return scalePlan{}, fmt.Errorf("%s: provider: configure exactly one provider", config.FileName)
	}
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
	if err := checkPreferred(prefer, byRole, map[metadata.Role]int{metadata.ControlPlane: p.wantCP, metadata.Worker: p.wantW}); err != nil {
		return p, err
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
			// Named ones first, in the order named, then outdated ones, then newest first:
			// the highest index.
			slices.SortStableFunc(have, func(a, b state.Node) int {
				ia, ib := slices.Index(prefer, a.Name), slices.Index(prefer, b.Name)
				switch {
				case ia >= 0 && ib >= 0:
					return ia - ib
				case ia >= 0:
					return -1
				case ib >= 0:
					return 1
				}
				if oa, ob := slices.Contains(outdated, a.Name), slices.Contains(outdated, b.Name); oa != ob {
					if oa {
						return -1
					}
					return 1
				}
				return suffix(b.Name, r.prefix) - suffix(a.Name, r.prefix)
			})
			p.remove = append(p.remove, have[:len(have)-r.want]...)
		}
	}
	return p, nil
}

// checkPreferred checks apply --remove's names against the nodes (by role) and the counts
// the configuration wants: each must be a node of the cluster, and a role may not have more
// named than the configuration removes of it (a name apply would not remove is a mistake the
// operator should hear of, not a silent no-op).
func checkPreferred(prefer []string, byRole map[metadata.Role][]state.Node, want map[metadata.Role]int) error {
	named := map[metadata.Role]int{}
	var problems []error
	for i, name := range prefer {
		if slices.Contains(prefer[:i], name) {
			problems = append(problems, fmt.Errorf("--remove %s: named twice", name))
			continue
		}
		var role metadata.Role
		for r, nodes := range byRole {
			if slices.ContainsFunc(nodes, func(n state.Node) bool { return n.Name == name }) {
				role = r
			}
		}
		if role == "" {
			problems = append(problems, fmt.Errorf("--remove %s: no such node in %s", name, state.FileName))
			continue
		}
		named[role]++
	}
	for role, n := range named {
		if drop := len(byRole[role]) - want[role]; n > drop {
			problems = append(problems, fmt.Errorf("--remove names %d %s node(s), but %s removes %d of them (it wants %d, the cluster has %d): lower the count in the configuration",
				n, role, config.FileName, max(drop, 0), want[role], len(byRole[role])))
		}
	}
	return errors.Join(problems...)
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
			what = "drained, shut down gracefully if etcd keeps its quorum without it, etcd member removed (only if quorum holds), deleted from Kubernetes and the platform, refused from then on"
		}
		fmt.Fprintf(out, "  - %s (%s: %s)\n", r.Name, r.Role, what)
	}
}

// scaleOptions bound the waits of scaling.
type scaleOptions struct {
	drainTimeout   time.Duration
	allowDowngrade bool
	// remove names nodes to remove before the newest (apply --remove).
	remove []string
	// deleteNodeLocalVolumes accepts destroying the node-local volumes of the nodes apply
	// removes or replaces (apply --delete-node-local-volumes); without it apply refuses to
	// remove such a node.
	deleteNodeLocalVolumes bool
}

// reconcile brings an initialized cluster's node counts to the configuration's: it says what
// it changes, then adds nodes (they join through the join service) and removes nodes.
//
// Every step is idempotent, so an apply that was interrupted anywhere (killed, its machine
// rebooted) is finished by the next: first the state file is made to agree with the
// platform (syncWithPlatform: machines made for an earlier apply are adopted, removals it
// began are finished), then the plan is made from that, and apply waits until every node is
// Ready whether or not it changes anything. Transient failures of the API server and the
// platform are retried (internal/retry).
func reconcile(ctx context.Context, out io.Writer, t *phaseTimer, workspace string, conf *config.Config, st *state.State, o scaleOptions) error {
	// A release is checked whole (signature, policy, node image) before anything changes.
	image, rel, err := configuredImage(ctx, workspace, conf, st.Release, o.allowDowngrade)
	if err != nil {
		return err
	}
	// So is whether its nodes can join the running cluster at all (their trust of its join
	// services), before anything else is read or changed.
	if rel != nil {
		if err := checkJoinTrust(ctx, workspace, conf, st, rel); err != nil {
			return err
		}
	}
	restConfig, err := newKubeConfig(filepath.Join(workspace, AdminConfFile))
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		return err
	}
	platform, err := platformOf(workspace, st)
	if err != nil {
		return err
	}
	warnServiceLB(ctx, out, workspace, st, client)
	prog := newProgress(t)
	stop := prog.start(ctx)
	defer stop()
	r := &reconciler{out: out, t: t, prog: prog, client: client, restConfig: restConfig, platform: platform,
		st: st, statePath: filepath.Join(workspace, state.FileName), o: o}
	u := &upgrade{reconciler: r, workspace: workspace, conf: conf, image: image, release: rel}
	if err := u.reconcileNodes(ctx); err != nil {
		return err
	}
	return recordDisks(ctx, out, workspace, st, client)
}

// reconcileNodes is apply's work on an initialized cluster's nodes, once the release is
// checked and the clients made: the state file made to agree with the platform, every check
// that may refuse (the upgrade's, the node counts', the node-local volumes' of the nodes that
// would go) before anything changes, then the registry mirrors, the scaling and the upgrade.
func (u *upgrade) reconcileNodes(ctx context.Context) error {
	r := u.reconciler
	if err := r.syncWithPlatform(ctx); err != nil {
		return err
	}
	stale, err := u.check(ctx)
	if err != nil {
		return err
	}
	var outdated []string
	for _, n := range stale {
		outdated = append(outdated, n.Name)
	}
	plan, err := planScale(u.conf, r.st, u.image, r.o.remove, outdated)
	if err != nil {
		return err
	}
	// Every node that goes, by scale-down, --remove or the upgrade's roll, is checked for
	// node-local volumes before the first one goes.
	if err := r.guardNodeLocalVolumes(ctx, leavingNodes(plan, stale)); err != nil {
		return err
	}
	mirrorsChanged, err := syncRegistryMirrors(ctx, r.out, r.client, u.conf)
	if err != nil {
		return err
	}
	if err := r.scale(ctx, plan); err != nil {
		return err
	}
	if err := u.run(ctx); err != nil {
		return err
	}
	if plan.empty() && !u.changed && !mirrorsChanged {
		fmt.Fprintf(r.out, "cluster %s (ID %x) has %d control plane(s) and %d worker(s), as configured: nothing to apply\n", r.st.Name, []byte(r.st.ClusterID), plan.haveCP, plan.haveW)
	}
	return nil
}

// scale carries out plan: it adds nodes, waits until every node is Ready, then removes
// nodes.
func (r *reconciler) scale(ctx context.Context, plan scalePlan) error {
	if plan.empty() {
		// An earlier apply may have been interrupted while its nodes joined.
		if err := r.waitAllReady(ctx, nil); err != nil {
			return err
		}
		return nil
	}
	plan.print(r.out)
	if len(plan.add) > 0 {
		if err := r.createNodes(ctx, plan.add); err != nil {
			return err
		}
	}
	// Every node Ready before any is removed: the new ones, and those an interrupted apply
	// left joining. A removal must not count on a member that is still joining. Nodes to be
	// removed are not waited for: an interrupted removal may have deleted their Node already.
	if err := r.waitAllReady(ctx, plan.remove); err != nil {
		return err
	}
	for _, n := range plan.remove {
		if err := r.remove(ctx, n); err != nil {
			return fmt.Errorf("removing %s (apply again to finish; every step is idempotent): %w", n.Name, err)
		}
	}
	fmt.Fprintf(r.out, "applied: %d control plane(s) and %d worker(s)\n", plan.wantCP, plan.wantW)
	return nil
}

// reconciler is one apply of an initialized cluster.
type reconciler struct {
	out        io.Writer
	t          *phaseTimer
	prog       *progress
	client     kubernetes.Interface
	restConfig *rest.Config
	platform   provider.Provider
	st         *state.State
	statePath  string
	o          scaleOptions
	// revokeWait bounds waitRevoked (revokedBound when zero).
	revokeWait time.Duration
}

// do runs one idempotent step of node, again while it fails transiently (retry.Transient),
// within bound (or ctx, when sooner); each failure is the node's progress.
func (r *reconciler) do(ctx context.Context, node, what string, bound time.Duration, op func(context.Context) error) error {
	return r.doWith(ctx, retry.Default, node, what, bound, op)
}

// pollEvery is the policy of a step that polls for a condition: every interval, not backing
// off, so that it sees the condition hold within interval.
func pollEvery(interval time.Duration) retry.Policy {
	return retry.Policy{Initial: interval, Max: interval, Factor: 1}
}

// doWith is do with the retries' policy p.
func (r *reconciler) doWith(ctx context.Context, p retry.Policy, node, what string, bound time.Duration, op func(context.Context) error) error {
	if bound > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, bound)
		defer cancel()
	}
	if node != "" {
		r.prog.step(node, what)
	}
	err := retry.Do(ctx, p, nil, func(ctx context.Context) error {
		err := op(ctx)
		if node != "" {
			r.prog.failed(node, err)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// platformNodes lists the platform's nodes, retrying transient failures.
func (r *reconciler) platformNodes(ctx context.Context) ([]provider.Node, error) {
	var nodes []provider.Node
	err := r.do(ctx, "", "listing the platform's nodes", time.Minute, func(ctx context.Context) error {
		var err error
		nodes, err = r.platform.Nodes(ctx)
		return err
	})
	return nodes, err
}

func (r *reconciler) writeState() error { return state.Write(r.statePath, r.st) }

// syncWithPlatform makes the state file agree with the platform before anything is planned,
// so that no machine is orphaned by an apply that was interrupted:
//   - a machine the state file does not know, and that is not a removed node, was created
//     for an earlier apply that ended before it recorded it: it is adopted (it joins, or
//     already did, through the join service like any new node);
//   - a machine of a node the state file records as removed is deleted (its name is refused
//     by the join service anyway);
//   - a node of the state file without a machine was being removed when an earlier apply
//     ended (the machine is deleted last): its removal is finished.
func (r *reconciler) syncWithPlatform(ctx context.Context) error {
	nodes, err := r.platformNodes(ctx)
	if err != nil {
		return err
	}
	inState, removed, onPlatform := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, n := range r.st.Nodes {
		inState[n.Name] = true
	}
	for _, n := range r.st.Removed {
		removed[n.Name] = true
	}
	changed := false
	for _, n := range nodes {
		onPlatform[n.Name] = true
		switch {
		case removed[n.Name]:
			fmt.Fprintf(r.out, "the platform still has %s, which %s records as removed: deleting its machine\n", n.Name, state.FileName)
			if err := r.deleteMachine(ctx, n.Name); err != nil {
				return err
			}
		case !inState[n.Name]:
			fmt.Fprintf(r.out, "adopting %s: the platform created it for an earlier apply that ended before recording it\n", n.Name)
			r.st.Nodes = append(r.st.Nodes, state.Node{Name: n.Name, Role: n.Role, IPs: n.IPs, Unexpected: n.Unexpected})
			changed = true
		}
	}
	if changed {
		if err := r.writeState(); err != nil {
			return err
		}
	}
	for _, n := range slices.Clone(r.st.Nodes) {
		if onPlatform[n.Name] {
			continue
		}
		fmt.Fprintf(r.out, "%s has no machine any more: an earlier apply was removing it; finishing the removal\n", n.Name)
		if err := r.remove(ctx, n); err != nil {
			return fmt.Errorf("finishing the removal of %s: %w", n.Name, err)
		}
	}
	return nil
}

// createNodes asks the platform for the nodes it does not have yet, and records those it has.
// Creating is not idempotent on the platform (a second request for a name fails), so each
// attempt first asks what exists: a request whose answer was lost is not made again.
func (r *reconciler) createNodes(ctx context.Context, specs []provider.NodeSpec) error {
	err := r.do(ctx, "", "creating nodes", 0, func(ctx context.Context) error {
		have, err := r.platform.Nodes(ctx)
		if err != nil {
			return err
		}
		var missing []provider.NodeSpec
		for _, s := range specs {
			if !slices.ContainsFunc(have, func(n provider.Node) bool { return n.Name == s.Name }) {
				missing = append(missing, s)
			}
		}
		if len(missing) == 0 {
			return nil
		}
		_, err = r.platform.CreateNodes(ctx, missing)
		return err
	})
	// Record what the platform made, even half-way: the state file is the record.
	if nodes, lerr := r.platformNodes(ctx); lerr == nil {
		for _, n := range nodes {
			if slices.ContainsFunc(specs, func(s provider.NodeSpec) bool { return s.Name == n.Name }) &&
				!slices.ContainsFunc(r.st.Nodes, func(s state.Node) bool { return s.Name == n.Name }) {
				r.st.Nodes = append(r.st.Nodes, state.Node{Name: n.Name, Role: n.Role, IPs: n.IPs, Unexpected: n.Unexpected})
			}
		}
		if werr := r.writeState(); werr != nil {
			return errors.Join(err, werr)
		}
	}
	if err != nil {
		return err
	}
	r.t.phase("create", fmt.Sprintf("%d node(s) booting", len(specs)))
	return nil
}

// waitAllReady waits until every node of the state file that should be admitted, except
// those in leaving, is Ready and verifiable; nodes that already are say nothing.
func (r *reconciler) waitAllReady(ctx context.Context, leaving []state.Node) error {
	want := map[string]bool{}
	for _, n := range r.st.Nodes {
		if !n.Unexpected && !slices.ContainsFunc(leaving, func(l state.Node) bool { return l.Name == n.Name }) {
			want[n.Name] = true
		}
	}
	return waitNodesReady(ctx, r.out, r.t, r.prog, r.client, r.platform, r.st.Nodes, want, true)
}

// deleteMachine deletes a node's machine; one that is gone already is no error.
func (r *reconciler) deleteMachine(ctx context.Context, name string) error {
	return r.do(ctx, name, "deleting the machine", 0, func(ctx context.Context) error {
		if err := r.platform.DeleteNode(ctx, name); err != nil && !errors.Is(err, provider.ErrNoNode) {
			return err
		}
		return nil
	})
}

// remove removes node n (removeNode) and records it as removed in the state file.
func (r *reconciler) remove(ctx context.Context, n state.Node) error {
	if err := r.removeNode(ctx, n); err != nil {
		return err
	}
	r.prog.done(n.Name)
	if !slices.ContainsFunc(r.st.Removed, func(rm state.RemovedNode) bool { return rm.Name == n.Name }) {
		r.st.Removed = append(r.st.Removed, state.RemovedNode{Name: n.Name, Role: n.Role, RemovedAt: time.Now().UTC()})
	}
	r.st.Nodes = slices.DeleteFunc(r.st.Nodes, func(s state.Node) bool { return s.Name == n.Name })
	return r.writeState()
}

// recordDisks is apply's refresh of the disk records, once every node it added is Ready (and
// on every apply, so an apply that failed to record is repaired by the next).
func recordDisks(ctx context.Context, out io.Writer, workspace string, st *state.State, client kubernetes.Interface) error {
	var report state.DiskReport
	err := retry.Do(ctx, retry.Default, nil, func(ctx context.Context) error {
		var err error
		report, err = refreshDisks(ctx, workspace, st, client)
		return err
	})
	if err != nil {
		return fmt.Errorf("recording the nodes' disks (recover needs them; apply again to retry): %w", err)
	}
	printDiskReport(out, report)
	return nil
}
