package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/conformance"
)

// TestConformanceSmoke runs the smoke subset of the Kubernetes conformance suite
// (conformance.Smoke: networking, DNS, Services, pods, ConfigMaps, Secrets) against a 1 + 2
// cluster, the way `make conformance` runs the whole suite (hack/conformance.sh: the suite and
// its images built for the cluster's version, loaded into the nodes, no registry). Every test of
// the subset must run and pass: one that matches no test of the suite fails this too.
func TestConformanceSmoke(t *testing.T) {
	bin, _ := buildBinaries(t)
	ws := t.TempDir()
	miniUp(t, bin, ws, "--workers", "2")

	results := t.TempDir()
	script := filepath.Join(repoOutput(t), "..", "hack", "conformance.sh")
	// The script, ginkgo and its e2e.test processes are one process group, killed together
	// when the test's time runs out, so that the cluster's cleanup still runs.
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	cmd.Env = append(os.Environ(), "CONSTELLATION="+bin, "CONFORMANCE_WORKSPACE="+ws, "CONFORMANCE_RESULTS="+results,
		"CONFORMANCE_FOCUS="+conformance.SmokeFocus(), "CONFORMANCE_NODES=4", "CONFORMANCE_TIMEOUT=20m")
	out, err := cmd.CombinedOutput()
	// The suite's log is long; on failure the summary and the log's path say what failed.
	summary, _ := os.ReadFile(filepath.Join(results, "summary.txt"))
	if err != nil {
		tail := out
		if len(tail) > 8000 {
			tail = tail[len(tail)-8000:]
		}
		t.Fatalf("hack/conformance.sh: %v\nsummary:\n%s\nlast output:\n%s", err, summary, tail)
	}
	f, err := os.Open(filepath.Join(results, "junit.xml"))
	require.NoError(t, err)
	defer f.Close()
	s, err := conformance.Summarize(f)
	require.NoError(t, err)
	t.Logf("conformance smoke: %s", summary)
	assert.Empty(t, s.Failures)
	assert.Empty(t, s.Skipped, "a smoke test skipped itself")
	assert.Equal(t, len(conformance.Smoke), s.Passed, "every smoke test ran and passed")
}
