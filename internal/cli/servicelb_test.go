package cli

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/openconstellation/constellation/internal/state"
)

// TestEnsureServiceLBAccess: the local platform's Service load balancers get a role that may
// read Services and write their status, and nothing else, bound to their ServiceAccount, and a
// kubeconfig for it (0600) beside the cluster; running it again changes nothing but the token.
func TestEnsureServiceLBAccess(t *testing.T) {
	ws := t.TempDir()
	writeKubeconfig(t, filepath.Join(ws, AdminConfFile), "kubernetes-admin@mini", "https://127.0.0.1:40001")
	st := &state.State{Name: "mini", Provider: state.ProviderLocal}
	client := fake.NewClientset()
	// The fake has no TokenRequest: answer as the API server does.
	client.PrependReactor("create", "serviceaccounts", func(action k8stesting.Action) (bool, runtime.Object, error) {
		if action.GetSubresource() != "token" {
			return false, nil, nil
		}
		return true, &authenticationv1.TokenRequest{Status: authenticationv1.TokenRequestStatus{Token: "token-of-the-service-lb"}}, nil
	})
	ctx := context.Background()
	for range 2 {
		require.NoError(t, ensureServiceLBAccess(ctx, ws, st, client))
	}
	role, err := client.RbacV1().ClusterRoles().Get(ctx, serviceLBRole, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, []authorizationv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"services/status"}, Verbs: []string{"update", "patch"}},
	}, role.Rules)
	binding, err := client.RbacV1().ClusterRoleBindings().Get(ctx, serviceLBRole, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, serviceLBAccount, binding.Subjects[0].Name)
	assert.Equal(t, "kube-system", binding.Subjects[0].Namespace)

	path := filepath.Join(ws, "mini", "service-lb.kubeconfig")
	info, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())
	cfg, err := clientcmd.LoadFromFile(path)
	require.NoError(t, err)
	assert.Equal(t, "https://127.0.0.1:40001", cfg.Clusters[cfg.Contexts[cfg.CurrentContext].Cluster].Server)
	assert.Equal(t, "token-of-the-service-lb", cfg.AuthInfos[serviceLBAccount].Token)
	assert.Empty(t, cfg.AuthInfos[serviceLBAccount].ClientKeyData, "a token, not the admin's key")
}
