package deploy

import (
	"context"
	"fmt"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	admissionv1ac "k8s.io/client-go/applyconfigurations/admissionregistration/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	rbacv1ac "k8s.io/client-go/applyconfigurations/rbac/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/openconstellation/constellation/internal/diskowner"
	"github.com/openconstellation/constellation/internal/kube/kubeletcsr"
)

// Node identity: what the cluster enforces so that a node's Kubernetes credentials name that
// node alone and die with its removal (docs/joinservice.md, "Node credentials";
// docs/threat-model.md, A4).
//
//   - SelfNodeClientRenewal lets a kubelet renew its client certificate for its own name:
//     kube-controller-manager approves a request from system:node:<name> for CN
//     system:node:<name> and nothing else (its "selfnodeclient" rule). It is the only
//     approval rule for kubelet client certificates in the cluster: kubeadm init's
//     bootstrap-token phase, which would also bind the "nodeclient" rule (any node name, for
//     anyone holding a bootstrap token), is skipped (internal/kube/kubeadmconfig).
//   - RemovedNodesPolicy (a ValidatingAdmissionPolicy whose parameters are the removed-node
//     records of internal/diskowner) refuses every write of a removed node's identity
//     (system:node:<name>): its Node, Lease, pod status, events and, above all, its
//     certificate requests, so it cannot renew; anyone's creation of a Node with its name; and
//     anyone's binding of a pod to its name (a pod created with spec.nodeName, a pods/binding),
//     so that nothing gives the Node authorizer a pod of a removed node again: not a
//     DaemonSet controller or scheduler acting on a stale view of the Nodes, not an
//     administrator. It takes effect when `apply` writes the record, before the Node is
//     deleted. Reads are not admission's to refuse: the Node authorizer limits them to what is
//     bound to the node (nothing, once removal deleted its pods), and its certificate expires
//     within kubeletcsr.ClientValidity.
const (
	// SelfNodeClientRenewal is the ClusterRoleBinding's name: kubeadm's own, so kubeadm's
	// upgrade finds it.
	SelfNodeClientRenewal = "kubeadm:node-autoapprove-certificate-rotation"
	selfNodeClientRole    = "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient"
	// RemovedNodesPolicy names the ValidatingAdmissionPolicy and its binding.
	RemovedNodesPolicy = "constellation-removed-nodes"
)

// removedNodeRecordValid is the CEL condition that params, a removed-node record, names a
// node. A record without one refuses nobody (the validations pass): a stray ConfigMap with
// the label must not stop every kubelet of the cluster.
const removedNodeRecordValid = `has(params.data) && 'node' in params.data && params.data['node'] != ''`

func selfNodeClientBinding() *rbacv1ac.ClusterRoleBindingApplyConfiguration {
	return rbacv1ac.ClusterRoleBinding(SelfNodeClientRenewal).WithLabels(labels("node-identity")).
		WithRoleRef(rbacv1ac.RoleRef().WithAPIGroup("rbac.authorization.k8s.io").WithKind("ClusterRole").WithName(selfNodeClientRole)).
		WithSubjects(rbacv1ac.Subject().WithAPIGroup("rbac.authorization.k8s.io").WithKind("Group").WithName(kubeletcsr.NodesGroup))
}

