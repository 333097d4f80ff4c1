package joinservice_test

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/handshakelimit/floodtest"
	"github.com/openconstellation/constellation/internal/joinservice"
)

// BenchmarkStalledConnections floods the join service, built and served as cmd/joinservice
// does, with
// 10,000 TCP connections that never complete TLS: from one address, from 1,000 addresses (10
// each), and from 1,000 addresses sending half a ClientHello (the TLS stack reserves a 16 KiB
// record for each). Default bounds: 4 pending per address, 512 in all, 20 s deadline. The attacker runs in a child process (this test binary again), so the
// figures are the service's alone. Reported, per flood (run with -benchtime 1x):
//
//   - held-MB: growth of HeapInuse+StackInuse (runtime.MemStats) once every connection was
//     decided on, after a GC: what the stalled connections hold;
//   - peak-MB: the largest growth sampled every 20 ms during the flood, without forcing a GC;
//   - pending: connections the service holds (the rest were refused or displaced at accept);
//   - goroutines: goroutines added by the flood once decided on;
//   - join-ms: a genuine node's join (new attested connection, ticket) during the flood;
//   - drain-s: from the flood's end until the service runs no more goroutines than before
//     (the deadline closes the pending connections); after-goroutines: the difference then.
func BenchmarkStalledConnections(b *testing.B) {
	for _, run := range []struct {
		name        string
		peers, each int
		half        bool
	}{
		{"one-address", 1, 10000, false},
		{"1000-addresses", 1000, 10, false},
		{"1000-addresses-half-hello", 1000, 10, true},
	} {
		b.Run(run.name, func(b *testing.B) {
			for range b.N {
				stalledFlood(b, run.peers, run.each, run.half)
			}
		})
	}
}

func stalledFlood(b *testing.B, peers, each int, half bool) {
	b.StopTimer()
	e := newEnv(b, envOptions{})
	limits := joinservice.DefaultAcceptLimits
	// Warm up what a join sets up once (API server client, gRPC), so that it is not counted.
	_, err := e.join(e.joiner("worker-0", "127.0.0.10"), false)
	require.NoError(b, err)
	runtime.GC()
	baseMem := inUse()
	baseGoroutines := runtime.NumGoroutine()

	n := peers * each
	pending := min(peers*min(each, limits.PerPeer), limits.Total)
	decided := func() float64 {
		sum := 0.0
		for _, reason := range []string{"peer-busy", "busy", "displaced", "timeout"} {
			sum += e.counter(rejections, "stage", "accept", "reason", reason)
		}
		return sum
	}

	sampler := samplePeaks()

	b.StartTimer()
	start := time.Now()
	attacker := startAttacker(b, e.addr, peers, each, half)
	deadline := time.Now().Add(limits.Timeout / 2)
	for decided() < float64(n-pending) {
		require.True(b, time.Now().Before(deadline), "the service decided on %v of %d connections before the first deadlines", decided(), n-pending)
		time.Sleep(10 * time.Millisecond)
	}
	floodDone := time.Since(start)
	b.StopTimer()
	peak, _ := sampler.stop()
	runtime.GC()
	held := int64(inUse()) - int64(baseMem)
	goroutines := runtime.NumGoroutine() - baseGoroutines

	t0 := time.Now()
	_, err = e.join(e.joiner("worker-1", "127.0.0.11"), false)
	joinTime := time.Since(t0)
	require.NoError(b, err, "a genuine node joins during the flood")

	drainStart := time.Now()
	after := floodtest.Goroutines(baseGoroutines, limits.Timeout+time.Minute) - baseGoroutines
	drain := time.Since(drainStart)
	attacker.stop()

	b.ReportMetric(mb(held), "held-MB")
	b.ReportMetric(mb(int64(peak)-int64(baseMem)), "peak-MB")
	b.ReportMetric(float64(pending), "pending")
	b.ReportMetric(float64(goroutines), "goroutines")
	b.ReportMetric(float64(joinTime.Microseconds())/1000, "join-ms")
	b.ReportMetric(drain.Seconds()+floodDone.Seconds(), "drain-s")
	b.ReportMetric(float64(after), "after-goroutines")
	b.ReportMetric(float64(attacker.resetAtDial), "reset-at-dial")
}

// peaks samples the process's inUse and goroutine count every 20 ms, without forcing a GC,
// until stop returns the largest values seen.
type peaks struct {
	done       chan struct{}
	sampled    chan struct{}
	mem        uint64
	goroutines int
}

func samplePeaks() *peaks {
	p := &peaks{done: make(chan struct{}), sampled: make(chan struct{})}
	go func() {
		defer close(p.sampled)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-p.done:
				return
			case <-tick.C:
				p.mem = max(p.mem, inUse())
				p.goroutines = max(p.goroutines, runtime.NumGoroutine())
			}
		}
	}()
	return p
}

func (p *peaks) stop() (mem uint64, goroutines int) {
	close(p.done)
	<-p.sampled
	return p.mem, p.goroutines
}

func inUse() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse + m.StackInuse
}

func mb(v int64) float64 { return float64(v) / (1 << 20) }

// attacker is the child process that holds the stalled connections.
type attacker struct {
	cmd         *exec.Cmd
	stdin       io.Closer
	resetAtDial int
}

// stallHelperEnv, set in a child's environment, makes TestMain run runStallHelper instead of
// the tests: "addr peers each half".
const stallHelperEnv = "JOINSERVICE_STALL_HELPER"

func startAttacker(b *testing.B, addr string, peers, each int, half bool) *attacker {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %d %d %t", stallHelperEnv, addr, peers, each, half))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(b, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(b, err)
	require.NoError(b, cmd.Start())
	a := &attacker{cmd: cmd, stdin: stdin}
	b.Cleanup(a.stop)
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(b, err, "the attacker process reports its connections")
	var open int
	_, err = fmt.Sscanf(line, "ready %d %d", &open, &a.resetAtDial)
	require.NoError(b, err, "attacker said %q", line)
	require.Equal(b, peers*each, open+a.resetAtDial)
	return a
}

func (a *attacker) stop() {
	if a.stdin != nil {
		a.stdin.Close()
		_ = a.cmd.Wait()
		a.stdin = nil
	}
}

// runStallHelper is the attacker process: it opens the connections of spec in order (each
// address its connections in a row), reports "ready OPEN RESET", holds them until its stdin
// closes, and exits.
func runStallHelper(spec string) int {
	fields := strings.Fields(spec)
	if len(fields) != 4 {
		fmt.Fprintln(os.Stderr, "stall helper: bad spec", spec)
		return 2
	}
	peers, err1 := strconv.Atoi(fields[1])
	each, err2 := strconv.Atoi(fields[2])
	half, err3 := strconv.ParseBool(fields[3])
	if err1 != nil || err2 != nil || err3 != nil {
		fmt.Fprintln(os.Stderr, "stall helper: bad spec", spec)
		return 2
	}
	// Each connection is a descriptor: use the hard limit.
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil && lim.Cur < lim.Max {
		lim.Cur = lim.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	}
	var locals []string
	for _, local := range floodtest.Locals("127.1.0.0", peers) {
		locals = append(locals, floodtest.Repeat(local, each)...)
	}
	flood, err := floodtest.StallAll(locals, fields[0], half)
	if err != nil {
		fmt.Fprintln(os.Stderr, "stall helper:", err)
		return 1
	}
	fmt.Printf("ready %d %d\n", len(flood.Open), flood.ResetAtDial)
	_, _ = io.Copy(io.Discard, os.Stdin)
	flood.Close()
	return 0
}
