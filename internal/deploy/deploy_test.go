package deploy_test

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/openconstellation/constellation/internal/attestation/akca"
	"github.com/openconstellation/constellation/internal/clusterrecord"
	"github.com/openconstellation/constellation/internal/csidriver"
	"github.com/openconstellation/constellation/internal/deploy"
	"github.com/openconstellation/constellation/internal/diskowner"
	"github.com/openconstellation/constellation/internal/joinservice"
	"github.com/openconstellation/constellation/internal/joinservice/refusals"
	"github.com/openconstellation/constellation/internal/kube/kubetest"
	"github.com/openconstellation/constellation/internal/pki"
	"github.com/openconstellation/constellation/pkg/attestation/choose"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/measurements/measurementstest"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// One real kube-apiserver + etcd for the package, started by the first test that needs it.
var shared kubetest.Shared

func TestMain(m *testing.M) {
	code := m.Run()
	shared.Stop()
	os.Exit(code)
}

const image = "localhost/constellation/services:3f2a9c0d1e"

var ns = clusterrecord.Namespace

func config(t *testing.T) deploy.Config {
	t.Helper()
	ca, err := akca.New("local AK CA", time.Now(), time.Hour)
	require.NoError(t, err)
	return deploy.Config{
		Image:       image,
		Platform:    sandboxFacts,
		Attestation: choose.Reference{Variant: variant.QEMUVTPM, Values: choose.Values{Measurements: measurements.ReferenceSets{{Name: "image-v1", Measurements: measurementstest.Image(variant.QEMUVTPM, map[uint32][]byte{11: bytes.Repeat([]byte{1}, 32)})}}, AKRoots: string(pki.EncodeCert(ca.Certificate()))}},
	}
}

// sandboxFacts are the local provider's node platform facts (its nodeboot states them).
var sandboxFacts = deploy.PlatformFacts{
	Name: "local", MetadataURL: "http://10.42.0.1:8080",
	TPM: "/run/constellation/tpm.sock", TPMKind: deploy.TPMSocket, EventLog: "/run/constellation/eventlog",
}

// cluster is the shared API server, emptied of everything a test deployed when it ends.
func cluster(t *testing.T) *kubetest.Cluster {
	t.Helper()
	kube := shared.Get(t)
	t.Cleanup(func() { forget(kube.Admin) })
	forget(kube.Admin)
	return kube
}

func forget(c kubernetes.Interface) {
	ctx := context.Background()
	for _, name := range deploy.DaemonSets {
		_ = c.AppsV1().DaemonSets(ns).Delete(ctx, name, metav1.DeleteOptions{})
		_ = c.CoreV1().ServiceAccounts(ns).Delete(ctx, name, metav1.DeleteOptions{})
	}
	_ = c.RbacV1().Roles(diskowner.Namespace).Delete(ctx, deploy.JoinService, metav1.DeleteOptions{})
	_ = c.RbacV1().RoleBindings(diskowner.Namespace).Delete(ctx, deploy.JoinService, metav1.DeleteOptions{})
	_ = c.RbacV1().ClusterRoleBindings().Delete(ctx, deploy.SelfNodeClientRenewal, metav1.DeleteOptions{})
	for _, name := range csiClusterRoles {
		_ = c.RbacV1().ClusterRoles().Delete(ctx, name, metav1.DeleteOptions{})
		_ = c.RbacV1().ClusterRoleBindings().Delete(ctx, name, metav1.DeleteOptions{})
	}
	_ = c.RbacV1().Roles(ns).Delete(ctx, deploy.CSIController, metav1.DeleteOptions{})
	_ = c.RbacV1().RoleBindings(ns).Delete(ctx, deploy.CSIController, metav1.DeleteOptions{})
	_ = c.StorageV1().CSIDrivers().Delete(ctx, csidriver.Name, metav1.DeleteOptions{})
	for _, sc := range []string{deploy.EncryptedStorageClass, deploy.StorageClass} {
		_ = c.StorageV1().StorageClasses().Delete(ctx, sc, metav1.DeleteOptions{})
	}
	_ = c.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(ctx, deploy.RemovedNodesPolicy, metav1.DeleteOptions{})
	_ = c.AdmissionregistrationV1().ValidatingAdmissionPolicies().Delete(ctx, deploy.RemovedNodesPolicy, metav1.DeleteOptions{})
	for _, cm := range []string{clusterrecord.AttestationConfigMapName, clusterrecord.ClusterConfigMapName} {
		_ = c.CoreV1().ConfigMaps(ns).Delete(ctx, cm, metav1.DeleteOptions{})
	}
	for _, s := range []string{clusterrecord.MasterSecretName, clusterrecord.KeyServiceTLSSecretName} {
		_ = c.CoreV1().Secrets(ns).Delete(ctx, s, metav1.DeleteOptions{})
	}
}

// csiClusterRoles name the CSI sidecars' ClusterRoles and ClusterRoleBindings.
var csiClusterRoles = []string{"constellation-csi-provisioner", "constellation-csi-attacher", "constellation-csi-resizer"}

// recordInit creates what the init server records before it deploys.
func recordInit(t *testing.T, c kubernetes.Interface) {
	t.Helper()
	ctx := context.Background()
	_, err := c.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: clusterrecord.MasterSecretName},
		Data:       map[string][]byte{clusterrecord.MasterSecretKey: []byte(`{"key":"","salt":""}`)},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = c.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: clusterrecord.ClusterConfigMapName},
		Data:       map[string]string{clusterrecord.ClusterKey: `{}`},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
}

