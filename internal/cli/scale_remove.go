package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/openconstellation/constellation/internal/diskowner"
	"github.com/openconstellation/constellation/internal/kube/drain"
	"github.com/openconstellation/constellation/internal/kube/etcdmember"
	"github.com/openconstellation/constellation/internal/metadata"
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
//  3. the control plane's etcd member is removed (again only if quorum holds);
//  4. the node is recorded as removed (the join service refuses its name from then on, even
//     if the platform lists it again), its Node object deleted, and the machine deleted with
//     its disk.
//
// Every step is idempotent (a drained node drains at once, a member removed before is
// NoMember, the removal record and the deletions tolerate being done already), and each is
// retried while it fails transiently: removing the etcd leader's member makes the API server
// answer "request timed out" until etcd elected another.
func (r *reconciler) removeNode(ctx context.Context, n state.Node) error {
	var etcd *etcdmember.Client
	if n.Role == metadata.ControlPlane {
		err := r.do(ctx, n.Name, "finding an etcd member to run etcdctl on", etcdStepBound, func(ctx context.Context) error {
			runner, err := etcdmember.NewPodRunner(ctx, r.restConfig, r.client, n.Name)
			if err != nil {
				return err
			}
			etcd = etcdmember.New(runner, 0)
			return nil
		})
		if err != nil {
			return fmt.Errorf("reaching etcd through another control plane: %w", err)
		}
		var plan etcdmember.Removal
		if err := r.do(ctx, n.Name, "checking etcd's quorum", etcdStepBound, func(ctx context.Context) error {
			plan, err = etcd.PlanRemove(ctx, n.Name)
			return err
		}); err != nil {
			return err
		}
		fmt.Fprintf(r.out, "  etcd: %s\n", plan)
	}
	r.prog.step(n.Name, "drain (its pods evicted, PodDisruptionBudgets respected)")
	report, err := drain.Drain(ctx, r.client, n.Name, drain.Options{Timeout: r.o.drainTimeout})
	switch {
	case errors.Is(err, drain.ErrNodeNotFound):
		r.t.phase("drain", n.Name+" is not registered with Kubernetes: nothing to drain")
	case err != nil:
		return fmt.Errorf("draining %s (it stays cordoned; fix what blocks the drain and run apply again): %w", n.Name, err)
	default:
		var evicted []string
		for _, p := range report.Evicted {
			evicted = append(evicted, p.String())
		}
		detail := "no pods to evict"
		if len(evicted) > 0 {
			detail = "evicted " + strings.Join(evicted, ", ")
		}
		r.t.phase("drain", fmt.Sprintf("%s: %s", n.Name, detail))
	}
	if etcd != nil {
		var removal etcdmember.Removal
		if err := r.do(ctx, n.Name, "removing its etcd member", etcdStepBound, func(ctx context.Context) error {
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
	r.t.phase("removed", n.Name+": deleted from Kubernetes and the platform, refused from now on")
	return nil
}
