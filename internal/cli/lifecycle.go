package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/openconstellation/constellation/internal/clusterrecord"
	"github.com/openconstellation/constellation/internal/deploy"
	"github.com/openconstellation/constellation/internal/kube/drain"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/nodeauthz"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/retry"
	"github.com/openconstellation/constellation/internal/state"
)

// inWorkspace is the RunE of a command that works on the workspace within a timeout: it
// resolves -C and bounds the context, then runs run.
func inWorkspace(timeout *time.Duration, run func(ctx context.Context, out io.Writer, workspace string, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		ws, err := absWorkspace(cmd)
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(cmd.Context(), pacedTimeout(cmd, ws, *timeout))
		defer cancel()
		return run(ctx, newSyncWriter(cmd.OutOrStdout()), ws, args)
	}
}

func newRebootCmd() *cobra.Command {
	var timeout time.Duration
	var o rebootOptions
	var noWait bool
	cmd := &cobra.Command{
		Use:   "reboot NODE...",
		Short: "Reboot nodes, as a machine reboots, and wait until they are back",
		Long: `Reboot nodes through the platform: the node's TPM resets, the platform measures its
image again and its bootstrapper starts fresh. The node proves its image to the join service
again, gets a rejoin ticket with its own disk key, unlocks its state and comes back with its
pods (a control plane with its etcd data). The command waits until each node is Ready again
(its kubelet reported after the reboot), unless --no-wait.

A reboot is graceful: one node after the other, each is cordoned and drained first (its pods
evicted through the Eviction API, so PodDisruptionBudgets hold, within --drain-timeout; pods
without a controller stay and run again after the reboot), the platform shuts it down in
order (a control plane's API server leaves the API load balancer and finishes its requests
before its etcd stops), and it is uncordoned once it is back. Not drained: the only control
plane (nothing could serve the API meanwhile), and every node with --no-wait or --no-drain.

A cluster whose only control plane reboots has no join service until that control plane is
back: it waits for 'constellation recover'.`,
		Args: cobra.MinimumNArgs(1),
		RunE: inWorkspace(&timeout, func(ctx context.Context, out io.Writer, ws string, args []string) error {
			o.wait = !noWait
			return rebootNodes(ctx, out, ws, args, o)
		}),
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Minute, "give up after this long")
	cmd.Flags().BoolVar(&noWait, "no-wait", false, "return once the platform rebooted the nodes (no drain: nothing would uncordon them)")
	cmd.Flags().BoolVar(&o.noDrain, "no-drain", false, "reboot without draining the nodes first")
	cmd.Flags().DurationVar(&o.drainTimeout, "drain-timeout", 2*time.Minute, "how long the drain of each node may wait for its pods to be evicted (PodDisruptionBudgets)")
	return cmd
}

// rebootOptions are reboot's flags.
type rebootOptions struct {
	wait, noDrain bool
	drainTimeout  time.Duration
}

// rebooter is one reboot command.
type rebooter struct {
	out       io.Writer
	t         *phaseTimer
	prog      *progress
	platform  provider.Provider
	workspace string
	o         rebootOptions
}

func rebootNodes(ctx context.Context, out io.Writer, workspace string, names []string, o rebootOptions) error {
	st, platform, err := loadState(workspace)
	if err != nil {
		return err
	}
	for _, name := range names {
		if !slices.ContainsFunc(st.Nodes, func(n state.Node) bool { return n.Name == name }) {
			return fmt.Errorf("no node %q in %s (nodes: %s)", name, state.FileName, nodeNames(st.Nodes))
		}
	}
	// A rebooted control plane may need recover (the only one does): its disk must be known.
	refreshDisksBeforeShutdown(ctx, out, workspace, st, platform)
	t := newPhaseTimer(out)
	prog := newProgress(t)
	stop := prog.start(ctx)
	defer stop()
	r := &rebooter{out: out, t: t, prog: prog, platform: platform, workspace: workspace, o: o}
	var graceful, plain []string
	for _, name := range names {
		if o.wait && !o.noDrain && !onlyControlPlane(st, name) {
			graceful = append(graceful, name)
		} else {
			plain = append(plain, name)
		}
	}
	// One node after the other: the drained ones are a rolling reboot.
	for _, name := range graceful {
		if err := r.drainedReboot(ctx, name); err != nil {
			return err
		}
	}
	if len(plain) == 0 {
		return nil
	}
	return r.rebootAll(ctx, plain)
}

