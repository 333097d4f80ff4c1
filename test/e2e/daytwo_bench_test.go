package e2e

import (
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// BenchmarkDayTwo measures the day-two operations on a cluster of one control plane and two
// workers, each until the command returns (every node concerned Ready and verifiable or, for
// reboot and recover, Ready by a kubelet heartbeat after the command started): adding a
// worker (apply), rebooting a worker, and stop → start → recover. Run with -benchtime 1x:
// each iteration creates and removes a cluster.
func BenchmarkDayTwo(b *testing.B) {
	bin, _ := buildBinaries(b)
	var add, reboot, restart time.Duration
	timed := func(ws string, args ...string) time.Duration {
		start := time.Now()
		out, err := exec.Command(bin, append(args, "-C", ws)...).CombinedOutput()
		require.NoError(b, err, "%s", out)
		return time.Since(start)
	}
	withBenchCluster(b, bin, []string{"--workers", "2"}, func(ws string) {
		setCounts(b, ws, 1, 3)
		add += timed(ws, "apply")
		reboot += timed(ws, "reboot", "worker-0")
		start := time.Now()
		timed(ws, "stop")
		timed(ws, "start")
		timed(ws, "recover")
		restart += time.Since(start)
	})
	n := float64(b.N)
	b.ReportMetric(add.Seconds()/n, "addworker-s")
	b.ReportMetric(reboot.Seconds()/n, "rebootworker-s")
	b.ReportMetric(restart.Seconds()/n, "stopstartrecover-s")
}
