// Package nodeos is the operating system of a local sandbox node, run by the node's
// bootstrapper inside the namespaces the provider made for it: it mounts the node's private
// views of the host's file system, starts containerd with the node image's configuration,
// imports the node images, mounts the encrypted state once the bootstrapper unlocked it, and
// supervises the kubelet (the systemd of a real node image).
//
// What is encrypted: what holds the cluster's state and must outlive a boot (/etc/kubernetes,
// /var/lib/kubelet/pki, /var/lib/etcd, kubeadm's kubelet files: keys, kubeconfigs,
// certificates, etcd data) is bind-mounted or linked from the unlocked gocryptfs state
// storage, so it only reaches the disk encrypted. Everything else the node writes to /etc and
// /var/lib, the kubelet's pod volumes and checkpoints included, goes to overlays whose upper
// layers are on the node's /run tmpfs: never on a disk, gone at the next boot. containerd's root is on the same tmpfs: images (public) and container layers never
// reach the disk. /var/log is an overlay whose upper layer is in the workspace (logs are for
// the operator, like a serial console). See layout.go for why no overlay lies on the storage.
package nodeos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/openconstellation/constellation/internal/nodeimage"
	"github.com/openconstellation/constellation/internal/provider/local"
	"github.com/openconstellation/constellation/internal/provider/local/sandbox"
)

// Paths inside a node (docs/local-provider.md).
const (
	RunDir    = "/run/constellation"
	TPMSocket = RunDir + "/tpm.sock"
	// EventLog is the TCG event log of the node's measured boot, the provider's (the
	// sandbox's binary_bios_measurements), bound read-only.
	EventLog          = RunDir + "/eventlog"
	StateMount        = RunDir + "/state"
	CNIConfDir        = RunDir + "/cni"
	ContainerdSocket  = "/run/containerd/containerd.sock"
	CRISocket         = "unix://" + ContainerdSocket
	containerdConfig  = RunDir + "/containerd.toml"
	kubeletConfigFile = "/var/lib/kubelet/config.yaml"
	kubeletFlagsFile  = "/var/lib/kubelet/kubeadm-flags.env"
)

// Config is the node's view of its sandbox.
type Config struct {
	// NodeDir is the node's folder in the workspace: logs/, log/ (the /var/log upper
	// layer) and tpm/tpm.sock.
	NodeDir string
	// ContainerdConfig is the node image's containerd configuration.
	ContainerdConfig []byte
	// Images are docker-archive tarballs to import into containerd.
	Images []string
	// ImageStores are folders whose archives (*.tar) are imported too, listed when containerd
	// is up: the images a user loaded (constellation image load), kept on the host.
	ImageStores []string
	// Kubelet is the kubelet binary of the node image.
	Kubelet string
	Log     *slog.Logger
	// Machine says the node is a machine of its own (a VM of the QEMU provider): its TPM and
	// its boot's event log are its kernel's devices, not the provider's files in NodeDir.
	Machine bool
}

// OS is a booted node OS.
type OS struct {
	cfg        Config
	containerd *exec.Cmd
	kubelet    *Supervisor
	// imported is closed when the image import ended; importErr is its result.
	imported  chan struct{}
	importErr error
}

// LogDir is where the node's processes log (in the workspace).
func (c Config) LogDir() string { return filepath.Join(c.NodeDir, "logs") }