// versions are the resource versions of every deployed object, by "Kind/name".
func versions(t *testing.T, c kubernetes.Interface) map[string]string {
	t.Helper()
	ctx := context.Background()
	out := map[string]string{}
	for _, name := range deploy.DaemonSets {
		ds, err := c.AppsV1().DaemonSets(ns).Get(ctx, name, metav1.GetOptions{})
		require.NoError(t, err)
		out["DaemonSet/"+name] = ds.ResourceVersion
		sa, err := c.CoreV1().ServiceAccounts(ns).Get(ctx, name, metav1.GetOptions{})
		require.NoError(t, err)
		out["ServiceAccount/"+name] = sa.ResourceVersion
	}
	role, err := c.RbacV1().Roles(diskowner.Namespace).Get(ctx, deploy.JoinService, metav1.GetOptions{})
	require.NoError(t, err)
	out["Role"] = role.ResourceVersion
	rb, err := c.RbacV1().RoleBindings(diskowner.Namespace).Get(ctx, deploy.JoinService, metav1.GetOptions{})
	require.NoError(t, err)
	out["RoleBinding"] = rb.ResourceVersion
	crb, err := c.RbacV1().ClusterRoleBindings().Get(ctx, deploy.SelfNodeClientRenewal, metav1.GetOptions{})
	require.NoError(t, err)
	out["ClusterRoleBinding"] = crb.ResourceVersion
	vap, err := c.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, deploy.RemovedNodesPolicy, metav1.GetOptions{})
	require.NoError(t, err)
	out["ValidatingAdmissionPolicy"] = vap.ResourceVersion
	vapb, err := c.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Get(ctx, deploy.RemovedNodesPolicy, metav1.GetOptions{})
	require.NoError(t, err)
	out["ValidatingAdmissionPolicyBinding"] = vapb.ResourceVersion
	cm, err := c.CoreV1().ConfigMaps(ns).Get(ctx, clusterrecord.AttestationConfigMapName, metav1.GetOptions{})
	require.NoError(t, err)
	out["ConfigMap"] = cm.ResourceVersion
	for _, name := range csiClusterRoles {
		cr, err := c.RbacV1().ClusterRoles().Get(ctx, name, metav1.GetOptions{})
		require.NoError(t, err)
		out["ClusterRole/"+name] = cr.ResourceVersion
		crb, err := c.RbacV1().ClusterRoleBindings().Get(ctx, name, metav1.GetOptions{})
		require.NoError(t, err)
		out["ClusterRoleBinding/"+name] = crb.ResourceVersion
	}
	csiRole, err := c.RbacV1().Roles(ns).Get(ctx, deploy.CSIController, metav1.GetOptions{})
	require.NoError(t, err)
	out["Role/"+deploy.CSIController] = csiRole.ResourceVersion
	csiRB, err := c.RbacV1().RoleBindings(ns).Get(ctx, deploy.CSIController, metav1.GetOptions{})
	require.NoError(t, err)
	out["RoleBinding/"+deploy.CSIController] = csiRB.ResourceVersion
	driver, err := c.StorageV1().CSIDrivers().Get(ctx, csidriver.Name, metav1.GetOptions{})
	require.NoError(t, err)
	out["CSIDriver"] = driver.ResourceVersion
	for _, name := range []string{deploy.EncryptedStorageClass, deploy.StorageClass} {
		sc, err := c.StorageV1().StorageClasses().Get(ctx, name, metav1.GetOptions{})
		require.NoError(t, err)
		out["StorageClass/"+name] = sc.ResourceVersion
	}
	s, err := c.CoreV1().Secrets(ns).Get(ctx, clusterrecord.KeyServiceTLSSecretName, metav1.GetOptions{})
	require.NoError(t, err)
	out["Secret"] = s.ResourceVersion
	return out
}

