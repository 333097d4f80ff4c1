package deploy_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	storagev1ac "k8s.io/client-go/applyconfigurations/storage/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/openconstellation/constellation/internal/csidriver"
	"github.com/openconstellation/constellation/internal/deploy"
)

// A cluster deployed when local-path was the default StorageClass (its annotation applied by
// deploy's field manager) has exactly one default after the next apply: the encrypted class.
func TestApplyMovesTheDefaultClass(t *testing.T) {
	kube := cluster(t)
	c := kube.Admin
	ctx := context.Background()
	recordInit(t, c)
	_, err := c.StorageV1().StorageClasses().Apply(ctx, storagev1ac.StorageClass(deploy.StorageClass).
		WithAnnotations(map[string]string{deploy.DefaultClassAnnotation: "true"}).
		WithProvisioner(deploy.StorageProvisionerName).
		WithVolumeBindingMode(storagev1.VolumeBindingWaitForFirstConsumer).
		WithReclaimPolicy(corev1.PersistentVolumeReclaimDelete), metav1.ApplyOptions{FieldManager: deploy.FieldManager, Force: true})
	require.NoError(t, err)
	require.Equal(t, []string{"local-path by " + deploy.StorageProvisionerName}, defaultClasses(t, c))

	require.NoError(t, deploy.Apply(ctx, c, config(t), nil))
	assert.Equal(t, []string{"encrypted by " + csidriver.Name}, defaultClasses(t, c))
	local, err := c.StorageV1().StorageClasses().Get(ctx, deploy.StorageClass, metav1.GetOptions{})
	require.NoError(t, err)
	assert.NotContains(t, local.Annotations, deploy.DefaultClassAnnotation)
}

// The CSI controller's identity, through the API server's RBAC: it can do what the sidecars
// do (provision, attach, resize, elect leaders in their own Leases) and nothing that would let
// a compromised controller pod take over kube-system's other Leases (the scheduler's and
// controller manager's leader locks, the removed-node authorizers' readiness reports) or read
// the cluster's secrets.
func TestCSIControllerIdentityAgainstRBAC(t *testing.T) {
	kube := cluster(t)
	c := kube.Admin
	ctx := context.Background()
	recordInit(t, c)
	require.NoError(t, deploy.Apply(ctx, c, config(t), nil))

	restCfg, err := clientcmd.BuildConfigFromFlags("", kube.Kubeconfig)
	require.NoError(t, err)
	restCfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":" + deploy.CSIController}
	sa, err := kubernetes.NewForConfig(restCfg)
	require.NoError(t, err)

	// Leases that are not the sidecars', as the control plane would have them.
	for _, name := range []string{"kube-scheduler", "constellation-nodeauthz-control-plane-0"} {
		_, err := c.CoordinationV1().Leases(ns).Create(ctx, lease(name, "someone"), metav1.CreateOptions{})
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.CoordinationV1().Leases(ns).Delete(ctx, name, metav1.DeleteOptions{}) })
	}
	pvName := "pvc-0f5e5b2a-1c3d-4e5f-8a9b-0c1d2e3f4a5b"
	t.Cleanup(func() { _ = c.CoreV1().PersistentVolumes().Delete(ctx, pvName, metav1.DeleteOptions{}) })

	t.Run("allowed", func(t *testing.T) {
		// Each sidecar's leader election: create, read and renew its Lease.
		for _, name := range []string{
			"volumes-constellation-openconstellation-dev",                          // csi-provisioner
			"external-attacher-leader-volumes-constellation-openconstellation-dev", // csi-attacher
			"external-resizer-volumes-constellation-openconstellation-dev",         // csi-resizer
		} {
			t.Cleanup(func() { _ = c.CoordinationV1().Leases(ns).Delete(ctx, name, metav1.DeleteOptions{}) })
			_, err := sa.CoordinationV1().Leases(ns).Create(ctx, lease(name, "control-plane-0"), metav1.CreateOptions{})
			require.NoError(t, err, name)
			l, err := sa.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{})
			require.NoError(t, err, name)
			l.Spec.HolderIdentity = ptr("control-plane-1")
			_, err = sa.CoordinationV1().Leases(ns).Update(ctx, l, metav1.UpdateOptions{})
			require.NoError(t, err, name)
		}
		// The provisioner's work.
		_, err := sa.CoreV1().PersistentVolumes().Create(ctx, &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: pvName},
			Spec: corev1.PersistentVolumeSpec{
				Capacity:               corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
				AccessModes:            []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: csidriver.Name, VolumeHandle: pvName}},
			},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
		_, err = sa.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
		require.NoError(t, err)
		_, err = sa.CoreV1().PersistentVolumeClaims("default").List(ctx, metav1.ListOptions{})
		require.NoError(t, err)
	})

	for action, call := range map[string]func() error{
		"take over the scheduler's leader Lease": func() error {
			l, err := c.CoordinationV1().Leases(ns).Get(ctx, "kube-scheduler", metav1.GetOptions{})
			require.NoError(t, err)
			l.Spec.HolderIdentity = ptr("csi-controller")
			_, err = sa.CoordinationV1().Leases(ns).Update(ctx, l, metav1.UpdateOptions{})
			return err
		},
		"read a node authorizer's readiness Lease": func() error {
			_, err := sa.CoordinationV1().Leases(ns).Get(ctx, "constellation-nodeauthz-control-plane-0", metav1.GetOptions{})
			return err
		},
		"delete a Lease": func() error {
			return sa.CoordinationV1().Leases(ns).Delete(ctx, "kube-scheduler", metav1.DeleteOptions{})
		},
		"list kube-system's Leases": func() error {
			_, err := sa.CoordinationV1().Leases(ns).List(ctx, metav1.ListOptions{})
			return err
		},
		"read the master secret": func() error {
			_, err := sa.CoreV1().Secrets(ns).Get(ctx, "constellation-mastersecret", metav1.GetOptions{})
			return err
		},
		"create a pod": func() error {
			_, err := sa.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "planted"},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}}}, metav1.CreateOptions{})
			return err
		},
		"create a storage-capacity object (capacity tracking is off)": func() error {
			_, err := sa.StorageV1().CSIStorageCapacities(ns).Create(ctx, &storagev1.CSIStorageCapacity{ObjectMeta: metav1.ObjectMeta{Name: "planted"}, StorageClassName: deploy.EncryptedStorageClass}, metav1.CreateOptions{})
			return err
		},
		"change the CSIDriver": func() error {
			return sa.StorageV1().CSIDrivers().Delete(ctx, csidriver.Name, metav1.DeleteOptions{})
		},
	} {
		t.Run(action, func(t *testing.T) {
			err := call()
			assert.True(t, apierrors.IsForbidden(err), "want Forbidden, got %v", err)
		})
	}
}

