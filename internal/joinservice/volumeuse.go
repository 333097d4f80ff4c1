package joinservice

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/pager"

	"github.com/openconstellation/constellation/internal/csidriver"
)

// VolumeUse is the cluster's word on a volume and a node, the facts the join service
// authorizes a volume key by (docs/joinservice.md, "Volume keys"). Every answer is read at
// the moment of the call, never from a cache: a pod bound a moment ago must be seen, a pod or
// attachment removed a moment ago must not be.
type VolumeUse interface {
	// PersistentVolume returns the name of the PersistentVolume of driver csidriver.Name whose
	// volume handle is id, "" when there is none.
	PersistentVolume(ctx context.Context, id string) (string, error)
	// AttachedTo reports whether a VolumeAttachment of attacher csidriver.Name attaches the
	// PersistentVolume pv to node, with status attached.
	AttachedTo(ctx context.Context, pv, node string) (bool, error)
	// UsedOn reports whether a pod bound to node, not terminated, uses a
	// PersistentVolumeClaim (of its namespace) bound to the PersistentVolume pv.
	UsedOn(ctx context.Context, pv, node string) (bool, error)
}

// KubeVolumes answers VolumeUse from the API server. Every read is a list or get without a
// resource version, which the API server serves from etcd with a quorum read (the newest
// state, never its watch cache). It needs get and list of pods, persistentvolumeclaims,
// persistentvolumes and volumeattachments, and nothing else (internal/deploy).
type KubeVolumes struct {
	Client kubernetes.Interface
}

// listPage bounds one list response; a pager fetches the rest.
const listPage = 500

// errStopList ends a list once the item looked for is found.
var errStopList = errors.New("found")

// claimRef names a PersistentVolumeClaim; owner, when set, is the UID of the pod that must
// control it (a generic ephemeral volume's claim).
type claimRef struct {
	namespace, name string
	owner           types.UID
}

// PersistentVolume implements VolumeUse. A PersistentVolume's name is not derivable from its
// volume handle (the handle is a hash of the name: csidriver.IDFor), and the API server has
// no field selector on spec.csi, so the PersistentVolumes are listed.
func (k KubeVolumes) PersistentVolume(ctx context.Context, id string) (string, error) {
	var found string
	p := pager.New(func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		return k.Client.CoreV1().PersistentVolumes().List(ctx, opts)
	})
	p.PageSize = listPage
	err := p.EachListItem(ctx, metav1.ListOptions{}, func(obj runtime.Object) error {
		pv, ok := obj.(*corev1.PersistentVolume)
		if !ok {
			return fmt.Errorf("unexpected object %T in the PersistentVolume list", obj)
		}
		if csi := pv.Spec.CSI; csi != nil && csi.Driver == csidriver.Name && csi.VolumeHandle == id {
			found = pv.Name
			return errStopList
		}
		return nil
	})
	if err != nil && !errors.Is(err, errStopList) {
		return "", fmt.Errorf("listing PersistentVolumes: %w", err)
	}
	return found, nil
}

// AttachedTo implements VolumeUse. VolumeAttachments have no field selectors either; there
// is one per attached volume.
func (k KubeVolumes) AttachedTo(ctx context.Context, pv, node string) (bool, error) {
	var attached bool
	p := pager.New(func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		return k.Client.StorageV1().VolumeAttachments().List(ctx, opts)
	})
	p.PageSize = listPage
	err := p.EachListItem(ctx, metav1.ListOptions{}, func(obj runtime.Object) error {
		va, ok := obj.(*storagev1.VolumeAttachment)
		if !ok {
			return fmt.Errorf("unexpected object %T in the VolumeAttachment list", obj)
		}
		src := va.Spec.Source.PersistentVolumeName
		if va.Spec.Attacher == csidriver.Name && src != nil && *src == pv && va.Spec.NodeName == node && va.Status.Attached {
			attached = true
			return errStopList
		}
		return nil
	})
	if err != nil && !errors.Is(err, errStopList) {
		return false, fmt.Errorf("listing VolumeAttachments: %w", err)
	}
	return attached, nil
}

// UsedOn implements VolumeUse: the pods bound to node (field selector spec.nodeName), and
// the claims those that have not terminated use, each read once.
func (k KubeVolumes) UsedOn(ctx context.Context, pv, node string) (bool, error) {
	var claims []claimRef
	seen := map[claimRef]bool{}
	p := pager.New(func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		return k.Client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, opts)
	})
	p.PageSize = listPage
	err := p.EachListItem(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String()}, func(obj runtime.Object) error {
		pod, ok := obj.(*corev1.Pod)
		if !ok {
			return fmt.Errorf("unexpected object %T in the Pod list", obj)
		}
		// The field selector is the API server's; a pod of another node is never counted.
		if pod.Spec.NodeName != node || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			return nil
		}
		for _, v := range pod.Spec.Volumes {
			var c claimRef
			switch {
			case v.PersistentVolumeClaim != nil:
				c = claimRef{namespace: pod.Namespace, name: v.PersistentVolumeClaim.ClaimName}
			case v.Ephemeral != nil:
				// A generic ephemeral volume: the claim Kubernetes made for this pod, named
				// <pod>-<volume> and controlled by the pod; the kubelet uses it only then, and so
				// does this check (a claim of that name the pod does not own is not its volume).
				c = claimRef{namespace: pod.Namespace, name: pod.Name + "-" + v.Name, owner: pod.UID}
			default:
				continue
			}
			if !seen[c] {
				seen[c] = true
				claims = append(claims, c)
			}
		}
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("listing the pods bound to node %s: %w", node, err)
	}
	for _, c := range claims {
		pvc, err := k.Client.CoreV1().PersistentVolumeClaims(c.namespace).Get(ctx, c.name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("reading PersistentVolumeClaim %s/%s: %w", c.namespace, c.name, err)
		}
		if c.owner != "" {
			if ref := metav1.GetControllerOf(pvc); ref == nil || ref.UID != c.owner {
				continue
			}
		}
		if pvc.Spec.VolumeName == pv {
			return true, nil
		}
	}
	return false, nil
}
