package joinservice_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/openconstellation/constellation/internal/csidriver"
	"github.com/openconstellation/constellation/internal/joinservice"
)

// The unit tier of KubeVolumes' rules, on client-go's fake clientset (which ignores field
// selectors: the rules must hold without them). TestVolumeKeysFollowPods runs them against a
// real API server.
func TestKubeVolumes(t *testing.T) {
	pvName := "pv-a"
	id := csidriver.IDFor(pvName)
	pv := func(name, driver, handle string) runtime.Object {
		return &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PersistentVolumeSpec{
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: handle}},
		}}
	}
	va := func(name, attacher, pv, node string, attached bool) runtime.Object {
		return &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:   storagev1.VolumeAttachmentSpec{Attacher: attacher, NodeName: node, Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv}},
			Status: storagev1.VolumeAttachmentStatus{Attached: attached}}
	}
	pod := func(ns, name, node, claim string, phase corev1.PodPhase) runtime.Object {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.PodSpec{NodeName: node, Volumes: []corev1.Volume{
			{Name: "cfg", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
			{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}},
		}}, Status: corev1.PodStatus{Phase: phase}}
	}
	pvc := func(ns, name, volume string) runtime.Object {
		return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.PersistentVolumeClaimSpec{VolumeName: volume}}
	}

	// A pod with a generic ephemeral volume "scratch": its claim is <pod>-scratch, controlled
	// by the pod (owner UID), as Kubernetes' ephemeral volume controller makes it.
	ephemeralPod := func(name, node string) runtime.Object {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: name, UID: types.UID("uid-" + name)}, Spec: corev1.PodSpec{NodeName: node, Volumes: []corev1.Volume{
			{Name: "scratch", VolumeSource: corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{}}},
		}}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	}
	ephemeralClaim := func(pod, owner, volume string) runtime.Object {
		c := pvc("app", pod+"-scratch", volume).(*corev1.PersistentVolumeClaim)
		if owner != "" {
			controller := true
			c.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: owner, UID: types.UID("uid-" + owner), Controller: &controller}}
		}
		return c
	}

	testCases := map[string]struct {
		objects      []runtime.Object
		wantPV       string
		wantAttached bool
		wantUsed     bool
	}{
		"attached and used": {
			objects:      []runtime.Object{pv(pvName, csidriver.Name, id), va("a", csidriver.Name, pvName, "n1", true), pod("app", "p", "n1", "c", corev1.PodRunning), pvc("app", "c", pvName)},
			wantPV:       pvName,
			wantAttached: true, wantUsed: true,
		},
		"pending pod counts": {
			objects:      []runtime.Object{pv(pvName, csidriver.Name, id), va("a", csidriver.Name, pvName, "n1", true), pod("app", "p", "n1", "c", corev1.PodPending), pvc("app", "c", pvName)},
			wantPV:       pvName,
			wantAttached: true, wantUsed: true,
		},
		"another driver's volume of that handle": {
			objects: []runtime.Object{pv(pvName, "other.example", id)},
		},
		"attached elsewhere, used elsewhere": {
			objects: []runtime.Object{pv(pvName, csidriver.Name, id), va("a", csidriver.Name, pvName, "n2", true), pod("app", "p", "n2", "c", corev1.PodRunning), pvc("app", "c", pvName)},
			wantPV:  pvName,
		},
		"attachment not done, another attacher's done": {
			objects: []runtime.Object{pv(pvName, csidriver.Name, id), va("a", csidriver.Name, pvName, "n1", false), va("b", "other.example", pvName, "n1", true)},
			wantPV:  pvName,
		},
		"terminated pods": {
			objects: []runtime.Object{pv(pvName, csidriver.Name, id), va("a", csidriver.Name, pvName, "n1", true),
				pod("app", "done", "n1", "c", corev1.PodSucceeded), pod("app", "crashed", "n1", "c", corev1.PodFailed), pvc("app", "c", pvName)},
			wantPV: pvName, wantAttached: true,
		},
		"the claim of that name in another namespace": {
			objects: []runtime.Object{pv(pvName, csidriver.Name, id), va("a", csidriver.Name, pvName, "n1", true),
				pod("app", "p", "n1", "c", corev1.PodRunning), pvc("app", "c", "pv-other"), pvc("victim", "c", pvName)},
			wantPV: pvName, wantAttached: true,
		},
		"generic ephemeral volume of a pod of the node": {
			objects: []runtime.Object{pv(pvName, csidriver.Name, id), va("a", csidriver.Name, pvName, "n1", true),
				ephemeralPod("p", "n1"), ephemeralClaim("p", "p", pvName)},
			wantPV: pvName, wantAttached: true, wantUsed: true,
		},
		"an ephemeral volume's claim the pod does not control": {
			objects: []runtime.Object{pv(pvName, csidriver.Name, id), va("a", csidriver.Name, pvName, "n1", true),
				ephemeralPod("p", "n1"), ephemeralClaim("p", "", pvName)},
			wantPV: pvName, wantAttached: true,
		},
		"an ephemeral volume's claim another pod controls": {
			objects: []runtime.Object{pv(pvName, csidriver.Name, id), va("a", csidriver.Name, pvName, "n1", true),
				ephemeralPod("p", "n1"), ephemeralClaim("p", "other", pvName)},
			wantPV: pvName, wantAttached: true,
		},
		"claim missing": {
			objects: []runtime.Object{pv(pvName, csidriver.Name, id), va("a", csidriver.Name, pvName, "n1", true), pod("app", "p", "n1", "c", corev1.PodRunning)},
			wantPV:  pvName, wantAttached: true,
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			k := joinservice.KubeVolumes{Client: fake.NewClientset(tc.objects...)}
			got, err := k.PersistentVolume(ctx, id)
			require.NoError(t, err)
			assert.Equal(t, tc.wantPV, got)
			attached, err := k.AttachedTo(ctx, pvName, "n1")
			require.NoError(t, err)
			assert.Equal(t, tc.wantAttached, attached)
			used, err := k.UsedOn(ctx, pvName, "n1")
			require.NoError(t, err)
			assert.Equal(t, tc.wantUsed, used)
		})
	}
}
