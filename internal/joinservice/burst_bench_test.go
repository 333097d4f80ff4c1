package joinservice_test

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openconstellation/constellation/internal/bootstrapper/joinclient"
)

// burstSize is how many new nodes ask for a join ticket at the same moment in
// BenchmarkJoinBurst.
const burstSize = 1000

// BenchmarkJoinBurst: 1,000 new nodes ask the join service (defaults: 16 handshakes working,
// 256 waiting) for a join ticket at the same moment, as a scale-up of a large pool would. The
// service turns away what exceeds its bounds before any quote or validation: a connection over
// its 512 pending ones is reset at accept. A node tries again as the join client does: after a
// reset before the service sent a byte (no work done, like a refused connection) at the poll
// interval (joinclient.PollInterval, 0.5 s ± 20 %), after any other refusal on the back-off
// schedule (joinclient.NewBackoff: about 1 s, doubling). The join client observes the reset on
// its connection; the joiners here dial through the env's gRPC client and tell it from the
// flattened error. Every node must get its ticket; reported: the time to the last ticket, the
// tickets (must equal the nodes), the attempts per node, and the test process's peak
// HeapInuse+StackInuse over its baseline (sampled every 20 ms; the 1,000 joiners' connections
// share the process, so this bounds the service's from above) and peak goroutines.
//
// One iteration is one burst: run with -benchtime 1x.
func BenchmarkJoinBurst(b *testing.B) {
	e, nodes := newBenchEnv(b)
	var longest time.Duration
	var attempts, tickets int64
	var peakGoroutines int
	var peakBytes uint64
	b.ResetTimer()
	for round := range b.N {
		b.StopTimer()
		// Every node its own address: per-address limits do not apply, the global ones do.
		joiners := e.benchJoiners(nodes, burstSize, func(i int) string { return fmt.Sprintf("127.%d.%d.%d", 2+round, i/250, i%250+1) })
		runtime.GC()
		base, baseGoroutines := inUse(), runtime.NumGoroutine()
		sampler := samplePeaks()
		b.StartTimer()
		start := time.Now()
		var wg sync.WaitGroup
		for _, j := range joiners {
			wg.Go(func() {
				asJoiner(func() {
					schedule := joinclient.NewSchedule(joinclient.PollInterval, joinclient.NewBackoff)
					for attempt := 1; ; attempt++ {
						atomic.AddInt64(&attempts, 1)
						_, err := e.join(j, false)
						if err == nil {
							atomic.AddInt64(&tickets, 1)
							return
						}
						if attempt == 20 {
							b.Errorf("node %s (%s): no ticket after %d attempts: %v", j.name, j.local, attempt, err)
							return
						}
						kind := joinclient.Refused
						if strings.Contains(err.Error(), "connection reset by peer") {
							kind = joinclient.Unreachable
						}
						time.Sleep(schedule.Wait(kind))
					}
				})
			})
		}
		wg.Wait()
		if d := time.Since(start); d > longest {
			longest = d
		}
		b.StopTimer()
		mem, goroutines := sampler.stop()
		if mem > base {
			peakBytes = max(peakBytes, mem-base)
		}
		peakGoroutines = max(peakGoroutines, goroutines-baseGoroutines)
	}
	b.ReportMetric(longest.Seconds(), "s-to-last-ticket")
	b.ReportMetric(float64(tickets)/float64(b.N), "tickets")
	b.ReportMetric(float64(attempts)/float64(tickets), "attempts/ticket")
	b.ReportMetric(float64(peakBytes)/(1<<20), "peak-MB")
	b.ReportMetric(float64(peakGoroutines), "peak-goroutines")
	if tickets != int64(burstSize*b.N) {
		b.Errorf("%d tickets for %d nodes", tickets, burstSize*b.N)
	}
}
