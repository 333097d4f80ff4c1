package e2e

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// phaseLine is a phase line of mini up: "[  45.9s] init       control-plane-0 ...";
// registered is the time a join line says the node registered.
var (
	phaseLine  = regexp.MustCompile(`(?m)^\[\s*([0-9.]+)s\] (all ready|\S+) .*$`)
	registered = regexp.MustCompile(`Node registered at ([0-9.]+)s`)
)

// BenchmarkMiniUp measures `mini up` of one control plane and two workers with warm build
// caches, and reports the time at which each phase ended (seconds since the start): create,
// init, the last join, and all nodes ready (Ready with a running verification service).
// Run with -benchtime 1x: each iteration creates and removes a cluster.
func BenchmarkMiniUp(b *testing.B) {
	bin, _ := buildBinaries(b)
	images := filepath.Join(repoOutput(b), "images")
	var create, init, join, ready float64
	for i := 0; i < b.N; i++ {
		joins := 0.0
		ws := b.TempDir()
		out, err := exec.Command(bin, "mini", "up", "-C", ws, "--workers", "2", "--kube-dir", kubeDir(b), "--images", images).CombinedOutput()
		downOut, downErr := exec.Command(bin, "mini", "down", "-C", ws).CombinedOutput()
		require.NoError(b, err, "%s", out)
		require.NoError(b, downErr, "%s", downOut)
		for _, m := range phaseLine.FindAllStringSubmatch(string(out), -1) {
			at, err := strconv.ParseFloat(m[1], 64)
			require.NoError(b, err)
			switch m[2] {
			case "create":
				create += at
			case "init":
				init += at
			case "join":
				r := registered.FindStringSubmatch(m[0])
				require.NotNil(b, r, m[0])
				reg, err := strconv.ParseFloat(r[1], 64)
				require.NoError(b, err)
				joins = max(joins, reg)
			case "all ready":
				ready += at
			}
		}
		join += joins
	}
	n := float64(b.N)
	b.ReportMetric(create/n, "create-s")
	b.ReportMetric(init/n, "init-s")
	b.ReportMetric(join/n, "lastjoin-s")
	b.ReportMetric(ready/n, "allready-s")
}
