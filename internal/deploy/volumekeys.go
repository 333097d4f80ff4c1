package deploy

import (
	"context"

	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	rbacv1ac "k8s.io/client-go/applyconfigurations/rbac/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/openconstellation/constellation/internal/clusterrecord"
)

// JoinServiceVolumeReader names the join service's ClusterRole and ClusterRoleBinding for
// volume keys.
const JoinServiceVolumeReader = JoinService + "-volume-reader"

// joinServiceVolumeReaderRole is what the join service reads before it releases a volume's
// key (joinservice.KubeVolumes; docs/joinservice.md, "Volume keys"): get and list of pods,
// persistentvolumeclaims, persistentvolumes and volumeattachments, cluster-wide (pods and
// claims live in every namespace). Read-only: no watch (the service reads fresh at every
// request and keeps no cache), no write of anything. A cluster-wide read of pods shows their
// specs, which an administrator's secrets do not live in (Secrets are not granted).
func joinServiceVolumeReaderRole() *rbacv1ac.ClusterRoleApplyConfiguration {
	return rbacv1ac.ClusterRole(JoinServiceVolumeReader).WithLabels(labels(JoinService)).WithRules(
		rbacv1ac.PolicyRule().WithAPIGroups("").WithResources("pods", "persistentvolumeclaims", "persistentvolumes").WithVerbs("get", "list"),
		rbacv1ac.PolicyRule().WithAPIGroups(storagev1.GroupName).WithResources("volumeattachments").WithVerbs("get", "list"),
	)
}

func joinServiceVolumeReaderBinding() *rbacv1ac.ClusterRoleBindingApplyConfiguration {
	return rbacv1ac.ClusterRoleBinding(JoinServiceVolumeReader).WithLabels(labels(JoinService)).
		WithRoleRef(rbacv1ac.RoleRef().WithAPIGroup(rbacv1.GroupName).WithKind("ClusterRole").WithName(JoinServiceVolumeReader)).
		WithSubjects(rbacv1ac.Subject().WithKind(rbacv1.ServiceAccountKind).WithName(JoinService).WithNamespace(clusterrecord.Namespace))
}

// joinServiceVolumeObjects are the ClusterRole and its binding, applied after the join
// service's other permissions.
func joinServiceVolumeObjects() []object {
	role, binding := joinServiceVolumeReaderRole(), joinServiceVolumeReaderBinding()
	return []object{
		{"ClusterRole", JoinServiceVolumeReader, "", role, func(ctx context.Context, c kubernetes.Interface, o metav1.ApplyOptions) error {
			_, err := c.RbacV1().ClusterRoles().Apply(ctx, role, o)
			return err
		}},
		{"ClusterRoleBinding", JoinServiceVolumeReader, "", binding, func(ctx context.Context, c kubernetes.Interface, o metav1.ApplyOptions) error {
			_, err := c.RbacV1().ClusterRoleBindings().Apply(ctx, binding, o)
			return err
		}},
	}
}
