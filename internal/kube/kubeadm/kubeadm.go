// Package kubeadm runs the kubeadm binary for the bootstrapper: `kubeadm init` on the first
// control-plane node, `kubeadm join` on the others and `kubeadm upgrade` on control planes of
// a newer Kubernetes version than their cluster's, each with a configuration from
// internal/kube/kubeadmconfig.
//
// The configuration is written to a private temporary file (mode 0600: it may carry a
// bootstrap token) that is removed when kubeadm ends. kubeadm's output goes to the caller's
// writer, which the init server streams to the CLI on failure.
package kubeadm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Runner runs one kubeadm binary.
type Runner struct {
	// Binary is kubeadm's path; "kubeadm" (from PATH) when empty.
	Binary string
	// Env is added to kubeadm's environment.
	Env []string
	// DryRun passes --dry-run: kubeadm writes its files to a temporary directory and
	// changes nothing on the node (tests).
	DryRun bool
}

// Init runs `kubeadm init --config <config>`. The bootstrap token kubeadm would print is
// not printed: Constellation's join service issues short-lived tokens itself.
func (r Runner) Init(ctx context.Context, config []byte, out io.Writer) error {
	return r.run(ctx, config, out, "init", "--skip-token-print", "--skip-certificate-key-print")
}

// Join runs `kubeadm join --config <config>`.
func (r Runner) Join(ctx context.Context, config []byte, out io.Writer) error {
	return r.run(ctx, config, out, "join")
}

// UpgradeApply runs `kubeadm upgrade apply --config <config> --yes` (no prompt): the control
// plane of this node moves to the configuration's version, and with it the cluster's
// configuration (kubeadm-config, kubelet-config). kubeadm moves the add-ons only when no other
// control plane runs an older version.
func (r Runner) UpgradeApply(ctx context.Context, config []byte, out io.Writer) error {
	return r.run(ctx, config, out, "upgrade apply", "--yes")
}

// UpgradeAddons runs `kubeadm upgrade node phase addon all --config <config>`: kube-proxy
// and CoreDNS move to the cluster's version, if every control plane runs it.
func (r Runner) UpgradeAddons(ctx context.Context, config []byte, out io.Writer) error {
	return r.run(ctx, config, out, "upgrade node phase addon all")
}

// run runs kubeadm's command (words separated by spaces) with config and the extra flags.
func (r Runner) run(ctx context.Context, config []byte, out io.Writer, command string, extra ...string) error {
	dir, err := os.MkdirTemp("", "kubeadm-config-")
	if err != nil {
		return fmt.Errorf("kubeadm %s: %w", command, err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "kubeadm.yaml")
	if err := os.WriteFile(path, config, 0o600); err != nil {
		return fmt.Errorf("kubeadm %s: writing config: %w", command, err)
	}
	bin := r.Binary
	if bin == "" {
		bin = "kubeadm"
	}
	args := append(strings.Fields(command), "--config", path)
	args = append(args, extra...)
	if r.DryRun {
		args = append(args, "--dry-run")
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), r.Env...)
	// Keep the tail of the output for the error, and pass all of it to out.
	tail := &tailBuffer{max: 4096}
	w := io.Writer(tail)
	if out != nil {
		w = io.MultiWriter(out, tail)
	}
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("kubeadm %s: %w (%w)", command, ctx.Err(), err)
		}
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return fmt.Errorf("kubeadm %s failed with exit code %d: %s", command, exit.ExitCode(), lastLines(tail.Bytes(), 5))
		}
		return fmt.Errorf("kubeadm %s: %w", command, err)
	}
	return nil
}

// LogOutput returns a writer for kubeadm's output that logs every line of it to log.
func LogOutput(log *slog.Logger) io.Writer { return logWriter{log} }

type logWriter struct{ log *slog.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	for _, line := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		if line = strings.TrimSpace(line); line != "" {
			w.log.Info("kubeadm: " + line)
		}
	}
	return len(p), nil
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	max int
	buf []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.buf = append(t.buf, p...)
	if len(t.buf) > 2*t.max {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) Bytes() []byte {
	if len(t.buf) > t.max {
		return t.buf[len(t.buf)-t.max:]
	}
	return t.buf
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(bytes.ToValidUTF8(b, []byte("?")))), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
