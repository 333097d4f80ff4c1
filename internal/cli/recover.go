package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"

	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/kms"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/recovery"
	"github.com/openconstellation/constellation/internal/retry"
	"github.com/openconstellation/constellation/internal/state"
	"github.com/openconstellation/constellation/pkg/attestation"
)

func newRecoverCmd() *cobra.Command {
	var timeout time.Duration
	var disks []string
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
workers rejoin by themselves once the join service runs again.

A node gets only the key of its own disk: the disk recorded for it in
constellation-state.yaml, copied from the cluster's disk-owner records while the cluster ran
(apply, status, reboot, stop). A control plane that names another disk is refused, and so,
before anything is sent to any node, is a control plane with no recorded disk, unless
--disk NODE=UUID names its disk (after you checked it against the platform).`,
		Args: cobra.NoArgs,
		RunE: inWorkspace(&timeout, func(ctx context.Context, out io.Writer, ws string, _ []string) error {
			return recoverCluster(ctx, out, ws, disks)
		}),
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Minute, "give up after this long")
	cmd.Flags().StringArrayVar(&disks, "disk", nil, "NODE=UUID: the disk of a control plane for which no disk, or a replaced one, is recorded (repeatable); recorded once the node recovered")
	return cmd
}

func recoverCluster(ctx context.Context, out io.Writer, workspace string, diskOverrides []string) error {
	st, platform, err := loadState(workspace)
	if err != nil {
		return err
	}
	if st.Phase != state.Initialized {
		return fmt.Errorf("%s: the cluster is %s, not initialized: there is nothing to recover", state.FileName, st.Phase)
	}
	// Before anything else: which disk's key each control plane may get.
	disks, notes, err := recoveryDisks(st, diskOverrides)
	if err != nil {
		return err
	}
	for _, n := range notes {
		fmt.Fprintln(out, n)
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
	prog := newProgress(t)
	stop := prog.start(ctx)
	defer stop()
	rec := controlPlaneRecovery{platform: platform, validator: validator, master: master, st: st, disks: disks}
	recovered, err := rec.run(ctx, t, prog)
	if err != nil {
		return err
	}
	if err := recordRecoveredDisks(out, workspace, st, recovered, disks); err != nil {
		return err
	}
	if err := retry.Do(ctx, retry.Default, nil, func(ctx context.Context) error {
		return refreshEndpoints(ctx, workspace, st, platform)
	}); err != nil {
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
	if err := waitBack(ctx, t, prog, platform, client, names, time.Time{}, start); err != nil {
		return err
	}
	// The cluster's records are readable again.
	if report, err := refreshDisks(ctx, workspace, st, client); err != nil {
		fmt.Fprintf(out, "WARNING: could not refresh the disk records from the cluster: %v\n", err)
	} else {
		printDiskReport(out, report)
	}
	fmt.Fprintf(out, "recovered cluster %s (ID %x): %d nodes Ready\n", st.Name, []byte(st.ClusterID), len(names))
	return nil
}

// controlPlaneRecovery gives each waiting control plane of st its keys (recovery.Recover).
type controlPlaneRecovery struct {
	platform  provider.Provider
	validator attestation.Validator
	master    kms.MasterSecret
	st        *state.State
	// disks are the disks whose keys the control planes may get (recoveryDisks): every
	// control plane has one.
	disks map[string]string
	// recover is recovery.Recover (tests: a fake); clock paces the attempts (cliClock).
	recover func(context.Context, recovery.Config) ([]byte, error)
	clock   clock.Clock
}

// recoveryPace is how often recover attempts one node: never more often than the node's
// recovery server admits a caller (recovery.MinAttemptInterval), and after each refusal of the
// node (its limits said no) twice as long as the time before, up to a minute, with jitter. A
// node that asks for a longer wait (RetryInfo) gets it.
var recoveryPace = retry.Policy{Initial: recovery.MinAttemptInterval, Max: time.Minute, Factor: 2, Jitter: 0.2}

// platformPoll is how often recover asks the platform what the control planes report (a
// local call, and not the node's budget).
const platformPoll = time.Second

// nodeAttempts is the schedule of one control plane's recovery.
type nodeAttempts struct {
	next    time.Time
	backoff *wait.Backoff
}

// run repeats until every control plane is back in its cluster, and returns those that
// recovered through it (the others rejoined by themselves). Security failures end it at once.
// Each node is attempted at recoveryPace; prog says per node what is awaited and its first and
// last errors. Each round:
//
//  1. asks the platform what every node reports (a stopped node ends the command);
//  2. for each control plane not done: back in its cluster, not yet waiting for recovery, or
//     waiting, when it is attempted if its pace allows;
//  3. waits platformPoll, unless every control plane is done.
func (r controlPlaneRecovery) run(ctx context.Context, t *phaseTimer, prog *progress) (map[string]bool, error) {
	l := r.newRecoveryLoop(t, prog)
	for !l.allDone() {
		reported, err := l.reports(ctx)
		if err != nil {
			return nil, err
		}
		for _, n := range l.controlPlanes {
			if err := l.step(ctx, n, reported[n.Name]); err != nil {
				return nil, err
			}
		}
		if l.allDone() {
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("control planes not recovered: %s: %w", prog.summary(), ctx.Err())
		case <-l.clock.After(platformPoll):
		}
	}
	return l.recovered, nil
}

// recoveryLoop is the state of one run of controlPlaneRecovery.
type recoveryLoop struct {
	controlPlaneRecovery
	t    *phaseTimer
	prog *progress
	// controlPlanes are the nodes to bring back; a control plane is done when it is back in
	// its cluster: recovered here, or rejoined by itself (another control plane's join
	// service came back first).
	controlPlanes []state.Node
	done          map[string]bool
	recovered     map[string]bool
	attempts      map[string]*nodeAttempts
	// refusedSince is when each control plane was first seen reporting its state disk
	// refused, in an unbroken run of such reports.
	refusedSince map[string]time.Time
}

func (r controlPlaneRecovery) newRecoveryLoop(t *phaseTimer, prog *progress) *recoveryLoop {
	if r.recover == nil {
		r.recover = recovery.Recover
	}
	if r.clock == nil {
		r.clock = cliClock
	}
	l := &recoveryLoop{controlPlaneRecovery: r, t: t, prog: prog, done: map[string]bool{}, recovered: map[string]bool{}, attempts: map[string]*nodeAttempts{}, refusedSince: map[string]time.Time{}}
	for _, n := range r.st.Nodes {
		if n.Role == metadata.ControlPlane {
			l.controlPlanes = append(l.controlPlanes, n)
			prog.waiting(n.Name, "to report that it waits for recovery")
		}
	}
	return l
}

func (l *recoveryLoop) allDone() bool { return len(l.done) >= len(l.controlPlanes) }

// reports asks the platform what each node's bootstrapper reports. A platform that does not
// answer is each waiting node's failure; a stopped node ends the command.
func (l *recoveryLoop) reports(ctx context.Context) (map[string]provider.Node, error) {
	reported := map[string]provider.Node{}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	nodes, err := l.platform.Nodes(pctx)
	cancel()
	if err != nil {
		for _, n := range l.controlPlanes {
			if !l.done[n.Name] {
				l.prog.failed(n.Name, fmt.Errorf("platform: %w", err))
			}
		}
	}
	for _, n := range nodes {
		reported[n.Name] = n
		if n.State == provider.Stopped {
			return nil, fmt.Errorf("%s is stopped: start the cluster first ('constellation start')", n.Name)
		}
	}
	return reported, nil
}

// step moves control plane n on by what it reports; a state disk it keeps refusing ends the
// command.
func (l *recoveryLoop) step(ctx context.Context, n state.Node, platformNode provider.Node) error {
	reported := platformNode.Reported
	if reported != metadata.PhaseStateDiskRefused {
		delete(l.refusedSince, n.Name)
	}
	switch {
	case l.done[n.Name]:
		return nil
	case metadata.InCluster(reported):
		l.done[n.Name] = true
		l.prog.done(n.Name)
		l.t.phase("back", fmt.Sprintf("%s is back in its cluster (%s)", n.Name, reported))
		return nil
	case reported == metadata.PhaseStateDiskRefused:
		return l.refused(n.Name, platformNode.ReportedDetail)
	case reported != metadata.PhaseWaitingForRecovery:
		what := reported
		if what == "" {
			what = "nothing reported yet"
		}
		l.prog.waiting(n.Name, "to report that it waits for recovery (bootstrapper: "+what+")")
		return nil
	}
	a := l.attempts[n.Name]
	if a == nil {
		a = &nodeAttempts{backoff: recoveryPace.Backoff()}
		l.attempts[n.Name] = a
	}
	now := l.clock.Now()
	if now.Before(a.next) {
		l.prog.waiting(n.Name, fmt.Sprintf("its keys over attested TLS (next attempt in %s)", a.next.Sub(now).Round(time.Second)))
		return nil
	}
	l.prog.waiting(n.Name, "its keys over attested TLS")
	return l.attempt(ctx, n, a)
}

// attempt sends control plane n its keys once; a refusal sets its next attempt, a security
// failure is final.
func (l *recoveryLoop) attempt(ctx context.Context, n state.Node, a *nodeAttempts) error {
	_, err := l.recover(ctx, recovery.Config{
		Endpoint: nodeEndpoint(n, provider.RecoverPort), Dial: l.platform.Dialer(), Validator: l.validator,
		ExpectedNode: n.Name, Disk: l.disks[n.Name],
		MasterSecret: l.master, MeasurementSalt: l.st.MeasurementSalt, ClusterID: l.st.ClusterID,
	})
	switch {
	case err == nil:
		l.done[n.Name], l.recovered[n.Name] = true, true
		l.prog.done(n.Name)
		l.t.phase("recovered", n.Name+" got its keys over attested TLS and re-entered the cluster")
	case errors.Is(err, recovery.ErrBusy):
		// The node's limits refused: wait longer each time, and at least as long as
		// the node asked.
		l.prog.failed(n.Name, err)
		delay := a.backoff.Step()
		if d, ok := retry.After(err); ok && d > delay {
			delay = d
		}
		a.next = l.clock.Now().Add(delay)
	case recovery.Retryable(err), errors.Is(err, recovery.ErrNotWaiting):
		// Not up yet, or back already (the platform's report tells next round): the
		// next attempt no sooner than the node admits one.
		l.prog.failed(n.Name, err)
		a.next = l.clock.Now().Add(recovery.MinAttemptInterval)
	default:
		// Security failures are final: nothing was sent, and retrying would not change it.
		err = fmt.Errorf("recovering %s: %w%s", n.Name, err, wrongDiskHint(l.st, err))
		if h := l.prog.history(n.Name); h.Attempts() > 0 && h.First().Error() != err.Error() {
			err = fmt.Errorf("%w (its first error was: %v)", err, h.First())
		}
		return err
	}
	return nil
}

// refusalGrace is how long recover waits on a control plane that reports its state disk
// refused before it gives up: longer than the node takes to look again, so a report made
// before the operator restored the disk does not end the command.
const refusalGrace = metadata.StateDiskRecheck + 15*time.Second

// refused waits on a control plane that reports its state disk refused, for refusalGrace
// from the first such report, then ends the command naming the node's reason.
func (l *recoveryLoop) refused(node, detail string) error {
	now := l.clock.Now()
	since, ok := l.refusedSince[node]
	if !ok {
		since, l.refusedSince[node] = now, now
	}
	if now.Sub(since) >= refusalGrace {
		return stateDiskRefused(node, detail)
	}
	l.prog.waiting(node, fmt.Sprintf("its state disk, which it refuses (%s); it looks again every %s", detail, metadata.StateDiskRecheck))
	return nil
}

// stateDiskRefused is the error of a node that reports its state disk refused: it will use
// nothing of that disk, so no key sent to it would bring it back.
func stateDiskRefused(node, detail string) error {
	return fmt.Errorf("%s refuses its state disk, and uses and writes nothing of it: %s. The disk was changed outside the node (replaced, forged or damaged): restore the disk the node made (the node looks again every 30 s), or remove the node", node, detail)
}

// wrongDiskHint explains a recovery.DiskError: whose disk the node named, and what to do.
func wrongDiskHint(st *state.State, err error) string {
	var de *recovery.DiskError
	if !errors.As(err, &de) {
		return ""
	}
	if owner, ok := st.NodeByDisk(de.Named); ok {
		return fmt.Sprintf(". %s records %s as %s's disk: %s holds another node's disk (swapped, copied or relabelled) and gets no key", state.FileName, de.Named, owner.Name, de.Node)
	}
	return fmt.Sprintf(". A changed disk is suspicious: if %s's disk was replaced on purpose, check %s against the platform's disk of %s and run recover with --disk %s=%s", de.Node, de.Named, de.Node, de.Node, de.Named)
}

// recordRecoveredDisks records a disk named with --disk once its node recovered with it: the
// operator said so, and the node showed that its disk opens with that disk's key. A node that
// came back by itself (rejoin) showed nothing here, and keeps its record.
func recordRecoveredDisks(out io.Writer, workspace string, st *state.State, recovered map[string]bool, disks map[string]string) error {
	changed := false
	for i, n := range st.Nodes {
		if recovered[n.Name] && disks[n.Name] != n.Disk {
			st.Nodes[i].Disk = disks[n.Name]
			changed = true
			fmt.Fprintf(out, "%s: disk %s recorded in %s (--disk)\n", n.Name, disks[n.Name], state.FileName)
		}
	}
	if !changed {
		return nil
	}
	return state.Write(filepath.Join(workspace, state.FileName), st)
}