// Boot prepares the sandbox: /run as tmpfs, the TPM socket at TPMSocket, /var/log overlay,
// /etc and /var/lib overlays on the tmpfs, hostname, containerd, and starts importing the
// images. It returns while the import runs: only the kubelet and kubeadm need the images
// (WaitImages; the kubelet's supervisor waits by itself), and the node's attestation, its
// state storage and its init or join call need none, so they overlap the import (about 5 s on
// a quiet machine, 12 s with three nodes booting on a busy one).
func Boot(ctx context.Context, cfg Config, hostname string) (*OS, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(cfg.LogDir(), 0o755); err != nil {
		return nil, err
	}
	if err := syscall.Sethostname([]byte(hostname)); err != nil {
		return nil, fmt.Errorf("setting hostname: %w", err)
	}
	// Nothing mounted in here may reach the host's namespace.
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return nil, fmt.Errorf("making mounts private: %w", err)
	}
	// containerd's root is below /run (the image's containerd.toml): on a machine, whose
	// memory is its own, /run may take three quarters of it (tmpfs only uses what is
	// written); a sandbox's tmpfs keeps the kernel's default, half the host's memory.
	runOptions := "mode=755"
	if cfg.Machine {
		runOptions += ",size=75%"
	}
	if err := syscall.Mount("tmpfs", "/run", "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, runOptions); err != nil {
		return nil, fmt.Errorf("mounting /run: %w", err)
	}
	for _, d := range []string{RunDir, CNIConfDir, "/run/containerd", "/run/netns"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	if !cfg.Machine {
		if err := bindFile(filepath.Join(cfg.NodeDir, "tpm", "tpm.sock"), TPMSocket); err != nil {
			return nil, fmt.Errorf("attaching the vTPM: %w", err)
		}
		if err := bindFileReadOnly(filepath.Join(cfg.NodeDir, "tpm", local.EventLogFile), EventLog); err != nil {
			return nil, fmt.Errorf("attaching the boot's event log: %w", err)
		}
	}
	// A sandbox's /var/log is the host's: its node's logs go to an overlay whose upper layer
	// is in the workspace. A machine's /var is its own (volatile; its journal goes to its
	// console).
	if !cfg.Machine {
		if err := overlay("/var/log", filepath.Join(cfg.NodeDir, "log"), true); err != nil {
			return nil, err
		}
	}
	// Before anything of the node runs: from here on, nothing the node writes to /etc or
	// /var/lib reaches the host's directories or a disk.
	if err := nodeLayout.mountVolatile(); err != nil {
		return nil, err
	}
	o := &OS{cfg: cfg}
	if err := o.startContainerd(ctx); err != nil {
		return nil, err
	}
	o.imported = make(chan struct{})
	go func() {
		defer close(o.imported)
		o.importErr = o.importImages(ctx)
		if o.importErr != nil {
			o.cfg.Log.Error("importing images", "err", o.importErr)
		}
	}()
	return o, nil
}

// WaitImages waits until the image import ended and returns its error.
func (o *OS) WaitImages(ctx context.Context) error {
	select {
	case <-o.imported:
		return o.importErr
	case <-ctx.Done():
		return fmt.Errorf("waiting for the image import: %w", ctx.Err())
	}
}

// MountState binds the node's persistent directories (PersistentDirs) and links its persistent
// files (PersistentFiles) from the unlocked state storage at dir, and writes the node's
// identity files. The pod addresses the CNI plugin
// (host-local) records in /var/lib/cni are volatile: no container survives a boot.
func (o *OS) MountState(dir, hostname string, ip netip.Addr) error {
	if err := nodeLayout.mountState(dir); err != nil {
		return err
	}
	hosts := fmt.Sprintf("127.0.0.1\tlocalhost\n::1\tlocalhost\n%s\t%s\n", ip, hostname)
	if err := os.WriteFile("/etc/hosts", []byte(hosts), 0o644); err != nil {
		return fmt.Errorf("writing /etc/hosts: %w", err)
	}
	if err := os.WriteFile("/etc/hostname", []byte(hostname+"\n"), 0o644); err != nil {
		return fmt.Errorf("writing /etc/hostname: %w", err)
	}
	return nil
}

// SetUpPodNetwork creates the pod bridge, cni0, with a hardware address of its own
// (sandbox.BridgeMAC of its gateway address: a bridge without one changes its address when a
// pod's veth leaves, and every pod's cached gateway goes dead for seconds), and writes the pod
// network configuration: the bridge plugin on cni0 with the node's pod range, routed (not
// masqueraded) to the other nodes by the provider's routes, and the portmap plugin for pods'
// hostPorts (the node's iptables rules; the conformance suite's HostPort test). After a reboot the bridge may
// exist already: its address is set again.
func SetUpPodNetwork(ctx context.Context, podCIDR netip.Prefix) error {
	mac, err := sandbox.BridgeMAC(podCIDR.Masked().Addr().Next())
	if err != nil {
		return err
	}
	if out, err := exec.CommandContext(ctx, "ip", "link", "add", PodBridge, "address", mac, "type", "bridge").CombinedOutput(); err != nil {
		if !strings.Contains(string(out), "File exists") {
			return fmt.Errorf("creating the pod bridge %s: %w: %s", PodBridge, err, out)
		}
		if out, err := exec.CommandContext(ctx, "ip", "link", "set", PodBridge, "address", mac).CombinedOutput(); err != nil {
			return fmt.Errorf("setting the address of the pod bridge %s: %w: %s", PodBridge, err, out)
		}
	}
	return writeCNIConfig(podCIDR)
}

// PodBridge is the node's pod bridge.
const PodBridge = "cni0"

