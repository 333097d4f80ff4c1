package keyservice

import (
	"context"
	"testing"

	"github.com/openconstellation/constellation/internal/pki"
)

// BenchmarkGetDataKey measures key requests over the real gRPC + mutual TLS path, on one
// established connection, from parallel callers (as the join service calls it).
func BenchmarkGetDataKey(b *testing.B) {
	f := startServer(b)
	c := f.client(b, tlsCert(b, f.ca, pki.Leaf{CommonName: "joinservice", Client: true}))
	if _, err := c.DataKey(context.Background(), "measurementSecret", 32); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := c.DataKey(context.Background(), "3f2504e0-4f89-11d3-9a0c-0305e82c3301", 32); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "keys/s")
}
