package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
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
	printVolumes(r.out, "would destroy", vols)
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

// printVolumes prints a line per volume destroyed: "  <verb> node-local volume <volume> on
// node <node>".
func printVolumes(out io.Writer, verb string, vols []nodevolumes.Volume) {
	for _, v := range vols {
		fmt.Fprintf(out, "  %s %s\n", verb, describeVolume(v))
	}
}

func describeVolume(v nodevolumes.Volume) string {
	kind := "node-local volume"
	if v.Movable {
		kind = "volume"
	}
	return fmt.Sprintf("%s %s %s", kind, v, v.Where())
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

// terminateRefusal is terminate's answer without --yes: what it would destroy, every volume
// with its data named (or, when they cannot be listed, that all of them go), and the flag that
// confirms it.
func terminateRefusal(ctx context.Context, workspace string) error {
	const what = "terminate deletes the cluster, its state and its master secret"
	if !hasAdminConf(workspace) {
		return errors.New(what + ": confirm with --yes")
	}
	vols, err := volumesLostWith(ctx, workspace)
	if err != nil {
		return fmt.Errorf("%s, and every volume of the cluster with its data (cannot list the cluster's volumes: %w): confirm with --yes", what, err)
	}
	if len(vols) == 0 {
		return errors.New(what + " (it holds no volume): confirm with --yes")
	}
	described := make([]string, len(vols))
	for i, v := range vols {
		described[i] = describeVolume(v)
	}
	return fmt.Errorf("%s, and %d volume(s) with their data: %s: confirm with --yes", what, len(vols), strings.Join(described, "; "))
}

// announceLostVolumes prints, before terminate removes anything, every volume it destroys:
// --yes asks nothing, so this is where the operator reads what went. A cluster whose API does
// not answer is terminated all the same (terminate is how a broken cluster goes): then it says
// that every volume goes, unnamed.
func announceLostVolumes(ctx context.Context, out io.Writer, workspace string) {
	if !hasAdminConf(workspace) {
		return // never initialized: no workload, no volume
	}
	vols, err := volumesLostWith(ctx, workspace)
	switch {
	case err != nil:
		fmt.Fprintf(out, "terminate: cannot list the cluster's volumes (%v); every volume of the cluster is destroyed with it\n", err)
	case len(vols) > 0:
		fmt.Fprintf(out, "terminate: %d volume(s) are destroyed with the cluster, their data with them (the local provider keeps movable volumes in the cluster's folder, which goes too):\n", len(vols))
		printVolumes(out, "destroys", vols)
	}
}

func hasAdminConf(workspace string) bool {
	_, err := os.Stat(filepath.Join(workspace, AdminConfFile))
	return err == nil
}
