package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"path"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	rbacv1ac "k8s.io/client-go/applyconfigurations/rbac/v1"
	storagev1ac "k8s.io/client-go/applyconfigurations/storage/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/openconstellation/constellation/internal/volumes"
)

// The node-local StorageClass (docs/local-provider.md "Volumes"), an explicit choice since the
// encrypted volumes that move with their pods are the default (csi.go):
// local-path-provisioner, built from its Go module into the services image, makes each volume
// a directory of its node's state storage (volumes.Dir), so a volume reaches the disk only
// encrypted with that node's state key, and is lost with the node. The names are upstream's,
// so its documentation applies as written.
const (
	StorageNamespace   = "local-path-storage"
	StorageProvisioner = "local-path-provisioner"
	StorageConfigMap   = "local-path-config"
	StorageClass       = "local-path"
	// StorageProvisionerName is the provisioner the StorageClass names (upstream's default).
	StorageProvisionerName = "rancher.io/local-path"
)

// volumeHelper is the command of the provisioner's helper pods (cmd/volumehelper).
var volumeHelper = path.Join(BinDir, "volumehelper")

// storageObjects are the node-local StorageClass's objects: the provisioner's namespace, identity
// and permissions (upstream's), its configuration, its Deployment and the StorageClass.
func storageObjects(p params) ([]object, error) {
	cfg, err := storageConfigMap(p)
	if err != nil {
		return nil, err
	}
	nsObj := corev1ac.Namespace(StorageNamespace).WithLabels(labels(StorageProvisioner))
	sa := corev1ac.ServiceAccount(StorageProvisioner, StorageNamespace).WithLabels(labels(StorageProvisioner))
	role, roleBinding := storageRole(), storageRoleBinding()
	clusterRole, clusterRoleBinding := storageClusterRole(), storageClusterRoleBinding()
	deployment, class := storageDeployment(p), storageClass()
	ns := StorageNamespace
	return []object{
		{"Namespace", ns, "", nsObj, func(ctx context.Context, c kubernetes.Interface, o metav1.ApplyOptions) error {
			_, err := c.CoreV1().Namespaces().Apply(ctx, nsObj, o)
			return err
		}},
		{"ServiceAccount", StorageProvisioner, ns, sa, func(ctx context.Context, c kubernetes.Interface, o metav1.ApplyOptions) error {
			_, err := c.CoreV1().ServiceAccounts(ns).Apply(ctx, sa, o)
			return err
		}},
		{"Role", StorageProvisioner, ns, role, func(ctx context.Context, c kubernetes.Interface, o metav1.ApplyOptions) error {
			_, err := c.RbacV1().Roles(ns).Apply(ctx, role, o)
			return err
		}},
		{"RoleBinding", StorageProvisioner, ns, roleBinding, func(ctx context.Context, c kubernetes.Interface, o metav1.ApplyOptions) error {
			_, err := c.RbacV1().RoleBindings(ns).Apply(ctx, roleBinding, o)
			return err
		}},
		{"ClusterRole", StorageProvisioner, "", clusterRole, func(ctx context.Context, c kubernetes.Interface, o metav1.ApplyOptions) error {
			_, err := c.RbacV1().ClusterRoles().Apply(ctx, clusterRole, o)
			return err
		}},
		{"ClusterRoleBinding", StorageProvisioner, "", clusterRoleBinding, func(ctx context.Context, c kubernetes.Interface, o metav1.ApplyOptions) error {
			_, err := c.RbacV1().ClusterRoleBindings().Apply(ctx, clusterRoleBinding, o)
			return err
		}},
		{"ConfigMap", StorageConfigMap, ns, cfg, func(ctx context.Context, c kubernetes.Interface, o metav1.ApplyOptions) error {
			_, err := c.CoreV1().ConfigMaps(ns).Apply(ctx, cfg, o)
			return err
		}},
		{"Deployment", StorageProvisioner, ns, deployment, func(ctx context.Context, c kubernetes.Interface, o metav1.ApplyOptions) error {
			_, err := c.AppsV1().Deployments(ns).Apply(ctx, deployment, o)
			return err
		}},
		{"StorageClass", StorageClass, "", class, func(ctx context.Context, c kubernetes.Interface, o metav1.ApplyOptions) error {
			_, err := c.StorageV1().StorageClasses().Apply(ctx, class, o)
			return err
		}},
	}, nil
}

