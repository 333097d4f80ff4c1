package deploy

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	rbacv1ac "k8s.io/client-go/applyconfigurations/rbac/v1"
	storagev1ac "k8s.io/client-go/applyconfigurations/storage/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/openconstellation/constellation/internal/clusterrecord"
	"github.com/openconstellation/constellation/internal/csidriver"
)

// The encrypted volumes that move with their pods (docs/volumes.md "Deployment"): the driver
// (internal/csidriver) is registered as a CSIDriver, serves the default StorageClass, and its
// controller half runs on every control plane beside the Kubernetes CSI sidecars, all from the
// services image. Its node half runs in the node program, not in a pod.
const (
	// CSIController names the controller's DaemonSet, its ServiceAccount and its
	// leader-election Role and RoleBinding.
	CSIController = "constellation-csi-controller"
	// EncryptedStorageClass is the cluster's default StorageClass, served by the driver.
	EncryptedStorageClass = "encrypted"
	// DefaultClassAnnotation marks the cluster's default StorageClass.
	DefaultClassAnnotation = "storageclass.kubernetes.io/is-default-class"
)

// The controller pod's shared socket directory (an emptyDir): the driver listens there, the
// sidecars dial it.
const (
	csiSocketDir = "/csi"
	csiSocket    = csiSocketDir + "/csi.sock"
)

// csiSidecar is one of the Kubernetes CSI sidecars (tools/<name>, built from the upstream
// release into the services image): its container and binary name, its ClusterRole's rules
// and the name of the Lease it elects its leader with.
type csiSidecar struct {
	name  string
	args  []string
	rules []*rbacv1ac.PolicyRuleApplyConfiguration
	lease string
}

// csiSidecars are the three sidecars, in the order of the pod's containers. Each ClusterRole
// holds exactly the rules of upstream's deploy/kubernetes/rbac.yaml of the pinned version (in
// the module cache after `go mod download` in tools/<name>):
//   - csi-provisioner: github.com/kubernetes-csi/external-provisioner/v6@v6.4.0, ClusterRole
//     external-provisioner-runner;
//   - csi-attacher: github.com/kubernetes-csi/external-attacher/v4@v4.13.0, ClusterRole
//     external-attacher-runner;
//   - csi-resizer: github.com/kubernetes-csi/external-resizer/v2@v2.3.0, ClusterRole
//     external-resizer-runner.
//
// Upstream's namespaced Roles (external-*-cfg) are replaced by csiLeaseRole: they grant every
// Lease of their namespace, which in kube-system would be the scheduler's and the controller
// manager's leader locks and the removed-node authorizers' readiness reports; and the
// provisioner's also grants what only storage-capacity tracking needs (csistoragecapacities,
// pods and replicasets: get), which is off (--enable-capacity defaults to false).
func csiSidecars() []csiSidecar {
	common := []string{"--csi-address=" + csiSocket, "--leader-election", "--leader-election-namespace=" + clusterrecord.Namespace}
	return []csiSidecar{
		{
			name: "csi-provisioner",
			// No topology: a volume is provider storage any node can attach. No PV/PVC
			// names in CreateVolume's parameters: the driver needs none, and they would
			// reach the platform's storage API.
			args: slices.Concat(common, []string{"--feature-gates=Topology=false", "--extra-create-metadata=false"}),
			rules: []*rbacv1ac.PolicyRuleApplyConfiguration{
				rule("", []string{"persistentvolumes"}, "get", "list", "watch", "create", "patch", "delete"),
				rule("", []string{"persistentvolumeclaims"}, "get", "list", "watch", "update"),
				rule(storagev1.GroupName, []string{"storageclasses"}, "get", "list", "watch"),
				rule("", []string{"events"}, "list", "watch", "create", "update", "patch"),
				rule("snapshot.storage.k8s.io", []string{"volumesnapshots"}, "get", "list", "watch", "update"),
				rule("snapshot.storage.k8s.io", []string{"volumesnapshotcontents"}, "get", "list"),
				rule(storagev1.GroupName, []string{"csinodes"}, "get", "list", "watch"),
				rule("", []string{"nodes"}, "get", "list", "watch"),
				rule(storagev1.GroupName, []string{"volumeattachments"}, "get", "list", "watch"),
			},
			// cmd/csi-provisioner: the provisioner's name with "/" replaced by "-".
			lease: leaseName(strings.ReplaceAll(csidriver.Name, "/", "-")),
		},
		{
			name: "csi-attacher",
			args: common,
			rules: []*rbacv1ac.PolicyRuleApplyConfiguration{
				rule("", []string{"persistentvolumes"}, "get", "list", "watch", "patch"),
				rule(storagev1.GroupName, []string{"csinodes"}, "get", "list", "watch"),
				rule(storagev1.GroupName, []string{"volumeattachments"}, "get", "list", "watch", "patch"),
				rule(storagev1.GroupName, []string{"volumeattachments/status"}, "patch"),
			},
			// cmd/csi-attacher: "external-attacher-leader-" and the driver's name.
			lease: leaseName("external-attacher-leader-" + csidriver.Name),
		},
		{
			name: "csi-resizer",
			// A volume in use is expanded as any other (online expansion: NodeExpandVolume),
			// so the resizer need not watch pods for "in use" errors.
			args: slices.Concat(common, []string{"--handle-volume-inuse-error=false"}),
			rules: []*rbacv1ac.PolicyRuleApplyConfiguration{
				rule("", []string{"persistentvolumes"}, "get", "list", "watch", "patch"),
				rule("", []string{"persistentvolumeclaims"}, "get", "list", "watch"),
				rule("", []string{"pods"}, "get", "list", "watch"),
				rule("", []string{"persistentvolumeclaims/status"}, "patch"),
				rule("", []string{"events"}, "list", "watch", "create", "update", "patch"),
				rule(storagev1.GroupName, []string{"volumeattributesclasses"}, "get", "list", "watch"),
			},
			// cmd/csi-resizer: "external-resizer-" and the driver's name, sanitized.
			lease: leaseName("external-resizer-" + leaseName(csidriver.Name)),
		},
	}
}