func TestApply(t *testing.T) {
	kube := cluster(t)
	c := kube.Admin
	ctx := context.Background()
	cfg := config(t)

	// Without init's records nothing is applied, and the error names both.
	err := deploy.Apply(ctx, c, cfg, nil)
	assert.ErrorContains(t, err, "init's Secret kube-system/constellation-mastersecret")
	assert.ErrorContains(t, err, "init's ConfigMap kube-system/constellation-cluster")
	_, err = c.AppsV1().DaemonSets(ns).Get(ctx, deploy.JoinService, metav1.GetOptions{})
	assert.True(t, apierrors.IsNotFound(err))

	recordInit(t, c)
	var progress []string
	require.NoError(t, deploy.Apply(ctx, c, cfg, func(s string) { progress = append(progress, s) }))
	assert.Equal(t, []string{
		"created Secret kube-system/constellation-keyservice-tls (key service TLS)",
		"applied ServiceAccount kube-system/constellation-key-service",
		"applied ServiceAccount kube-system/constellation-join-service",
		"applied ServiceAccount kube-system/constellation-verification-service",
		"applied Namespace constellation-disks",
		"applied Role constellation-disks/constellation-join-service",
		"applied RoleBinding constellation-disks/constellation-join-service",
		"applied Role kube-system/constellation-join-service-refusals",
		"applied RoleBinding kube-system/constellation-join-service-refusals",
		"applied ClusterRole constellation-join-service-volume-reader",
		"applied ClusterRoleBinding constellation-join-service-volume-reader",
		"applied ClusterRoleBinding kubeadm:node-autoapprove-certificate-rotation",
		"applied ValidatingAdmissionPolicy constellation-removed-nodes",
		"applied ValidatingAdmissionPolicyBinding constellation-removed-nodes",
		"applied ConfigMap kube-system/constellation-attestation",
		"applied ConfigMap kube-system/constellation-join-refusals",
		"applied ConfigMap kube-system/constellation-registries",
		"applied DaemonSet kube-system/constellation-key-service",
		"applied DaemonSet kube-system/constellation-join-service",
		"applied DaemonSet kube-system/constellation-verification-service",
		"applied Namespace local-path-storage",
		"applied ServiceAccount local-path-storage/local-path-provisioner",
		"applied Role local-path-storage/local-path-provisioner",
		"applied RoleBinding local-path-storage/local-path-provisioner",
		"applied ClusterRole local-path-provisioner",
		"applied ClusterRoleBinding local-path-provisioner",
		"applied ConfigMap local-path-storage/local-path-config",
		"applied Deployment local-path-storage/local-path-provisioner",
		"applied StorageClass local-path",
		"applied ServiceAccount kube-system/constellation-csi-controller",
		"applied ClusterRole constellation-csi-provisioner",
		"applied ClusterRoleBinding constellation-csi-provisioner",
		"applied ClusterRole constellation-csi-attacher",
		"applied ClusterRoleBinding constellation-csi-attacher",
		"applied ClusterRole constellation-csi-resizer",
		"applied ClusterRoleBinding constellation-csi-resizer",
		"applied Role kube-system/constellation-csi-controller",
		"applied RoleBinding kube-system/constellation-csi-controller",
		"applied CSIDriver " + csidriver.Name,
		"applied DaemonSet kube-system/constellation-csi-controller",
		"applied StorageClass encrypted",
	}, progress)

	t.Run("default StorageClass", func(t *testing.T) {
		assert.Equal(t, []string{"encrypted by " + csidriver.Name}, defaultClasses(t, c), "exactly one default: the encrypted class")
		sc, err := c.StorageV1().StorageClasses().Get(ctx, deploy.EncryptedStorageClass, metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, corev1.PersistentVolumeReclaimDelete, *sc.ReclaimPolicy)
		assert.True(t, *sc.AllowVolumeExpansion)
		assert.Equal(t, storagev1.VolumeBindingWaitForFirstConsumer, *sc.VolumeBindingMode)
		local, err := c.StorageV1().StorageClasses().Get(ctx, deploy.StorageClass, metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, deploy.StorageProvisionerName, local.Provisioner, "local-path stays, as an explicit node-local class")
		d, err := c.AppsV1().Deployments(deploy.StorageNamespace).Get(ctx, deploy.StorageProvisioner, metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, cfg.Image, d.Spec.Template.Spec.Containers[0].Image)
	})
	t.Run("CSIDriver", func(t *testing.T) {
		d, err := c.StorageV1().CSIDrivers().Get(ctx, csidriver.Name, metav1.GetOptions{})
		require.NoError(t, err)
		assert.True(t, *d.Spec.AttachRequired)
		assert.False(t, *d.Spec.PodInfoOnMount)
		assert.Equal(t, []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent}, d.Spec.VolumeLifecycleModes)
		assert.Equal(t, storagev1.FileFSGroupPolicy, *d.Spec.FSGroupPolicy)
	})
	t.Run("CSI controller", func(t *testing.T) {
		ds, err := c.AppsV1().DaemonSets(ns).Get(ctx, deploy.CSIController, metav1.GetOptions{})
		require.NoError(t, err)
		pod := ds.Spec.Template.Spec
		assert.True(t, pod.HostNetwork, "the metadata service names its caller by the node's address")
		assert.Equal(t, corev1.DNSClusterFirstWithHostNet, pod.DNSPolicy)
		assert.Equal(t, deploy.CSIController, pod.ServiceAccountName)
		assert.False(t, *pod.AutomountServiceAccountToken)
		assert.Equal(t, map[string]string{"node-role.kubernetes.io/control-plane": ""}, pod.NodeSelector)
		assert.Contains(t, pod.Tolerations, corev1.Toleration{Key: "node-role.kubernetes.io/control-plane", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule})
		for _, v := range pod.Volumes {
			assert.Nil(t, v.HostPath, "no host path: %s", v.Name)
		}
		var names []string
		for _, ctr := range pod.Containers {
			names = append(names, ctr.Name)
			assert.Equal(t, image, ctr.Image)
			assert.Equal(t, corev1.PullNever, ctr.ImagePullPolicy)
			assert.Equal(t, deploy.BinDir+"/"+ctr.Name, ctr.Command[0])
			sc := ctr.SecurityContext
			assert.False(t, *sc.AllowPrivilegeEscalation, ctr.Name)
			assert.True(t, *sc.ReadOnlyRootFilesystem, ctr.Name)
			assert.Equal(t, []corev1.Capability{"ALL"}, sc.Capabilities.Drop, ctr.Name)
			assert.Empty(t, sc.Capabilities.Add, ctr.Name)
			assert.Nil(t, sc.Privileged, ctr.Name)
			assert.True(t, *sc.RunAsNonRoot, ctr.Name)
			mounts := map[string]string{}
			for _, m := range ctr.VolumeMounts {
				mounts[m.MountPath] = m.Name
			}
			assert.Equal(t, "socket-dir", mounts["/csi"], ctr.Name)
			if ctr.Name == "csidriver" {
				assert.Equal(t, []string{"controller", "--endpoint=unix:///csi/csi.sock", "--platform=local", "--metadata-url=http://10.42.0.1:8080", "--log-level=info"}, ctr.Args)
				assert.NotContains(t, mounts, "/var/run/secrets/kubernetes.io/serviceaccount", "the driver talks to the platform and holds no cluster credential")
				continue
			}
			assert.Equal(t, "kube-api-access", mounts["/var/run/secrets/kubernetes.io/serviceaccount"], ctr.Name)
			assert.Subset(t, ctr.Args, []string{"--csi-address=/csi/csi.sock", "--leader-election", "--leader-election-namespace=kube-system"}, ctr.Name)
		}
		assert.Equal(t, []string{"csidriver", "csi-provisioner", "csi-attacher", "csi-resizer"}, names)
		assert.Subset(t, pod.Containers[1].Args, []string{"--feature-gates=Topology=false", "--extra-create-metadata=false"})
		assert.Contains(t, pod.Containers[3].Args, "--handle-volume-inuse-error=false")
	})

	t.Run("attestation ConfigMap", func(t *testing.T) {
		cm, err := c.CoreV1().ConfigMaps(ns).Get(ctx, clusterrecord.AttestationConfigMapName, metav1.GetOptions{})
		require.NoError(t, err)
		got, err := clusterrecord.ParseAttestation([]byte(cm.Data[clusterrecord.VariantKey]), []byte(cm.Data[clusterrecord.ReferenceSetsKey]), []byte(cm.Data[clusterrecord.AKRootsKey]), []byte(cm.Data[clusterrecord.HardwareKey]))
		require.NoError(t, err)
		assert.Equal(t, cfg.Attestation, got)
		assert.Equal(t, "constellation", cm.ManagedFields[0].Manager)
	})
	t.Run("key service TLS", func(t *testing.T) {
		s, err := c.CoreV1().Secrets(ns).Get(ctx, clusterrecord.KeyServiceTLSSecretName, metav1.GetOptions{})
		require.NoError(t, err)
		assert.NoError(t, deploy.CheckKeyServiceTLS(s.Data, time.Now()))
		assert.NoError(t, deploy.CheckKeyServiceTLS(s.Data, time.Now().Add(9*365*24*time.Hour)))
		assert.Error(t, deploy.CheckKeyServiceTLS(s.Data, time.Now().Add(11*365*24*time.Hour)))
	})
	t.Run("join service permissions", func(t *testing.T) {
		_, err := c.RbacV1().Roles(ns).Get(ctx, deploy.JoinService, metav1.GetOptions{})
		assert.True(t, apierrors.IsNotFound(err), "the join service needs nothing in kube-system: %v", err)
		rb, err := c.RbacV1().RoleBindings(diskowner.Namespace).Get(ctx, deploy.JoinService, metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, deploy.JoinService, rb.Subjects[0].Name)
		role, err := c.RbacV1().Roles(diskowner.Namespace).Get(ctx, deploy.JoinService, metav1.GetOptions{})
		require.NoError(t, err)
		require.Len(t, role.Rules, 1)
		assert.Equal(t, []string{"configmaps"}, role.Rules[0].Resources)
		assert.Equal(t, []string{"create", "get"}, role.Rules[0].Verbs)
		for name, token := range map[string]bool{deploy.JoinService: true, deploy.KeyService: false, deploy.VerificationService: false} {
			sa, err := c.CoreV1().ServiceAccounts(ns).Get(ctx, name, metav1.GetOptions{})
			require.NoError(t, err)
			assert.Equal(t, token, *sa.AutomountServiceAccountToken, name)
		}
	})
	// The join service's own identity, through the API server's RBAC: it can record and read
	// disk owners, and nothing that would let it rewrite one or plant objects elsewhere.
	t.Run("join service identity against RBAC", func(t *testing.T) {
		restCfg, err := clientcmd.BuildConfigFromFlags("", kube.Kubeconfig)
		require.NoError(t, err)
		restCfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":" + deploy.JoinService}
		sa, err := kubernetes.NewForConfig(restCfg)
		require.NoError(t, err)
		store := diskowner.Store{Client: sa}
		uuid := "0f5e5b2a-1c3d-4e5f-8a9b-0c1d2e3f4a5b"
		name, err := diskowner.ObjectName(uuid)
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.CoreV1().ConfigMaps(diskowner.Namespace).Delete(ctx, name, metav1.DeleteOptions{}) })

		owner, err := store.Claim(ctx, uuid, "worker-0")
		require.NoError(t, err)
		assert.Equal(t, "worker-0", owner)

		// It publishes its refusals, under its node's key, into the one object deploy made.
		book := refusals.NewBook()
		book.Add("10.42.0.99", refusals.Entry{Reason: "attestation", Error: "PCR 11: expected …"}, time.Now())
		pctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			done <- (&refusals.Publisher{Client: sa, Node: "control-plane-0", Book: book, Interval: 10 * time.Millisecond}).Run(pctx)
		}()
		require.Eventually(t, func() bool { return refusals.Of(ctx, c, "10.42.0.99").Count == 1 }, 10*time.Second, 20*time.Millisecond)
		stop()
		require.NoError(t, <-done)
		owner, err = store.Claim(ctx, uuid, "worker-1")
		require.NoError(t, err)
		assert.Equal(t, "worker-0", owner, "first writer wins")

		// It reads what a volume key is authorized by (joinservice.KubeVolumes), and only reads.
		volumes := joinservice.KubeVolumes{Client: sa}
		_, err = volumes.PersistentVolume(ctx, csidriver.IDFor("pv-x"))
		assert.NoError(t, err, "list PersistentVolumes")
		_, err = volumes.AttachedTo(ctx, "pv-x", "worker-0")
		assert.NoError(t, err, "list VolumeAttachments")
		_, err = volumes.UsedOn(ctx, "pv-x", "worker-0")
		assert.NoError(t, err, "list pods by node")
		_, err = sa.CoreV1().PersistentVolumeClaims("default").Get(ctx, "claim", metav1.GetOptions{})
		assert.True(t, apierrors.IsNotFound(err), "get a PersistentVolumeClaim: %v", err)

		for action, call := range map[string]func() error{
			"update a record": func() error {
				cm, err := c.CoreV1().ConfigMaps(diskowner.Namespace).Get(ctx, name, metav1.GetOptions{})
				require.NoError(t, err)
				cm.Data[diskowner.NodeKey] = "worker-1"
				_, err = sa.CoreV1().ConfigMaps(diskowner.Namespace).Update(ctx, cm, metav1.UpdateOptions{})
				return err
			},
			"delete a record": func() error {
				return sa.CoreV1().ConfigMaps(diskowner.Namespace).Delete(ctx, name, metav1.DeleteOptions{})
			},
			"create a bootstrap token": func() error {
				_, err := sa.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "bootstrap-token-abcdef"}, Type: "bootstrap.kubernetes.io/token"}, metav1.CreateOptions{})
				return err
			},
			"create a ConfigMap in kube-system": func() error {
				_, err := sa.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "planted"}}, metav1.CreateOptions{})
				return err
			},
			"read kube-system ConfigMaps": func() error {
				_, err := sa.CoreV1().ConfigMaps(ns).Get(ctx, clusterrecord.AttestationConfigMapName, metav1.GetOptions{})
				return err
			},
			"list the records": func() error {
				_, err := sa.CoreV1().ConfigMaps(diskowner.Namespace).List(ctx, metav1.ListOptions{})
				return err
			},
			"apply another ConfigMap in kube-system": func() error {
				_, err := sa.CoreV1().ConfigMaps(ns).Apply(ctx, corev1ac.ConfigMap(clusterrecord.AttestationConfigMapName, ns).WithData(map[string]string{"x": "y"}), metav1.ApplyOptions{FieldManager: "test", Force: true})
				return err
			},
			"watch pods": func() error {
				w, err := sa.CoreV1().Pods(metav1.NamespaceAll).Watch(ctx, metav1.ListOptions{})
				if err == nil {
					w.Stop()
				}
				return err
			},
			"delete a pod": func() error {
				return sa.CoreV1().Pods("default").Delete(ctx, "app", metav1.DeleteOptions{})
			},
			"create a VolumeAttachment": func() error {
				pv := "pv-x"
				_, err := sa.StorageV1().VolumeAttachments().Create(ctx, &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: "va-x"},
					Spec: storagev1.VolumeAttachmentSpec{Attacher: csidriver.Name, NodeName: "worker-0", Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv}}}, metav1.CreateOptions{})
				return err
			},
			"update a PersistentVolume": func() error {
				_, err := sa.CoreV1().PersistentVolumes().Update(ctx, &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-x"}}, metav1.UpdateOptions{})
				return err
			},
			"patch a PersistentVolumeClaim": func() error {
				_, err := sa.CoreV1().PersistentVolumeClaims("default").Patch(ctx, "claim", types.MergePatchType, []byte(`{}`), metav1.PatchOptions{})
				return err
			},
			"read Secrets": func() error {
				_, err := sa.CoreV1().Secrets(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
				return err
			},
			"read the refusals": func() error {
				_, err := sa.CoreV1().ConfigMaps(ns).Get(ctx, refusals.ConfigMapName, metav1.GetOptions{})
				return err
			},
		} {
			err := call()
			assert.True(t, apierrors.IsForbidden(err), "%s: want Forbidden, got %v", action, err)
		}
	})
	for name, tc := range map[string]struct {
		controlPlanes bool
		args          []string
		env           map[string]string // value, or "<field path>" for downward API
		hostPaths     map[string]corev1.HostPathType
		secrets       []string
		root          bool
	}{
		deploy.KeyService: {
			controlPlanes: true,
			args:          []string{"--listen=127.0.0.1:9001", "--master-secret=/etc/constellation/mastersecret/mastersecret.json", "--tls-dir=/etc/constellation/keyservice-tls"},
			secrets:       []string{clusterrecord.MasterSecretName, clusterrecord.KeyServiceTLSSecretName},
		},
		deploy.JoinService: {
			controlPlanes: true,
			args: []string{"--listen=:30090", "--tpm=unix:/run/constellation/tpm.sock", "--event-log=/run/constellation/eventlog", "--pki-dir=/etc/kubernetes/pki", "--key-service=127.0.0.1:9001",
				"--platform=local", "--metadata-url=http://10.42.0.1:8080", "--api-server-endpoint=$(HOST_IP):6443", "--config-dir=/etc/constellation/config"},
			env:       map[string]string{"KUBERNETES_SERVICE_HOST": "<status.hostIP>", "KUBERNETES_SERVICE_PORT": "6443", "HOST_IP": "<status.hostIP>", "NODE_NAME": "<spec.nodeName>"},
			hostPaths: map[string]corev1.HostPathType{"/etc/kubernetes/pki": corev1.HostPathDirectory, "/run/constellation/tpm.sock": corev1.HostPathSocket, "/run/constellation/eventlog": corev1.HostPathFile},
			secrets:   []string{clusterrecord.KeyServiceTLSSecretName},
			root:      true,
		},
		deploy.VerificationService: {
			args:      []string{"--grpc-listen=:30081", "--http-listen=:30080", "--tpm=unix:/run/constellation/tpm.sock", "--event-log=/run/constellation/eventlog", "--variant=qemu-vtpm"},
			hostPaths: map[string]corev1.HostPathType{"/run/constellation/tpm.sock": corev1.HostPathSocket, "/run/constellation/eventlog": corev1.HostPathFile},
			root:      true,
		},
	} {
		t.Run(name, func(t *testing.T) {
			ds, err := c.AppsV1().DaemonSets(ns).Get(ctx, name, metav1.GetOptions{})
			require.NoError(t, err)
			pod := ds.Spec.Template.Spec
			assert.True(t, pod.HostNetwork)
			assert.Equal(t, "system-node-critical", pod.PriorityClassName)
			assert.Equal(t, name, pod.ServiceAccountName)
			assert.Equal(t, appsv1.RollingUpdateDaemonSetStrategyType, ds.Spec.UpdateStrategy.Type)
			require.Len(t, pod.Containers, 1)
			ctr := pod.Containers[0]
			assert.Equal(t, image, ctr.Image)
			assert.Equal(t, corev1.PullNever, ctr.ImagePullPolicy)
			assert.True(t, strings.HasPrefix(ctr.Command[0], deploy.BinDir+"/"))
			assert.Subset(t, ctr.Args, tc.args)
			assert.Contains(t, ctr.Args, "--log-level=info")
			assert.Equal(t, name != deploy.JoinService, ctr.ReadinessProbe != nil, "probes a TCP port, except the join service's (a probe would be a refused admission)")
			sc := ctr.SecurityContext
			assert.False(t, *sc.AllowPrivilegeEscalation)
			assert.True(t, *sc.ReadOnlyRootFilesystem)
			assert.Equal(t, []corev1.Capability{"ALL"}, sc.Capabilities.Drop)
			assert.Equal(t, tc.root, *sc.RunAsUser == 0)
			if tc.controlPlanes {
				assert.Equal(t, map[string]string{"node-role.kubernetes.io/control-plane": ""}, pod.NodeSelector)
				assert.Contains(t, pod.Tolerations, corev1.Toleration{Key: "node-role.kubernetes.io/control-plane", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule})
			} else {
				assert.Empty(t, pod.NodeSelector)
				assert.Equal(t, []corev1.Toleration{{Operator: corev1.TolerationOpExists}}, pod.Tolerations, "on every node, whatever its taints")
			}
			env := map[string]string{}
			for _, e := range ctr.Env {
				if e.ValueFrom != nil {
					env[e.Name] = "<" + e.ValueFrom.FieldRef.FieldPath + ">"
				} else {
					env[e.Name] = e.Value
				}
			}
			for k, v := range tc.env {
				assert.Equal(t, v, env[k], k)
			}
			hostPaths := map[string]corev1.HostPathType{}
			var secrets []string
			for _, v := range pod.Volumes {
				if v.HostPath != nil {
					hostPaths[v.HostPath.Path] = *v.HostPath.Type
				}
				if v.Secret != nil {
					secrets = append(secrets, v.Secret.SecretName)
				}
			}
			assert.Equal(t, len(tc.hostPaths), len(hostPaths))
			for p, typ := range tc.hostPaths {
				assert.Equal(t, typ, hostPaths[p], p)
			}
			assert.ElementsMatch(t, tc.secrets, secrets)
		})
	}
	t.Run("join service sees only its own TLS pair", func(t *testing.T) {
		ds, err := c.AppsV1().DaemonSets(ns).Get(ctx, deploy.JoinService, metav1.GetOptions{})
		require.NoError(t, err)
		var items []string
		var projected []string
		for _, v := range ds.Spec.Template.Spec.Volumes {
			if v.Secret != nil {
				for _, it := range v.Secret.Items {
					items = append(items, it.Key)
				}
			}
			if v.Projected != nil {
				for _, src := range v.Projected.Sources {
					for _, it := range src.ConfigMap.Items {
						projected = append(projected, src.ConfigMap.Name+"/"+it.Key)
					}
				}
			}
		}
		assert.ElementsMatch(t, []string{"ca.crt", "joinservice.crt", "joinservice.key"}, items)
		assert.ElementsMatch(t, []string{"constellation-cluster/cluster.json", "constellation-attestation/variant",
			"constellation-attestation/reference-sets.json", "constellation-attestation/ak-roots.pem", "constellation-attestation/hardware.json",
			"constellation-registries/registry-mirrors.json"}, projected)
	})

	// Applying again changes nothing: not one resource version moves, the TLS pair stays.
	before := versions(t, c)
	progress = nil
	require.NoError(t, deploy.Apply(ctx, c, cfg, func(s string) { progress = append(progress, s) }))
	assert.Equal(t, before, versions(t, c))
	assert.NotContains(t, strings.Join(progress, "\n"), "created Secret")

	// Someone edits a DaemonSet: Apply takes the field back (forced conflicts).
	ds, err := c.AppsV1().DaemonSets(ns).Get(ctx, deploy.VerificationService, metav1.GetOptions{})
	require.NoError(t, err)
	ds.Spec.Template.Spec.Containers[0].Image = "localhost/constellation/services:tampered"
	_, err = c.AppsV1().DaemonSets(ns).Update(ctx, ds, metav1.UpdateOptions{FieldManager: "kubectl-edit"})
	require.NoError(t, err)
	require.NoError(t, deploy.Apply(ctx, c, cfg, nil))
	ds, err = c.AppsV1().DaemonSets(ns).Get(ctx, deploy.VerificationService, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, image, ds.Spec.Template.Spec.Containers[0].Image)

	// An upgrade adds a reference set: only the attestation ConfigMap changes.
	before = versions(t, c)
	cfg.Attestation.Measurements = append(cfg.Attestation.Measurements, measurements.ReferenceSet{Name: "image-v2", Measurements: measurementstest.Image(variant.QEMUVTPM, map[uint32][]byte{11: bytes.Repeat([]byte{2}, 32)})})
	require.NoError(t, deploy.Apply(ctx, c, cfg, nil))
	after := versions(t, c)
	assert.NotEqual(t, before["ConfigMap"], after["ConfigMap"])
	delete(before, "ConfigMap")
	delete(after, "ConfigMap")
	assert.Equal(t, before, after)
	cm, err := c.CoreV1().ConfigMaps(ns).Get(ctx, clusterrecord.AttestationConfigMapName, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Contains(t, cm.Data[clusterrecord.ReferenceSetsKey], "image-v2")
}

