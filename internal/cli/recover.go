package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/kms"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/recovery"
	"github.com/openconstellation/constellation/internal/state"
)

func newRecoverCmd() *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "recover",
		Short: "Give rebooted control planes their keys after a full shutdown",
		Long: `After every control plane rebooted at once (a full shutdown, 'constellation stop' and
'start', or the only control plane rebooted) no join service runs, so no node can get its
key. recover gives each control plane that waits for recovery exactly the keys it needs:
its own state-disk key and the measurement secret, derived here from
constellation-mastersecret.json. The master secret itself never leaves this machine.

Each key goes over the attested channel, only after the node's evidence checked out against
constellation-conf.yaml: the configured image, an AK the platform certified for that very
node as a control plane, and PCR 15 zero (the node waits). recover repeats until every
control plane is back (etcd has its quorum again), then waits until every node is Ready: the
workers rejoin by themselves once the join service runs again.`,
		Args: cobra.NoArgs,
		RunE: inWorkspace(&timeout, func(ctx context.Context, out io.Writer, ws string, _ []string) error {
			return recoverCluster(ctx, out, ws)
		}),
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Minute, "give up after this long")
	return cmd
}

func recoverCluster(ctx context.Context, out io.Writer, workspace string) error {
	st, platform, err := loadState(workspace)
	if err != nil {
		return err
	}
	if st.Phase != state.Initialized {
		return fmt.Errorf("%s: the cluster is %s, not initialized: there is nothing to recover", state.FileName, st.Phase)
	}
	conf, err := config.Load(filepath.Join(workspace, config.FileName))
	if err != nil {
		return err
	}
	master, err := kms.ReadMasterSecretFile(filepath.Join(workspace, MasterSecretFile))
	if err != nil {
		return fmt.Errorf("the master secret (recovery needs it): %w", err)
	}
	_, validator, err := clusterAttestation(ctx, platform, conf)
	if err != nil {
		return err
	}
	t := newPhaseTimer(out)
	start := time.Now()
	var controlPlanes []state.Node
	for _, n := range st.Nodes {
		if n.Role == metadata.ControlPlane {
			controlPlanes = append(controlPlanes, n)
		}
	}
	// A control plane is done when it is back in its cluster: recovered here, or rejoined by
	// itself (another control plane's join service came back first).
	done := map[string]bool{}
	last := map[string]string{}
	for len(done) < len(controlPlanes) {
		reported := map[string]string{}
		if nodes, err := platform.Nodes(ctx); err == nil {
			for _, n := range nodes {
				reported[n.Name] = n.Reported
				if n.State == provider.Stopped {
					return fmt.Errorf("%s is stopped: start the cluster first ('constellation start')", n.Name)
				}
			}
		}
		for _, n := range controlPlanes {
			if done[n.Name] {
				continue
			}
			if metadata.InCluster(reported[n.Name]) {
				done[n.Name] = true
				t.phase("back", fmt.Sprintf("%s is back in its cluster (%s)", n.Name, reported[n.Name]))
				continue
			}
			if reported[n.Name] != metadata.PhaseWaitingForRecovery {
				last[n.Name] = "booting: " + reported[n.Name]
				continue
			}
			_, err := recovery.Recover(ctx, recovery.Config{
				Endpoint: nodeEndpoint(n, provider.RecoverPort), Dial: platform.Dialer(), Validator: validator,
				ExpectedNode: n.Name, MasterSecret: master, MeasurementSalt: st.MeasurementSalt, ClusterID: st.ClusterID,
			})
			switch {
			case err == nil:
				done[n.Name] = true
				t.phase("recovered", n.Name+" got its keys over attested TLS and re-entered the cluster")
			case recovery.Retryable(err), errors.Is(err, recovery.ErrNotWaiting):
				// Not up yet, busy, or back already (the platform's report tells next round).
				last[n.Name] = err.Error()
			default:
				// Security failures are final: nothing was sent, and retrying would not change it.
				return fmt.Errorf("recovering %s: %w", n.Name, err)
			}
		}
		if len(done) == len(controlPlanes) {
			break
		}
		select {
		case <-ctx.Done():
			var waiting []string
			for _, n := range controlPlanes {
				if !done[n.Name] {
					waiting = append(waiting, fmt.Sprintf("%s (%s)", n.Name, last[n.Name]))
				}
			}
			return fmt.Errorf("control planes not recovered: %s: %w", strings.Join(waiting, "; "), ctx.Err())
		case <-time.After(time.Second):
		}
	}
	if err := refreshEndpoints(ctx, workspace, st, platform); err != nil {
		return err
	}
	client, err := newKubeClient(filepath.Join(workspace, AdminConfFile))
	if err != nil {
		return err
	}
	var names []string
	for _, n := range st.Nodes {
		if !n.Unexpected {
			names = append(names, n.Name)
		}
	}
	// Every node must be back (its bootstrapper reported so) and Ready by a kubelet heartbeat
	// after recovery started: Node objects still say Ready from before the shutdown.
	if err := waitBack(ctx, t, platform, client, names, time.Time{}, start); err != nil {
		return err
	}
	fmt.Fprintf(out, "recovered cluster %s (ID %x): %d nodes Ready\n", st.Name, []byte(st.ClusterID), len(names))
	return nil
}