// leaseName is how the sidecars turn a name into their Lease's name (csi-lib-utils
// leaderelection's sanitizeName, applied to the lock name): every character but letters,
// digits and "-" becomes "-", and a trailing "-" gets an "X".
func leaseName(name string) string {
	name = regexp.MustCompile("[^a-zA-Z0-9-]").ReplaceAllString(name, "-")
	if strings.HasSuffix(name, "-") {
		name += "X"
	}
	return name
}

func rule(group string, resources []string, verbs ...string) *rbacv1ac.PolicyRuleApplyConfiguration {
	return rbacv1ac.PolicyRule().WithAPIGroups(group).WithResources(resources...).WithVerbs(verbs...)
}

// csiObjects are the driver's objects: the controller's identity and permissions, the
// CSIDriver, the controller's DaemonSet and the default StorageClass.
func csiObjects(p params) []object {
	ns := clusterrecord.Namespace
	sa := serviceAccount(CSIController, false)
	objs := []object{{"ServiceAccount", CSIController, ns, sa, func(ctx context.Context, c kubernetes.Interface, o metav1.ApplyOptions) error {
		_, err := c.CoreV1().ServiceAccounts(ns).Apply(ctx, sa, o)
		return err
	}}}
	for _, s := range csiSidecars() {
		role, binding := csiClusterRole(s), csiClusterRoleBinding(s)
		objs = append(objs,
			object{"ClusterRole", *role.Name, "", role, func(ctx context.Context, c kubernetes.Interface, o metav1.ApplyOptions) error {
				_, err := c.RbacV1().ClusterRoles().Apply(ctx, role, o)
				return err
			}},
			object{"ClusterRoleBinding", *binding.Name, "", binding, func(ctx context.Context, c kubernetes.Interface, o metav1.ApplyOptions) error {
				_, err := c.RbacV1().ClusterRoleBindings().Apply(ctx, binding, o)
				return err
			}})
	}
	leaseRole, leaseBinding := csiLeaseRole(), csiLeaseRoleBinding()
	driver, ds, class := csiDriver(), csiControllerDaemonSet(p), encryptedStorageClass()
	return append(objs,
		object{"Role", CSIController, ns, leaseRole, func(ctx context.Context, c kubernetes.Interface, o metav1.ApplyOptions) error {
			_, err := c.RbacV1().Roles(ns).Apply(ctx, leaseRole, o)
			return err
		}},
		object{"RoleBinding", CSIController, ns, leaseBinding, func(ctx context.Context, c kubernetes.Interface, o metav1.ApplyOptions) error {
			_, err := c.RbacV1().RoleBindings(ns).Apply(ctx, leaseBinding, o)
			return err
		}},
		object{"CSIDriver", csidriver.Name, "", driver, func(ctx context.Context, c kubernetes.Interface, o metav1.ApplyOptions) error {
			_, err := c.StorageV1().CSIDrivers().Apply(ctx, driver, o)
			return err
		}},
		object{"DaemonSet", CSIController, ns, ds, func(ctx context.Context, c kubernetes.Interface, o metav1.ApplyOptions) error {
			_, err := c.AppsV1().DaemonSets(ns).Apply(ctx, ds, o)
			return err
		}},
		object{"StorageClass", EncryptedStorageClass, "", class, func(ctx context.Context, c kubernetes.Interface, o metav1.ApplyOptions) error {
			_, err := c.StorageV1().StorageClasses().Apply(ctx, class, o)
			return err
		}},
	)
}