// onlyControlPlane reports whether name is the cluster's only control plane.
func onlyControlPlane(st *state.State, name string) bool {
	cps := 0
	isCP := false
	for _, n := range st.Nodes {
		if n.Role == metadata.ControlPlane && !n.Unexpected {
			cps++
			isCP = isCP || n.Name == name
		}
	}
	return isCP && cps == 1
}

// rebootAll reboots names at once, and waits until they are back unless told not to.
func (r *rebooter) rebootAll(ctx context.Context, names []string) error {
	start := time.Now()
	for _, name := range names {
		if err := r.platformReboot(ctx, name); err != nil {
			return err
		}
	}
	if !r.o.wait {
		return nil
	}
	client, err := newKubeClient(filepath.Join(r.workspace, AdminConfFile))
	if err != nil {
		return err
	}
	return waitBack(ctx, r.t, r.prog, r.platform, client, names, start, start)
}

// platformReboot asks the platform to reboot name. A reboot whose answer was lost may have
// happened: rebooting again is harmless (waitBack counts boots after its start), so the
// request is simply retried.
func (r *rebooter) platformReboot(ctx context.Context, name string) error {
	r.prog.waiting(name, "the platform to reboot it")
	err := retry.Do(ctx, retry.Default, nil, func(ctx context.Context) error {
		err := r.platform.RebootNode(ctx, name)
		r.prog.failed(name, err)
		return err
	})
	if err != nil {
		return err
	}
	r.t.phase("reboot", name+" rebooted by the platform")
	return nil
}

// drainedReboot cordons and drains name (keeping pods without a controller: they run again
// after the reboot), reboots it, waits until it is back and uncordons it. A drain that times
// out uncordons the node again and fails, naming what blocked it: nothing was rebooted.
func (r *rebooter) drainedReboot(ctx context.Context, name string) error {
	client, err := newKubeClient(filepath.Join(r.workspace, AdminConfFile))
	if err != nil {
		return err
	}
	r.prog.step(name, "drain (its pods evicted, PodDisruptionBudgets respected)")
	report, err := drain.Drain(ctx, client, name, drain.Options{Timeout: r.o.drainTimeout, KeepUnmanaged: true})
	if err != nil && !errors.Is(err, drain.ErrNodeNotFound) {
		if _, uerr := drain.Uncordon(context.WithoutCancel(ctx), client, name); uerr != nil {
			err = errors.Join(err, uerr)
		}
		return fmt.Errorf("draining %s before its reboot (not rebooted; fix what blocks the drain, or reboot with --no-drain): %w", name, err)
	}
	r.t.phase("drain", fmt.Sprintf("%s: %s", name, evictedSummary(report)))
	start := time.Now()
	if err := r.platformReboot(ctx, name); err != nil {
		return err
	}
	if err := waitBack(ctx, r.t, r.prog, r.platform, client, []string{name}, start, start); err != nil {
		return err
	}
	err = retry.Do(ctx, retry.Default, nil, func(ctx context.Context) error {
		_, err := drain.Uncordon(ctx, client, name)
		return err
	})
	if err != nil {
		return fmt.Errorf("uncordoning %s after its reboot: %w", name, err)
	}
	r.t.phase("uncordon", name+" schedulable again")
	return nil
}

