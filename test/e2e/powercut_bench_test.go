package e2e

import (
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// BenchmarkPowerCut measures a cluster of one control plane and two workers coming back
// from power cuts: a worker's (cut until its new kubelet reported Ready; it rejoins by
// itself), and the whole cluster's with its provider (cut until `start`
// returned, until `recover` returned with every node Ready by a kubelet heartbeat after
// the recovery began, and until `verify` passed). Run with -benchtime 1x: each iteration
// creates and removes a cluster.
func BenchmarkPowerCut(b *testing.B) {
	bin, _ := buildBinaries(b)
	var worker, started, ready, verified time.Duration
	run := func(ws string, args ...string) {
		out, err := exec.Command(bin, append(args, "-C", ws)...).CombinedOutput()
		require.NoError(b, err, "%s", out)
	}
	withBenchCluster(b, bin, []string{"--workers", "2"}, func(ws string) {
		kubeconfig := filepath.Join(ws, "constellation-admin.conf")
		start := time.Now()
		run(ws, "mini", "power-cut", "worker-0")
		// Returns once the node booted again: later heartbeats are the new kubelet's.
		waitFreshReady(b, kubeconfig, "worker-0", time.Now())
		worker += time.Since(start)

		start = time.Now()
		run(ws, "mini", "power-cut")
		run(ws, "start")
		started += time.Since(start)
		run(ws, "recover")
		ready += time.Since(start)
		run(ws, "verify")
		verified += time.Since(start)
	})
	n := float64(b.N)
	b.ReportMetric(worker.Seconds()/n, "workercut-ready-s")
	b.ReportMetric(started.Seconds()/n, "clustercut-started-s")
	b.ReportMetric(ready.Seconds()/n, "clustercut-allready-s")
	b.ReportMetric(verified.Seconds()/n, "clustercut-verified-s")
}
