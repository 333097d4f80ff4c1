package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	rbacv1ac "k8s.io/client-go/applyconfigurations/rbac/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/openconstellation/constellation/internal/fileutil"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/state"
)

// The platform's Service load balancers (provider.ServiceLoadBalancer: the local provider's
// host ports for NodePort and LoadBalancer Services) act on the cluster with a credential of
// their own that may only read Services and write their status, as a cloud's load balancer
// controller does: a ServiceAccount, a ClusterRole and its binding, and a token, which apply
// writes into the platform's kubeconfig file. The token is valid for serviceLBTokenValidity;
// every apply issues a new one.
const (
	serviceLBAccount       = "constellation-service-lb"
	serviceLBRole          = "constellation:service-lb"
	serviceLBTokenValidity = 365 * 24 * time.Hour
)

// ensureServiceLBAccess gives the platform's Service load balancers their credential, if the
// platform has them.
func ensureServiceLBAccess(ctx context.Context, workspace string, st *state.State, client kubernetes.Interface) error {
	p, err := providerOf(st)
	if err != nil {
		return err
	}
	lb, ok := p.(provider.ServiceLoadBalancer)
	if !ok {
		return nil
	}
	if err := applyServiceLBRBAC(ctx, client); err != nil {
		return fmt.Errorf("the Service load balancers' role: %w", err)
	}
	expiration := int64(serviceLBTokenValidity / time.Second)
	tok, err := client.CoreV1().ServiceAccounts(metav1.NamespaceSystem).CreateToken(ctx, serviceLBAccount,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiration}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("a token for the Service load balancers: %w", err)
	}
	cluster, _, err := adminContext(filepath.Join(workspace, AdminConfFile))
	if err != nil {
		return err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["cluster"] = cluster
	cfg.AuthInfos[serviceLBAccount] = &clientcmdapi.AuthInfo{Token: tok.Status.Token}
	cfg.Contexts["service-lb"] = &clientcmdapi.Context{Cluster: "cluster", AuthInfo: serviceLBAccount}
	cfg.CurrentContext = "service-lb"
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		return err
	}
	path := lb.ServiceLBKubeconfig(workspace)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return fileutil.WriteAtomic(path, data, 0o600)
}

// applyServiceLBRBAC applies (server-side, as internal/deploy applies the cluster's objects)
// the ServiceAccount, the role that may read Services and write their status, and its
// binding.
func applyServiceLBRBAC(ctx context.Context, client kubernetes.Interface) error {
	opts := metav1.ApplyOptions{FieldManager: serviceLBFieldManager, Force: true}
	if _, err := client.CoreV1().ServiceAccounts(metav1.NamespaceSystem).Apply(ctx,
		corev1ac.ServiceAccount(serviceLBAccount, metav1.NamespaceSystem), opts); err != nil {
		return err
	}
	role := rbacv1ac.ClusterRole(serviceLBRole).WithRules(
		rbacv1ac.PolicyRule().WithAPIGroups("").WithResources("services").WithVerbs("get", "list", "watch"),
		rbacv1ac.PolicyRule().WithAPIGroups("").WithResources("services/status").WithVerbs("update", "patch"),
	)
	if _, err := client.RbacV1().ClusterRoles().Apply(ctx, role, opts); err != nil {
		return err
	}
	binding := rbacv1ac.ClusterRoleBinding(serviceLBRole).
		WithRoleRef(rbacv1ac.RoleRef().WithAPIGroup(rbacv1.GroupName).WithKind("ClusterRole").WithName(serviceLBRole)).
		WithSubjects(rbacv1ac.Subject().WithKind(rbacv1.ServiceAccountKind).WithName(serviceLBAccount).WithNamespace(metav1.NamespaceSystem))
	_, err := client.RbacV1().ClusterRoleBindings().Apply(ctx, binding, opts)
	return err
}

// serviceLBFieldManager owns the Service load balancers' objects.
const serviceLBFieldManager = "constellation-cli"

// warnServiceLB is ensureServiceLBAccess whose failure leaves the cluster as it is: Services
// are then not reachable from the host until an apply succeeds at it.
func warnServiceLB(ctx context.Context, out io.Writer, workspace string, st *state.State, client kubernetes.Interface) {
	if err := ensureServiceLBAccess(ctx, workspace, st, client); err != nil {
		fmt.Fprintf(out, "WARNING: NodePort and LoadBalancer Services are not reachable from the host: %v (apply again to retry)\n", err)
	}
}
