package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/provider/catalog"
	"github.com/openconstellation/constellation/internal/state"
)

func newMiniCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "mini",
		Short: "Run a local confidential cluster on this machine",
	}
	cmd.AddCommand(newMiniUpCmd(), newMiniDownCmd(), newMiniProviderCmd(), newMiniPowerCutCmd())
	return cmd
}

// miniOptions are the flags of mini up.
type miniOptions struct {
	controlPlanes, workers int
	kubernetesVersion      string
	kubeDir, imagesDir     string
	// extraWorkerImage adds a worker booting another image (tests: a modified bootstrapper).
	extraWorkerBootstrapper string
	timeout                 time.Duration
	mergeKubeconfig         bool
}

func newMiniUpCmd() *cobra.Command {
	var o miniOptions
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Create a local confidential cluster and initialize it",
		Long: `Create a local cluster: every node is a sandbox (network, mount and UTS namespaces)
with its own swtpm vTPM, booting a node image the provider measures into the vTPM. The CLI
initializes the first control plane over attested TLS; every other node joins after the join
service verified its attestation. Files go to <workspace>/mini; remove with 'mini down'.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ws, _ := cmd.Flags().GetString("workspace")
			ctx, cancel := context.WithTimeout(cmd.Context(), o.timeout)
			defer cancel()
			return miniUp(ctx, newSyncWriter(cmd.OutOrStdout()), ws, o)
		},
	}
	exe, _ := os.Executable()
	out := filepath.Dir(filepath.Dir(exe))
	cmd.Flags().IntVar(&o.controlPlanes, "control-planes", 1, "number of control-plane nodes")
	cmd.Flags().IntVar(&o.workers, "workers", 2, "number of worker nodes")
	cmd.Flags().StringVar(&o.kubernetesVersion, "kubernetes-version", config.DefaultKubernetesVersion, "Kubernetes version of a generated configuration ("+strings.Join(config.SupportedKubernetesVersions, ", ")+"); the workspace's configuration names its own")
	addKubeDirFlag(cmd, &o.kubeDir)
	cmd.Flags().StringVar(&o.imagesDir, "images", filepath.Join(out, "images"), "directory of the node's container images (make images)")
	cmd.Flags().StringVar(&o.extraWorkerBootstrapper, "extra-worker-bootstrapper", "", "add a worker whose image has this bootstrapper binary (tests)")
	cmd.Flags().DurationVar(&o.timeout, "timeout", 10*time.Minute, "give up after this long")
	cmd.Flags().BoolVar(&o.mergeKubeconfig, "merge-kubeconfig", false, "add the cluster to your kubeconfig ($KUBECONFIG's first file, else ~/.kube/config) as a context named after it, and make it current")
	_ = cmd.Flags().MarkHidden("extra-worker-bootstrapper")
	return cmd
}

func newMiniDownCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "down",
		Short: "Remove the local cluster and everything mini up created",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ws, _ := cmd.Flags().GetString("workspace")
			return miniDown(cmd.Context(), cmd.OutOrStdout(), ws)
		},
	}
}

func newMiniProviderCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "provider SPEC",
		Short:  "Run the local provider of a cluster (started by mini up)",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			daemon, ok := localPlatform().(provider.Daemon)
			if !ok {
				return errors.New("the local provider runs no process of its own")
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			return daemon.Serve(ctx, args)
		},
	}
}

func newMiniPowerCutCmd() *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "power-cut [NODE]",
		Short: "Cut the power of a node, or of the whole local cluster and its provider",
		Long: `Cut the power of a node of the local cluster: its processes and its vTPM are killed at
one instant (no orderly TPM shutdown, nothing in memory survives), then it boots again, as a
machine that powers on when power returns. Without NODE, cut the power of the whole cluster
and of its provider, as a crash of the host does; turn it on again with 'constellation start'
and give the control planes their keys with 'constellation recover'. For testing what a
power loss does to a cluster.`,
		Hidden: true,
		Args:   cobra.MaximumNArgs(1),
		RunE: inWorkspace(&timeout, func(ctx context.Context, out io.Writer, ws string, args []string) error {
			_, platform, err := loadState(ws)
			if err != nil {
				return err
			}
			cutter, ok := platform.(provider.PowerCutter)
			if !ok {
				return errors.New("power-cut works on local clusters only")
			}
			if len(args) == 1 {
				if err := cutter.PowerCutNode(ctx, args[0]); err != nil {
					return err
				}
				fmt.Fprintf(out, "cut the power of %s; it booted again\n", args[0])
				return nil
			}
			if err := cutter.PowerCut(ctx); err != nil {
				return err
			}
			fmt.Fprintf(out, "cut the power of every node and of the provider. Turn the cluster on with: %s start -C %s\n", toolPath("constellation"), ws)
			return nil
		}),
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 3*time.Minute, "give up after this long")
	return cmd
}

// generatedConfigMarker in the local provider's folder (which mini up owns entirely) records
// that mini up wrote the workspace's configuration.
const generatedConfigMarker = "generated-config"

// localPlatform is the provider mini runs: the local one, always in the catalog.
func localPlatform() provider.Platform {
	p, err := catalog.Lookup(state.ProviderLocal)
	if err != nil {
		panic(err) // a built-in of internal/provider/catalog
	}
	return p
}

func miniUp(ctx context.Context, out io.Writer, workspace string, o miniOptions) (retErr error) {
	if o.controlPlanes < 1 || o.workers < 0 || o.controlPlanes+o.workers > 50 {
		return fmt.Errorf("--control-planes must be at least 1 and --workers at least 0, at most 50 nodes in all (got %d and %d)", o.controlPlanes, o.workers)
	}
	workspace, err := filepath.Abs(workspace)
	if err != nil {
		return err
	}
	dir := localPlatform().Folder(workspace)
	if _, err := os.Stat(dir); err == nil {
		return fmt.Errorf("%s exists: a local cluster is already up; run 'constellation mini down' first", dir)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	defer func() {
		if retErr != nil {
			fmt.Fprintf(out, "\nmini up failed; the cluster is left as it is for inspection (logs: %s).\nRemove it with 'constellation mini down'.\n", filepath.Join(dir, "nodes"))
		}
	}()
	t := newPhaseTimer(out)

	// The node image: what the provider boots and measures, and what the reference values
	// are computed from, offline, before any node exists.
	imageDir := filepath.Join(dir, "image")
	// Its Kubernetes version is the workspace configuration's, if there is one.
	confPath := filepath.Join(workspace, config.FileName)
	_, err = os.Stat(confPath)
	generate := errors.Is(err, os.ErrNotExist)
	version := o.kubernetesVersion
	if !generate {
		conf, err := config.Load(confPath)
		if err != nil {
			return err
		}
		version = conf.KubernetesVersion
	}
	if err := layOutDefaultImage(imageDir, version, o.kubeDir, o.imagesDir); err != nil {
		return err
	}
	// The configuration: the user's if the workspace has one, else generated from the image
	// (and then removed again by mini down). Its reference values are what init checks.
	if generate {
		if err := generateLocal(out, workspace, generateLocalOptions{name: "constellation-mini", image: imageDir, controlPlanes: o.controlPlanes, workers: o.workers, kubernetesVersion: version}); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, generatedConfigMarker), nil, 0o644); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(out, "using the workspace's %s (its node counts and image; --control-planes and --workers apply to a generated one)\n", config.FileName)
	}
	return apply(ctx, out, t, workspace, createOptions{imagesDir: o.imagesDir, extraWorkerBootstrapper: o.extraWorkerBootstrapper, kubeDir: o.kubeDir, mergeKubeconfig: o.mergeKubeconfig})
}

// layOutDefaultImage lays out the local provider's default node image of a Kubernetes version
// in dir (provider.NodeImages).
func layOutDefaultImage(dir, kubernetesVersion, kubeDir, imagesDir string) error {
	images, ok := localPlatform().(provider.NodeImages)
	if !ok {
		return errors.New("the local provider lays out no node image")
	}
	return images.LayOutDefaultImage(dir, kubernetesVersion, kubeDir, imagesDir)
}

func miniDown(ctx context.Context, out io.Writer, workspace string) error {
	workspace, err := filepath.Abs(workspace)
	if err != nil {
		return err
	}
	return terminate(ctx, out, workspace, true)
}

// phaseTimer prints phases with their wall time (the mini up benchmark reads them). It is safe
// for concurrent use: a command's progress reporter prints through it while the command runs.
type phaseTimer struct {
	out   io.Writer
	start time.Time
	mu    sync.Mutex
	last  time.Time
}

func newPhaseTimer(out io.Writer) *phaseTimer {
	now := time.Now()
	return &phaseTimer{out: out, start: now, last: now}
}

func (p *phaseTimer) phase(name, detail string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	fmt.Fprintf(p.out, "[%6.1fs] %-10s %s (%.1fs)\n", now.Sub(p.start).Seconds(), name, detail, now.Sub(p.last).Seconds())
	p.last = now
}

// note prints a line in the phase format that is not a phase: the time since the last phase
// keeps counting.
func (p *phaseTimer) note(now time.Time, name, detail string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.out, "[%6.1fs] %-10s %s\n", now.Sub(p.start).Seconds(), name, detail)
}
