package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/openconstellation/constellation/internal/attestation/akca"
	"github.com/openconstellation/constellation/internal/attestation/softfirmware"
	"github.com/openconstellation/constellation/internal/provider/local"
	"github.com/openconstellation/constellation/internal/provider/local/sandbox"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm/swtpm"
)

// Machines are the hardware a cluster's nodes run on: how the provider powers one on, what it
// tells it, and how it stops it. The provider around them (network bridge, metadata, API load
// balancer, NAT, watchdog, volumes, the control API) is the same for every kind: sandboxes
// (this package's, the default) or virtual machines (internal/provider/qemu).
//
// Every process of a node's machine runs in the node's cgroup (MachineEnv.Cgroup.Child(name)),
// so that the provider can freeze and kill a node at one instant and `mini down` finds
// everything; the TPM runs beside it, as the provider's child.
type Machines interface {
	// Boot powers node m on: a fresh TPM power cycle, the node attached to the cluster's
	// network, its machine started. It returns once the machine runs.
	Boot(ctx context.Context, m Machine) (Power, error)
	// Detach removes the node's attachment to the cluster's network (after its machine is
	// off; missing pieces are not an error).
	Detach(ctx context.Context, name string, index int) error
	// Shutdown asks node's OS to stop its services before the power goes, within bounds;
	// the power-off kills what is left.
	Shutdown(name string)
	// StopAPIServer stops node's API server gracefully and leaves etcd running (a leaving
	// control plane, before its etcd member is removed); a machine that cannot reach into
	// its node returns an error saying so.
	StopAPIServer(name string) error
	// Route adds (or removes) the route on node to the pod range of node index peer, where
	// the provider sets a node's routes from the outside.
	Route(ctx context.Context, node string, peer int, add bool) error
	// Describe is what the metadata service and the status file say of node: its cgroup root
	// for the kubelet's pods ("" when the node has its own cgroup tree) and the network
	// namespace holding its network attachment.
	Describe(name string) (cgroupRoot, netns string)
	// Close ends what the machines keep for the whole cluster; the provider calls it last.
	Close()
}

// VolumeDisks is implemented by machines on which a volume is a disk of the running machine
// (the QEMU provider's), not a file the node opens from the host: the provider plugs the
// volume's file into the machine when its node looks the volume up (after the machine's
// firmware is done, so volumes never change a measured register), and unplugs it before the
// volume is detached.
type VolumeDisks interface {
	// PlugVolume makes the volume's backing file a disk of node's running machine. Plugged
	// already: nothing to do. A machine that is off is an error.
	PlugVolume(ctx context.Context, node, id, file string) error
	// UnplugVolume removes the volume's disk from node's machine once its file is released.
	// Not plugged, or the machine off: nothing to do.
	UnplugVolume(ctx context.Context, node, id string) error
}

// Power is one boot of a node's machine.
type Power interface {
	// PID is the machine's main process (the sandbox's bootstrapper) for importing images
	// into its mount namespace; 0 when its file system is not reachable from the host.
	PID() int
	// Exited is closed when the machine's main process exited; ExitErr says how.
	Exited() <-chan struct{}
	ExitErr() error
	// TPMExited is closed when the node's TPM exited; TPMExitErr says how.
	TPMExited() <-chan struct{}
	TPMExitErr() error
	// StopTPM stops the TPM after the machine's processes are gone; KillTPM cuts it.
	StopTPM() error
	KillTPM() error
}

// Machine is one node as Machines.Boot needs it.
type Machine struct {
	NodeSpec
	// Dir is the node's folder: its disk, TPM state and logs.
	Dir string
	// Peers are the indexes of the cluster's other nodes, for pod routes.
	Peers []int
	// Images are the container image archives the node imports (a sandbox node from the
	// host's files; a virtual machine carries its own in its image).
	Images []string
	// LoadedImagesDir holds the archives users loaded (constellation image load).
	LoadedImagesDir string
}

// MachineEnv is what the provider gives its machines.
type MachineEnv struct {
	Net    sandbox.Network
	Cgroup sandbox.Cgroup
	// CA certifies the nodes' attestation keys.
	CA  *akca.CA
	Dir string
	Log *slog.Logger
}

