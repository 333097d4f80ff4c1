package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/openconstellation/constellation/internal/diskowner"
	"github.com/openconstellation/constellation/internal/kube/drain"
	"github.com/openconstellation/constellation/internal/kube/etcdmember"
	"github.com/openconstellation/constellation/internal/kube/kubeletcsr"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/nodeauthz"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/retry"
	"github.com/openconstellation/constellation/internal/state"
)

// etcdStepBound bounds the retries of an etcd step: etcd settles within seconds after a
// membership change (a leader election, the strict reconfiguration check's 5 s); a refusal
// that lasts longer (a member down) is reported rather than waited out.
const etcdStepBound = time.Minute

// removeNode removes one node from the cluster, in the order that keeps the cluster whole:
//
//  1. a control plane's etcd member is checked first: a removal that would break etcd's
//     quorum is refused before anything changes;
//  2. the node is drained: cordoned, its pods evicted through the Eviction API (so
//     PodDisruptionBudgets hold), bounded by the drain timeout; a drain that times out names
//     the pods and budgets that blocked it, and the node stays (cordoned) in the cluster;
//     Then removal waits until Kubernetes detached the volumes of the evicted pods
//     (waitDetached), so that a pod whose volume moves with it starts on another node at once;
//  3. a control plane is shut down gracefully when etcd keeps its quorum without it
//     (shutdownFirst): its API server leaves the platform's load balancer and finishes its
//     requests while its etcd still runs, so no client of the API sees an error;
//  4. the control plane's etcd member is removed (again only if quorum holds);
//  5. the node is recorded as removed (the join service refuses its name from then on, even
//     if the platform lists it again), its Node object deleted, and the machine deleted with
//     its disk;
//  6. every pod still bound to it is deleted, and removal waits until they are gone
//     (unbindPods): what drain leaves (DaemonSet pods, static pods' mirror pods) and pods
//     still terminating would otherwise keep giving its credentials, through the Node
//     authorizer, the Secrets they use whenever the removed-node authorizer is down.
//
// Every step is idempotent (a drained node drains at once, a node shut down before shuts
// down at once, a member removed before is NoMember, the removal record and the deletions
// tolerate being done already), and each is retried while it fails transiently: removing the
// etcd leader's member makes the API server answer "request timed out" until etcd elected
// another.
func (r *reconciler) removeNode(ctx context.Context, n state.Node) error {
	var etcd *etcdmember.Client
	if n.Role == metadata.ControlPlane {
		var err error
		if etcd, err = r.etcdFor(ctx, n); err != nil {
			return err
		}
	}
	if err := r.drainForRemoval(ctx, n); err != nil {
		return err
	}
	r.waitDetached(ctx, n.Name)
	if etcd != nil {
		if err := r.shutdownFirst(ctx, n, etcd); err != nil {
			return err
		}
		var removal etcdmember.Removal
		if err := r.do(ctx, n.Name, "removing its etcd member", etcdStepBound, func(ctx context.Context) error {
			var err error
			removal, err = etcd.Remove(ctx, n.Name)
			return err
		}); err != nil {
			return err
		}
		r.t.phase("etcd", removal.String())
	}
	if err := r.do(ctx, n.Name, "recording the removal in the cluster", 0, func(ctx context.Context) error {
		return (diskowner.Store{Client: r.client}).MarkRemoved(ctx, n.Name, time.Now())
	}); err != nil {
		return err
	}
	if err := r.do(ctx, n.Name, "deleting its Node object", 0, func(ctx context.Context) error {
		return drain.Delete(ctx, r.client, n.Name)
	}); err != nil {
		return err
	}
	if err := r.deleteMachine(ctx, n.Name); err != nil {
		return err
	}
	if err := r.unbindPods(ctx, n.Name); err != nil {
		return err
	}
	if n.Role == metadata.ControlPlane {
		if err := r.do(ctx, n.Name, "deleting its removed-node authorizer's report", 0, func(ctx context.Context) error {
			return nodeauthz.DeleteReport(ctx, r.client, n.Name)
		}); err != nil {
			return err
		}
	}
	r.waitRevoked(ctx, n.Name)
	r.t.phase("removed", n.Name+": deleted from Kubernetes and the platform, refused from now on")
	return nil
}

