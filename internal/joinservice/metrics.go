package joinservice

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	tickets    *prometheus.CounterVec
	rejections *prometheus.CounterVec
	latency    *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		tickets: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "constellation", Subsystem: "joinservice", Name: "tickets_issued_total",
			Help: "Tickets and volume keys issued, by method (join, rejoin, volume-key) and role (worker, control-plane; any for rejoin and volume-key).",
		}, []string{"method", "role"}),
		rejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "constellation", Subsystem: "joinservice", Name: "rejections_total",
			Help: "Refused admissions, by stage (accept, handshake, join, rejoin, volume-key) and reason (accept: peer-busy, busy, displaced, timeout; handshake: rate-limited, peer-busy, busy, peer-table-full, measurement-mismatch, untrusted-signer, ...; join, rejoin: certificate-request, ...; volume-key: invalid-volume-id, volume-unknown, volume-not-attached, volume-not-used-by-node, ...).",
		}, []string{"stage", "reason"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "constellation", Subsystem: "joinservice", Name: "decision_duration_seconds",
			Help:    "Time from the accepted connection (stage accept), the start of the handshake (rejections there) or of the request to the decision.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}, []string{"stage", "decision"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.tickets, m.rejections, m.latency} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("registering join service metrics: %w", err)
			}
		}
	}
	return m, nil
}
