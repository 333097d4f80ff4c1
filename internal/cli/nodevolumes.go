package cli

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/openconstellation/constellation/internal/kube/nodevolumes"
	"github.com/openconstellation/constellation/internal/state"
)

// deleteNodeLocalVolumesFlag is apply's flag that accepts destroying the node-local volumes of
// the nodes it removes or replaces.
const deleteNodeLocalVolumesFlag = "--delete-node-local-volumes"

// volumesBound bounds the retries of listing the volumes of the nodes apply removes: an API
// server that restarts answers within it; one that does not is a refusal (fail closed).
const volumesBound = 30 * time.Second

// leavingNodes are the nodes apply removes (plan) or replaces (stale, the upgrade's roll), once
// each, in that order.
func leavingNodes(plan scalePlan, stale []state.Node) []string {
	var names []string
	for _, n := range append(slices.Clone(plan.remove), stale...) {
		if !slices.Contains(names, n.Name) {
			names = append(names, n.Name)
		}
	}
	return names
}

// guardNodeLocalVolumes names every node-local volume (internal/kube/nodevolumes) on the nodes
// apply removes or replaces, before anything changes, and refuses unless the operator accepted
// their loss (--delete-node-local-volumes): a node's machine is deleted with its disk, and a
// local-path volume is a directory on that disk (docs/local-provider.md "Volumes").
//
// It fails closed: when the API server cannot say which volumes the nodes hold (after
// retrying transient failures within volumesBound), apply refuses with the cause unless the
// flag accepts losing whatever they hold. It only reads, so a re-run after a killed apply asks
// again: a flag given to the first run does not carry over.
func (r *reconciler) guardNodeLocalVolumes(ctx context.Context, leaving []string) error {
	if len(leaving) == 0 {
		return nil
	}
	accepted := r.o.deleteNodeLocalVolumes
	var vols []nodevolumes.Volume
	err := r.do(ctx, "", "listing the node-local volumes of the nodes apply removes or replaces", volumesBound, func(ctx context.Context) error {
		var err error
		vols, err = nodevolumes.OnNodes(ctx, r.client, leaving)
		return err
	})
	nodes := strings.Join(leaving, ", ")
	if err != nil {
		if accepted {
			fmt.Fprintf(r.out, "apply: WARNING: cannot tell which node-local volumes %s hold (%v); %s accepts destroying whatever they hold\n", nodes, err, deleteNodeLocalVolumesFlag)
			return nil
		}
		return fmt.Errorf("refusing to remove or replace %s: cannot tell which node-local volumes they hold, whose data would be destroyed with them (nothing was changed): %w; run apply again once the Kubernetes API answers, or accept losing whatever they hold with %s",
			nodes, err, deleteNodeLocalVolumesFlag)
	}
	if len(vols) == 0 {
		return nil
	}
	fmt.Fprintf(r.out, "apply: %d node-local volume(s) on the node(s) it removes or replaces (%s) are destroyed with them:\n", len(vols), nodes)
	printVolumes(r.out, vols)
	if accepted {
		fmt.Fprintf(r.out, "  accepted with %s: their data is destroyed with the nodes\n", deleteNodeLocalVolumesFlag)
		return nil
	}
	claims := make([]string, len(vols))
	for i, v := range vols {
		claims[i] = v.String()
	}
	return fmt.Errorf("refusing to remove or replace %s: it would destroy %d node-local volume(s) with their data: %s (nothing was changed); copy the data off and delete the claims first, or accept the loss with %s",
		nodes, len(vols), strings.Join(claims, "; "), deleteNodeLocalVolumesFlag)
}

// printVolumes prints a plan line per volume that would be destroyed.
func printVolumes(out io.Writer, vols []nodevolumes.Volume) {
	for _, v := range vols {
		kind := "node-local volume"
		if v.Movable {
			kind = "volume"
		}
		fmt.Fprintf(out, "  would destroy %s %s %s\n", kind, v, v.Where())
	}
}

// terminateVolumesBound bounds terminate's look at the cluster's volumes: a cluster that is
// stopped or broken is terminated too, and must not wait long for its API.
const terminateVolumesBound = 10 * time.Second

// volumesLostWith lists every volume terminating the cluster destroys (nodevolumes.All: the
// node-local ones, and the movable ones, kept by the local provider in the workspace's folder
// that terminate removes), read with the workspace's admin kubeconfig. An error says why they
// cannot be listed.
func volumesLostWith(ctx context.Context, workspace string) ([]nodevolumes.Volume, error) {
	ctx, cancel := context.WithTimeout(ctx, terminateVolumesBound)
	defer cancel()
	client, err := newKubeClient(filepath.Join(workspace, AdminConfFile))
	if err != nil {
		return nil, err
	}
	return nodevolumes.All(ctx, client)
}
