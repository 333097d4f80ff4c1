package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// writeKubeconfig writes a kubeconfig with one context named name for server.
func writeKubeconfig(t *testing.T, path, name, server string) {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[name] = &clientcmdapi.Cluster{Server: server}
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: "token-of-" + name}
	cfg.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name}
	cfg.CurrentContext = name
	require.NoError(t, clientcmd.WriteToFile(*cfg, path))
}

// TestMergeKubeconfig: the admin kubeconfig becomes a context named after the cluster, current,
// beside the user's other clusters, in a 0600 file; merging again replaces it; forgetting it
// removes only what still points at this cluster.
func TestMergeKubeconfig(t *testing.T) {
	dir := t.TempDir()
	admin := filepath.Join(dir, "constellation-admin.conf")
	writeKubeconfig(t, admin, "kubernetes-admin@mini", "https://127.0.0.1:40001")
	target := filepath.Join(dir, "home", ".kube", "config")
	require.NoError(t, os.MkdirAll(filepath.Dir(target), 0o700))
	writeKubeconfig(t, target, "kind-dev", "https://127.0.0.1:6443")

	name, err := mergeKubeconfig(admin, "mini", target)
	require.NoError(t, err)
	assert.Equal(t, "mini", name)
	for range 2 { // merging again changes nothing else
		_, err = mergeKubeconfig(admin, "mini", target)
		require.NoError(t, err)
	}
	got, err := clientcmd.LoadFromFile(target)
	require.NoError(t, err)
	assert.Equal(t, "mini", got.CurrentContext)
	assert.Equal(t, "https://127.0.0.1:40001", got.Clusters["mini"].Server)
	assert.Equal(t, "token-of-kubernetes-admin@mini", got.AuthInfos["mini-admin"].Token)
	assert.Equal(t, "https://127.0.0.1:6443", got.Clusters["kind-dev"].Server, "the user's other cluster stays")
	assert.Len(t, got.Contexts, 2)
	info, err := os.Stat(target)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())

	removed, err := unmergeKubeconfig("mini", "https://127.0.0.1:9999", target)
	require.NoError(t, err)
	assert.False(t, removed, "an entry pointing elsewhere is the user's")
	removed, err = unmergeKubeconfig("mini", "https://127.0.0.1:40001", target)
	require.NoError(t, err)
	assert.True(t, removed)
	got, err = clientcmd.LoadFromFile(target)
	require.NoError(t, err)
	assert.Empty(t, got.CurrentContext)
	assert.NotContains(t, got.Contexts, "mini")
	assert.NotContains(t, got.AuthInfos, "mini-admin")
	assert.Contains(t, got.Contexts, "kind-dev")
}

// TestMergeKubeconfigTargets: $KUBECONFIG's first file is the target; a missing file is
// created; a symlinked kubeconfig is written through the link; a corrupt one is left alone.
func TestMergeKubeconfigTargets(t *testing.T) {
	dir := t.TempDir()
	first, second := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	t.Setenv("KUBECONFIG", first+string(os.PathListSeparator)+second)
	target, err := userKubeconfig()
	require.NoError(t, err)
	assert.Equal(t, first, target)

	admin := filepath.Join(dir, "admin.conf")
	writeKubeconfig(t, admin, "kubernetes-admin@c", "https://127.0.0.1:40002")
	_, err = mergeKubeconfig(admin, "c", filepath.Join(dir, "new", "config"))
	require.NoError(t, err, "a missing kubeconfig is created")

	real := filepath.Join(dir, "real-config")
	writeKubeconfig(t, real, "other", "https://10.0.0.1")
	link := filepath.Join(dir, "link")
	require.NoError(t, os.Symlink(real, link))
	_, err = mergeKubeconfig(admin, "c", link)
	require.NoError(t, err)
	fi, err := os.Lstat(link)
	require.NoError(t, err)
	assert.NotZero(t, fi.Mode()&os.ModeSymlink, "the link stays a link")
	got, err := clientcmd.LoadFromFile(real)
	require.NoError(t, err)
	assert.Contains(t, got.Contexts, "c")

	corrupt := filepath.Join(dir, "corrupt")
	require.NoError(t, os.WriteFile(corrupt, []byte("clusters: [not: {a kubeconfig"), 0o600))
	_, err = mergeKubeconfig(admin, "c", corrupt)
	assert.ErrorContains(t, err, "left as it is")
	data, err := os.ReadFile(corrupt)
	require.NoError(t, err)
	assert.Equal(t, "clusters: [not: {a kubeconfig", string(data))
}

// TestCompletion: the shell completion scripts docs/cli.md documents are there.
func TestCompletion(t *testing.T) {
	for shell, want := range map[string]string{"bash": "# bash completion V2 for constellation", "zsh": "#compdef constellation", "fish": "# fish completion for constellation"} {
		root := NewRootCmd()
		var out strings.Builder
		root.SetOut(&out)
		root.SetArgs([]string{"completion", shell})
		require.NoError(t, root.Execute(), shell)
		assert.Contains(t, out.String(), want, shell)
	}
}
