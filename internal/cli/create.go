package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/provider/catalog"
	"github.com/openconstellation/constellation/internal/state"
)

// createOptions are what creating nodes needs beyond the configuration.
type createOptions struct {
	// imagesDir holds the container images every node imports (make images).
	imagesDir string
	// extraWorkerBootstrapper adds a worker "worker-other" whose image has this bootstrapper
	// (tests: a node the join service must reject); kubeDir (<kubeDir>/<version>/bin) provides
	// its kubelet and kubeadm.
	extraWorkerBootstrapper, kubeDir string
	// drainTimeout bounds the drain of each node apply removes.
	drainTimeout time.Duration
	// allowDowngrade lets apply move the cluster to an older release.
	allowDowngrade bool
	// mergeKubeconfig adds the cluster to the user's kubeconfig once apply succeeded.
	mergeKubeconfig bool
	// image is the node image the nodes boot, resolved from the configuration
	// (configuredImage); empty: the configured image itself.
	image string
	// remove names the nodes apply removes first when it scales down (apply --remove).
	remove []string
	// deleteNodeLocalVolumes accepts destroying the node-local volumes of the nodes apply
	// removes or replaces (apply --delete-node-local-volumes).
	deleteNodeLocalVolumes bool
}

// addKubeDirFlag adds --kube-dir: the directory of the Kubernetes binaries, <version>/bin per
// version (make kube).
func addKubeDirFlag(cmd *cobra.Command, dir *string) {
	exe, _ := os.Executable()
	out := filepath.Dir(filepath.Dir(exe))
	cmd.Flags().StringVar(dir, "kube-dir", filepath.Join(out, "kube"), "directory of the Kubernetes binaries, <version>/bin per Kubernetes version (make kube)")
}

func addImagesFlag(cmd *cobra.Command, dir *string) {
	exe, _ := os.Executable()
	out := filepath.Dir(filepath.Dir(exe))
	cmd.Flags().StringVar(dir, "images", filepath.Join(out, "images"), "directory of the node's container images (make images)")
}

func newCreateCmd() *cobra.Command {
	var o createOptions
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Create the configured nodes (not yet initialized)",
		Long: `Create the nodes constellation-conf.yaml describes and record them in
constellation-state.yaml (phase created). With the local provider every node is a sandbox
with its own swtpm, booting the configured node image, measured by the provider. Initialize
the cluster with 'constellation apply'.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ws, err := absWorkspace(cmd)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			conf, err := config.Load(filepath.Join(ws, config.FileName))
			if err != nil {
				return err
			}
			if _, err := createCluster(ctx, cmd.OutOrStdout(), newPhaseTimer(cmd.OutOrStdout()), ws, conf, o); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Nodes created. Initialize the cluster with: constellation apply -C %s\n", ws)
			return nil
		},
	}
	addImagesFlag(cmd, &o.imagesDir)
	cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Minute, "give up after this long")
	return cmd
}

func newApplyCmd() *cobra.Command {
	var o createOptions
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "apply",
		Short: "Create the nodes if needed, then initialize the cluster over attested TLS",
		Long: `Bring the workspace's cluster to what constellation-conf.yaml describes:

  - no constellation-state.yaml: create the nodes (as 'constellation create');
  - nodes created: initialize the first control plane over attested TLS. It must prove, by
    its TPM quote, that it boots the configured image before it gets the master secret.
    Progress lines of the node stream to the terminal. Writes constellation-mastersecret.json
    (before the secret leaves this machine), constellation-admin.conf and the cluster ID into
    constellation-state.yaml, then waits until every node is Ready and verifiable;
  - initialized: bring the node counts to the configuration's. apply says what it changes
    first. New nodes (names never used before in the cluster) join through the join service
    after attestation; a new control plane grows etcd. Removed nodes (those named with
    --remove first, then the newest of their role; any control plane may go) are drained,
    respecting PodDisruptionBudgets within --drain-timeout; a control plane is taken out of
    the API load balancer and its etcd member removed, only if etcd keeps its quorum; then
    the node is deleted from Kubernetes and the platform, and its name and disk are refused
    from then on.

Before it removes or replaces a node (scale-down, --remove, an upgrade's roll), apply names
every node-local volume on it (local-path volumes: directories on the node's disk, destroyed
with it) and refuses, changing nothing, unless --delete-node-local-volumes accepts their loss.
When the Kubernetes API cannot say which volumes the nodes hold, it refuses too, unless the
flag is given.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ws, err := absWorkspace(cmd)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), pacedTimeout(cmd, ws, timeout))
			defer cancel()
			out := newSyncWriter(cmd.OutOrStdout())
			return apply(ctx, out, newPhaseTimer(out), ws, o)
		},
	}
	addImagesFlag(cmd, &o.imagesDir)
	cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Minute, "give up after this long")
	cmd.Flags().DurationVar(&o.drainTimeout, "drain-timeout", 2*time.Minute, "how long the drain of a removed node may wait for its pods to be evicted (PodDisruptionBudgets)")
	cmd.Flags().BoolVar(&o.allowDowngrade, "allow-downgrade", false, "accept a release older than the one the cluster runs")
	cmd.Flags().BoolVar(&o.mergeKubeconfig, "merge-kubeconfig", false, "add the cluster to your kubeconfig ($KUBECONFIG's first file, else ~/.kube/config) as a context named after it, and make it current")
	cmd.Flags().BoolVar(&o.deleteNodeLocalVolumes, strings.TrimPrefix(deleteNodeLocalVolumesFlag, "--"), false, "accept destroying the node-local volumes (local-path) of the nodes apply removes or replaces; without it apply refuses to remove such a node")
	cmd.Flags().StringSliceVar(&o.remove, "remove", nil, "when the configuration has fewer nodes of a role than the cluster, remove these nodes first (then the newest); e.g. --remove control-plane-0")
	return cmd
}

