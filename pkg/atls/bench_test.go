package atls_test

import (
	"context"
	"crypto/tls"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/pkg/atls"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm/vtpmtest"
)

// serve accepts connections and runs handshake on each until the listener closes.
func serve(b *testing.B, handshake func(net.Conn) error) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	b.Cleanup(func() { ln.Close() })
	go func() {
		for {
			raw, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer raw.Close()
				_ = handshake(raw)
			}()
		}
	}()
	return ln.Addr().String()
}

// measure runs fn as the benchmark's timed part and reports, besides time per operation, the
// handshakes per second and the process's CPU time per operation (user + system, both sides of
// the handshake): a figure that other load on the machine changes far less than time.
func measure(b *testing.B, fn func()) {
	before := cpuTime(b)
	b.ResetTimer()
	fn()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "handshakes/s")
	b.ReportMetric(float64((cpuTime(b)-before).Microseconds())/float64(b.N), "cpu-µs/op")
}

func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	require.NoError(b, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkHandshake measures attested handshakes per second over loopback with 2 concurrent
// clients (one per core), server and client in this process.
//
// Each backend also runs the limit of a handshake that attests per connection, under the same
// parallelism: limit/one-way is per operation a plain TLS 1.3 handshake (the floor) plus one
// quote and one validation bound to that connection's exporter, done back to back with no
// framing; limit/mutual is the floor plus two of each. A mode's overhead is its time over its
// limit (docs/benchmarks.md).
func BenchmarkHandshake(b *testing.B) {
	cert, err := atls.EphemeralCert()
	require.NoError(b, err)
	plainAddr := serve(b, func(raw net.Conn) error {
		return tls.Server(raw, &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}, SessionTicketsDisabled: true}).Handshake()
	})
	// plainHandshake is the floor: the TLS 1.3 handshake aTLS runs, with the same certificate.
	plainHandshake := func() (*tls.Conn, error) {
		return tls.Dial("tcp", plainAddr, &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true})
	}
	b.Run("plain-tls13", func(b *testing.B) {
		b.SetParallelism(1)
		measure(b, func() {
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					conn, err := plainHandshake()
					if err != nil {
						b.Error(err)
						return
					}
					conn.Close()
				}
			})
		})
	})

	for _, backend := range []string{"simulator", "swtpm"} {
		b.Run(backend, func(b *testing.B) {
			var server, client *node
			if backend == "simulator" {
				// One simulator per process: both sides share it (and its AK).
				server = bootNode(b, vtpmtest.Simulator(b))
				client = server
			} else {
				tpmA, _ := vtpmtest.Swtpm(b)
				tpmB, _ := vtpmtest.Swtpm(b)
				server, client = bootNode(b, tpmA), bootNode(b, tpmB)
			}
			modes := []struct {
				name           string
				server, client atls.Config
			}{
				{"server-attested", atls.Config{Issuer: server.issuer}, atls.Config{Validators: []attestation.Validator{server.validator(b)}}},
				{"client-attested", atls.Config{Validators: []attestation.Validator{client.validator(b)}}, atls.Config{Issuer: client.issuer}},
				{"mutual", atls.Config{Issuer: server.issuer, Validators: []attestation.Validator{client.validator(b)}}, atls.Config{Issuer: client.issuer, Validators: []attestation.Validator{server.validator(b)}}},
			}
			limits := []struct {
				name  string
				pairs []attestPair
			}{
				{"limit/one-way", []attestPair{{server.issuer, client.validator(b), atls.RoleServer}}},
				{"limit/mutual", []attestPair{{server.issuer, client.validator(b), atls.RoleServer}, {client.issuer, server.validator(b), atls.RoleClient}}},
			}
			for _, l := range limits {
				b.Run(l.name, func(b *testing.B) {
					b.SetParallelism(1)
					measure(b, func() {
						b.RunParallel(func(pb *testing.PB) {
							for pb.Next() {
								if err := attestedLimit(plainHandshake, l.pairs); err != nil {
									b.Error(err)
									return
								}
							}
						})
					})
				})
			}
			for _, m := range modes {
				b.Run(m.name, func(b *testing.B) {
					srv, cli := creds(b, m.server), creds(b, m.client)
					addr := serve(b, func(raw net.Conn) error {
						_, err := srv.Server(context.Background(), raw)
						return err
					})
					b.SetParallelism(1)
					measure(b, func() {
						b.RunParallel(func(pb *testing.PB) {
							for pb.Next() {
								conn, err := cli.Dial(context.Background(), "tcp", addr)
								if err != nil {
									b.Error(err)
									return
								}
								conn.Close()
							}
						})
					})
				})
			}
		})
	}
}

// attestPair is one direction of attestation: issuer attests in role, validator checks it.
type attestPair struct {
	issuer    attestation.Issuer
	validator attestation.Validator
	role      atls.Role
}

// attestedLimit does what no handshake that attests per connection can avoid: a TLS 1.3
// handshake, then for each pair one quote and one validation bound to its exporter.
func attestedLimit(handshake func() (*tls.Conn, error), pairs []attestPair) error {
	conn, err := handshake()
	if err != nil {
		return err
	}
	defer conn.Close()
	state := conn.ConnectionState()
	exporter, err := state.ExportKeyingMaterial(atls.ExporterLabel, nil, 32)
	if err != nil {
		return err
	}
	ctx := context.Background()
	for _, p := range pairs {
		purpose := attestation.PurposeATLSServer
		if p.role == atls.RoleClient {
			purpose = attestation.PurposeATLSClient
		}
		evidence, err := p.issuer.Issue(ctx, purpose, exporter)
		if err != nil {
			return err
		}
		if _, err := p.validator.Validate(ctx, evidence, purpose, exporter); err != nil {
			return err
		}
	}
	return nil
}

// BenchmarkNewCredentials: credentials a client makes per connection (the CLI, a joining
// node) cost no key pair or certificate; the server role's certificate is made on first use.
func BenchmarkNewCredentials(b *testing.B) {
	validators := []attestation.Validator{bootNode(b, vtpmtest.Simulator(b)).validator(b)}
	b.ResetTimer()
	for b.Loop() {
		if _, err := atls.NewCredentials(atls.Config{Validators: validators}); err != nil {
			b.Fatal(err)
		}
	}
}
