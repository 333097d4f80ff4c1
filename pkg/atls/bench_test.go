package atls_test

import (
	"context"
	"crypto/tls"
	"net"
	"testing"

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

func reportRate(b *testing.B) {
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "handshakes/s")
}

// BenchmarkHandshake measures attested handshakes per second over loopback with 2 concurrent
// clients (one per core), server and client in this process.
func BenchmarkHandshake(b *testing.B) {
	b.Run("plain-tls13", func(b *testing.B) {
		cert, err := atls.EphemeralCert()
		require.NoError(b, err)
		addr := serve(b, func(raw net.Conn) error {
			return tls.Server(raw, &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}, SessionTicketsDisabled: true}).Handshake()
		})
		b.SetParallelism(1)
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				conn, err := tls.Dial("tcp", addr, &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true})
				if err != nil {
					b.Error(err)
					return
				}
				conn.Close()
			}
		})
		reportRate(b)
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
			for _, m := range modes {
				b.Run(m.name, func(b *testing.B) {
					srv, cli := creds(b, m.server), creds(b, m.client)
					addr := serve(b, func(raw net.Conn) error {
						_, err := srv.Server(context.Background(), raw)
						return err
					})
					b.SetParallelism(1)
					b.ResetTimer()
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
					reportRate(b)
				})
			}
		})
	}
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