func removedNodesPolicy() *admissionv1ac.ValidatingAdmissionPolicyApplyConfiguration {
	user := `request.userInfo.username`
	nodeName := `params.data['node']`
	isNodeCreate := `request.resource.group == '' && request.resource.resource == 'nodes' && (!has(request.subResource) || request.subResource == '') && request.operation == 'CREATE'`
	// A pod is bound to a node when it is created with spec.nodeName or by a Binding (the
	// scheduler's pods/binding): spec.nodeName cannot be changed otherwise.
	isPodCreate := `request.resource.group == '' && request.resource.resource == 'pods' && (!has(request.subResource) || request.subResource == '') && request.operation == 'CREATE'`
	isPodBinding := `request.resource.group == '' && request.resource.resource == 'pods' && has(request.subResource) && request.subResource == 'binding' && request.operation == 'CREATE'`
	boundNode := fmt.Sprintf(`(%s) ? (has(object.spec.nodeName) ? object.spec.nodeName : '') : ((%s) ? object.target.name : '')`, isPodCreate, isPodBinding)
	return admissionv1ac.ValidatingAdmissionPolicy(RemovedNodesPolicy).WithLabels(labels("node-identity")).
		WithSpec(admissionv1ac.ValidatingAdmissionPolicySpec().
			WithFailurePolicy(admissionv1.Fail).
			WithParamKind(admissionv1ac.ParamKind().WithAPIVersion("v1").WithKind("ConfigMap")).
			WithMatchConstraints(admissionv1ac.MatchResources().WithResourceRules(
				admissionv1ac.NamedRuleWithOperations().
					WithOperations(admissionv1.Create, admissionv1.Update, admissionv1.Delete, admissionv1.Connect).
					WithAPIGroups("*").WithAPIVersions("*").WithResources("*/*"))).
			// Cheap filter first: only nodes' own requests, creations of Nodes and bindings of
			// pods.
			WithMatchConditions(admissionv1ac.MatchCondition().WithName("node-user-node-creation-or-pod-binding").
				WithExpression(fmt.Sprintf(`%s.startsWith('%s') || (%s) || (%s) || (%s)`, user, kubeletcsr.NodeUserPrefix, isNodeCreate, isPodCreate, isPodBinding))).
			WithValidations(
				admissionv1ac.Validation().
					WithExpression(fmt.Sprintf(`!(%s) || %s != '%s' + %s`, removedNodeRecordValid, user, kubeletcsr.NodeUserPrefix, nodeName)).
					WithMessageExpression(fmt.Sprintf(`'node ' + %s + ' was removed from the cluster (record %s/' + params.metadata.name + '): its credentials are revoked'`, nodeName, diskowner.Namespace)).
					WithReason(metav1.StatusReasonForbidden),
				admissionv1ac.Validation().
					WithExpression(fmt.Sprintf(`!(%s) || !(%s) || object.metadata.name != %s`, removedNodeRecordValid, isNodeCreate, nodeName)).
					WithMessageExpression(fmt.Sprintf(`'node ' + %s + ' was removed from the cluster (record %s/' + params.metadata.name + '): its name is not given out again'`, nodeName, diskowner.Namespace)).
					WithReason(metav1.StatusReasonForbidden),
				admissionv1ac.Validation().
					WithExpression(fmt.Sprintf(`!(%s) || (%s) != %s`, removedNodeRecordValid, boundNode, nodeName)).
					WithMessageExpression(fmt.Sprintf(`'node ' + %s + ' was removed from the cluster (record %s/' + params.metadata.name + '): no pod is bound to it again'`, nodeName, diskowner.Namespace)).
					WithReason(metav1.StatusReasonForbidden),
			))
}

func removedNodesPolicyBinding() *admissionv1ac.ValidatingAdmissionPolicyBindingApplyConfiguration {
	return admissionv1ac.ValidatingAdmissionPolicyBinding(RemovedNodesPolicy).WithLabels(labels("node-identity")).
		WithSpec(admissionv1ac.ValidatingAdmissionPolicyBindingSpec().
			WithPolicyName(RemovedNodesPolicy).
			WithValidationActions(admissionv1.Deny).
			WithParamRef(admissionv1ac.ParamRef().
				WithNamespace(diskowner.Namespace).
				WithSelector(metav1ac.LabelSelector().WithMatchLabels(map[string]string{diskowner.RecordKindLabel: diskowner.RemovedLabel})).
				// No removed node yet: nothing to refuse.
				WithParameterNotFoundAction(admissionv1.AllowAction)))
}

// nodeIdentityObjects are the cluster-scoped objects above, in the order Apply applies them.
func nodeIdentityObjects() []object {
	binding, policy, policyBinding := selfNodeClientBinding(), removedNodesPolicy(), removedNodesPolicyBinding()
	return []object{
		{"ClusterRoleBinding", SelfNodeClientRenewal, "", binding, func(ctx context.Context, c kubernetes.Interface, o metav1.ApplyOptions) error {
			_, err := c.RbacV1().ClusterRoleBindings().Apply(ctx, binding, o)
			return err
		}},
		{"ValidatingAdmissionPolicy", RemovedNodesPolicy, "", policy, func(ctx context.Context, c kubernetes.Interface, o metav1.ApplyOptions) error {
			_, err := c.AdmissionregistrationV1().ValidatingAdmissionPolicies().Apply(ctx, policy, o)
			return err
		}},
		{"ValidatingAdmissionPolicyBinding", RemovedNodesPolicy, "", policyBinding, func(ctx context.Context, c kubernetes.Interface, o metav1.ApplyOptions) error {
			_, err := c.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Apply(ctx, policyBinding, o)
			return err
		}},
	}
}
