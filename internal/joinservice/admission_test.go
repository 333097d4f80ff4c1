package joinservice

import (
	"context"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"

	"github.com/openconstellation/constellation/internal/attestation"
)

func TestRateLimiter(t *testing.T) {
	now := time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)
	r := newRateLimiter(rate.Limit(1), 2, func() time.Time { return now })
	a, b := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")

	require.NoError(t, r.allow(a))
	require.NoError(t, r.allow(a))
	err := r.allow(a)
	require.ErrorIs(t, err, errRateLimited)
	assert.ErrorContains(t, err, "too many join attempts from 10.0.0.1 (limit 1/s, burst 2)")
	require.NoError(t, r.allow(b), "peers have separate buckets")

	now = now.Add(time.Second)
	require.NoError(t, r.allow(a), "the bucket refills")
	require.ErrorIs(t, r.allow(a), errRateLimited)
}

func TestRateLimiterForgetsIdlePeers(t *testing.T) {
	now := time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)
	r := newRateLimiter(rate.Limit(1), 1, func() time.Time { return now })
	for i := range maxTrackedPeers {
		now = now.Add(time.Millisecond)
		require.NoError(t, r.allow(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})))
	}
	require.Len(t, r.peers, maxTrackedPeers)
	require.NoError(t, r.allow(netip.MustParseAddr("192.0.2.1")))
	assert.Less(t, len(r.peers), maxTrackedPeers, "memory stays bounded")
	assert.Contains(t, r.peers, netip.MustParseAddr("192.0.2.1"))
	// The most recent peer keeps its (empty) bucket.
	assert.ErrorIs(t, r.allow(netip.AddrFrom4([4]byte{10, 0, 255, 255})), errRateLimited)
}

type blockingValidator struct {
	attestation.Validator
	inFlight, peak atomic.Int32
	release        chan struct{}
}

func (b *blockingValidator) Validate(context.Context, []byte, attestation.Purpose, []byte) (*attestation.Verified, error) {
	n := b.inFlight.Add(1)
	for {
		p := b.peak.Load()
		if n <= p || b.peak.CompareAndSwap(p, n) {
			break
		}
	}
	<-b.release
	b.inFlight.Add(-1)
	return &attestation.Verified{}, nil
}

func TestBoundedValidator(t *testing.T) {
	inner := &blockingValidator{release: make(chan struct{})}
	v := boundedValidator{inner, make(chan struct{}, 2)}
	done := make(chan error, 5)
	for range 5 {
		go func() {
			_, err := v.Validate(context.Background(), nil, attestation.PurposeATLSClient, nil)
			done <- err
		}()
	}
	require.Eventually(t, func() bool { return inner.inFlight.Load() == 2 }, 5*time.Second, time.Millisecond)

	// A waiter whose handshake deadline passes gives up without validating.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := v.Validate(ctx, nil, attestation.PurposeATLSClient, nil)
	require.ErrorIs(t, err, context.Canceled)

	close(inner.release)
	for range 5 {
		require.NoError(t, <-done)
	}
	assert.Equal(t, int32(2), inner.peak.Load(), "never more than 2 validations at once")
}