// waitBack waits until each named node, booted after bootedAfter, is back in its cluster and
// serving: its bootstrapper reported it is in (rejoined, recovered, ...); its kubelet is alive
// now and says Ready; its verification service runs a container started in this boot; and, on
// a control plane, its removed-node authorizer reports synced since this boot (authorizerBack).
//
// "Alive now" needs care: a Node object keeps its Ready condition for a while after its
// kubelet died. A node that booted after heartbeatAfter must have posted its status (Ready's
// heartbeat) since that boot: only its new kubelet can have. A node that kept running (the
// workers during a control plane's recovery) must have renewed its lease since
// heartbeatAfter (kubelets renew every 10 s; their status heartbeat may be minutes old).
func waitBack(ctx context.Context, t *phaseTimer, prog *progress, platform provider.Provider, client kubernetes.Interface, names []string, bootedAfter, heartbeatAfter time.Time) error {
	back, ready := map[string]bool{}, map[string]bool{}
	bootedAt := map[string]time.Time{}
	for _, n := range names {
		prog.waiting(n, "its bootstrapper to report it is back in its cluster")
	}
	for {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		nodes, err := platform.Nodes(pctx)
		cancel()
		if err != nil {
			for _, n := range names {
				if !back[n] {
					prog.failed(n, fmt.Errorf("platform: %w", err))
				}
			}
		}
		for _, n := range nodes {
			if !slices.Contains(names, n.Name) || back[n.Name] {
				continue
			}
			thisBoot := n.BootedAt.After(bootedAfter.Add(-time.Second))
			if thisBoot && metadata.InCluster(n.Reported) {
				back[n.Name], bootedAt[n.Name] = true, n.BootedAt
				t.phase("back", fmt.Sprintf("%s: %s", n.Name, n.Reported))
				// Next: Kubernetes, whose API may take a while to answer while the control
				// planes come back.
				prog.waiting(n.Name, "its Node object")
			} else if thisBoot && n.Reported == metadata.PhaseStateDiskRefused {
				return stateDiskRefused(n.Name, n.ReportedDetail)
			} else {
				reported := n.Reported
				if reported == "" {
					reported = "nothing reported yet"
				}
				prog.waiting(n.Name, fmt.Sprintf("its bootstrapper to report it is back in its cluster (platform: %s, bootstrapper: %s)", n.State, reported))
			}
		}
		for _, name := range names {
			if !back[name] || ready[name] {
				continue
			}
			kctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			ok, why, err := servingAgain(kctx, client, name, bootedAt[name], heartbeatAfter)
			cancel()
			if err != nil {
				prog.failed(name, fmt.Errorf("the Kubernetes API: %w", err))
			}
			if !ok {
				prog.waiting(name, why)
				continue
			}
			ready[name] = true
			prog.done(name)
			t.phase("ready", name+" (Ready by a fresh kubelet heartbeat, verification service up)")
		}
		if len(ready) == len(names) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not back in the cluster: %s: %w", prog.summary(), ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// servingAgain checks one node of waitBack, and says what is missing.
func servingAgain(ctx context.Context, client kubernetes.Interface, name string, bootedAt, heartbeatAfter time.Time) (bool, string, error) {
	node, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return false, "its Node object", err
	}
	c := readyCondition(*node)
	if c == nil || c.Status != corev1.ConditionTrue {
		return false, "its kubelet to report Ready", nil
	}
	second := func(t time.Time) time.Time { return t.Truncate(time.Second) }
	if bootedAt.After(heartbeatAfter) {
		if c.LastHeartbeatTime.Time.Before(second(bootedAt)) {
			return false, "a status from its kubelet since it booted", nil
		}
	} else {
		lease, err := client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, "its kubelet's lease", err
		}
		if lease.Spec.RenewTime == nil || lease.Spec.RenewTime.Time.Before(second(heartbeatAfter)) {
			return false, "its kubelet to renew its lease", nil
		}
	}
	pods, err := client.CoreV1().Pods(clusterrecord.Namespace).List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/name=" + deploy.VerificationService, FieldSelector: "spec.nodeName=" + name,
	})
	if err != nil {
		return false, "its verification service", err
	}
	for _, p := range pods.Items {
		if !podReady(p) {
			continue
		}
		fresh := len(p.Status.ContainerStatuses) > 0
		for _, cs := range p.Status.ContainerStatuses {
			if cs.State.Running == nil || cs.State.Running.StartedAt.Time.Before(second(bootedAt)) {
				fresh = false
			}
		}
		if fresh {
			return authorizerBack(ctx, client, name, second(bootedAt))
		}
	}
	return false, "its verification service to run again", nil
}

// authorizerBack checks, for a control plane that reports its removed-node authorizer
// (nodeauthz), that the authorizer of this boot reports ready: a report renewed since
// bootedAt that says synced. A node without a report (a worker, or an image from before the
// reports) has nothing to wait for.
func authorizerBack(ctx context.Context, client kubernetes.Interface, name string, bootedAt time.Time) (bool, string, error) {
	reports, err := nodeauthz.Reports(ctx, client)
	if err != nil {
		return false, "its removed-node authorizer's report", err
	}
	rep, ok := reports[name]
	if !ok {
		return true, "", nil
	}
	if rep.RenewedAt.Before(bootedAt) {
		return false, "its removed-node authorizer to report since it booted", nil
	}
	if h := nodeauthz.Assess(reports, name, time.Now()); !h.Ready {
		return false, "its removed-node authorizer to be ready (now: " + h.Why + ")", nil
	}
	return true, "", nil
}

