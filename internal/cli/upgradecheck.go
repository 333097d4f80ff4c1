package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/version"

	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/kube/kubeupgrade"
	"github.com/openconstellation/constellation/internal/release"
	"github.com/openconstellation/constellation/internal/release/releasesource"
	"github.com/openconstellation/constellation/internal/state"
)

func newUpgradeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "upgrade",
		Short: "Find the releases the cluster can move to (the move itself is 'constellation apply')",
	}
	cmd.AddCommand(newUpgradeCheckCmd())
	return cmd
}

func newUpgradeCheckCmd() *cobra.Command {
	var source string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "check",
		Short: "List the releases of a release source and which of them the cluster may move to",
		Long: `List the releases of the release source (--source, or release.source of the configuration):
each is opened as apply opens it (signed by the pinned release.key, every image register
enforced, the cluster's attestation variant, its node image as signed, the version it is
listed as) and checked against what the cluster runs: no older release (apply
--allow-downgrade accepts one), Kubernetes one minor at a time and never back, and its nodes
must trust the cluster's join services (it was made with FROM naming the running release or
image). To move, set provider.<name>.image to the release's directory and kubernetesVersion
to its Kubernetes version, then run 'constellation apply' (docs/upgrades.md).`,
		Args: cobra.NoArgs,
		RunE: inWorkspace(&timeout, func(ctx context.Context, out io.Writer, ws string, _ []string) error {
			return upgradeCheck(ctx, out, ws, source)
		}),
	}
	cmd.Flags().StringVar(&source, "source", "", "release source: a directory of release directories or an HTTP(S) URL serving one (default: release.source of the configuration)")
	cmd.Flags().DurationVar(&timeout, "timeout", time.Minute, "give up after this long")
	return cmd
}

// running is what the cluster runs, as far as the workspace and the cluster say.
type running struct {
	release    string // "" if not a release
	kubernetes string // the oldest kubelet's version, or the configuration's without a cluster
	// cluster is the initialized cluster's state; nil when there is none (no join service
	// runs yet).
	cluster *state.State
}

func upgradeCheck(ctx context.Context, out io.Writer, workspace, source string) error {
	conf, err := config.Load(filepath.Join(workspace, config.FileName))
	if err != nil {
		return err
	}
	if source == "" {
		source = conf.Release.SourcePath(workspace)
	}
	if source == "" {
		return fmt.Errorf("no release source: pass --source or set release.source in %s", config.FileName)
	}
	key, err := pinnedReleaseKey(workspace, conf)
	if err != nil {
		return err
	}
	now, err := runningOf(ctx, workspace, conf)
	if err != nil {
		return err
	}
	policy, images, err := releaseRules(conf, now.release, false)
	if err != nil {
		return err
	}
	lctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	listed, err := releasesource.Client{}.List(lctx, source, key, policy, images.ImageDigest)
	if err != nil {
		return err
	}
	printRunning(out, now)
	if len(listed) == 0 {
		fmt.Fprintf(out, "no releases in %s\n", source)
		return nil
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "RELEASE\tKUBERNETES\tVERDICT\tLOCATION")
	for _, l := range listed {
		switch {
		case l.Err != nil:
			// The name it was listed under: a release is shown by its signed version only
			// once it opened as that version.
			fmt.Fprintf(w, "%s\t-\trefused: %v\t%s\n", path.Base(filepath.ToSlash(l.Dir)), l.Err, l.Dir)
		default:
			m := l.Release.Manifest()
			v := verdict(now, m)
			if now.cluster != nil && strings.HasPrefix(v, "allowed") {
				if err := checkJoinTrust(lctx, workspace, conf, now.cluster, l.Release); err != nil {
					v = "refused: " + err.Error()
				}
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", m.Version, m.KubernetesVersion, v, l.Dir)
		}
	}
	return w.Flush()
}

func printRunning(out io.Writer, now running) {
	rel := "release " + now.release
	if now.release == "" {
		rel = "no release (a development image)"
	}
	fmt.Fprintf(out, "running: %s, Kubernetes %s\n", rel, now.kubernetes)
}

// verdict says whether the cluster may move to the release m.
func verdict(now running, m release.Manifest) string {
	if err := kubernetesSkew(now.kubernetes, m.KubernetesVersion); err != nil {
		return "refused: " + err.Error()
	}
	switch {
	case m.Version == now.release:
		return "running"
	case now.kubernetes != m.KubernetesVersion:
		return fmt.Sprintf("allowed: upgrade with Kubernetes %s -> %s", now.kubernetes, m.KubernetesVersion)
	default:
		return "allowed: upgrade"
	}
}

// kubernetesSkew checks Kubernetes' version-skew rule for a move to the release's version.
func kubernetesSkew(current, target string) error {
	if err := kubeupgrade.Skew(current, target); err != nil {
		return fmt.Errorf("the release's Kubernetes %w", err)
	}
	return nil
}

// runningOf reads what the workspace's cluster runs: its release (state file) and the oldest
// kubelet's Kubernetes version; without a cluster, the configuration's version.
func runningOf(ctx context.Context, workspace string, conf *config.Config) (running, error) {
	st, err := state.Load(filepath.Join(workspace, state.FileName))
	if errors.Is(err, os.ErrNotExist) {
		return running{kubernetes: conf.KubernetesVersion}, nil
	}
	if err != nil {
		return running{}, err
	}
	now := running{release: st.Release, kubernetes: conf.KubernetesVersion}
	if st.Phase != state.Initialized {
		return now, nil
	}
	now.cluster = st
	client, err := newKubeClient(filepath.Join(workspace, AdminConfFile))
	if err != nil {
		return running{}, err
	}
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	nodes, err := client.CoreV1().Nodes().List(lctx, metav1.ListOptions{})
	if err != nil {
		return running{}, fmt.Errorf("reading the nodes' Kubernetes versions: %w", err)
	}
	var oldest *version.Version
	for _, n := range nodes.Items {
		v, err := version.ParseSemantic(n.Status.NodeInfo.KubeletVersion)
		if err == nil && (oldest == nil || v.LessThan(oldest)) {
			oldest = v
		}
	}
	if oldest != nil {
		now.kubernetes = "v" + oldest.String()
	}
	return now, nil
}