func newTerminateCmd() *cobra.Command {
	var yes bool
	cmd := &cobra.Command{
		Use:   "terminate",
		Short: "Remove the cluster's nodes and the files that belong to them",
		Long: `Remove every node of the workspace's cluster, and constellation-state.yaml,
constellation-admin.conf and constellation-mastersecret.json: with the nodes and their
encrypted state gone, they protect nothing. constellation-conf.yaml stays.

Every volume of the cluster goes with it: the node-local ones (local-path) with their nodes,
and the movable ones, which the local provider keeps in the cluster's folder. Without --yes,
terminate names them and refuses; with --yes it names them before it removes anything.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ws, err := absWorkspace(cmd)
			if err != nil {
				return err
			}
			if !yes {
				return terminateRefusal(cmd.Context(), ws)
			}
			return terminate(cmd.Context(), cmd.OutOrStdout(), ws, false)
		},
	}
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation")
	return cmd
}

func absWorkspace(cmd *cobra.Command) (string, error) {
	ws, err := cmd.Flags().GetString("workspace")
	if err != nil {
		return "", err
	}
	return filepath.Abs(ws)
}

// apply creates the nodes if the workspace has none, then initializes the cluster.
func apply(ctx context.Context, out io.Writer, t *phaseTimer, workspace string, o createOptions) error {
	conf, err := config.Load(filepath.Join(workspace, config.FileName))
	if err != nil {
		return err
	}
	st, err := state.Load(filepath.Join(workspace, state.FileName))
	switch {
	case errors.Is(err, os.ErrNotExist):
		if st, err = createCluster(ctx, out, t, workspace, conf, o); err != nil {
			return err
		}
	case err != nil:
		return err
	}
	if st.Name != conf.Name {
		return fmt.Errorf("%s names cluster %q, but %s describes %q: they are not the same cluster", state.FileName, st.Name, config.FileName, conf.Name)
	}
	if st.Phase == state.Initialized {
		err = reconcile(ctx, out, t, workspace, conf, st, scaleOptions{drainTimeout: o.drainTimeout, allowDowngrade: o.allowDowngrade, remove: o.remove, deleteNodeLocalVolumes: o.deleteNodeLocalVolumes})
	} else {
		err = initAndWait(ctx, out, t, workspace, conf, st)
	}
	if err != nil || !o.mergeKubeconfig {
		return err
	}
	return mergeIntoUserKubeconfig(out, workspace, st.Name)
}

// createCluster creates the nodes conf describes with its provider and records them in a new
// state file (phase created).
func createCluster(ctx context.Context, out io.Writer, t *phaseTimer, workspace string, conf *config.Config, o createOptions) (*state.State, error) {
	statePath := filepath.Join(workspace, state.FileName)
	if _, err := os.Stat(statePath); err == nil {
		return nil, fmt.Errorf("%s exists: the workspace already has a cluster (remove it with 'constellation terminate')", statePath)
	}
	platform, err := catalog.Lookup(conf.Provider.Name())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", config.FileName, err)
	}
	image, rel, err := configuredImage(ctx, workspace, conf, "", o.allowDowngrade)
	if err != nil {
		return nil, err
	}
	o.image = image
	st, err := createOn(ctx, t, statePath, platform, workspace, conf, o)
	if err != nil || rel == nil {
		return st, err
	}
	st.Release = rel.Version()
	return st, state.Write(statePath, st)
}

// createOn creates the cluster with platform and records it in the state file at statePath.
func createOn(ctx context.Context, t *phaseTimer, statePath string, platform provider.Platform, workspace string, conf *config.Config, o createOptions) (*state.State, error) {
	running, err := platform.Create(ctx, createRequest(workspace, conf, o))
	if err != nil {
		return nil, err
	}
	st, err := recordCreated(ctx, statePath, conf, platform.Name(), running)
	if err != nil {
		return nil, err
	}
	t.phase("create", fmt.Sprintf("%d nodes booting", len(st.Nodes)))
	return st, nil
}

// createRequest is what the provider creates for conf: its control planes and workers, named
// by role and index, each booting the configured image.
func createRequest(workspace string, conf *config.Config, o createOptions) provider.CreateRequest {
	req := provider.CreateRequest{
		Workspace: workspace, Config: conf, ImagesDir: o.imagesDir,
		UnexpectedWorkerBootstrapper: o.extraWorkerBootstrapper, KubeDir: o.kubeDir,
	}
	lc := conf.Provider.Block()
	imageDir := o.image
	if imageDir == "" {
		imageDir = lc.ImagePath(workspace)
	}
	for i := 0; i < lc.ControlPlanes; i++ {
		req.Nodes = append(req.Nodes, provider.NodeSpec{Name: fmt.Sprintf("control-plane-%d", i), Role: metadata.ControlPlane, Image: imageDir})
	}
	for i := 0; i < lc.Workers; i++ {
		req.Nodes = append(req.Nodes, provider.NodeSpec{Name: fmt.Sprintf("worker-%d", i), Role: metadata.Worker, Image: imageDir})
	}
	return req
}

// recordCreated writes the state file of a cluster its provider just created: its nodes and
// endpoints as the platform lists them, phase created.
func recordCreated(ctx context.Context, statePath string, conf *config.Config, providerName string, platform provider.Provider) (*state.State, error) {
	nodes, err := platform.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	endpoints, err := platform.Endpoints(ctx)
	if err != nil {
		return nil, err
	}
	st := &state.State{
		Version: state.Version1, Name: conf.Name, Provider: providerName, Phase: state.Created,
		CreatedAt: time.Now().UTC(), APIServerEndpoint: endpoints.APIServer,
	}
	recordNodes(st, nodes)
	st.InitEndpoint = nodeEndpoint(st.Nodes[0], provider.InitPort)
	if err := state.Write(statePath, st); err != nil {
		return nil, err
	}
	return st, nil
}

// terminate removes the cluster through its platform (every node, disk, process and network
// of it), then the files of the cluster; generatedConfigToo also removes a configuration mini
// up generated (mini down).
func terminate(ctx context.Context, out io.Writer, workspace string, generatedConfigToo bool) error {
	platforms := platformsIn(workspace)
	if _, err := os.Stat(filepath.Join(workspace, state.FileName)); errors.Is(err, os.ErrNotExist) && len(platforms) == 0 {
		fmt.Fprintln(out, "no cluster in", workspace)
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	announceLostVolumes(ctx, out, workspace)
	forgetInUserKubeconfig(out, workspace)
	// The cluster's files go with it: its state and keys protect nothing any more. A
	// configuration mini up generated goes too (mini down); one the user wrote stays.
	files := []string{AdminConfFile, MasterSecretFile, state.FileName}
	nodes := 0
	for _, p := range platforms {
		if _, err := os.Stat(filepath.Join(p.Folder(workspace), generatedConfigMarker)); err == nil && generatedConfigToo {
			files = append(files, config.FileName)
		}
		n, err := p.Remove(ctx, workspace)
		if err != nil {
			return err
		}
		nodes += n
	}
	for _, f := range files {
		if err := os.Remove(filepath.Join(workspace, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	fmt.Fprintf(out, "removed the cluster (%d nodes) and its files from %s\n", nodes, workspace)
	return nil
}

// platformsIn returns the providers that may hold a cluster of workspace: the state file's,
// and every provider whose folder exists there (a state file may be missing, create failed
// half-way, or unreadable: the provider's folder alone says what to remove).
func platformsIn(workspace string) []provider.Platform {
	var out []provider.Platform
	named := ""
	if st, err := state.Load(filepath.Join(workspace, state.FileName)); err == nil {
		if p, err := catalog.Lookup(st.Provider); err == nil {
			out, named = append(out, p), p.Name()
		}
	}
	for _, p := range catalog.All() {
		if p.Name() == named {
			continue
		}
		if folder := p.Folder(workspace); folder != "" {
			if _, err := os.Stat(folder); err == nil {
				out = append(out, p)
			}
		}
	}
	return out
}