// detachBound bounds the wait until a drained node's volumes are detached; detachPoll is the
// pause between its rounds.
const (
	detachBound = 2 * time.Minute
	detachPoll  = time.Second
)

// waitDetached waits, within detachBound, until no volume is attached to the drained node
// (drain.AttachedVolumes), naming every 5 s the volumes it waits for. Why: the node's kubelet
// unmounts its evicted pods' volumes after they are gone and reports it; Kubernetes then
// detaches them at once. A Node deleted before that keeps them attached six more minutes, and
// the pods that moved wait for them. A node whose kubelet no longer answers never reports:
// past the bound, removal goes on and says so; Kubernetes detaches the volumes six minutes
// after the Node object is gone, and no data is lost (the volumes' storage outlives the node).
func (r *reconciler) waitDetached(ctx context.Context, node string) {
	var attached []string
	err := r.doWith(ctx, pollEvery(detachPoll), node, "waiting until its volumes are detached (their pods start elsewhere)", detachBound, func(ctx context.Context) error {
		var err error
		if attached, err = drain.AttachedVolumes(ctx, r.client, node); err != nil {
			return err
		}
		if len(attached) > 0 {
			return retry.NotYet(fmt.Errorf("%d volume(s) still attached to %s: %s", len(attached), node, strings.Join(attached, ", ")))
		}
		return nil
	})
	if err != nil {
		fmt.Fprintf(r.out, "note: %s's volumes are not detached (%v); Kubernetes detaches them 6 minutes after its Node object is gone, and their pods start elsewhere then; their data is kept\n", node, err)
		return
	}
	r.t.phase("detached", node+": no volume is attached to it")
}

// unbindBound bounds the wait until no pod is bound to a removed node; unbindPoll is the
// pause between its rounds.
const (
	unbindBound = 2 * time.Minute
	unbindPoll  = time.Second
)

