package e2e

import (
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// BenchmarkControlPlaneScaleDown measures `apply` from three control planes to one when the
// first member removed leads etcd (the case that once stopped half-way with "etcdserver:
// request timed out, possibly due to previous leader failure"): control-plane-2's member is
// made the leader (etcdctl move-leader), then `apply` removes control-plane-2 and -1 (drain,
// member removal through the leader change, deletion), timed until it returns. One worker
// holds the workloads. Run with -benchtime 1x: each iteration creates and removes a cluster.
func BenchmarkControlPlaneScaleDown(b *testing.B) {
	bin, _ := buildBinaries(b)
	var scaleDown time.Duration
	withBenchCluster(b, bin, []string{"--control-planes", "3", "--workers", "1"}, func(ws string) {
		kubeconfig := filepath.Join(ws, "constellation-admin.conf")
		moveEtcdLeader(b, kubeconfig, "control-plane-2")
		setCounts(b, ws, 1, 1)
		start := time.Now()
		out, err := exec.Command(bin, "apply", "-C", ws).CombinedOutput()
		scaleDown += time.Since(start)
		require.NoError(b, err, "%s", out)
		_, members := etcdLeaderMember(b, kubeconfig)
		require.Len(b, members, 1, "etcd's members after the scale-down")
		require.Equal(b, "control-plane-0", members[0].Name)
	})
	b.ReportMetric(scaleDown.Seconds()/float64(b.N), "cp3to1-leader-s")
}
