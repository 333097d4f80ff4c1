package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// BenchmarkUpgrade measures `apply` moving a cluster of one control plane and two workers
// from its development image to a signed release: the release's reference set added and
// loaded by the join service, then three nodes replaced one at a time (each replacement
// attested and Ready before the old node is drained and removed), the old set retired.
//
// While it runs, a workload (Deployment hello, 3 replicas, a PodDisruptionBudget, a
// LoadBalancer Service) is asked every 100 ms from the host through its LoadBalancer address,
// the API every 500 ms and its /readyz every 500 ms (2 s timeout), and BENCH_CPU_LOAD processes
// (default: twice the cores) spin beside the cluster; BENCH_BUILD_LOAD adds that many loops of a
// Go build of the standard library into an empty build cache (CPU and disk, as a parallel build
// loads the machine). Every failed request is logged with its reason and with how long the poller itself
// was stalled (availability_test.go); the failures are reported as metrics, whose target is 0.
//
// Reported: the whole upgrade, its time per node, and the failed requests of each target. Run
// with -benchtime 1x: each iteration creates and removes a cluster.
func BenchmarkUpgrade(b *testing.B) {
	bin, _ := buildBinaries(b)
	var upgrade time.Duration
	var lbFailed, apiFailed, readyzFailed, starved int
	withBenchCluster(b, bin, []string{"--control-planes", "1", "--workers", "2"}, func(ws string) {
		kubeconfig := filepath.Join(ws, "constellation-admin.conf")
		helloService(b, kubeconfig, filepath.Join(repoOutput(b), "images"), "LoadBalancer")
		base := filepath.Join(ws, "mini", "image")
		r := newReleases(b)
		useRelease(b, ws, r.key+".pub", r.source, r.create(base, "v0.1.0", base))
		client := adminClient(b, kubeconfig)
		p := pollTargets(b, kubeconfig, "hello",
			serviceTarget("hello", "from the host through its LoadBalancer address, 2 s timeout", askLoadBalancer(b, kubeconfig)),
			apiTarget(client), readyzTarget(client))
		stopLoad := cpuLoad(b, benchCPULoad(b), benchLoad(b, "BENCH_BUILD_LOAD", 0))
		start := time.Now()
		out, err := exec.Command(bin, "apply", "-C", ws).CombinedOutput()
		upgrade += time.Since(start)
		stopLoad()
		p.report(b)
		require.NoError(b, err, "%s", out)
		require.Contains(b, string(out), "upgraded: every node boots release v0.1.0")
		lbFailed += p.counts[0].failures
		apiFailed += p.counts[1].failures
		readyzFailed += p.counts[2].failures
		for _, c := range p.counts {
			starved += c.starved
		}
	})
	n := float64(b.N)
	b.ReportMetric(upgrade.Seconds()/n, "upgrade-1+2-s")
	b.ReportMetric(upgrade.Seconds()/n/3, "per-node-s")
	b.ReportMetric(float64(lbFailed)/n, "lb-failed")
	b.ReportMetric(float64(apiFailed)/n, "api-failed")
	b.ReportMetric(float64(readyzFailed)/n, "readyz-failed")
	b.ReportMetric(float64(starved)/n, "failed-while-poller-stalled")
}

// benchCPULoad is the number of spinning processes beside a benchmark: $BENCH_CPU_LOAD, else
// twice the cores.
func benchCPULoad(b *testing.B) int { return benchLoad(b, "BENCH_CPU_LOAD", 2*runtime.NumCPU()) }

// benchLoad is the number in $env, else def.
func benchLoad(b *testing.B, env string, def int) int {
	v := os.Getenv(env)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	require.NoError(b, err, env)
	return n
}

// cpuLoad starts spinners processes that spin and builders loops of `go build -a std` into an
// empty build cache of their own, each in a process group of its own, until the returned func
// (or the benchmark's cleanup) kills those groups.
func cpuLoad(b *testing.B, spinners, builders int) (stop func()) {
	b.Helper()
	var procs []*exec.Cmd
	start := func(script string, env ...string) {
		cmd := exec.Command("sh", "-c", script)
		cmd.Env = append(os.Environ(), env...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		require.NoError(b, cmd.Start())
		procs = append(procs, cmd)
	}
	for range spinners {
		start("while :; do :; done")
	}
	for range builders {
		cache := b.TempDir()
		start(`while :; do go build -a std >/dev/null 2>&1; go clean -cache; done`, "GOCACHE="+cache)
	}
	b.Logf("load: %d spinning processes, %d build loops", spinners, builders)
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		for _, p := range procs {
			_ = syscall.Kill(-p.Process.Pid, syscall.SIGKILL)
			_ = p.Wait()
		}
	}
	b.Cleanup(stop)
	return stop
}
