// Package nodevolumes finds the PersistentVolumes whose data lives on a node: what removing or
// replacing that node destroys. The CLI names them before it removes a node and refuses
// without the operator's explicit consent (docs/cli.md "Node-local volumes"), as `kubectl
// drain` refuses pods with local data.
//
// A volume is node-local when its data is on one node's disk:
//   - spec.local or spec.hostPath: a directory or device of the node (local-path-provisioner's
//     volumes are hostPath PersistentVolumes pinned to their node by node affinity);
//   - any other volume whose required node affinity restricts it to named nodes
//     (kubernetes.io/hostname In, or the field metadata.name In, in every term): a node-local
//     CSI driver's volume, reachable only from those nodes;
//
// except a volume of the cluster's own driver (spec.csi.driver == csidriver.Name): its data is
// provider-backed storage any node attaches, so it moves with its pods.
//
// Only volumes with a claim (spec.claimRef) are listed: a bound volume, or a released one that
// its Retain policy keeps for its data. A volume never claimed holds nobody's data.
package nodevolumes

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/openconstellation/constellation/internal/csidriver"
	"github.com/openconstellation/constellation/pkg/untrusted"
)

// Volume is a claimed PersistentVolume and where its data is.
type Volume struct {
	// PV is the PersistentVolume's name.
	PV string
	// Claim is the claim's namespace/name.
	Claim string
	// StorageClass is the volume's class, "" for none.
	StorageClass string
	// Size is the volume's capacity as the PersistentVolume states it ("1Gi"), "" if unset.
	Size string
	// Nodes are the nodes the data lives on (for a volume pinned to several, on one of them),
	// among those asked about. Empty for a movable volume, and for a node-local volume
	// whose node no affinity names (Unpinned).
	Nodes []string
	// Unpinned: a local or hostPath volume without node affinity naming its node: its data
	// is on whichever node mounted it, so any node removed may hold it.
	Unpinned bool
	// Movable: a volume of the cluster's own driver (csidriver.Name), not node-local.
	Movable bool
}

// String describes the volume for a plan line: default/data-0 (pv pvc-…, 1Gi, local-path).
// Every name is the API server's (validated object names) but is printed escaped anyway: the
// terminal is the operator's.
func (v Volume) String() string {
	class := v.StorageClass
	if class == "" {
		class = "no storage class"
	}
	size := v.Size
	if size == "" {
		size = "size not set"
	}
	return fmt.Sprintf("%s (pv %s, %s, %s)", untrusted.Text(v.Claim), untrusted.Text(v.PV), untrusted.Text(size), untrusted.Text(class))
}

// Where says where the volume's data is: "on node worker-1", "on any node that mounted it
// (...)" or "kept by the platform outside every node (movable)".
func (v Volume) Where() string {
	switch {
	case v.Movable:
		return "kept by the platform outside every node (movable)"
	case v.Unpinned:
		return "on whichever node mounted it (no node affinity names its node)"
	case len(v.Nodes) == 1:
		return "on node " + untrusted.Text(v.Nodes[0])
	default:
		return "on one of the nodes " + untrusted.Text(strings.Join(v.Nodes, ", "))
	}
}

// OnNodes lists the node-local volumes whose data is on one of nodes (see the package
// documentation), sorted by node, then claim. Nothing is listed for no nodes, and the API
// is not asked then.
func OnNodes(ctx context.Context, client kubernetes.Interface, nodes []string) ([]Volume, error) {
	if len(nodes) == 0 {
		return nil, nil
	}
	pvs, err := list(ctx, client)
	if err != nil {
		return nil, err
	}
	var out []Volume
	for i := range pvs {
		v, ok := describe(&pvs[i])
		if !ok || v.Movable {
			continue
		}
		if v.Unpinned {
			out = append(out, v)
			continue
		}
		if on := onAny(&pvs[i], v.Nodes, nodes); len(on) > 0 {
			v.Nodes = on
			out = append(out, v)
		}
	}
	sortVolumes(out)
	return out, nil
}

// All lists every claimed volume whose data goes with the cluster: every node-local volume
// (on any node) and every movable one, sorted node-local first. A volume of another kind (a
// network file system, a cloud disk of another driver) outlives the cluster and is not listed.
func All(ctx context.Context, client kubernetes.Interface) ([]Volume, error) {
	pvs, err := list(ctx, client)
	if err != nil {
		return nil, err
	}
	var out []Volume
	for i := range pvs {
		if v, ok := describe(&pvs[i]); ok {
			out = append(out, v)
		}
	}
	sortVolumes(out)
	return out, nil
}