// Refusals: by the API server (the error names the object, and nothing after it is
// applied), by Config checks (before any request), and an unusable existing TLS Secret.
func TestApplyRefused(t *testing.T) {
	ctx := context.Background()

	t.Run("immutable ConfigMap in the way", func(t *testing.T) {
		kube := cluster(t)
		c := kube.Admin
		recordInit(t, c)
		_, err := c.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: clusterrecord.AttestationConfigMapName},
			Data:       map[string]string{"variant": "qemu-vtpm"},
			Immutable:  ptr(true),
		}, metav1.CreateOptions{})
		require.NoError(t, err)
		err = deploy.Apply(ctx, c, config(t), nil)
		require.Error(t, err)
		assert.ErrorContains(t, err, "deploy: applying ConfigMap kube-system/constellation-attestation:")
		assert.ErrorContains(t, err, "immutable")
		assert.True(t, apierrors.IsInvalid(err), "the API server's error is wrapped: %v", err)
		_, err = c.AppsV1().DaemonSets(ns).Get(ctx, deploy.KeyService, metav1.GetOptions{})
		assert.True(t, apierrors.IsNotFound(err), "nothing after the refused object is applied")
	})

	t.Run("admission policy denies a DaemonSet", func(t *testing.T) {
		kube := cluster(t)
		c := kube.Admin
		recordInit(t, c)
		cfg := config(t)
		cfg.Image = deniedImage
		denyImage(t, c)
		err := deploy.Apply(ctx, c, cfg, nil)
		assert.ErrorContains(t, err, "deploy: applying DaemonSet kube-system/constellation-join-service:")
		assert.ErrorContains(t, err, "no join service here (test policy)")
		assert.True(t, apierrors.IsInvalid(err) || apierrors.IsForbidden(err), "%v", err)
		_, err = c.AppsV1().DaemonSets(ns).Get(ctx, deploy.VerificationService, metav1.GetOptions{})
		assert.True(t, apierrors.IsNotFound(err), "nothing after the refused object is applied")
	})

	t.Run("unusable TLS Secret", func(t *testing.T) {
		kube := cluster(t)
		c := kube.Admin
		recordInit(t, c)
		_, err := c.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: clusterrecord.KeyServiceTLSSecretName},
			Data:       map[string][]byte{"ca.crt": []byte("not a certificate")},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
		err = deploy.Apply(ctx, c, config(t), nil)
		assert.ErrorContains(t, err, "Secret kube-system/constellation-keyservice-tls exists but is unusable")
	})

	t.Run("invalid configuration", func(t *testing.T) {
		cfg := config(t)
		cfg.Image = "constellation/services"
		cfg.Attestation.Measurements = nil
		cfg.Attestation.AKRoots = ""
		cfg.LogLevel = "trace"
		cfg.Platform.MetadataURL = "ftp://10.42.0.1"
		err := deploy.Apply(ctx, nil, cfg, nil) // no client: nothing may be sent
		for _, want := range []string{`image "constellation/services"`, "at least one reference-value set is required", "akRoots: no certificate", `log level "trace"`, "ftp://10.42.0.1"} {
			assert.ErrorContains(t, err, want)
		}
	})
}