// csiClusterRoleName names a sidecar's ClusterRole and ClusterRoleBinding: upstream's names
// (external-provisioner-runner, ...) would collide with another driver's deployment of the
// same sidecars.
func csiClusterRoleName(sidecar string) string { return "constellation-" + sidecar }

func csiClusterRole(s csiSidecar) *rbacv1ac.ClusterRoleApplyConfiguration {
	return rbacv1ac.ClusterRole(csiClusterRoleName(s.name)).WithLabels(labels(CSIController)).WithRules(s.rules...)
}

func csiClusterRoleBinding(s csiSidecar) *rbacv1ac.ClusterRoleBindingApplyConfiguration {
	return rbacv1ac.ClusterRoleBinding(csiClusterRoleName(s.name)).WithLabels(labels(CSIController)).
		WithRoleRef(rbacv1ac.RoleRef().WithAPIGroup(rbacv1.GroupName).WithKind("ClusterRole").WithName(csiClusterRoleName(s.name))).
		WithSubjects(rbacv1ac.Subject().WithKind(rbacv1.ServiceAccountKind).WithName(CSIController).WithNamespace(clusterrecord.Namespace))
}

// csiLeaseRole lets the sidecars elect their leaders in kube-system: their three Leases by
// name (get, update: client-go's LeaseLock needs no more), and create, which RBAC cannot
// restrict by name. No other Lease of kube-system can be read, taken over or deleted.
func csiLeaseRole() *rbacv1ac.RoleApplyConfiguration {
	var leases []string
	for _, s := range csiSidecars() {
		leases = append(leases, s.lease)
	}
	return rbacv1ac.Role(CSIController, clusterrecord.Namespace).WithLabels(labels(CSIController)).WithRules(
		rbacv1ac.PolicyRule().WithAPIGroups("coordination.k8s.io").WithResources("leases").WithVerbs("create"),
		rbacv1ac.PolicyRule().WithAPIGroups("coordination.k8s.io").WithResources("leases").WithResourceNames(leases...).WithVerbs("get", "update"),
	)
}

func csiLeaseRoleBinding() *rbacv1ac.RoleBindingApplyConfiguration {
	return rbacv1ac.RoleBinding(CSIController, clusterrecord.Namespace).WithLabels(labels(CSIController)).
		WithRoleRef(rbacv1ac.RoleRef().WithAPIGroup(rbacv1.GroupName).WithKind("Role").WithName(CSIController)).
		WithSubjects(rbacv1ac.Subject().WithKind(rbacv1.ServiceAccountKind).WithName(CSIController).WithNamespace(clusterrecord.Namespace))
}

// csiDriver registers the driver: volumes are attached (ControllerPublishVolume, so the
// platform enforces one node at a time) before a node stages them; the kubelet passes no pod
// information on mounts (the node half asks the join service for the key, which checks the
// pod itself); persistent volumes only; the kubelet applies a pod's fsGroup to the files.
func csiDriver() *storagev1ac.CSIDriverApplyConfiguration {
	return storagev1ac.CSIDriver(csidriver.Name).WithLabels(labels(CSIController)).
		WithSpec(storagev1ac.CSIDriverSpec().
			WithAttachRequired(true).
			WithPodInfoOnMount(false).
			WithVolumeLifecycleModes(storagev1.VolumeLifecyclePersistent).
			WithFSGroupPolicy(storagev1.FileFSGroupPolicy))
}

