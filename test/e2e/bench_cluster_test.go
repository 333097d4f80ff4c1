package e2e

import (
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// withBenchCluster runs measure once per benchmark iteration on a fresh cluster of
// `mini up` with args (in its own workspace), and removes the cluster afterwards, also when
// measure fails.
func withBenchCluster(b *testing.B, bin string, args []string, measure func(ws string)) {
	b.Helper()
	images := filepath.Join(repoOutput(b), "images")
	for i := 0; i < b.N; i++ {
		ws := b.TempDir()
		up := append([]string{"mini", "up", "-C", ws, "--kube-dir", kubeDir(b), "--images", images}, args...)
		out, err := exec.Command(bin, up...).CombinedOutput()
		if err != nil {
			_, _ = exec.Command(bin, "mini", "down", "-C", ws).CombinedOutput()
			require.NoError(b, err, "%s", out)
		}
		func() {
			defer func() {
				downOut, downErr := exec.Command(bin, "mini", "down", "-C", ws).CombinedOutput()
				require.NoError(b, downErr, "%s", downOut)
			}()
			measure(ws)
		}()
	}
}