// NewMachines makes the machines of a cluster from the provider's environment.
type NewMachines func(env MachineEnv) (Machines, error)

// MachineKind makes the machines of a kind from a cluster spec's MachineShape.
type MachineKind func(shape json.RawMessage) (NewMachines, error)

var (
	kindsMu sync.RWMutex
	kinds   = map[string]MachineKind{}
)

// RegisterMachines registers a kind of machines (a provider's package does, when the
// provider catalog links it in), so that the provider process of a cluster whose spec names
// the kind runs its nodes on them.
func RegisterMachines(kind string, k MachineKind) {
	kindsMu.Lock()
	defer kindsMu.Unlock()
	kinds[kind] = k
}

// machinesOf returns the machines spec names: sandboxes unless it names a registered kind.
func machinesOf(spec Spec) (NewMachines, error) {
	if spec.Machines == "" {
		return Sandboxes, nil
	}
	kindsMu.RLock()
	k, ok := kinds[spec.Machines]
	kindsMu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("the cluster's machines are %q, which this program does not run", spec.Machines)
	}
	return k(spec.MachineShape)
}

// Sandboxes are the local provider's machines: a node is a set of namespaces on the host, its
// boot a swtpm power cycle with the provider playing firmware, then the bootstrapper.
func Sandboxes(env MachineEnv) (Machines, error) { return &sandboxes{env: env}, nil }

type sandboxes struct{ env MachineEnv }

func (s *sandboxes) Describe(name string) (string, string) {
	return string(s.env.Cgroup.Child(name).Child("pods")), sandbox.NSPath(s.env.Net.NodeNS(name))
}

func (s *sandboxes) Close() {}

func (s *sandboxes) Route(ctx context.Context, node string, peer int, add bool) error {
	return s.env.Net.Route(ctx, node, peer, add)
}

func (s *sandboxes) Detach(ctx context.Context, name string, index int) error {
	return s.env.Net.DeleteNode(ctx, name, index)
}

func (s *sandboxes) Shutdown(name string) {
	stopSteps(s.env.Log, s.env.Cgroup.Child(name), name, shutdownSteps)
}

func (s *sandboxes) StopAPIServer(name string) error {
	stopSteps(s.env.Log, s.env.Cgroup.Child(name), name, shutdownSteps[:2])
	return nil
}

// Boot makes the node's network namespace, linked to every node; starts its swtpm and plays
// firmware (measures the image with its event log, certifies the AK, locks the platform
// hierarchy); then starts the bootstrapper in the node's cgroup and namespaces, logging to
// the node's bootstrapper.log.
func (s *sandboxes) Boot(ctx context.Context, m Machine) (Power, error) {
	if err := s.env.Net.DeleteNode(ctx, m.Name, m.Index); err != nil {
		return nil, err
	}
	if err := s.env.Net.AddNode(ctx, m.Name, m.Index, m.Peers); err != nil {
		return nil, fmt.Errorf("network of %s: %w", m.Name, err)
	}
	tpm, err := s.startTPM(ctx, m)
	if err != nil {
		return nil, err
	}
	cmd, err := s.startBootstrapper(m)
	if err != nil {
		_ = tpm.Stop()
		return nil, err
	}
	b := &sandboxBoot{cmd: cmd, tpm: tpm, exited: make(chan struct{})}
	go func() {
		b.err = cmd.Wait()
		close(b.exited)
	}()
	return b, nil
}

func (s *sandboxes) startTPM(ctx context.Context, m Machine) (*swtpm.Process, error) {
	tpmProc, err := swtpm.Start(ctx, swtpm.Options{StateDir: filepath.Join(m.Dir, "tpm")})
	if err != nil {
		return nil, err
	}
	image, err := local.ImageComponents(m.Image)
	if err == nil {
		err = s.playFirmware(ctx, tpmProc, m, image)
	}
	if err != nil {
		_ = tpmProc.Stop()
		return nil, err
	}
	return tpmProc, nil
}

