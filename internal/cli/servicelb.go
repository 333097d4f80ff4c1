package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	admin, err := clientcmd.LoadFromFile(filepath.Join(workspace, AdminConfFile))
	if err != nil {
		return fmt.Errorf("reading the admin kubeconfig: %w", err)
	}
	ctxName := admin.Contexts[admin.CurrentContext]
	if ctxName == nil || admin.Clusters[ctxName.Cluster] == nil {
		return fmt.Errorf("the admin kubeconfig names no cluster")
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["cluster"] = admin.Clusters[ctxName.Cluster]
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

// applyServiceLBRBAC creates (or sets again) the ServiceAccount, the role that may read
// Services and write their status, and its binding.
func applyServiceLBRBAC(ctx context.Context, client kubernetes.Interface) error {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: serviceLBAccount, Namespace: metav1.NamespaceSystem}}
	if _, err := client.CoreV1().ServiceAccounts(sa.Namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: serviceLBRole},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{""}, Resources: []string{"services/status"}, Verbs: []string{"update", "patch"}},
		},
	}
	if err := createOrUpdate(ctx, role, client.RbacV1().ClusterRoles().Create, client.RbacV1().ClusterRoles().Update); err != nil {
		return err
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: serviceLBRole},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: serviceLBRole},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: serviceLBAccount, Namespace: metav1.NamespaceSystem}},
	}
	return createOrUpdate(ctx, binding, client.RbacV1().ClusterRoleBindings().Create, client.RbacV1().ClusterRoleBindings().Update)
}

// createOrUpdate creates obj, or updates the existing one to it.
func createOrUpdate[T any](ctx context.Context, obj T, create func(context.Context, T, metav1.CreateOptions) (T, error), update func(context.Context, T, metav1.UpdateOptions) (T, error)) error {
	if _, err := create(ctx, obj, metav1.CreateOptions{}); err == nil || !apierrors.IsAlreadyExists(err) {
		return err
	}
	_, err := update(ctx, obj, metav1.UpdateOptions{})
	return err
}

// warnServiceLB is ensureServiceLBAccess whose failure leaves the cluster as it is: Services
// are then not reachable from the host until an apply succeeds at it.
func warnServiceLB(ctx context.Context, out io.Writer, workspace string, st *state.State, client kubernetes.Interface) {
	if err := ensureServiceLBAccess(ctx, workspace, st, client); err != nil {
		fmt.Fprintf(out, "WARNING: NodePort and LoadBalancer Services are not reachable from the host: %v (apply again to retry)\n", err)
	}
}
