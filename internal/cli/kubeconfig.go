package cli

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/openconstellation/constellation/internal/fileutil"
	"github.com/openconstellation/constellation/internal/state"
)

// The user's kubeconfig (--merge-kubeconfig): the workspace's admin kubeconfig is added to it
// as a context named after the cluster, with a cluster of that name and a user "<name>-admin",
// and made the current context, as upstream's --merge-kubeconfig and kind do. Entries of
// other clusters are kept; entries of the same names are replaced (the cluster created
// again). terminate removes the entries again, but only those that still point at this
// cluster's API endpoint: a context the user changed since is theirs.

// userKubeconfig is the kubeconfig kubectl reads and writes by default: the first file of
// $KUBECONFIG, else ~/.kube/config.
func userKubeconfig() (string, error) {
	if list := filepath.SplitList(os.Getenv(clientcmd.RecommendedConfigPathEnvVar)); len(list) > 0 && list[0] != "" {
		return list[0], nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("no home directory for ~/.kube/config: %w", err)
	}
	return filepath.Join(home, clientcmd.RecommendedHomeDir, clientcmd.RecommendedFileName), nil
}

// kubeconfigNames are the names of a cluster's entries in the user's kubeconfig.
func kubeconfigNames(cluster string) (context, user string) { return cluster, cluster + "-admin" }

// mergeKubeconfig adds the admin kubeconfig adminConf of cluster to the user's kubeconfig
// target and makes its context the current one. It returns the context's name.
func mergeKubeconfig(adminConf, cluster, target string) (string, error) {
	adminCluster, adminUser, err := adminContext(adminConf)
	if err != nil {
		return "", err
	}
	path, existing, err := loadUserKubeconfig(target)
	if err != nil {
		return "", err
	}
	name, user := kubeconfigNames(cluster)
	existing.Clusters[name] = adminCluster
	existing.AuthInfos[user] = adminUser
	existing.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: user}
	existing.CurrentContext = name
	return name, writeUserKubeconfig(path, existing)
}

// adminContext reads the cluster and user of the admin kubeconfig's current context.
func adminContext(adminConf string) (*clientcmdapi.Cluster, *clientcmdapi.AuthInfo, error) {
	admin, err := clientcmd.LoadFromFile(adminConf)
	if err != nil {
		return nil, nil, fmt.Errorf("reading the admin kubeconfig: %w", err)
	}
	ctx, ok := admin.Contexts[admin.CurrentContext]
	if !ok || admin.Clusters[ctx.Cluster] == nil || admin.AuthInfos[ctx.AuthInfo] == nil {
		return nil, nil, fmt.Errorf("%s: its current context %q names no cluster and user", adminConf, admin.CurrentContext)
	}
	return admin.Clusters[ctx.Cluster], admin.AuthInfos[ctx.AuthInfo], nil
}

// unmergeKubeconfig removes cluster's entries from the user's kubeconfig target if its
// cluster entry still points at server (https://host:port). It reports whether it removed
// them.
func unmergeKubeconfig(cluster, server, target string) (bool, error) {
	path, existing, err := loadUserKubeconfig(target)
	if err != nil {
		return false, err
	}
	name, user := kubeconfigNames(cluster)
	c, ok := existing.Clusters[name]
	if !ok || c.Server != server {
		return false, nil
	}
	delete(existing.Clusters, name)
	delete(existing.AuthInfos, user)
	delete(existing.Contexts, name)
	if existing.CurrentContext == name {
		existing.CurrentContext = ""
	}
	return true, writeUserKubeconfig(path, existing)
}

// loadUserKubeconfig reads target (following a symlink, as kubectl does); a missing file is
// an empty kubeconfig. It returns the path to write.
func loadUserKubeconfig(target string) (string, *clientcmdapi.Config, error) {
	path := target
	if resolved, err := filepath.EvalSymlinks(target); err == nil {
		path = resolved
	}
	cfg, err := clientcmd.LoadFromFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return path, clientcmdapi.NewConfig(), nil
	case err != nil:
		return "", nil, fmt.Errorf("reading your kubeconfig %s (left as it is): %w", path, err)
	}
	return path, cfg, nil
}

// writeUserKubeconfig writes cfg to path, 0600 (it holds client keys), atomically.
func writeUserKubeconfig(path string, cfg *clientcmdapi.Config) error {
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		return fmt.Errorf("encoding your kubeconfig: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	if err := fileutil.WriteAtomic(path, data, 0o600); err != nil {
		return fmt.Errorf("writing your kubeconfig %s: %w", path, err)
	}
	return nil
}

// mergeIntoUserKubeconfig is --merge-kubeconfig: merge and say so.
func mergeIntoUserKubeconfig(out io.Writer, workspace, cluster string) error {
	target, err := userKubeconfig()
	if err != nil {
		return err
	}
	name, err := mergeKubeconfig(filepath.Join(workspace, AdminConfFile), cluster, target)
	if err != nil {
		return fmt.Errorf("--merge-kubeconfig: %w", err)
	}
	fmt.Fprintf(out, "merged into %s as context %q (now the current context): kubectl get nodes\n", target, name)
	return nil
}

// forgetInUserKubeconfig removes the workspace's cluster from the user's kubeconfig, if
// --merge-kubeconfig put it there and it still points at this cluster. Failing to is a
// warning: the cluster goes anyway.
func forgetInUserKubeconfig(out io.Writer, workspace string) {
	st, err := state.Load(filepath.Join(workspace, state.FileName))
	if err != nil || st.APIServerEndpoint == "" {
		return
	}
	target, err := userKubeconfig()
	if err != nil {
		return
	}
	removed, err := unmergeKubeconfig(st.Name, "https://"+st.APIServerEndpoint, target)
	switch {
	case err != nil:
		fmt.Fprintf(out, "WARNING: could not remove cluster %s from %s: %v\n", st.Name, target, err)
	case removed:
		fmt.Fprintf(out, "removed context %q from %s\n", st.Name, target)
	}
}