func list(ctx context.Context, client kubernetes.Interface) ([]corev1.PersistentVolume, error) {
	pvs, err := client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing PersistentVolumes: %w", err)
	}
	return pvs.Items, nil
}

// describe returns pv as a Volume when it has a claim and its data goes with a node or the
// cluster: node-local (Nodes are every node its affinity names) or movable.
func describe(pv *corev1.PersistentVolume) (Volume, bool) {
	ref := pv.Spec.ClaimRef
	if ref == nil {
		return Volume{}, false
	}
	v := Volume{PV: pv.Name, Claim: ref.Namespace + "/" + ref.Name, StorageClass: pv.Spec.StorageClassName}
	if q, ok := pv.Spec.Capacity[corev1.ResourceStorage]; ok {
		v.Size = q.String()
	}
	if csi := pv.Spec.CSI; csi != nil && csi.Driver == csidriver.Name {
		v.Movable = true
		return v, true
	}
	pinned, isPinned := pinnedNodes(pv)
	onNode := pv.Spec.Local != nil || pv.Spec.HostPath != nil
	switch {
	case isPinned:
		v.Nodes = pinned
		return v, true
	case onNode:
		v.Unpinned = true
		return v, true
	default:
		return Volume{}, false
	}
}

// onAny returns the nodes of leaving that hold pv's data. A local or hostPath volume's data
// is on one of its pinned nodes, which one is not known: any of them leaving may destroy it.
// Another driver's volume pinned to several nodes is reachable from each of them (replicated,
// or on storage they share): it is lost only when every one of them leaves.
func onAny(pv *corev1.PersistentVolume, pinned, leaving []string) []string {
	var on []string
	for _, n := range pinned {
		if slices.Contains(leaving, n) {
			on = append(on, n)
		}
	}
	if pv.Spec.Local != nil || pv.Spec.HostPath != nil || len(on) == len(pinned) {
		return on
	}
	return nil
}

// pinnedNodes returns the nodes pv's required node affinity restricts it to, and whether it
// does: every term (terms are ORed) must restrict the node's name, by the label
// kubernetes.io/hostname In or the field metadata.name In (a term's requirements are ANDed, so
// other requirements beside it only narrow it further). The hostname label is taken as the
// node's name, as the kubelet sets it on this platform.
func pinnedNodes(pv *corev1.PersistentVolume) ([]string, bool) {
	aff := pv.Spec.NodeAffinity
	if aff == nil || aff.Required == nil || len(aff.Required.NodeSelectorTerms) == 0 {
		return nil, false
	}
	var nodes []string
	for _, term := range aff.Required.NodeSelectorTerms {
		names, ok := termNodes(term)
		if !ok {
			return nil, false
		}
		for _, n := range names {
			if !slices.Contains(nodes, n) {
				nodes = append(nodes, n)
			}
		}
	}
	slices.Sort(nodes)
	return nodes, true
}

// termNodes returns the node names one selector term restricts to (the intersection of its
// name requirements), and whether it has any.
func termNodes(term corev1.NodeSelectorTerm) ([]string, bool) {
	var names []string
	pinned := false
	restrict := func(values []string) {
		if !pinned {
			names, pinned = slices.Clone(values), true
			return
		}
		names = slices.DeleteFunc(names, func(n string) bool { return !slices.Contains(values, n) })
	}
	for _, r := range term.MatchExpressions {
		if r.Key == corev1.LabelHostname && r.Operator == corev1.NodeSelectorOpIn {
			restrict(r.Values)
		}
	}
	for _, r := range term.MatchFields {
		if r.Key == "metadata.name" && r.Operator == corev1.NodeSelectorOpIn {
			restrict(r.Values)
		}
	}
	return names, pinned
}

// sortVolumes orders node-local volumes before movable ones, then by node, claim and PV.
func sortVolumes(vs []Volume) {
	slices.SortStableFunc(vs, func(a, b Volume) int {
		if a.Movable != b.Movable {
			if a.Movable {
				return 1
			}
			return -1
		}
		if c := strings.Compare(strings.Join(a.Nodes, ","), strings.Join(b.Nodes, ",")); c != 0 {
			return c
		}
		if c := strings.Compare(a.Claim, b.Claim); c != 0 {
			return c
		}
		return strings.Compare(a.PV, b.PV)
	})
}
