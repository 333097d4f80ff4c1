package joinservice_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/openconstellation/constellation/api/join/joinpb"
	"github.com/openconstellation/constellation/internal/csidriver"
	"github.com/openconstellation/constellation/internal/diskowner"
)

func (e *env) volumeKey(j *joiner, id string) (*joinpb.IssueVolumeKeyResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn := e.conn(j)
	defer conn.Close()
	return joinpb.NewJoinServiceClient(conn).IssueVolumeKey(ctx, &joinpb.IssueVolumeKeyRequest{VolumeId: id})
}

// volumes makes the Kubernetes objects of encrypted volumes in a namespace of their own, as
// the provisioner, the attacher and users would: a PersistentVolume of the driver, its bound
// claim, a VolumeAttachment, pods.
type volumes struct {
	t  *testing.T
	ns string
}

func newVolumes(t *testing.T) *volumes {
	ctx := context.Background()
	ns := "volumes-" + rand.String(6)
	_, err := kube.Admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	require.NoError(t, err)
	// No controller manager runs: the pods' service account is made by hand.
	_, err = kube.Admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = kube.Admin.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	return &volumes{t: t, ns: ns}
}

// volume makes a PersistentVolume named name of driver with a claim of the same name bound
// to it, and returns the volume's id.
func (v *volumes) volume(name, driver string) string {
	t, ctx := v.t, context.Background()
	pvName := v.ns + "-" + name
	id := csidriver.IDFor(pvName)
	_, err := kube.Admin.CoreV1().PersistentVolumes().Create(ctx, &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: pvName},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: id}},
			ClaimRef:                      &corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: v.ns, Name: name},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = kube.Admin.CoreV1().PersistentVolumes().Delete(context.Background(), pvName, metav1.DeleteOptions{})
	})
	storageClass := ""
	_, err = kube.Admin.CoreV1().PersistentVolumeClaims(v.ns).Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
			VolumeName:       pvName,
			StorageClassName: &storageClass,
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	return id
}

// attach makes the VolumeAttachment of volume name to node, attached or not, as the attacher
// (csi-attacher) reports it.
func (v *volumes) attach(name, node, attacher string, attached bool) {
	t, ctx := v.t, context.Background()
	pvName := v.ns + "-" + name
	va, err := kube.Admin.StorageV1().VolumeAttachments().Create(ctx, &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: "va-" + pvName + "-" + node},
		Spec: storagev1.VolumeAttachmentSpec{
			Attacher: attacher, NodeName: node,
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pvName},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = kube.Admin.StorageV1().VolumeAttachments().Delete(context.Background(), va.Name, metav1.DeleteOptions{})
	})
	va.Status.Attached = attached
	_, err = kube.Admin.StorageV1().VolumeAttachments().UpdateStatus(ctx, va, metav1.UpdateOptions{})
	require.NoError(t, err)
}

// pod binds a pod using claim to node, in phase (empty: as created, Pending).
func (v *volumes) pod(name, node, claim string, phase corev1.PodPhase) {
	t, ctx := v.t, context.Background()
	p, err := kube.Admin.CoreV1().Pods(v.ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			NodeName:   node,
			Containers: []corev1.Container{{Name: "app", Image: "registry.example/app:1", VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim},
			}}},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	if phase != "" {
		p.Status.Phase = phase
		_, err = kube.Admin.CoreV1().Pods(v.ns).UpdateStatus(ctx, p, metav1.UpdateOptions{})
		require.NoError(t, err)
	}
}

func (v *volumes) deletePod(name string) {
	zero := int64(0)
	require.NoError(v.t, kube.Admin.CoreV1().Pods(v.ns).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: &zero}))
}