func readyCondition(n corev1.Node) *corev1.NodeCondition {
	for i, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

func newStopCmd() *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "stop",
		Short: "Turn every node of the cluster off, keeping its encrypted state",
		Long: `Shut every node down through the platform, all at once, as shutting down every
machine of the cluster: each node's OS stops its services in order (on the local provider the
API servers, then etcd) before its power goes. Each node's encrypted state, TPM and logs are
kept. 'constellation start' turns the
nodes on again; since no join service runs while every control plane waits for its key,
'constellation recover' then gives each control plane its key.`,
		Args: cobra.NoArgs,
		RunE: inWorkspace(&timeout, func(ctx context.Context, out io.Writer, ws string, _ []string) error {
			st, platform, err := loadState(ws)
			if err != nil {
				return err
			}
			// The last chance to record the disks recover will need.
			refreshDisksBeforeShutdown(ctx, out, ws, st, platform)
			// Each node shuts down in order (a machine's OS takes a while).
			if err := whileEachNode(ctx, out, st.Nodes, "the platform to shut it down", platform.Stop); err != nil {
				return fmt.Errorf("stopping the cluster: %w", err)
			}
			fmt.Fprintf(out, "stopped every node; their state is kept. Start again with: %s start -C %s\n", toolPath("constellation"), ws)
			return nil
		}),
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 3*time.Minute, "give up after this long")
	return cmd
}

// whileEachNode runs op on the whole cluster and says, per node, every few seconds what it
// waits for meanwhile.
func whileEachNode(ctx context.Context, out io.Writer, nodes []state.Node, waitingFor string, op func(context.Context) error) error {
	prog := newProgress(newPhaseTimer(out))
	for _, n := range nodes {
		prog.waiting(n.Name, waitingFor)
	}
	stop := prog.start(ctx)
	defer stop()
	return op(ctx)
}

func newStartCmd() *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "start",
		Short: "Turn the nodes of a stopped cluster on again",
		Long: `Turn every node of a stopped cluster on again. The nodes boot, find their state
belongs to the cluster and ask for their keys: while no join service runs (every control plane
waits too), they wait and say so ('constellation status'). Give the control planes their keys
with 'constellation recover'; the other nodes then rejoin by themselves.`,
		Args: cobra.NoArgs,
		RunE: inWorkspace(&timeout, func(ctx context.Context, out io.Writer, ws string, _ []string) error {
			st, platform, err := loadState(ws)
			if err != nil {
				return err
			}
			// Starting takes a while (every node boots).
			if err := whileEachNode(ctx, out, st.Nodes, "the platform to boot it", platform.Start); err != nil {
				return fmt.Errorf("starting the cluster: %w", err)
			}
			if err := retry.Do(ctx, retry.Default, nil, func(ctx context.Context) error {
				return refreshEndpoints(ctx, ws, st, platform)
			}); err != nil {
				return err
			}
			fmt.Fprintf(out, "started %d nodes. Once they wait for recovery, run: %s recover -C %s\n", len(st.Nodes), toolPath("constellation"), ws)
			return nil
		}),
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 3*time.Minute, "give up after this long")
	return cmd
}

// refreshEndpoints records the platform's endpoints in the state file when they changed.
func refreshEndpoints(ctx context.Context, workspace string, st *state.State, platform provider.Provider) error {
	e, err := platform.Endpoints(ctx)
	if err != nil {
		return err
	}
	if e.APIServer == st.APIServerEndpoint {
		return nil
	}
	st.APIServerEndpoint = e.APIServer
	return errors.Join(state.Write(filepath.Join(workspace, state.FileName), st), pointKubeconfig(workspace, e.APIServer))
}

func nodeNames(nodes []state.Node) string {
	var names []string
	for _, n := range nodes {
		names = append(names, n.Name)
	}
	return strings.Join(names, ", ")
}