// deniedImage is refused by the policy of denyImage.
const deniedImage = "localhost/constellation/services:denied"

// denyImage installs a ValidatingAdmissionPolicy that refuses the join service's DaemonSet
// with deniedImage, and waits until the API server enforces it. It is removed when the test
// ends; it concerns only that image, so its removal need not take effect before other tests.
func denyImage(t *testing.T, c kubernetes.Interface) {
	t.Helper()
	ctx := context.Background()
	policy := &admissionv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "deny-image"},
		Spec: admissionv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr(admissionv1.Fail),
			MatchConstraints: &admissionv1.MatchResources{ResourceRules: []admissionv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionv1.RuleWithOperations{
					Operations: []admissionv1.OperationType{admissionv1.Create, admissionv1.Update},
					Rule:       admissionv1.Rule{APIGroups: []string{"apps"}, APIVersions: []string{"v1"}, Resources: []string{"daemonsets"}},
				},
			}}},
			Validations: []admissionv1.Validation{{
				Expression: "object.metadata.name != '" + deploy.JoinService + "' || object.spec.template.spec.containers[0].image != '" + deniedImage + "'",
				Message:    "no join service here (test policy)",
			}},
		},
	}
	_, err := c.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, policy, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = c.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, &admissionv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "deny-image"},
		Spec:       admissionv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: "deny-image", ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = c.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(ctx, "deny-image", metav1.DeleteOptions{})
		_ = c.AdmissionregistrationV1().ValidatingAdmissionPolicies().Delete(ctx, "deny-image", metav1.DeleteOptions{})
	})
	// The API server loads policies asynchronously: probe with a dry run until it refuses.
	probe := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: deploy.JoinService},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"probe": "x"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"probe": "x"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: deniedImage}}},
			},
		},
	}
	require.Eventually(t, func() bool {
		_, err := c.AppsV1().DaemonSets(ns).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), "test policy")
	}, 20*time.Second, 100*time.Millisecond, "the policy takes effect")
}