// unbindPods deletes every pod still bound to node, once node's Node object and machine are
// gone, and waits until they are gone, polling every unbindPoll within unbindBound (the
// progress says every 5 s which pods it waits for and what keeps them).
//
// Why: the Node authorizer lets a node read what the pods bound to it use (Secrets,
// ConfigMaps, volume claims, service account tokens), terminating pods included, as long as
// their objects exist, Node object or not. The removed-node authorizer refuses a removed node
// everything, but fails open while it is down or not synced; without its pods, the node's
// credentials read nothing of anyone's workloads even then.
//
// The order: the Node object goes first, so the DaemonSet controller makes no pod for the node
// any more (and the removed-nodes admission policy refuses every pod bound to its name from
// the removal record on); the machine goes next, so nothing runs these pods any more and
// deleting them at once (grace period 0) gives up nothing: the node's kubelet could not
// confirm a graceful deletion anyway, its writes are refused. Finalizers are not removed:
// they are their controllers' to remove, and the removal waits for them.
func (r *reconciler) unbindPods(ctx context.Context, node string) error {
	var deleted []drain.PodRef
	err := r.doWith(ctx, pollEvery(unbindPoll), node, "deleting the pods still bound to it (the Node authorizer gives a node what its pods use)", unbindBound, func(ctx context.Context) error {
		d, stuck, err := drain.DeleteBoundPods(ctx, r.client, node)
		deleted = append(deleted, d...)
		if err != nil {
			return err
		}
		if len(stuck) > 0 {
			names := make([]string, len(stuck))
			for i, p := range stuck {
				names[i] = p.String()
			}
			return retry.NotYet(fmt.Errorf("%d pod(s) still bound to %s: %s", len(stuck), node, strings.Join(names, "; ")))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%w (until they are gone, %s's credentials read what they use whenever the removed-node authorizer is down)", err, node)
	}
	if len(deleted) == 0 {
		r.t.phase("unbound", node+": no pod is bound to it any more")
		return nil
	}
	names := make([]string, len(deleted))
	for i, p := range deleted {
		names[i] = p.String()
	}
	r.t.phase("unbound", fmt.Sprintf("%s: deleted the %d pod(s) still bound to it (%s); none is bound to it any more", node, len(deleted), strings.Join(names, ", ")))
	return nil
}

// revokedBound bounds the wait until the API server refuses a removed node's identity.
const revokedBound = time.Minute

// waitRevoked waits until the API server refuses node's identity (a SubjectAccessReview of
// system:node:<node> reading its own Node is denied: the removed-node authorizer saw the
// removal record), so that "refused from now on" holds when apply says it. Its watch of the
// records takes effect within about a second; a lag beyond revokedBound is reported, not an
// error: the admission policy refuses the identity's writes already, and its certificate
// expires within 24 h.
func (r *reconciler) waitRevoked(ctx context.Context, node string) {
	bound := r.revokeWait
	if bound <= 0 {
		bound = revokedBound
	}
	err := r.do(ctx, node, "waiting until the API server refuses its credentials", bound, func(ctx context.Context) error {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: kubeletcsr.NodeUserPrefix + node, Groups: []string{"system:nodes", "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "get", Resource: "nodes", Name: node},
		}}
		got, err := r.client.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		if !got.Status.Denied {
			return retry.WithDelay(retry.NotYet(errors.New("the removed-node authorizer does not refuse it yet")), 200*time.Millisecond)
		}
		return nil
	})
	if err != nil {
		fmt.Fprintf(r.out, "note: the API server does not refuse %s's credentials yet (%v; %s); its writes are refused by admission, no pod is bound to it any more (so the Node authorizer gives it nothing the cluster's pods use), and its certificate expires within 24 h\n",
			node, err, r.authorizersSummary(ctx, node))
	}
}

// authorizersSummary says which control planes' removed-node authorizers are not ready, as
// their reports say (nodeauthz.Assess); removed, the node being removed, is not asked about.
func (r *reconciler) authorizersSummary(ctx context.Context, removed string) string {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	reports, err := nodeauthz.Reports(ctx, r.client)
	if err != nil {
		return err.Error()
	}
	now := time.Now()
	var notReady []string
	for _, n := range r.st.Nodes {
		if n.Role != metadata.ControlPlane || n.Unexpected || n.Name == removed {
			continue
		}
		if h := nodeauthz.Assess(reports, n.Name, now); !h.Ready {
			notReady = append(notReady, fmt.Sprintf("%s: %s", n.Name, h.Why))
		}
	}
	if len(notReady) == 0 {
		return "every control plane reports its removed-node authorizer ready"
	}
	return "removed-node authorizer not ready on " + strings.Join(notReady, "; ")
}

// etcdFor finds an etcd member on another control plane to run etcdctl on, and checks that
// removing n's member keeps etcd's quorum (refused otherwise, before anything changes).
func (r *reconciler) etcdFor(ctx context.Context, n state.Node) (*etcdmember.Client, error) {
	var etcd *etcdmember.Client
	err := r.do(ctx, n.Name, "finding an etcd member to run etcdctl on", etcdStepBound, func(ctx context.Context) error {
		runner, err := etcdmember.NewPodRunner(ctx, r.restConfig, r.client, n.Name)
		if err != nil {
			return err
		}
		etcd = etcdmember.New(runner, 0)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reaching etcd through another control plane: %w", err)
	}
	var plan etcdmember.Removal
	if err := r.do(ctx, n.Name, "checking etcd's quorum", etcdStepBound, func(ctx context.Context) error {
		plan, err = etcd.PlanRemove(ctx, n.Name)
		return err
	}); err != nil {
		return nil, err
	}
	fmt.Fprintf(r.out, "  etcd: %s\n", plan)
	return etcd, nil
}

// drainForRemoval drains n (every pod evicted but DaemonSets' and static ones), within the
// drain timeout.
func (r *reconciler) drainForRemoval(ctx context.Context, n state.Node) error {
	r.prog.step(n.Name, "drain (its pods evicted, PodDisruptionBudgets respected)")
	report, err := drain.Drain(ctx, r.client, n.Name, drain.Options{Timeout: r.o.drainTimeout})
	switch {
	case errors.Is(err, drain.ErrNodeNotFound):
		r.t.phase("drain", n.Name+" is not registered with Kubernetes: nothing to drain")
	case err != nil:
		return fmt.Errorf("draining %s (it stays cordoned; fix what blocks the drain and run apply again): %w", n.Name, err)
	default:
		r.t.phase("drain", fmt.Sprintf("%s: %s", n.Name, evictedSummary(report)))
	}
	return nil
}

func evictedSummary(report drain.Report) string {
	var evicted []string
	for _, p := range report.Evicted {
		evicted = append(evicted, p.String())
	}
	if len(evicted) == 0 {
		return "no pods to evict"
	}
	return "evicted " + strings.Join(evicted, ", ")
}

// shutdownFirst shuts control plane n down gracefully before its etcd member is removed,
// when the platform can (provider.NodeShutdowner) and etcd keeps its quorum while the member
// is down (Removal.QuorumWhileDown: three members or more, the others healthy). Why: a
// control plane's API server talks only to its own etcd member, which stops once it is
// removed; an API server left running would answer every request that needs etcd with an
// error until the load balancer's health check took it out, and its clients' connections
// would stay on it. Shut down first, it leaves the load balancer at once and finishes its
// requests with its etcd still running. With two members, shutting one down would stop
// etcd: there only its API server stops first (stopAPIServerFirst), its member goes next.
func (r *reconciler) shutdownFirst(ctx context.Context, n state.Node, etcd *etcdmember.Client) error {
	sd, ok := r.platform.(provider.NodeShutdowner)
	if !ok {
		return nil
	}
	var plan etcdmember.Removal
	if err := r.do(ctx, n.Name, "checking etcd's quorum without it", etcdStepBound, func(ctx context.Context) error {
		var err error
		plan, err = etcd.PlanRemove(ctx, n.Name)
		return err
	}); err != nil {
		return err
	}
	if plan.NoMember {
		return nil
	}
	if !plan.QuorumWhileDown() {
		return r.stopAPIServerFirst(ctx, n)
	}
	if err := r.do(ctx, n.Name, "shutting its machine down (its API server leaves the load balancer, then etcd stops)", 0, func(ctx context.Context) error {
		if err := sd.ShutdownNode(ctx, n.Name); err != nil && !errors.Is(err, provider.ErrNoNode) {
			return err
		}
		return nil
	}); err != nil {
		return err
	}
	r.t.phase("shutdown", n.Name+": shut down gracefully; etcd keeps its quorum without it")
	return nil
}

// stopAPIServerFirst stops control plane n's API server gracefully, its etcd left running,
// when the platform can (provider.APIServerStopper): with two etcd members, n's member cannot
// be missed while it is removed, so the machine cannot be shut down first, but its API server
// can leave the load balancer and finish its requests before its etcd member goes (which
// stops the member: an API server left on it would hang every request that needs etcd).
func (r *reconciler) stopAPIServerFirst(ctx context.Context, n state.Node) error {
	st, ok := r.platform.(provider.APIServerStopper)
	if !ok {
		return nil
	}
	if err := r.do(ctx, n.Name, "stopping its API server (it leaves the load balancer; etcd keeps running)", 0, func(ctx context.Context) error {
		if err := st.StopAPIServer(ctx, n.Name); err != nil && !errors.Is(err, provider.ErrNoNode) {
			return err
		}
		return nil
	}); err != nil {
		return err
	}
	r.t.phase("shutdown", n.Name+": API server stopped gracefully; its etcd member goes next (two members cannot lose one first)")
	return nil
}