func writeCNIConfig(podCIDR netip.Prefix) error {
	conf := fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "constellation",
  "plugins": [
    {
      "type": "bridge",
      "bridge": %[2]q,
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": %[1]q}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}},
    {"type": "loopback"}
  ]
}
`, podCIDR.Masked().String(), PodBridge)
	return os.WriteFile(filepath.Join(CNIConfDir, "10-constellation.conflist"), []byte(conf), 0o644)
}

func (o *OS) startContainerd(ctx context.Context) error {
	if err := os.WriteFile(containerdConfig, o.cfg.ContainerdConfig, 0o644); err != nil {
		return err
	}
	logf, err := os.OpenFile(filepath.Join(o.cfg.LogDir(), "containerd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command("containerd", "--config", containerdConfig)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("starting containerd: %w", err)
	}
	logf.Close()
	o.containerd = cmd
	go func() { _ = cmd.Wait() }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if c, err := net.Dial("unix", ContainerdSocket); err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("containerd did not open %s (see %s)", ContainerdSocket, filepath.Join(o.cfg.LogDir(), "containerd.log"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (o *OS) importImages(ctx context.Context) error {
	start := time.Now()
	images := o.cfg.Images
	for _, dir := range o.cfg.ImageStores {
		loaded, err := nodeimage.ArchivesIn(dir)
		if err != nil {
			return fmt.Errorf("loaded images in %s: %w", dir, err)
		}
		images = append(images, loaded...)
	}
	if err := nodeimage.Import(ctx, "ctr", ContainerdSocket, "k8s.io", images...); err != nil {
		return err
	}
	o.cfg.Log.Info("images imported", "count", len(images), "seconds", time.Since(start).Seconds())
	return nil
}

// Kubelet returns the kubelet supervisor, started on first use.
func (o *OS) Kubelet(extraArgs ...string) *Supervisor {
	if o.kubelet == nil {
		o.kubelet = &Supervisor{binary: o.cfg.Kubelet, extra: extraArgs, logFile: filepath.Join(o.cfg.LogDir(), "kubelet.log"), log: o.cfg.Log, images: o.WaitImages}
	}
	return o.kubelet
}

// Logs returns the tail of the node's containerd and kubelet logs (for init failures).
func (o *OS) Logs(_ context.Context) []byte {
	var b strings.Builder
	for _, name := range []string{"containerd.log", "kubelet.log"} {
		data, err := os.ReadFile(filepath.Join(o.cfg.LogDir(), name))
		if err != nil {
			continue
		}
		if len(data) > 16<<10 {
			data = data[len(data)-16<<10:]
		}
		fmt.Fprintf(&b, "==> %s <==\n%s\n", name, data)
	}
	return []byte(b.String())
}

// Supervisor runs the kubelet the way kubeadm's systemd drop-in does: once kubeadm wrote
// its configuration, with kubeadm's flags, restarted whenever it exits.
type Supervisor struct {
	binary  string
	extra   []string
	logFile string
	log     *slog.Logger
	// images waits for the node's images: the kubelet starts only once they are imported,
	// since it would otherwise try to pull its static pods' images (a sandbox node has no
	// registry) and back off for 10 s and more.
	images func(context.Context) error

	mu      sync.Mutex
	cmd     *exec.Cmd
	started bool
	// fatal: a kubelet exit is a node failure, reported on failed, not restarted.
	fatal  bool
	failed chan error
	// restarting: the current exit was asked for by Restart.
	restarting bool
}

// ExitIsFatal makes the next kubelet exit a node failure: the supervisor stops restarting it
// and reports the exit on Failed. A node calls it once it is in its cluster: from then on a
// dead kubelet means a broken node, which the platform's watchdog reboots (a restart within
// the boot would hide it).
func (s *Supervisor) ExitIsFatal() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fatal = true
}

// Failed reports the kubelet's exit once ExitIsFatal was called.
func (s *Supervisor) Failed() <-chan error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failed == nil {
		s.failed = make(chan error, 1)
	}
	return s.failed
}

// Start begins supervising: the kubelet starts as soon as kubeadm wrote its configuration.
func (s *Supervisor) Start(ctx context.Context) {
	s.mu.Lock()
	if s.started {
		s.mu.Unlock()
		return
	}
	s.started = true
	s.mu.Unlock()
	go s.loop(ctx)
}

// Restart implements node.Kubelet: it (re)starts the kubelet.
func (s *Supervisor) Restart(ctx context.Context) error {
	s.Start(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil && s.cmd.Process != nil {
		s.restarting = true
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
	}
	return nil
}

func (s *Supervisor) failedChan() chan error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failed == nil {
		s.failed = make(chan error, 1)
	}
	return s.failed
}

func (s *Supervisor) loop(ctx context.Context) {
	if s.images != nil {
		if err := s.images(ctx); err != nil {
			// Without its images the kubelet cannot run the node's pods: a node failure.
			s.log.Error("kubelet not started", "err", err)
			select {
			case s.failedChan() <- fmt.Errorf("kubelet not started: %w", err):
			default:
			}
			return
		}
	}
	for ctx.Err() == nil {
		args, err := s.args()
		if err != nil {
			select {
			case <-ctx.Done():
				return
			case <-time.After(200 * time.Millisecond):
			}
			continue
		}
		logf, err := os.OpenFile(s.logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			s.log.Error("kubelet log", "err", err)
			return
		}
		cmd := exec.Command(s.binary, args...)
		cmd.Stdout, cmd.Stderr = logf, logf
		s.mu.Lock()
		err = cmd.Start()
		if err == nil {
			s.cmd = cmd
		}
		s.mu.Unlock()
		if err != nil {
			s.log.Error("starting kubelet", "err", err)
			logf.Close()
			time.Sleep(time.Second)
			continue
		}
		s.log.Info("kubelet started", "pid", cmd.Process.Pid)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err = <-done:
			logf.Close()
			s.mu.Lock()
			fatal, restarting := s.fatal, s.restarting
			s.restarting = false
			s.mu.Unlock()
			if fatal && !restarting {
				s.log.Error("kubelet exited", "err", err)
				if err == nil {
					err = errors.New("exit status 0")
				}
				select {
				case s.failedChan() <- fmt.Errorf("kubelet (pid %d) exited: %w", cmd.Process.Pid, err):
				default:
				}
				return
			}
			s.log.Warn("kubelet exited; restarting", "err", err)
			time.Sleep(time.Second)
		case <-ctx.Done():
			_ = cmd.Process.Signal(syscall.SIGTERM)
			<-done
			logf.Close()
			return
		}
	}
}

// args builds the kubelet's command line from kubeadm's files, as kubeadm's systemd drop-in
// (10-kubeadm.conf) does.
func (s *Supervisor) args() ([]string, error) {
	if _, err := os.Stat(kubeletConfigFile); err != nil {
		return nil, err
	}
	flags, err := os.ReadFile(kubeletFlagsFile)
	if err != nil {
		return nil, err
	}
	args := []string{
		"--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf",
		"--kubeconfig=/etc/kubernetes/kubelet.conf",
		"--config=" + kubeletConfigFile,
	}
	args = append(args, ParseKubeadmFlags(string(flags))...)
	return append(args, s.extra...), nil
}

// ParseKubeadmFlags extracts the flags of kubeadm-flags.env
// (KUBELET_KUBEADM_ARGS="--a=b --c=d").
func ParseKubeadmFlags(env string) []string {
	for _, line := range strings.Split(env, "\n") {
		v, ok := strings.CutPrefix(strings.TrimSpace(line), "KUBELET_KUBEADM_ARGS=")
		if !ok {
			continue
		}
		return strings.Fields(strings.Trim(v, `"`))
	}
	return nil
}

