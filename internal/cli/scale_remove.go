package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/openconstellation/constellation/internal/diskowner"
	"github.com/openconstellation/constellation/internal/kube/drain"
	"github.com/openconstellation/constellation/internal/kube/etcdmember"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/state"
)

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
func removeNode(ctx context.Context, out io.Writer, t *phaseTimer, client kubernetes.Interface, restConfig *rest.Config, platform provider.Provider, n state.Node, o scaleOptions) error {
	var etcd *etcdmember.Client
	if n.Role == metadata.ControlPlane {
		runner, err := etcdmember.NewPodRunner(ctx, restConfig, client, n.Name)
		if err != nil {
			return fmt.Errorf("reaching etcd through another control plane: %w", err)
		}
		etcd = etcdmember.New(runner, 0)
		plan, err := etcd.PlanRemove(ctx, n.Name)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "  etcd: %s\n", plan)
	}
	report, err := drain.Drain(ctx, client, n.Name, drain.Options{Timeout: o.drainTimeout})
	switch {
	case errors.Is(err, drain.ErrNodeNotFound):
		t.phase("drain", n.Name+" never registered with Kubernetes: nothing to drain")
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
		t.phase("drain", fmt.Sprintf("%s: %s", n.Name, detail))
	}
	if etcd != nil {
		removal, err := etcd.Remove(ctx, n.Name)
		if err != nil {
			return err
		}
		t.phase("etcd", removal.String())
	}
	if err := (diskowner.Store{Client: client}).MarkRemoved(ctx, n.Name, time.Now()); err != nil {
		return err
	}
	if err := drain.Delete(ctx, client, n.Name); err != nil {
		return err
	}
	if err := platform.DeleteNode(ctx, n.Name); err != nil && !errors.Is(err, provider.ErrNoNode) {
		return err
	}
	t.phase("removed", n.Name+": deleted from Kubernetes and the platform, refused from now on")
	return nil
}
