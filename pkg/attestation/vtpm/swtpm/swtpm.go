// Package swtpm runs a software TPM (swtpm, from Debian's swtpm package) as a child process
// serving the raw TPM command protocol on a unix socket. It is the vTPM of the local
// provider's nodes and of the integration tests.
package swtpm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
)

// Options configures one swtpm.
type Options struct {
	// StateDir holds the TPM's persistent state (created if missing). Keeping it keeps the
	// TPM's seeds, so keys made from templates (the AK) are the same after a restart.
	StateDir string
	// SocketDir holds the command and control sockets; defaults to StateDir. Unix socket
	// paths are limited to 107 bytes, so keep it short.
	SocketDir string
	// LogFile receives swtpm's own log; defaults to StateDir/swtpm.log.
	LogFile string
	// Binary defaults to "swtpm" on PATH.
	Binary string
	// Machine makes the TPM of a virtual machine (QEMU's tpm emulator backend): swtpm serves
	// only its control socket, through which QEMU initializes it and hands it the data
	// channel, and the machine's firmware sends TPM2_Startup. Open is not available then:
	// the TPM is the machine's alone.
	Machine bool
}

// Process is a running swtpm.
type Process struct {
	cmd     *exec.Cmd
	sock    string
	ctrl    string
	exited  chan struct{}
	waitErr error
}

// startTimeout bounds how long swtpm may take to open its socket.
const startTimeout = 10 * time.Second

// Start launches swtpm and waits until it accepts connections. The TPM is powered on and
// TPM2_Startup(CLEAR) has run, as after a platform reset.
func Start(ctx context.Context, opts Options) (*Process, error) {
	if opts.StateDir == "" {
		return nil, errors.New("swtpm: no state directory")
	}
	if opts.SocketDir == "" {
		opts.SocketDir = opts.StateDir
	}
	if opts.LogFile == "" {
		opts.LogFile = filepath.Join(opts.StateDir, "swtpm.log")
	}
	if opts.Binary == "" {
		opts.Binary = "swtpm"
	}
	// swtpm's options are comma-separated key=value lists (dir=...,mode=...): a path with a
	// comma would be split into other options and swtpm exits without a word.
	for _, path := range []string{opts.StateDir, opts.SocketDir, opts.LogFile} {
		if strings.Contains(path, ",") {
			return nil, fmt.Errorf("swtpm: path %q contains a comma, which swtpm's option syntax cannot express; use another directory", path)
		}
	}
	for _, d := range []string{opts.StateDir, opts.SocketDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("swtpm: %w", err)
		}
	}
	p := &Process{
		sock:   filepath.Join(opts.SocketDir, "tpm.sock"),
		ctrl:   filepath.Join(opts.SocketDir, "tpm.ctrl"),
		exited: make(chan struct{}),
	}
	if len(p.sock) > 107 {
		return nil, fmt.Errorf("swtpm: socket path %s is longer than 107 bytes", p.sock)
	}
	for _, s := range []string{p.sock, p.ctrl} {
		if err := os.Remove(s); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("swtpm: removing stale socket: %w", err)
		}
	}
	args := []string{"socket", "--tpm2", "--tpmstate", "dir=" + opts.StateDir, "--ctrl", "type=unixio,path=" + p.ctrl}
	probe := p.sock
	if opts.Machine {
		probe = p.ctrl
	} else {
		args = append(args, "--server", "type=unixio,path="+p.sock, "--flags", "not-need-init,startup-clear")
	}
	args = append(args, "--log", "file="+opts.LogFile+",level=1")
	p.cmd = exec.Command(opts.Binary, args...)
	// Die with the process that started us: a crashed test or CLI must not leave TPMs behind.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("swtpm: starting %s: %w", opts.Binary, err)
	}
	go func() {
		p.waitErr = p.cmd.Wait()
		close(p.exited)
	}()

	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	for {
		// Probe the command socket itself: its file appears at bind(), before swtpm listens,
		// so the file existing does not mean a connection would be accepted. swtpm serves one
		// connection at a time and accepts the next once the probe closes.
		if conn, err := net.Dial("unix", probe); err == nil {
			conn.Close()
			return p, nil
		}
		select {
		case <-p.exited:
			log, _ := os.ReadFile(opts.LogFile)
			return nil, fmt.Errorf("swtpm exited during start-up: %v; log: %s", p.waitErr, log)
		case <-ctx.Done():
			_ = p.Stop()
			return nil, fmt.Errorf("swtpm: socket not ready: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Addr is the address for vtpm.Open.
func (p *Process) Addr() string { return "unix:" + p.sock }

// CtrlPath is the control socket's path: a virtual machine's TPM backend connects to it
// (Options.Machine).
func (p *Process) CtrlPath() string { return p.ctrl }

// Pid is the process ID of swtpm.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Exited is closed once swtpm has exited, whoever ended it: a node's platform watches it
// the way a machine notices its TPM chip failing.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// ExitErr is how swtpm ended (its wait status, e.g. "signal: killed"); call it only after
// Exited is closed.
func (p *Process) ExitErr() error { return p.waitErr }

// Open connects to the TPM. swtpm serves one connection at a time.
func (p *Process) Open(ctx context.Context) (*vtpm.TPM, error) {
	return vtpm.Open(ctx, p.Addr())
}

// Kill cuts the TPM's power: SIGKILL, so it gets no TPM2_Shutdown and no chance to finish
// the command in flight, as in a power loss. It waits for swtpm to exit. The state directory
// keeps whatever swtpm had written; the next Start is a start-up after a power loss.
func (p *Process) Kill() error {
	select {
	case <-p.exited:
	default:
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
	_ = os.Remove(p.sock)
	_ = os.Remove(p.ctrl)
	return nil
}

// Stop terminates swtpm (SIGTERM, then SIGKILL after 5 s) and waits for it to exit. Nobody
// sends TPM2_Shutdown either: for the TPM this is a power loss too, as a machine's reset is.
func (p *Process) Stop() error {
	select {
	case <-p.exited:
		return nil
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
	_ = os.Remove(p.sock)
	_ = os.Remove(p.ctrl)
	return nil
}