// Wait against the real API server. There is no controller manager in the test control
// plane, so the test writes the DaemonSet status the controller would.
func TestWait(t *testing.T) {
	kube := cluster(t)
	c := kube.Admin
	ctx := context.Background()
	recordInit(t, c)
	require.NoError(t, deploy.Apply(ctx, c, config(t), nil))

	short := func() error {
		wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		return deploy.Wait(wctx, c, 50*time.Millisecond)
	}
	err := short()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	for _, name := range deploy.DaemonSets {
		assert.ErrorContains(t, err, "DaemonSet kube-system/"+name+": generation 1 not yet observed by the controller")
	}

	setStatus := func(name string, desired, available int32) {
		ds, err := c.AppsV1().DaemonSets(ns).Get(ctx, name, metav1.GetOptions{})
		require.NoError(t, err)
		ds.Status = appsv1.DaemonSetStatus{
			ObservedGeneration: ds.Generation, DesiredNumberScheduled: desired, CurrentNumberScheduled: desired,
			UpdatedNumberScheduled: desired, NumberReady: available, NumberAvailable: available,
		}
		_, err = c.AppsV1().DaemonSets(ns).UpdateStatus(ctx, ds, metav1.UpdateOptions{})
		require.NoError(t, err)
	}
	setStatus(deploy.KeyService, 1, 1)
	setStatus(deploy.JoinService, 1, 0)
	setStatus(deploy.VerificationService, 0, 0)
	setStatus(deploy.CSIController, 1, 1)
	err = short()
	assert.NotContains(t, err.Error(), deploy.KeyService+":")
	assert.ErrorContains(t, err, "DaemonSet kube-system/constellation-join-service: 1 of 1 pods up to date, 0 available")
	assert.ErrorContains(t, err, "DaemonSet kube-system/constellation-verification-service: targets no node yet")

	// The pods come up while Wait waits.
	done := make(chan error, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		done <- deploy.Wait(wctx, c, 50*time.Millisecond)
	}()
	time.Sleep(200 * time.Millisecond)
	setStatus(deploy.JoinService, 1, 1)
	setStatus(deploy.VerificationService, 3, 3)
	require.NoError(t, <-done)
	require.NoError(t, deploy.Wait(ctx, c, 0, deploy.JoinService))

	// A new generation is not ready until the controller has seen it.
	require.NoError(t, deploy.Apply(ctx, c, func() deploy.Config { cfg := config(t); cfg.LogLevel = "debug"; return cfg }(), nil))
	assert.ErrorContains(t, short(), "generation 2 not yet observed")

	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	assert.ErrorContains(t, deploy.Wait(wctx, c, 50*time.Millisecond, "no-such-service"), "DaemonSet kube-system/no-such-service does not exist")
}