// A volume's key goes only to the node that has the volume attached and a pod using it. The
// attacker is an attested node of the right image, named by the platform (worker-1, or a
// removed worker): it asks for the keys of volumes its pods do not use. Every case fails on a
// service that derives a volume's key for any attested node that asks (seen failing before
// authorizeVolume existed).
func TestVolumeKeysFollowPods(t *testing.T) {
	e := newEnv(t, envOptions{})
	v := newVolumes(t)

	// worker-0's application: attached to worker-0, used by its pod.
	mine := v.volume("mine", csidriver.Name)
	v.attach("mine", "worker-0", csidriver.Name, true)
	v.pod("app", "worker-0", "mine", "")
	// worker-1 has it attached, but only a pod on worker-0 uses it (a stale attachment).
	attachedNotUsed := v.volume("attached-not-used", csidriver.Name)
	v.attach("attached-not-used", "worker-1", csidriver.Name, true)
	v.pod("elsewhere", "worker-0", "attached-not-used", "")
	// worker-1 has it attached; its pod there finished.
	finished := v.volume("finished", csidriver.Name)
	v.attach("finished", "worker-1", csidriver.Name, true)
	v.pod("job", "worker-1", "finished", corev1.PodSucceeded)
	// worker-1's pod uses it, but the attacher has not attached it yet.
	pending := v.volume("pending", csidriver.Name)
	v.attach("pending", "worker-1", csidriver.Name, false)
	v.pod("waiting", "worker-1", "pending", "")
	// Attached to worker-1 and used there, but by another driver's attacher.
	otherAttacher := v.volume("other-attacher", csidriver.Name)
	v.attach("other-attacher", "worker-1", "other.csi.example", true)
	v.pod("other", "worker-1", "other-attacher", "")
	// Another driver's volume with an id of our form.
	otherDriver := v.volume("other-driver", "other.csi.example")
	v.attach("other-driver", "worker-1", csidriver.Name, true)
	v.pod("foreign", "worker-1", "other-driver", "")
	// worker-9 has its volume attached and used, and was removed from the cluster (the
	// platform lists its name again); worker-2's instance was deleted.
	removedVol := v.volume("removed", csidriver.Name)
	v.attach("removed", "worker-9", csidriver.Name, true)
	v.pod("on-removed", "worker-9", "removed", "")
	require.NoError(t, diskowner.Store{Client: kube.Admin}.MarkRemoved(context.Background(), "worker-9", time.Now()))
	goneVol := v.volume("gone", csidriver.Name)
	v.attach("gone", "worker-2", csidriver.Name, true)
	v.pod("on-gone", "worker-2", "gone", "")
	e.removed.Store("worker-2", true)

	testCases := map[string]struct {
		node       string
		id         string
		wantCode   codes.Code
		wantReason string
		wantMsg    string
	}{
		"another node's volume, used by a pod there": {
			node: "worker-1", id: mine,
			wantCode: codes.PermissionDenied, wantReason: "volume-not-attached", wantMsg: "is not attached to node \"worker-1\"",
		},
		"attached to the node, used only by a pod elsewhere": {
			node: "worker-1", id: attachedNotUsed,
			wantCode: codes.PermissionDenied, wantReason: "volume-not-used-by-node", wantMsg: "no running pod bound to node \"worker-1\"",
		},
		"attached to the node, its pod there finished": {
			node: "worker-1", id: finished,
			wantCode: codes.PermissionDenied, wantReason: "volume-not-used-by-node", wantMsg: "no running pod",
		},
		"used by the node's pod, not attached yet": {
			node: "worker-1", id: pending,
			wantCode: codes.PermissionDenied, wantReason: "volume-not-attached", wantMsg: "is not attached",
		},
		"attached by another driver's attacher": {
			node: "worker-1", id: otherAttacher,
			wantCode: codes.PermissionDenied, wantReason: "volume-not-attached", wantMsg: "is not attached",
		},
		"another driver's volume": {
			node: "worker-1", id: otherDriver,
			wantCode: codes.PermissionDenied, wantReason: "volume-unknown", wantMsg: "no PersistentVolume of driver",
		},
		"no such volume": {
			node: "worker-1", id: csidriver.IDFor("never provisioned"),
			wantCode: codes.PermissionDenied, wantReason: "volume-unknown", wantMsg: "no PersistentVolume",
		},
		"removed node the platform lists again, its own volume": {
			node: "worker-9", id: removedVol,
			wantCode: codes.PermissionDenied, wantReason: "removed-node", wantMsg: "was removed from the cluster",
		},
		"node the platform no longer lists, its own volume": {
			node: "worker-2", id: goneVol,
			wantCode: codes.PermissionDenied, wantReason: "unknown-node", wantMsg: "platform does not know this node",
		},
		"id of another form: a disk UUID": {
			node: "worker-0", id: "2f4a1c9e-8b7d-4e21-9a3c-5d6e7f809a1b",
			wantCode: codes.InvalidArgument, wantReason: "invalid-volume-id", wantMsg: "is not of the form vol-",
		},
		"id of another form: the measurement secret": {
			node: "worker-0", id: "measurementSecret",
			wantCode: codes.InvalidArgument, wantReason: "invalid-volume-id", wantMsg: "is not of the form vol-",
		},
		"id of another form: upper case": {
			node: "worker-0", id: "VOL-" + mine[4:],
			wantCode: codes.InvalidArgument, wantReason: "invalid-volume-id", wantMsg: "is not of the form vol-",
		},
		"empty id": {
			node: "worker-0", id: "",
			wantCode: codes.InvalidArgument, wantReason: "invalid-volume-id", wantMsg: "is not of the form vol-",
		},
		"the node's own volume": {node: "worker-0", id: mine, wantCode: codes.OK},
	}
	i := 10
	for name, tc := range testCases {
		i++
		t.Run(name, func(t *testing.T) {
			j := e.joiner(tc.node, fmt.Sprintf("127.0.7.%d", i))
			keysBefore := e.keys.calls.Load()
			rejectedBefore := e.counter("constellation_joinservice_rejections_total", "stage", "volume-key", "reason", tc.wantReason)
			issuedBefore := e.counter("constellation_joinservice_tickets_issued_total", "method", "volume-key", "role", "any")

			resp, err := e.volumeKey(j, tc.id)
			assert.Equal(t, tc.wantCode, status.Code(err), "%v", err)
			if tc.wantCode == codes.OK {
				require.NoError(t, err)
				want, err := e.secret.VolumeKey(tc.id)
				require.NoError(t, err)
				assert.Equal(t, want, resp.Key, "the key is kms.MasterSecret.VolumeKey of the id")
				assert.Equal(t, issuedBefore+1, e.counter("constellation_joinservice_tickets_issued_total", "method", "volume-key", "role", "any"))
				accepted := e.logLines("admission accepted")
				require.NotEmpty(t, accepted)
				last := accepted[len(accepted)-1]
				assert.Equal(t, "volume-key", last["method"])
				assert.Equal(t, tc.id, last["volume"])
				return
			}
			assert.Nil(t, resp, "no key in a refused response")
			assert.ErrorContains(t, err, tc.wantMsg)
			assert.Equal(t, keysBefore, e.keys.calls.Load(), "a refused request must not derive a key")
			assert.Equal(t, rejectedBefore+1, e.counter("constellation_joinservice_rejections_total", "stage", "volume-key", "reason", tc.wantReason))
			assert.Equal(t, issuedBefore, e.counter("constellation_joinservice_tickets_issued_total", "method", "volume-key", "role", "any"))
			recorded := e.logLines("admission rejected")
			require.NotEmpty(t, recorded)
			last := recorded[len(recorded)-1]
			assert.Equal(t, "volume-key", last["method"])
			assert.Equal(t, tc.wantReason, last["reason"])
			if tc.wantReason == "unknown-node" {
				assert.Empty(t, last["node"], "the platform named no node")
			} else {
				assert.Equal(t, tc.node, last["node"])
			}
		})
	}
	// Volume-key refusals are not join refusals: the book the CLI reads for joins has none.
	book, _ := e.svc.Refusals().Snapshot()
	for _, r := range book {
		assert.NotContains(t, []string{"volume-unknown", "volume-not-attached", "volume-not-used-by-node", "invalid-volume-id"}, r.Reason)
	}
}

// The service reads the cluster at every request: a pod bound a moment ago is seen at once,
// and so is one deleted a moment ago (an informer's cache would lag behind both).
func TestVolumeKeysReadFresh(t *testing.T) {
	e := newEnv(t, envOptions{})
	v := newVolumes(t)
	id := v.volume("moving", csidriver.Name)
	v.attach("moving", "worker-1", csidriver.Name, true)
	j := e.joiner("worker-1", "127.0.8.1")

	_, err := e.volumeKey(j, id)
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	v.pod("app", "worker-1", "moving", "")
	resp, err := e.volumeKey(j, id)
	require.NoError(t, err, "a pod bound a moment ago")
	want, err := e.secret.VolumeKey(id)
	require.NoError(t, err)
	assert.Equal(t, want, resp.Key)

	v.deletePod("app")
	_, err = e.volumeKey(j, id)
	assert.Equal(t, codes.PermissionDenied, status.Code(err), "a pod deleted a moment ago: %v", err)
	assert.ErrorContains(t, err, "no running pod")
}
