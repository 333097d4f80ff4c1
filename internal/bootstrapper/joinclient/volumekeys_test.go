package joinclient_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/openconstellation/constellation/internal/bootstrapper/bootstraptest"
	"github.com/openconstellation/constellation/internal/bootstrapper/joinclient"
	"github.com/openconstellation/constellation/internal/csidriver"
	"github.com/openconstellation/constellation/internal/joinservice"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// volumeFor makes the objects of an encrypted volume used on node: its PersistentVolume,
// bound claim and pod, and, when attached, its VolumeAttachment; it returns the volume's id.
func volumeFor(t *testing.T, node string, attached bool) string {
	ctx, c := context.Background(), kube.Admin
	ns := "vk-" + rand.String(6)
	_, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = c.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	pvName := "pv-" + ns
	id := csidriver.IDFor(pvName)
	_, err = c.CoreV1().PersistentVolumes().Create(ctx, &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: pvName},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:               corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:            []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: csidriver.Name, VolumeHandle: id}},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	empty := ""
	_, err = c.CoreV1().PersistentVolumeClaims(ns).Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "data"},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, VolumeName: pvName, StorageClassName: &empty,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = c.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "app"},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "app", Image: "registry.example/app:1"}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"}}}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	va, err := c.StorageV1().VolumeAttachments().Create(ctx, &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: "va-" + ns},
		Spec:       storagev1.VolumeAttachmentSpec{Attacher: csidriver.Name, NodeName: node, Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pvName}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	va.Status.Attached = attached
	_, err = c.StorageV1().VolumeAttachments().UpdateStatus(ctx, va, metav1.UpdateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx := context.Background()
		_ = c.StorageV1().VolumeAttachments().Delete(ctx, va.Name, metav1.DeleteOptions{})
		_ = c.CoreV1().PersistentVolumes().Delete(ctx, pvName, metav1.DeleteOptions{})
		_ = c.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
	})
	return id
}

// volumeKeys is the node's key source as the bootstrapper builds it: the join client's
// dialer (the node's TPM, its check of the service) and the cluster it joined.
func (e *env) volumeKeys(clusterID []byte, endpoints ...string) (*joinclient.VolumeKeys, *atomicMeta) {
	t := e.t
	check, err := joinservice.ServiceCheck{Variant: variant.QEMUVTPM}.Validator(e.node.TPM)
	require.NoError(t, err)
	dial, err := joinclient.AttestedDialer(e.node.Issuer(t), check)
	require.NoError(t, err)
	meta := &atomicMeta{Static: &metadata.Static{Instance: e.meta.Instance, Endpoints: endpoints}}
	keys, err := joinclient.NewVolumeKeys(joinclient.VolumeKeysConfig{
		Metadata: meta, Dial: dial, ClusterID: clusterID,
		PollInterval: fastPoll, Backoff: fastBackoff, Log: slog.New(slog.NewTextHandler(&e.logs, nil)),
	})
	require.NoError(t, err)
	return keys, meta
}

// atomicMeta counts the key source's attempts (one endpoint list each).
type atomicMeta struct {
	*metadata.Static
	calls int
}

func (m *atomicMeta) JoinEndpoints(ctx context.Context) ([]string, error) {
	m.calls++
	return m.Static.JoinEndpoints(ctx)
}

// The node side of IssueVolumeKey against the real join service (real aTLS both ways, a real
// API server): the key of a volume attached to the node and used by its pod; a refusal
// returned at once, naming its reason; a dead endpoint skipped; a service of another cluster
// never believed.
func TestVolumeKeys(t *testing.T) {
	e := newEnv(t, metadata.Worker, bootstraptest.ClusterOptions{})
	mine := volumeFor(t, "node-1", true)
	pending := volumeFor(t, "node-1", false)
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	deadAddr := dead.Addr().String()
	require.NoError(t, dead.Close())

	t.Run("the node's volume", func(t *testing.T) {
		keys, meta := e.volumeKeys(e.cluster.ClusterID, deadAddr, e.cluster.Addr)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		key, err := keys.VolumeKey(ctx, mine)
		require.NoError(t, err)
		want, err := e.cluster.Master.VolumeKey(mine)
		require.NoError(t, err)
		assert.Equal(t, want, key)
		assert.Equal(t, 1, meta.calls, "a dead endpoint before a live one costs no second attempt")
	})
	t.Run("refused at once, naming the reason", func(t *testing.T) {
		keys, meta := e.volumeKeys(e.cluster.ClusterID, e.cluster.Addr)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		key, err := keys.VolumeKey(ctx, pending)
		assert.Nil(t, key)
		var refused *joinclient.RefusedError
		require.ErrorAs(t, err, &refused)
		assert.Equal(t, codes.PermissionDenied, refused.Code)
		assert.Contains(t, refused.Reason, "volume-not-attached")
		assert.Equal(t, 1, meta.calls, "a definitive refusal is not asked again")
	})
	t.Run("invalid id, never sent", func(t *testing.T) {
		keys, meta := e.volumeKeys(e.cluster.ClusterID, e.cluster.Addr)
		_, err := keys.VolumeKey(context.Background(), "../../etc/passwd")
		assert.ErrorContains(t, err, "is not of the form vol-")
		assert.Zero(t, meta.calls)
	})
	t.Run("service of another cluster", func(t *testing.T) {
		keys, meta := e.volumeKeys([]byte("another cluster's ID"), e.cluster.Addr)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		key, err := keys.VolumeKey(ctx, mine)
		assert.Nil(t, key)
		require.Error(t, err)
		assert.True(t, errors.Is(err, context.DeadlineExceeded), "%v", err)
		// The first attempts say why (later ones may meet the service's handshake rate limit).
		assert.Contains(t, e.logs.String(), "join service belongs to another cluster")
		assert.Greater(t, meta.calls, 1, "retried until the deadline")
	})
	t.Run("no service yet, until the deadline", func(t *testing.T) {
		keys, _ := e.volumeKeys(e.cluster.ClusterID, deadAddr)
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		_, err := keys.VolumeKey(ctx, mine)
		assert.True(t, errors.Is(err, context.DeadlineExceeded), "%v", err)
		assert.ErrorContains(t, err, "no key before the deadline")
	})
}
