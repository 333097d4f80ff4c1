package cli

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/crypto/bcrypt"

	"github.com/openconstellation/constellation/internal/attestation/akca"
	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/fileutil"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/nodeimage"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/provider/local"
	"github.com/openconstellation/constellation/internal/provider/local/cluster"
	"github.com/openconstellation/constellation/internal/provider/local/sandbox"
	"github.com/openconstellation/constellation/internal/state"
)

// Files of the local provider in miniDir that create writes and init reads.
const (
	akCAKeyFile    = "ak-ca-key.pem"
	initSecretFile = "init-secret"
)

// createOptions are what creating nodes needs beyond the configuration.
type createOptions struct {
	// imagesDir holds the container images every node imports (make images).
	imagesDir string
	// extraWorkerBootstrapper adds a worker "worker-other" whose image has this bootstrapper
	// (tests: a node the join service must reject); kubeBin provides its kubelet and kubeadm.
	extraWorkerBootstrapper, kubeBin string
	// drainTimeout bounds the drain of each node apply removes.
	drainTimeout time.Duration
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
    after attestation; a new control plane grows etcd. Removed nodes (the newest of their
    role first) are drained, respecting PodDisruptionBudgets within --drain-timeout; a
    control plane's etcd member is removed first, and only if etcd keeps its quorum; then the
    node is deleted from Kubernetes and the platform, and its name and disk are refused from
    then on.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ws, err := absWorkspace(cmd)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			out := newSyncWriter(cmd.OutOrStdout())
			return apply(ctx, out, newPhaseTimer(out), ws, o)
		},
	}
	addImagesFlag(cmd, &o.imagesDir)
	cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Minute, "give up after this long")
	cmd.Flags().DurationVar(&o.drainTimeout, "drain-timeout", 2*time.Minute, "how long the drain of a removed node may wait for its pods to be evicted (PodDisruptionBudgets)")
	return cmd
}