// storageRole: the helper pods, which the provisioner creates and deletes in its namespace.
func storageRole() *rbacv1ac.RoleApplyConfiguration {
	return rbacv1ac.Role(StorageProvisioner, StorageNamespace).WithLabels(labels(StorageProvisioner)).
		WithRules(rbacv1ac.PolicyRule().WithAPIGroups("").WithResources("pods").WithVerbs("get", "list", "watch", "create", "patch", "update", "delete"))
}

func storageRoleBinding() *rbacv1ac.RoleBindingApplyConfiguration {
	return rbacv1ac.RoleBinding(StorageProvisioner, StorageNamespace).WithLabels(labels(StorageProvisioner)).
		WithRoleRef(rbacv1ac.RoleRef().WithAPIGroup(rbacv1.GroupName).WithKind("Role").WithName(StorageProvisioner)).
		WithSubjects(rbacv1ac.Subject().WithKind(rbacv1.ServiceAccountKind).WithName(StorageProvisioner).WithNamespace(StorageNamespace))
}

// storageClusterRole is upstream's: claims and nodes to read, volumes to make and remove.
func storageClusterRole() *rbacv1ac.ClusterRoleApplyConfiguration {
	return rbacv1ac.ClusterRole(StorageProvisioner).WithLabels(labels(StorageProvisioner)).WithRules(
		rbacv1ac.PolicyRule().WithAPIGroups("").WithResources("nodes", "persistentvolumeclaims", "configmaps", "pods", "pods/log").WithVerbs("get", "list", "watch"),
		rbacv1ac.PolicyRule().WithAPIGroups("").WithResources("persistentvolumes").WithVerbs("get", "list", "watch", "create", "patch", "update", "delete"),
		rbacv1ac.PolicyRule().WithAPIGroups("").WithResources("events").WithVerbs("create", "patch"),
		rbacv1ac.PolicyRule().WithAPIGroups(storagev1.GroupName).WithResources("storageclasses").WithVerbs("get", "list", "watch"),
	)
}

func storageClusterRoleBinding() *rbacv1ac.ClusterRoleBindingApplyConfiguration {
	return rbacv1ac.ClusterRoleBinding(StorageProvisioner).WithLabels(labels(StorageProvisioner)).
		WithRoleRef(rbacv1ac.RoleRef().WithAPIGroup(rbacv1.GroupName).WithKind("ClusterRole").WithName(StorageProvisioner)).
		WithSubjects(rbacv1ac.Subject().WithKind(rbacv1.ServiceAccountKind).WithName(StorageProvisioner).WithNamespace(StorageNamespace))
}

// provisionerConfig is local-path-provisioner's config.json: every node keeps its volumes in
// volumes.Dir, and the helper pods run volumehelper instead of upstream's shell scripts.
type provisionerConfig struct {
	NodePathMap     []nodePath `json:"nodePathMap"`
	SetupCommand    string     `json:"setupCommand"`
	TeardownCommand string     `json:"teardownCommand"`
}

type nodePath struct {
	Node  string   `json:"node"`
	Paths []string `json:"paths"`
}