// overlay mounts an overlay on target with target as its lower layer and its upper and work
// directories in dir. userxattr keeps overlayfs' metadata in user.* extended attributes: the
// workspace's /var/log upper layer has always been mounted with it, and overlayfs would not
// understand that layer's metadata without it.
func overlay(target, dir string, userxattr bool) error {
	upper, work := filepath.Join(dir, "upper"), filepath.Join(dir, "work")
	for _, d := range []string{upper, work} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", target, upper, work)
	if userxattr {
		opts = "userxattr," + opts
	}
	if err := syscall.Mount("overlay", target, "overlay", 0, opts); err != nil {
		return fmt.Errorf("mounting overlay on %s: %w", target, err)
	}
	return nil
}

// bindFileReadOnly binds src on dst and makes the mount read-only (a bind mount takes the
// flag only on a remount): what the node's software reads there, it cannot change for others.
func bindFileReadOnly(src, dst string) error {
	if err := bindFile(src, dst); err != nil {
		return err
	}
	if err := syscall.Mount("", dst, "", syscall.MS_BIND|syscall.MS_REMOUNT|syscall.MS_RDONLY, ""); err != nil {
		return fmt.Errorf("making %s read-only: %w", dst, err)
	}
	return nil
}

func bindFile(src, dst string) error {
	if _, err := os.Stat(src); err != nil {
		return err
	}
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	f.Close()
	if err := syscall.Mount(src, dst, "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mounting %s on %s: %w", src, dst, err)
	}
	return nil
}