// Run is what the init server calls: from the admin kubeconfig to applied objects.
func TestRun(t *testing.T) {
	kube := cluster(t)
	recordInit(t, kube.Admin)
	kubeconfig, err := os.ReadFile(kube.Kubeconfig)
	require.NoError(t, err)
	var progress []string
	require.NoError(t, deploy.Run(context.Background(), kubeconfig, config(t), func(s string) { progress = append(progress, s) }))
	assert.Contains(t, progress, "applied DaemonSet kube-system/constellation-verification-service")

	cfg := config(t)
	cfg.WaitTimeout = 300 * time.Millisecond
	progress = nil
	err = deploy.Run(context.Background(), kubeconfig, cfg, func(s string) { progress = append(progress, s) })
	assert.ErrorContains(t, err, "waiting for the services")
	// The wait says at once what it waits for (no controller runs here: no DaemonSet is
	// observed), then every 5 s.
	var waiting []string
	for _, line := range progress {
		if strings.HasPrefix(line, "waiting for the services (") {
			waiting = append(waiting, line)
		}
	}
	if assert.Len(t, waiting, 1, "progress: %q", progress) {
		assert.Contains(t, waiting[0], "DaemonSet kube-system/constellation-join-service: generation 1 not yet observed")
		assert.NotContains(t, waiting[0], "\n", "one line")
	}

	assert.ErrorContains(t, deploy.Run(context.Background(), []byte("not a kubeconfig"), config(t), nil), "deploy: admin kubeconfig")
}

func TestRender(t *testing.T) {
	out, err := deploy.Render(config(t))
	require.NoError(t, err)
	docs := regexp.MustCompile(`(?m)^---\n`).Split(string(out), -1)[1:]
	var kinds []string
	for _, d := range docs {
		var obj struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name, Namespace string
			} `json:"metadata"`
		}
		require.NoError(t, yaml.Unmarshal([]byte(d), &obj))
		kinds = append(kinds, obj.Kind+"/"+obj.Metadata.Namespace+"/"+obj.Metadata.Name)
	}
	assert.Equal(t, []string{
		"ServiceAccount/kube-system/constellation-key-service", "ServiceAccount/kube-system/constellation-join-service", "ServiceAccount/kube-system/constellation-verification-service",
		"Namespace//constellation-disks",
		"Role/constellation-disks/constellation-join-service", "RoleBinding/constellation-disks/constellation-join-service",
		"Role/kube-system/constellation-join-service-refusals", "RoleBinding/kube-system/constellation-join-service-refusals",
		"ClusterRole//constellation-join-service-volume-reader", "ClusterRoleBinding//constellation-join-service-volume-reader",
		"ClusterRoleBinding//kubeadm:node-autoapprove-certificate-rotation",
		"ValidatingAdmissionPolicy//constellation-removed-nodes", "ValidatingAdmissionPolicyBinding//constellation-removed-nodes",
		"ConfigMap/kube-system/constellation-attestation", "ConfigMap/kube-system/constellation-join-refusals", "ConfigMap/kube-system/constellation-registries",
		"DaemonSet/kube-system/constellation-key-service", "DaemonSet/kube-system/constellation-join-service", "DaemonSet/kube-system/constellation-verification-service",
		"Namespace//local-path-storage", "ServiceAccount/local-path-storage/local-path-provisioner",
		"Role/local-path-storage/local-path-provisioner", "RoleBinding/local-path-storage/local-path-provisioner",
		"ClusterRole//local-path-provisioner", "ClusterRoleBinding//local-path-provisioner",
		"ConfigMap/local-path-storage/local-path-config", "Deployment/local-path-storage/local-path-provisioner",
		"StorageClass//local-path",
		"ServiceAccount/kube-system/constellation-csi-controller",
		"ClusterRole//constellation-csi-provisioner", "ClusterRoleBinding//constellation-csi-provisioner",
		"ClusterRole//constellation-csi-attacher", "ClusterRoleBinding//constellation-csi-attacher",
		"ClusterRole//constellation-csi-resizer", "ClusterRoleBinding//constellation-csi-resizer",
		"Role/kube-system/constellation-csi-controller", "RoleBinding/kube-system/constellation-csi-controller",
		"CSIDriver//" + csidriver.Name,
		"DaemonSet/kube-system/constellation-csi-controller",
		"StorageClass//encrypted",
	}, kinds)
	assert.Contains(t, string(out), "image: "+image)
	assert.Contains(t, string(out), "imagePullPolicy: Never")

	_, err = deploy.Render(deploy.Config{})
	assert.ErrorContains(t, err, "image")
}

// The join service's tickets name the cluster's API endpoint when there is one, else the
// address of the node it runs on.
func TestRenderAPIServerEndpoint(t *testing.T) {
	testCases := map[string]struct {
		endpoint, want, wantErr string
	}{
		"the platform's load balancer": {endpoint: "10.42.0.2:6443", want: "--api-server-endpoint=10.42.0.2:6443"},
		"none: the node's own address": {want: "--api-server-endpoint=$(HOST_IP):6443"},
		"not IP:port":                  {endpoint: "api.example:6443", wantErr: `API server endpoint "api.example:6443": want IP:port`},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			cfg := config(t)
			cfg.APIServerEndpoint = tc.endpoint
			out, err := deploy.Render(cfg)
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Contains(t, string(out), tc.want)
		})
	}
}