// storageConfigMap holds the provisioner's configuration and its helper pods' template: the
// services image (never pulled), root (the volumes directory is root's) with only the
// capabilities that remove what a workload of another user left in its volume.
func storageConfigMap(p params) (*corev1ac.ConfigMapApplyConfiguration, error) {
	cfg, err := json.MarshalIndent(provisionerConfig{
		NodePathMap:     []nodePath{{Node: "DEFAULT_PATH_FOR_NON_LISTED_NODES", Paths: []string{volumes.Dir}}},
		SetupCommand:    volumeHelper,
		TeardownCommand: volumeHelper,
	}, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("storage configuration: %w", err)
	}
	root := int64(0)
	falseVal, trueVal := false, true
	helper := corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: "helper-pod", Labels: labels(StorageProvisioner)},
		Spec: corev1.PodSpec{
			PriorityClassName: "system-node-critical",
			Containers: []corev1.Container{{
				Name: "helper", Image: p.image, ImagePullPolicy: corev1.PullNever,
				SecurityContext: &corev1.SecurityContext{
					RunAsUser: &root, AllowPrivilegeEscalation: &falseVal, ReadOnlyRootFilesystem: &trueVal,
					Capabilities:   &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"DAC_OVERRIDE", "FOWNER"}},
					SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
				},
			}},
		},
	}
	helperYAML, err := yaml.Marshal(helper)
	if err != nil {
		return nil, fmt.Errorf("storage helper pod: %w", err)
	}
	return corev1ac.ConfigMap(StorageConfigMap, StorageNamespace).WithLabels(labels(StorageProvisioner)).
		WithData(map[string]string{"config.json": string(cfg), "helperPod.yaml": string(helperYAML)}), nil
}

// storageDeployment runs the provisioner: one replica, anywhere (control planes included), as
// an unprivileged user: it only talks to the API server.
func storageDeployment(p params) *appsv1ac.DeploymentApplyConfiguration {
	const configDir = "/etc/config/"
	c := corev1ac.Container().WithName(StorageProvisioner).WithImage(p.image).WithImagePullPolicy(corev1.PullNever).
		WithCommand(path.Join(BinDir, StorageProvisioner)).
		WithArgs("start", "--config", configDir+"config.json", "--provisioner-name", StorageProvisionerName,
			"--service-account-name", StorageProvisioner, "--configmap-name", StorageConfigMap, "--helper-image", p.image).
		WithEnv(corev1ac.EnvVar().WithName("POD_NAMESPACE").WithValueFrom(fieldRef("metadata.namespace")),
			corev1ac.EnvVar().WithName("CONFIG_MOUNT_PATH").WithValue(configDir)).
		WithVolumeMounts(corev1ac.VolumeMount().WithName("config").WithMountPath(configDir)).
		WithSecurityContext(restricted(nonRootUser))
	pod := corev1ac.PodSpec().WithServiceAccountName(StorageProvisioner).WithContainers(c).
		WithPriorityClassName("system-cluster-critical").
		WithTolerations(corev1ac.Toleration().WithKey(controlPlaneLabel).WithOperator(corev1.TolerationOpExists).WithEffect(corev1.TaintEffectNoSchedule)).
		WithVolumes(corev1ac.Volume().WithName("config").WithConfigMap(corev1ac.ConfigMapVolumeSource().WithName(StorageConfigMap)))
	return appsv1ac.Deployment(StorageProvisioner, StorageNamespace).WithLabels(labels(StorageProvisioner)).
		WithSpec(appsv1ac.DeploymentSpec().WithReplicas(1).
			WithSelector(metav1ac.LabelSelector().WithMatchLabels(map[string]string{nameLabel: StorageProvisioner})).
			WithTemplate(corev1ac.PodTemplateSpec().WithLabels(labels(StorageProvisioner)).WithSpec(pod)))
}

// storageClass is the node-local StorageClass, asked for by name: a volume is made on the
// node its first pod is scheduled to, and removed with its claim. It carries no
// DefaultClassAnnotation: applied with the same field manager, that removes the annotation
// from a cluster where it was the default.
func storageClass() *storagev1ac.StorageClassApplyConfiguration {
	return storagev1ac.StorageClass(StorageClass).WithLabels(labels(StorageProvisioner)).
		WithProvisioner(StorageProvisionerName).
		WithVolumeBindingMode(storagev1.VolumeBindingWaitForFirstConsumer).
		WithReclaimPolicy(corev1.PersistentVolumeReclaimDelete)
}