func (s *sandboxes) playFirmware(ctx context.Context, tpmProc *swtpm.Process, m Machine, image []softfirmware.Component) error {
	tpm, err := tpmProc.Open(ctx)
	if err != nil {
		return err
	}
	defer tpm.Close()
	// The firmware's event log of this boot replaces the last boot's (the power cycle reset
	// the PCRs); it is written before the node starts, which reads it (nodeos).
	bootLog, err := softfirmware.MeasureLogged(tpm, image)
	if err == nil {
		err = local.WriteEventLog(filepath.Join(m.Dir, "tpm", local.EventLogFile), bootLog)
	}
	if err == nil {
		err = softfirmware.CertifyAK(tpm, s.env.CA, m.Name, m.Role, time.Now())
	}
	if err == nil {
		err = softfirmware.LockPlatform(tpm)
	}
	return err
}

func (s *sandboxes) startBootstrapper(m Machine) (*exec.Cmd, error) {
	cg := s.env.Cgroup.Child(m.Name)
	if err := cg.Create(); err != nil {
		return nil, err
	}
	if err := cg.Child("pods").Create(); err != nil {
		return nil, err
	}
	args := []string{"--node-dir", m.Dir, "--image-dir", m.Image}
	for _, img := range m.Images {
		args = append(args, "--image", img)
	}
	args = append(args, loadedImagesArgs(filepath.Join(m.Image, "bootstrapper"), m.LoadedImagesDir)...)
	launch, err := inCgroup(cg, append([]string{"nsenter", "--net=" + sandbox.NSPath(s.env.Net.NodeNS(m.Name)), "--",
		"unshare", "--mount", "--uts", "--propagation", "private", "--", filepath.Join(m.Image, "bootstrapper")}, args...))
	if err != nil {
		return nil, err
	}
	logf, err := os.OpenFile(filepath.Join(m.Dir, "logs", "bootstrapper.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(launch[0], launch[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return cmd, nil
}

// InCgroup returns the command line that runs command in cgroup cg: the launcher puts itself
// into the cgroup before it execs, so nothing the command starts escapes the cgroup.
func InCgroup(cg sandbox.Cgroup, command []string) ([]string, error) { return inCgroup(cg, command) }

func inCgroup(cg sandbox.Cgroup, command []string) ([]string, error) {
	procs, err := cg.Procs()
	if err != nil {
		return nil, err
	}
	script := `for f in ` + strings.Join(procs, " ") + `; do echo $$ > "$f" || exit 1; done; exec "$@"`
	return append([]string{"sh", "-c", script, "launch"}, command...), nil
}

type sandboxBoot struct {
	cmd    *exec.Cmd
	tpm    *swtpm.Process
	exited chan struct{}
	err    error
}

func (b *sandboxBoot) PID() int                   { return b.cmd.Process.Pid }
func (b *sandboxBoot) Exited() <-chan struct{}    { return b.exited }
func (b *sandboxBoot) ExitErr() error             { return b.err }
func (b *sandboxBoot) TPMExited() <-chan struct{} { return b.tpm.Exited() }
func (b *sandboxBoot) TPMExitErr() error          { return b.tpm.ExitErr() }
func (b *sandboxBoot) StopTPM() error             { return b.tpm.Stop() }
func (b *sandboxBoot) KillTPM() error             { return b.tpm.Kill() }

// stopSteps stops the processes of a node's cgroup by steps, in order.
func stopSteps(log *slog.Logger, cg sandbox.Cgroup, name string, steps []shutdownStep) {
	start := time.Now()
	for _, s := range steps {
		pids, err := cg.SignalCommand(s.comm, s.sig)
		if err != nil {
			log.Warn("graceful shutdown", "node", name, "step", s.comm, "err", err)
			return
		}
		if len(pids) == 0 || s.bound == 0 {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), s.bound)
		err = sandbox.WaitGone(ctx, pids)
		cancel()
		if err != nil {
			// Killed before the next step: etcd must not wait for a client that is leaving.
			log.Info("graceful shutdown: killing what is left of the step", "node", name, "step", s.comm, "after", s.bound.String())
			for _, pid := range pids {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			wctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = sandbox.WaitGone(wctx, pids)
			cancel()
		}
	}
	log.Info("graceful stop done", "node", name, "steps", len(steps), "took", time.Since(start).Round(time.Millisecond).String())
}
