package e2e

import (
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// BenchmarkUpgrade measures `apply` moving a cluster of one control plane and two workers
// from its development image to a signed release: the release's reference set added and
// loaded by the join service, then three nodes replaced one at a time (each replacement
// attested and Ready before the old node is drained and removed), the old set retired.
// Reported: the whole upgrade and its time per node. Run with -benchtime 1x: each iteration
// creates and removes a cluster.
func BenchmarkUpgrade(b *testing.B) {
	bin, _ := buildBinaries(b)
	var upgrade time.Duration
	withBenchCluster(b, bin, []string{"--control-planes", "1", "--workers", "2"}, func(ws string) {
		base := filepath.Join(ws, "mini", "image")
		r := newReleases(b)
		useRelease(b, ws, r.key+".pub", r.source, r.create(base, "v0.1.0", base))
		start := time.Now()
		out, err := exec.Command(bin, "apply", "-C", ws).CombinedOutput()
		upgrade += time.Since(start)
		require.NoError(b, err, "%s", out)
		require.Contains(b, string(out), "upgraded: every node boots release v0.1.0")
	})
	b.ReportMetric(upgrade.Seconds()/float64(b.N), "upgrade-1+2-s")
	b.ReportMetric(upgrade.Seconds()/float64(b.N)/3, "per-node-s")
}
