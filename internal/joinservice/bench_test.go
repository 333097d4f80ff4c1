package joinservice_test

import (
	"crypto/ecdsa"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/openconstellation/constellation/internal/joinservice"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm/vtpmtest"
)

// BenchmarkJoin measures whole admissions against the real API server (etcd with fsync): a
// new attested connection per join (mutual attestation, both sides quoting on swtpm), the
// request, key derivation, kubelet serving and client certificates. Reported: tickets/s
// and p50/p99 latency of one join at 1, 16 and 100 concurrent joiners (each starting its next
// join as soon as one ends: the service saturated, latency = joiners / throughput), and for
// bursts of 100 new nodes joining at once (how a scale-up looks: each node joins once).
//
// The service quotes on its own swtpm, as in a cluster. The joining nodes share one in-process
// simulator TPM: in a cluster each node quotes on its own machine, but here the joiners run
// on the same 2 cores as the service, the API server and etcd, and the simulator costs about a
// fifth of swtpm's CPU per quote, so the figures measure the service rather than the load
// generator.
//
// CPU time per ticket is reported per party: the service (the test process without the
// joiners' goroutines, split by a CPU profile), the joiners, kube-apiserver, etcd and the
// service's swtpm.
func BenchmarkJoin(b *testing.B) {
	for _, run := range []struct {
		name        string
		concurrency int
		// waves: joins start in waves of concurrency simultaneous new nodes, each wave
		// after the previous one finished (a scale-up of that many nodes), instead of
		// concurrency joiners that each start the next join as soon as one ends.
		waves bool
	}{
		{"joiners=1", 1, false},
		{"joiners=16", 16, false},
		{"joiners=100", 100, false},
		{"burst=100", 100, true},
	} {
		b.Run(run.name, func(b *testing.B) {
			e, nodes := newBenchEnv(b)
			// One round of joins before the timer (joiners past b.N): the first connections
			// to the API server and the key service, and the heap's growth, are start-up, not
			// the saturated service (a first wave of new nodes is burst=100's).
			warmup := run.concurrency
			joiners := e.benchJoiners(nodes, b.N+warmup, func(i int) string { return fmt.Sprintf("127.1.%d.%d", i/250%250, i%250+1) })
			latencies := make([]time.Duration, b.N+warmup)
			joinRange := func(from, to, workers int) {
				next := make(chan int, to-from)
				for i := from; i < to; i++ {
					next <- i
				}
				close(next)
				var wg sync.WaitGroup
				for range workers {
					wg.Go(func() {
						asJoiner(func() {
							for i := range next {
								t0 := time.Now()
								_, err := e.join(joiners[i], false)
								latencies[i] = time.Since(t0)
								if err != nil {
									b.Error(err)
								}
							}
						})
					})
				}
				wg.Wait()
			}
			joinRange(b.N, b.N+warmup, warmup)
			latencies = latencies[:b.N]
			pids := kube.PIDs()
			pids["swtpm"] = e.serviceSwtpm
			b.ResetTimer()
			cpu := startCPUSplit(b, pids)
			start := time.Now()
			if run.waves {
				for from := 0; from < b.N; from += run.concurrency {
					to := min(from+run.concurrency, b.N)
					joinRange(from, to, to-from)
				}
			} else {
				joinRange(0, b.N, run.concurrency)
			}
			elapsed := time.Since(start)
			b.StopTimer()
			reportCPU(b, cpu.stop(b), b.N)
			slices.Sort(latencies)
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "tickets/s")
			b.ReportMetric(float64(latencies[len(latencies)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(latencies[(len(latencies)*99)/100].Microseconds())/1000, "p99-ms")
		})
	}
}

// newBenchEnv is the join service of newEnv and the simulator TPM its simulated joiners share,
// booted with the service's image and its AK root provisioned.
func newBenchEnv(b *testing.B) (*env, *vtpm.TPM) {
	e := newEnv(b, envOptions{})
	// The service's process runs with its collector settings (cmd/joinservice); the
	// joiners, sharing the process, get them too.
	if os.Getenv("JOIN_DEFAULT_GC") == "" {
		b.Cleanup(joinservice.SetGCDefaults(os.Getenv))
	}
	nodes := vtpmtest.Simulator(b)
	measure(b, nodes, imageV1)
	provisionRoot(b, nodes, e.akCA)
	return e, nodes
}

// benchJoiners prepares n simulated new nodes on tpm, the i-th connecting from addr(i), outside
// any timer (AK certificate, CSR keys). Each has its own AK certificate, so the service
// verifies a new chain per join as it would for new nodes; the joiners' check of the service
// is one validator for all (load generator, not measured).
func (e *env) benchJoiners(tpm *vtpm.TPM, n int, addr func(i int) string) []*joiner {
	joiners := make([]*joiner, n)
	var serviceValidator attestation.Validator
	for i := range joiners {
		j := e.joiner(fmt.Sprintf("node-%03d", i%256), addr(i))
		j.tpm = tpm
		if serviceValidator == nil {
			serviceValidator = e.serviceValidator(j)
		}
		j.serviceValidator = serviceValidator
		e.prepare(j)
		// A node makes its certificate requests before it dials the service.
		serving, client := j.csr(j.key), j.clientCSR(j.clientKey)
		j.csr = func(*ecdsa.PrivateKey) []byte { return serving }
		j.clientCSR = func(*ecdsa.PrivateKey) []byte { return client }
		joiners[i] = j
	}
	return joiners
}