func newTerminateCmd() *cobra.Command {
	var yes bool
	cmd := &cobra.Command{
		Use:   "terminate",
		Short: "Remove the cluster's nodes and the files that belong to them",
		Long: `Remove every node of the workspace's cluster, and constellation-state.yaml,
constellation-admin.conf and constellation-mastersecret.json: with the nodes and their
encrypted state gone, they protect nothing. constellation-conf.yaml stays.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ws, err := absWorkspace(cmd)
			if err != nil {
				return err
			}
			if !yes {
				return errors.New("terminate deletes the cluster, its state and its master secret: confirm with --yes")
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
		return reconcile(ctx, out, t, workspace, conf, st, scaleOptions{drainTimeout: o.drainTimeout})
	}
	return initAndWait(ctx, out, t, workspace, conf, st)
}

// createCluster creates the nodes conf describes with the local provider and records them
// in a new state file (phase created).
func createCluster(ctx context.Context, out io.Writer, t *phaseTimer, workspace string, conf *config.Config, o createOptions) (*state.State, error) {
	statePath := filepath.Join(workspace, state.FileName)
	if _, err := os.Stat(statePath); err == nil {
		return nil, fmt.Errorf("%s exists: the workspace already has a cluster (remove it with 'constellation terminate')", statePath)
	}
	lc := conf.Provider.Local
	if lc == nil {
		return nil, fmt.Errorf("%s: provider.local: the only provider is local", config.FileName)
	}
	if v := conf.Attestation.Variant(); v != local.Variant {
		return nil, fmt.Errorf("%s: attestation: the local provider's nodes attest with %s (attestation.%s)", config.FileName, local.Variant, config.FieldName(local.Variant))
	}
	// The sandbox network assigns fixed ranges (docs/local-provider.md).
	if conf.Network.PodCIDR != sandbox.PodCIDR.String() || conf.Network.ServiceCIDR != sandbox.ServiceCIDR.String() {
		return nil, fmt.Errorf("%s: network: the local provider uses podCIDR %s and serviceCIDR %s (got %s and %s)",
			config.FileName, sandbox.PodCIDR, sandbox.ServiceCIDR, conf.Network.PodCIDR, conf.Network.ServiceCIDR)
	}
	dir := filepath.Join(workspace, miniDir)
	if _, err := cluster.ReadSpec(dir); err == nil {
		return nil, fmt.Errorf("%s has a local cluster: remove it with 'constellation terminate' or 'constellation mini down'", dir)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	imageDir := lc.Image
	if !filepath.IsAbs(imageDir) {
		imageDir = filepath.Join(workspace, imageDir)
	}
	index, err := nodeimage.ReadIndex(o.imagesDir)
	if err != nil {
		return nil, fmt.Errorf("reading the node's container images (run 'make images' first): %w", err)
	}

	ca, err := akca.New("constellation local AK CA", time.Now(), 365*24*time.Hour)
	if err != nil {
		return nil, err
	}
	caCert, caKey, err := ca.PEM()
	if err != nil {
		return nil, err
	}
	caPath, caKeyPath := filepath.Join(dir, akCAFile), filepath.Join(dir, akCAKeyFile)
	// Key material goes through fileutil: a 0600 temporary file created exclusively, so a
	// leftover or planted file at any name neither redirects the key nor lends it its mode.
	if err := fileutil.WriteAtomic(caPath, caCert, 0o644); err != nil {
		return nil, err
	}
	if err := fileutil.WriteAtomic(caKeyPath, caKey, 0o600); err != nil {
		return nil, err
	}
	// The init secret gates who may initialize: the provider publishes only its hash.
	initSecret := make([]byte, 32)
	if _, err := rand.Read(initSecret); err != nil {
		return nil, err
	}
	if err := fileutil.WriteAtomic(filepath.Join(dir, initSecretFile), initSecret, 0o600); err != nil {
		return nil, err
	}
	hash, err := bcrypt.GenerateFromPassword(initSecret, bcrypt.DefaultCost)
	if err != nil {
		return nil, err
	}

	spec := cluster.Spec{Dir: dir, Images: index.Files(o.imagesDir), InitSecretHash: string(hash), AKCACert: caPath, AKCAKey: caKeyPath}
	for i := 0; i < lc.ControlPlanes; i++ {
		spec.Nodes = append(spec.Nodes, cluster.NodeSpec{NodeSpec: provider.NodeSpec{Name: fmt.Sprintf("control-plane-%d", i), Role: metadata.ControlPlane, Image: imageDir}})
	}
	for i := 0; i < lc.Workers; i++ {
		spec.Nodes = append(spec.Nodes, cluster.NodeSpec{NodeSpec: provider.NodeSpec{Name: fmt.Sprintf("worker-%d", i), Role: metadata.Worker, Image: imageDir}})
	}
	if o.extraWorkerBootstrapper != "" {
		data, err := os.ReadFile(filepath.Join(imageDir, local.NodeConfigFile))
		if err != nil {
			return nil, err
		}
		nodeConfig, err := local.ParseNodeConfig(data)
		if err != nil {
			return nil, err
		}
		other := filepath.Join(dir, "image-other")
		if err := buildNodeImage(other, o.extraWorkerBootstrapper, o.kubeBin, nodeConfig); err != nil {
			return nil, err
		}
		spec.Nodes = append(spec.Nodes, cluster.NodeSpec{NodeSpec: provider.NodeSpec{Name: "worker-other", Role: metadata.Worker, Image: other, Unexpected: true}})
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	platform, err := cluster.Launch(ctx, exe, spec)
	if err != nil {
		return nil, err
	}
	nodes, err := platform.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	endpoints, err := platform.Endpoints(ctx)
	if err != nil {
		return nil, err
	}
	st := &state.State{
		Version: state.Version1, Name: conf.Name, Provider: state.ProviderLocal, Phase: state.Created,
		CreatedAt: time.Now().UTC(), APIServerEndpoint: endpoints.APIServer,
	}
	recordNodes(st, nodes)
	st.InitEndpoint = nodeEndpoint(st.Nodes[0], provider.InitPort)
	if err := state.Write(statePath, st); err != nil {
		return nil, err
	}
	t.phase("create", fmt.Sprintf("%d nodes booting", len(spec.Nodes)))
	return st, nil
}

// terminate removes the cluster through its platform (every node, disk, process and network
// of it), then the files of the cluster; generatedConfigToo also removes a configuration mini
// up generated (mini down).
func terminate(ctx context.Context, out io.Writer, workspace string, generatedConfigToo bool) error {
	dir := filepath.Join(workspace, miniDir)
	_, statErr := os.Stat(dir)
	_, stateErr := os.Stat(filepath.Join(workspace, state.FileName))
	if errors.Is(statErr, os.ErrNotExist) && errors.Is(stateErr, os.ErrNotExist) {
		fmt.Fprintln(out, "no cluster in", workspace)
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	// A state file may be missing (create failed half-way) or unreadable: the local
	// provider's folder alone says what to remove.
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	var platform provider.Provider = &cluster.Local{Dir: dir, Exe: exe}
	nodes := 0
	if spec, err := cluster.ReadSpec(dir); err == nil {
		nodes = len(spec.Nodes)
	}
	if err := platform.Destroy(ctx); err != nil {
		return fmt.Errorf("removing the cluster: %w", err)
	}
	// The cluster's files go with it: its state and keys protect nothing any more. A
	// configuration mini up generated goes too (mini down); one the user wrote stays.
	files := []string{AdminConfFile, MasterSecretFile, state.FileName}
	if _, err := os.Stat(filepath.Join(dir, generatedConfigMarker)); err == nil && generatedConfigToo {
		files = append(files, config.FileName)
	}
	for _, f := range files {
		if err := os.Remove(filepath.Join(workspace, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	fmt.Fprintf(out, "removed the cluster (%d nodes) and its files from %s\n", nodes, workspace)
	return nil
}
