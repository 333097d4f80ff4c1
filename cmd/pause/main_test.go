package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/openconstellation/constellation/internal/kubeversion"
	"github.com/openconstellation/constellation/internal/testtier"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestVersion: pause stands in for the pause image of every supported Kubernetes version.
func TestVersion(t *testing.T) {
	for _, r := range kubeversion.Releases() {
		assert.Equal(t, r.Pause, version, r.Kubernetes)
	}
}

// startPause builds pause and starts it as PID 1 of a new PID namespace (as in a pod).
func startPause(t *testing.T) *exec.Cmd {
	t.Helper()
	testtier.Integration(t, "a PID namespace, as root")
	bin := filepath.Join(t.TempDir(), "pause")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "building pause: %s", out)

	cmd := exec.Command(bin)
	cmd.Stderr = &logWriter{t: t}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_, _ = cmd.Process.Wait()
	})
	return cmd
}

// children returns the PIDs of pid's children, zombies included.
func children(t *testing.T, pid int) []string {
	t.Helper()
	p := strconv.Itoa(pid)
	data, err := os.ReadFile(filepath.Join("/proc", p, "task", p, "children"))
	require.NoError(t, err)
	return strings.Fields(string(data))
}

// reapsOrphan makes a shell in pause's PID namespace start a 1 s sleep (stdio detached) and exit:
// the sleep is re-parented to pause, PID 1 of the namespace, which must reap it when it exits.
func reapsOrphan(t *testing.T, pid int) {
	t.Helper()
	out, err := exec.Command("nsenter", "--target", strconv.Itoa(pid), "--pid", "--",
		"sh", "-c", "sleep 1 </dev/null >/dev/null 2>&1 & exit 0").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Len(t, children(t, pid), 1, "the orphaned sleep is pause's child")
	require.Eventually(t, func() bool { return len(children(t, pid)) == 0 }, 10*time.Second, 20*time.Millisecond,
		"pause did not reap the exited orphan")
}

func TestReapsOrphans(t *testing.T) {
	pause := startPause(t)
	reapsOrphan(t, pause.Process.Pid)
	reapsOrphan(t, pause.Process.Pid)
}

func TestExitsOnSignal(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			pause := startPause(t)
			// The Go runtime catches every signal from its start and exits 2 on SIGTERM until
			// main asks for it; pause reaps only after it did, so a reaped orphan says it is ready.
			reapsOrphan(t, pause.Process.Pid)
			require.NoError(t, pause.Process.Signal(sig))
			done := make(chan error, 1)
			go func() { done <- pause.Wait() }()
			select {
			case err := <-done:
				assert.NoError(t, err, "pause exits 0 on %v", sig)
			case <-time.After(5 * time.Second):
				t.Fatalf("pause did not exit on %v", sig)
			}
		})
	}
}

// logWriter passes pause's messages to the test log.
type logWriter struct{ t *testing.T }

func (w *logWriter) Write(p []byte) (int, error) {
	w.t.Logf("pause: %s", strings.TrimSpace(string(p)))
	return len(p), nil
}