func lease(name, holder string) *coordinationv1.Lease {
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr(holder), LeaseDurationSeconds: ptr(int32(15))}}
}

// Run waits for the CSI controller with the services, unless Config.SkipCSIControllerWait
// leaves it out.
func TestRunWaitsForCSIController(t *testing.T) {
	kube := cluster(t)
	c := kube.Admin
	ctx := context.Background()
	recordInit(t, c)
	require.NoError(t, deploy.Apply(ctx, c, config(t), nil))
	for _, name := range []string{deploy.KeyService, deploy.JoinService, deploy.VerificationService} {
		ds, err := c.AppsV1().DaemonSets(ns).Get(ctx, name, metav1.GetOptions{})
		require.NoError(t, err)
		ds.Status = appsv1.DaemonSetStatus{ObservedGeneration: ds.Generation, DesiredNumberScheduled: 1, CurrentNumberScheduled: 1,
			UpdatedNumberScheduled: 1, NumberReady: 1, NumberAvailable: 1}
		_, err = c.AppsV1().DaemonSets(ns).UpdateStatus(ctx, ds, metav1.UpdateOptions{})
		require.NoError(t, err)
	}
	kubeconfig, err := os.ReadFile(kube.Kubeconfig)
	require.NoError(t, err)

	cfg := config(t)
	cfg.WaitTimeout = 700 * time.Millisecond
	err = deploy.Run(ctx, kubeconfig, cfg, nil)
	assert.ErrorContains(t, err, "DaemonSet kube-system/constellation-csi-controller: generation 1 not yet observed")
	assert.NotContains(t, err.Error(), deploy.JoinService)

	cfg.SkipCSIControllerWait = true
	var progress []string
	require.NoError(t, deploy.Run(ctx, kubeconfig, cfg, func(s string) { progress = append(progress, s) }))
	assert.Contains(t, progress, "applied DaemonSet kube-system/constellation-csi-controller", "applied all the same")
	assert.Contains(t, progress, "join, key and verification services ready")
}