// encryptedStorageClass is the cluster's default StorageClass: a volume is created when its
// first pod is scheduled, removed with its claim (its ciphertext, nothing else), and can grow.
func encryptedStorageClass() *storagev1ac.StorageClassApplyConfiguration {
	return storagev1ac.StorageClass(EncryptedStorageClass).WithLabels(labels(CSIController)).
		WithAnnotations(map[string]string{DefaultClassAnnotation: "true"}).
		WithProvisioner(csidriver.Name).
		WithReclaimPolicy(corev1.PersistentVolumeReclaimDelete).
		WithAllowVolumeExpansion(true).
		WithVolumeBindingMode(storagev1.VolumeBindingWaitForFirstConsumer)
}

// apiAccessVolume is what the kubelet mounts as a pod's service-account token
// (automountServiceAccountToken), here mounted only into the containers that talk to the
// API server: the token, the cluster CA and the namespace.
func apiAccessVolume() *corev1ac.VolumeApplyConfiguration {
	return corev1ac.Volume().WithName("kube-api-access").WithProjected(corev1ac.ProjectedVolumeSource().WithDefaultMode(0o444).WithSources(
		corev1ac.VolumeProjection().WithServiceAccountToken(corev1ac.ServiceAccountTokenProjection().WithPath("token").WithExpirationSeconds(3607)),
		corev1ac.VolumeProjection().WithConfigMap(corev1ac.ConfigMapProjection().WithName("kube-root-ca.crt").
			WithItems(corev1ac.KeyToPath().WithKey("ca.crt").WithPath("ca.crt"))),
		corev1ac.VolumeProjection().WithDownwardAPI(corev1ac.DownwardAPIProjection().
			WithItems(corev1ac.DownwardAPIVolumeFile().WithPath("namespace").WithFieldRef(corev1ac.ObjectFieldSelector().WithFieldPath("metadata.namespace")))),
	))
}

// apiAccessDir is where client-go's in-cluster configuration reads the token.
const apiAccessDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// csiControllerDaemonSet runs the driver's controller half on every control plane: the
// driver (csidriver controller), which reaches the platform's storage (the node platform's,
// found through its metadata service: the local providers' volume API, Azure's disks) from the
// node's address (hostNetwork: the service names its caller by source
// address), and the three sidecars, which watch the API server and call the driver over a
// socket in the pod (an emptyDir). Leader election makes one replica of each sidecar act.
// All run as an unprivileged user without capabilities on a read-only root. Only the sidecars
// get the service-account token: the driver, which talks to the platform, holds no cluster
// credential. The sidecars talk to the API server of their own node, as the join service.
func csiControllerDaemonSet(p params) *appsv1ac.DaemonSetApplyConfiguration {
	socketMount := corev1ac.VolumeMount().WithName("socket-dir").WithMountPath(csiSocketDir)
	containers := []*corev1ac.ContainerApplyConfiguration{
		container("csidriver", p.image, "csidriver",
			"controller", "--endpoint=unix://"+csiSocket, "--platform="+p.platform.Name, "--metadata-url="+p.platform.MetadataURL, "--log-level="+p.logLevel,
		).WithSecurityContext(restricted(nonRootUser)).WithVolumeMounts(socketMount),
	}
	for _, s := range csiSidecars() {
		containers = append(containers, container(s.name, p.image, s.name, s.args...).
			WithEnv(
				corev1ac.EnvVar().WithName("KUBERNETES_SERVICE_HOST").WithValueFrom(fieldRef("status.hostIP")),
				corev1ac.EnvVar().WithName("KUBERNETES_SERVICE_PORT").WithValue(fmt.Sprint(APIServerPort)),
			).
			WithSecurityContext(restricted(nonRootUser)).
			WithVolumeMounts(socketMount, corev1ac.VolumeMount().WithName("kube-api-access").WithMountPath(apiAccessDir).WithReadOnly(true)))
	}
	pod := onControlPlanes(corev1ac.PodSpec()).
		WithAutomountServiceAccountToken(false).
		WithContainers(containers...).
		WithVolumes(
			corev1ac.Volume().WithName("socket-dir").WithEmptyDir(corev1ac.EmptyDirVolumeSource()),
			apiAccessVolume(),
		)
	ds := daemonSet(CSIController, pod)
	// The services' frame uses the node's DNS; the controller may resolve cluster names.
	ds.Spec.Template.Spec.WithDNSPolicy(corev1.DNSClusterFirstWithHostNet)
	return ds
}
