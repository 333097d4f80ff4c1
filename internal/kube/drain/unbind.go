package drain

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/openconstellation/constellation/pkg/untrusted"
)

// Why a removed node's pods must go, and not only its Node: the Node authorizer lets a node
// read every Secret, ConfigMap, PersistentVolumeClaim and service account token that a pod
// bound to it (spec.nodeName) references, whether or not the Node object still exists, and
// a pod that is terminating counts until its object is gone. The removed-node authorizer
// (internal/nodeauthz) refuses a removed node everything, but it fails open while it is down
// or not synced; then only what is still bound to the node decides what the node reads. A
// drain leaves DaemonSet pods and mirror pods of static pods on the node, so after a removal
// they would keep giving a removed node's credentials the Secrets they mount, rotated ones
// included, until the pod garbage collector got to them.

// DeleteBoundPods asks for the deletion of every pod bound to node at once (grace period 0,
// each with a UID precondition, so a pod of the same name made meanwhile is not touched). It
// returns the pods it asked to delete and those still bound to node afterwards, each with
// what keeps it: finalizers, or a deletion not yet done. It is one round: the caller polls it
// until nothing is left. A pod that is gone before its deletion is no error.
//
// Only for a node that is gone: its kubelet no longer runs the pods, and it could not confirm
// a graceful deletion anyway (a removed node's writes are refused, internal/deploy
// RemovedNodesPolicy). A grace period of 0 on a pod whose containers still ran elsewhere would
// give up Kubernetes' guarantee that a pod's containers have stopped before its name is
// free; on a node whose machine is deleted there is nothing left to stop. Finalizers are left
// to whoever set them.
func DeleteBoundPods(ctx context.Context, client kubernetes.Interface, node string) (deleted []PodRef, stuck []StuckPod, err error) {
	pods, err := podsOn(ctx, client, node)
	if err != nil {
		return nil, nil, err
	}
	for i := range pods {
		p := &pods[i]
		if p.DeletionTimestamp != nil && p.DeletionGracePeriodSeconds != nil && *p.DeletionGracePeriodSeconds == 0 {
			continue // asked already; only its finalizers keep it
		}
		err := client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{
			GracePeriodSeconds: ptr.To[int64](0),
			Preconditions:      &metav1.Preconditions{UID: &p.UID},
		})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return deleted, nil, fmt.Errorf("deleting pod %s, bound to node %q: %w", refOf(p), node, err)
		}
		if err == nil {
			deleted = append(deleted, refOf(p))
		}
	}
	left, err := podsOn(ctx, client, node)
	if err != nil {
		return deleted, nil, err
	}
	for i := range left {
		stuck = append(stuck, StuckPod{Pod: refOf(&left[i]), Reason: boundReason(&left[i])})
	}
	return deleted, stuck, nil
}

// boundReason says what keeps p after its deletion was asked for.
func boundReason(p *corev1.Pod) string {
	if p.DeletionTimestamp == nil {
		return "bound to the node, deletion not yet requested"
	}
	if len(p.Finalizers) > 0 {
		return "deleted, kept by its finalizers " + untrusted.QuoteList(p.Finalizers) + " (for their controllers to remove)"
	}
	return "deleted, not gone yet"
}