func ptr[T any](v T) *T { return &v }

// RollServices moves the services' DaemonSets to a new image one at a time, each rolled out
// before the next (the key service before the join service that calls it), and leaves a
// DaemonSet that runs the image alone, so a rerun goes on where an interrupted roll stopped.
func TestRollServices(t *testing.T) {
	kube := cluster(t)
	c := kube.Admin
	ctx := context.Background()
	recordInit(t, c)
	require.NoError(t, deploy.Apply(ctx, c, config(t), nil))
	const image = "localhost/constellation/services:v020"

	// The DaemonSet controller's part: each DaemonSet is rolled out at its generation, and the
	// order the images changed in is recorded.
	var order []string
	stop := make(chan struct{})
	controllerDone := make(chan struct{})
	go func() {
		defer close(controllerDone)
		seen := map[string]bool{}
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			for _, name := range deploy.DaemonSets {
				ds, err := c.AppsV1().DaemonSets(ns).Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					continue
				}
				if ds.Spec.Template.Spec.Containers[0].Image == image && !seen[name] {
					seen[name] = true
					order = append(order, name)
				}
				ds.Status = appsv1.DaemonSetStatus{ObservedGeneration: ds.Generation, DesiredNumberScheduled: 1, CurrentNumberScheduled: 1,
					UpdatedNumberScheduled: 1, NumberReady: 1, NumberAvailable: 1}
				_, _ = c.AppsV1().DaemonSets(ns).UpdateStatus(ctx, ds, metav1.UpdateOptions{})
			}
		}
	}()
	var once sync.Once
	stopController := func() { once.Do(func() { close(stop); <-controllerDone }) }
	t.Cleanup(stopController)

	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var steps []string
	changed, err := deploy.RollServices(rctx, c, image, func(s string) { steps = append(steps, s) })
	require.NoError(t, err)
	want := []string{deploy.KeyService, deploy.JoinService, deploy.VerificationService, deploy.CSIController}
	assert.Equal(t, want, changed)
	for _, name := range deploy.DaemonSets {
		ds, err := c.AppsV1().DaemonSets(ns).Get(ctx, name, metav1.GetOptions{})
		require.NoError(t, err)
		for _, ctr := range ds.Spec.Template.Spec.Containers {
			assert.Equal(t, image, ctr.Image, name+" "+ctr.Name)
		}
	}
	stopController()
	assert.Equal(t, want, order, "one DaemonSet at a time, in order")
	assert.Contains(t, steps[0], deploy.KeyService+": rolling out "+image)

	changed, err = deploy.RollServices(rctx, c, image, func(string) {})
	require.NoError(t, err)
	assert.Empty(t, changed, "a rerun changes nothing")

	// A cluster deployed before the volume driver has no CSI controller: the services roll
	// all the same.
	require.NoError(t, c.AppsV1().DaemonSets(ns).Delete(ctx, deploy.CSIController, metav1.DeleteOptions{}))
	steps = nil
	changed, err = deploy.RollServices(rctx, c, image, func(s string) { steps = append(steps, s) })
	require.NoError(t, err)
	assert.Empty(t, changed)
	assert.Contains(t, steps, deploy.CSIController+": not deployed in this cluster, nothing to roll")
}

// defaultClasses are the StorageClasses marked default, as "name by provisioner".
func defaultClasses(t *testing.T, c kubernetes.Interface) []string {
	t.Helper()
	classes, err := c.StorageV1().StorageClasses().List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	var defaults []string
	for _, sc := range classes.Items {
		if sc.Annotations[deploy.DefaultClassAnnotation] == "true" {
			defaults = append(defaults, sc.Name+" by "+sc.Provisioner)
		}
	}
	return defaults
}

// The services take their node platform's facts: the platform's name and metadata service,
// and the TPM and event log they mount, a swtpm's socket or a VM's TPM device alike; facts
// that do not hold are refused before anything is rendered.
func TestRenderPlatformFacts(t *testing.T) {
	vm := deploy.PlatformFacts{
		Name: "qemu", MetadataURL: "http://10.42.0.1:8080",
		TPM: "/dev/tpmrm0", TPMKind: deploy.TPMDevice, EventLog: "/sys/kernel/security/tpm0/binary_bios_measurements",
	}
	testCases := map[string]struct {
		facts   deploy.PlatformFacts
		want    []string
		notWant []string
		wantErr []string
	}{
		"sandbox: swtpm socket": {
			facts: sandboxFacts,
			want:  []string{"--platform=local", "--tpm=unix:/run/constellation/tpm.sock", "--event-log=/run/constellation/eventlog", "type: Socket"},
		},
		"VM: TPM device": {
			facts: vm,
			// The event log is mounted where a container can have a mount point, not in sysfs.
			want: []string{"--platform=qemu", "--tpm=/dev/tpmrm0", "--event-log=/run/constellation/eventlog", "type: CharDevice",
				"path: /sys/kernel/security/tpm0/binary_bios_measurements", "mountPath: /run/constellation/eventlog"},
			notWant: []string{"tpm.sock", "type: Socket", "mountPath: /sys/"},
		},
		"no event log": {
			facts:   func() deploy.PlatformFacts { f := sandboxFacts; f.EventLog = ""; return f }(),
			want:    []string{"--tpm=unix:/run/constellation/tpm.sock"},
			notWant: []string{"--event-log", "eventlog"},
		},
		"none": {
			wantErr: []string{`platform name ""`, `platform metadata URL ""`, `platform TPM path ""`, `platform TPM kind ""`},
		},
		"unusable": {
			facts:   deploy.PlatformFacts{Name: "Local", MetadataURL: "10.42.0.1:8080", TPM: "dev/tpmrm0", TPMKind: "pipe", EventLog: "/run/../eventlog"},
			wantErr: []string{`platform name "Local"`, `platform metadata URL "10.42.0.1:8080"`, `platform TPM path "dev/tpmrm0"`, `platform TPM kind "pipe"`, `platform event log path "/run/../eventlog"`},
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			cfg := config(t)
			cfg.Platform = tc.facts
			out, err := deploy.Render(cfg)
			if tc.wantErr != nil {
				for _, want := range tc.wantErr {
					assert.ErrorContains(t, err, want)
				}
				return
			}
			require.NoError(t, err)
			for _, want := range tc.want {
				assert.Contains(t, string(out), want)
			}
			for _, notWant := range tc.notWant {
				assert.NotContains(t, string(out), notWant)
			}
		})
	}
}
