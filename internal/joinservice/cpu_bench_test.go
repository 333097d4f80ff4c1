package joinservice_test

import (
	"bytes"
	"context"
	"os"
	"runtime/pprof"
	"syscall"
	"testing"
	"time"

	"github.com/google/pprof/profile"
	"github.com/prometheus/procfs"
	"github.com/stretchr/testify/require"
)

// joinerLabel marks the goroutines of the simulated joining nodes (the load generator) in the
// CPU profile of a benchmark, so that the rest of the test process is the service's.
var joinerLabel = pprof.Labels("side", "joiner")

// asJoiner runs fn as a joining node: every goroutine it starts (gRPC's and aTLS's included)
// carries joinerLabel.
func asJoiner(fn func()) { pprof.Do(context.Background(), joinerLabel, func(context.Context) { fn() }) }

// cpuSplit accounts the CPU time of a benchmark run by who spent it. The test process is
// split by a CPU profile taken during the run: samples of goroutines labelled as joiners
// (asJoiner) are the load generator's, all others the service's (its gRPC server, aTLS, checks,
// signatures, its API client). Other processes (the API server, etcd, the service's swtpm) are
// read from /proc.
type cpuSplit struct {
	pids      map[string]int
	before    map[string]time.Duration
	self      time.Duration
	profile   bytes.Buffer
	profiling bool
}

// startCPUSplit starts accounting; pids names the other processes to account.
func startCPUSplit(b *testing.B, pids map[string]int) *cpuSplit {
	c := &cpuSplit{pids: pids, before: map[string]time.Duration{}}
	for name, pid := range pids {
		c.before[name] = procCPU(b, pid)
	}
	c.self = selfCPU(b)
	// Fails when go test's -cpuprofile runs: then the process is reported as a whole.
	c.profiling = pprof.StartCPUProfile(&c.profile) == nil
	return c
}

// stop ends accounting and returns the CPU time each party spent: "service" and "joiners"
// (or "test-process" without a profile), and one entry per process of pids.
func (c *cpuSplit) stop(b *testing.B) map[string]time.Duration {
	if c.profiling {
		pprof.StopCPUProfile()
	}
	spent := map[string]time.Duration{}
	for name, pid := range c.pids {
		spent[name] = procCPU(b, pid) - c.before[name]
	}
	self := selfCPU(b) - c.self
	if !c.profiling {
		spent["test-process"] = self
		return spent
	}
	if path := os.Getenv("JOIN_CPUPROFILE"); path != "" {
		// The profile the split is taken from, for go tool pprof (-tagignore side=joiner
		// shows the service alone).
		require.NoError(b, os.WriteFile(path, c.profile.Bytes(), 0o644))
	}
	p, err := profile.Parse(&c.profile)
	require.NoError(b, err)
	cpu := -1
	for i, st := range p.SampleType {
		if st.Type == "cpu" {
			cpu = i
		}
	}
	require.GreaterOrEqual(b, cpu, 0, "no cpu samples in the profile")
	var joiners, all int64
	for _, s := range p.Sample {
		all += s.Value[cpu]
		if v := s.Label["side"]; len(v) == 1 && v[0] == "joiner" {
			joiners += s.Value[cpu]
		}
	}
	if all == 0 {
		spent["test-process"] = self
		return spent
	}
	// The profile samples; the process's own accounting is exact: split the latter by the
	// former's shares.
	spent["joiners"] = time.Duration(float64(self) * float64(joiners) / float64(all))
	spent["service"] = self - spent["joiners"]
	return spent
}

// reportCPU reports each party's CPU time per operation in milliseconds.
func reportCPU(b *testing.B, spent map[string]time.Duration, n int) {
	for name, d := range spent {
		b.ReportMetric(float64(d.Microseconds())/1000/float64(n), name+"-cpu-ms/op")
	}
}

func procCPU(b *testing.B, pid int) time.Duration {
	p, err := procfs.NewProc(pid)
	require.NoError(b, err)
	st, err := p.Stat()
	require.NoError(b, err)
	return time.Duration(st.CPUTime() * float64(time.Second))
}

func selfCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	require.NoError(b, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
