// Package verifyservice is the verification service (docs/design.md "1.7 Verification from
// outside"; its client is pkg/verify): a node answers a caller's fresh nonce with evidence of
// its current state, over gRPC and HTTP, and `constellation verify` checks that evidence
// against its reference values and the node's PCR 15 against the cluster ID it expects, so a
// user knows they talk to their cluster.
//
// The evidence is self-authenticating (the node's attestation key signs the PCR values and the
// caller's nonce), so the service is served without TLS. It proves the node's state when it
// answered, and nothing about later connections to that address.
//
// The node's TPM is a swtpm that serves one connection at a time, shared with the
// bootstrapper and the other services of the node: give the server a vtpm.PerUseIssuer.
// Anyone who reaches the port makes the node quote, so before a request touches the TPM the
// server applies a handshakelimit.Limiter: a rate and a bound on requests in progress per
// caller address, and a bound on requests in progress in total (MaxWaiting). Requests
// beyond a bound are refused at once. Before that, connections that have not sent their
// first request (gRPC: the HTTP/2 preface; HTTP: the request header) are bounded from the
// moment they are accepted (AcceptLimits, handshakelimit.AcceptLimiter), so connections
// that stall cost at most a socket.
package verifyservice

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"net/url"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/openconstellation/constellation/internal/handshakelimit"
	"github.com/openconstellation/constellation/pkg/api/verify/verifypb"
	"github.com/openconstellation/constellation/pkg/attestation"
)

// Defaults of Config.
const (
	DefaultIssueTimeout = 10 * time.Second
	DefaultMaxWaiting   = 16
	// DefaultPeerRate and DefaultPeerBurst: `constellation verify` asks each node once per
	// run; a monitoring loop a few times a minute.
	DefaultPeerRate   = rate.Limit(1)
	DefaultPeerBurst  = 10
	DefaultMaxPerPeer = 2
)

// DefaultAcceptLimits bound, per protocol, the connections that have not sent their first
// request yet: a caller needs one at a time. The deadline is above the HTTP server's
// ReadHeaderTimeout (cmdutil.HTTP, 5 s), which so stays the one an HTTP caller meets first.
var DefaultAcceptLimits = handshakelimit.AcceptLimits{PerPeer: 4, Total: 256, Timeout: 10 * time.Second}

// HTTPPath is the path of the HTTP endpoint: GET HTTPPath?nonce=<hex>.
const HTTPPath = "/v1/attest"

// Config configures the server.
type Config struct {
	// Issuer issues the node's evidence (a vtpm.PerUseIssuer on a swtpm node).
	Issuer attestation.Issuer
	// IssueTimeout bounds one request's wait for the TPM and its quote (DefaultIssueTimeout).
	IssueTimeout time.Duration
	// MaxWaiting bounds the requests being answered at once (DefaultMaxWaiting); more are
	// refused with ResourceExhausted (gRPC) or 503 (HTTP).
	MaxWaiting int
	// PeerRate and PeerBurst bound the requests of one caller address (per second, and at
	// once after idling; DefaultPeerRate, DefaultPeerBurst); MaxPerPeer its requests in
	// progress (DefaultMaxPerPeer). More are refused with ResourceExhausted (gRPC) or 429
	// (HTTP).
	PeerRate   rate.Limit
	PeerBurst  int
	MaxPerPeer int
	// AcceptLimits bound, per protocol, the connections that have not sent their first
	// request yet (DefaultAcceptLimits for unset limits); their Timeout closes them.
	AcceptLimits handshakelimit.AcceptLimits
	// Now is the limiter's clock (time.Now when nil).
	Now func() time.Time
	Log *slog.Logger
	// Registerer, when set, receives the server's metrics.
	Registerer prometheus.Registerer
}

// Server answers nonces with evidence.
type Server struct {
	verifypb.UnimplementedVerificationServiceServer
	cfg     Config
	limiter *handshakelimit.Limiter
	// grpcAccept and httpAccept bound each listener's connections before their first
	// request.
	grpcAccept, httpAccept *handshakelimit.AcceptLimiter
	metrics                *metrics
}

// New checks cfg and returns a server.
func New(cfg Config) (*Server, error) {
	if cfg.Issuer == nil {
		return nil, errors.New("verification service: no issuer")
	}
	if cfg.IssueTimeout <= 0 {
		cfg.IssueTimeout = DefaultIssueTimeout
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	// Requests do not queue for the TPM beyond MaxWaiting: Waiting stays zero.
	limiter, err := handshakelimit.New(handshakelimit.Limits{
		Rate: cfg.PeerRate, Burst: cfg.PeerBurst, PerPeer: cfg.MaxPerPeer, Concurrent: cfg.MaxWaiting,
	}.Or(handshakelimit.Limits{
		Rate: DefaultPeerRate, Burst: DefaultPeerBurst, PerPeer: DefaultMaxPerPeer, Concurrent: DefaultMaxWaiting,
		What: "attestation requests",
	}), cfg.Now)
	if err != nil {
		return nil, fmt.Errorf("verification service: %w", err)
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, limiter: limiter, metrics: m}
	accept := cfg.AcceptLimits.Or(DefaultAcceptLimits)
	if s.grpcAccept, err = handshakelimit.NewAcceptLimiter(accept, s.observeAccept("grpc")); err != nil {
		return nil, fmt.Errorf("verification service: %w", err)
	}
	if s.httpAccept, err = handshakelimit.NewAcceptLimiter(accept, s.observeAccept("http")); err != nil {
		return nil, fmt.Errorf("verification service: %w", err)
	}
	return s, nil
}

// NewGRPCServer returns the gRPC server to serve s with: connections bounded from the moment
// they are accepted until their HTTP/2 preface, the service registered. opts are added.
func (s *Server) NewGRPCServer(opts ...grpc.ServerOption) *handshakelimit.GRPCServer {
	g := handshakelimit.NewGRPCServer(s.grpcAccept, nil, opts...)
	verifypb.RegisterVerificationServiceServer(g, s)
	return g
}

// HTTPAcceptLimiter bounds the HTTP listener's connections until their first request header:
// serve s with cmdutil.HTTP(name, addr, s, s.HTTPAcceptLimiter()).
func (s *Server) HTTPAcceptLimiter() *handshakelimit.AcceptLimiter { return s.httpAccept }

// observeAccept counts what the accept-time bound did to a connection of protocol, as result
// "accept-" + the outcome (peer-busy, busy, displaced, timeout).
func (s *Server) observeAccept(protocol string) func(netip.Addr, string) {
	return func(remote netip.Addr, outcome string) {
		s.metrics.requests.WithLabelValues(protocol, "accept-"+outcome).Inc()
		// Debug, not Warn: a flood would flood the log; the counter has the numbers.
		s.cfg.Log.Debug("connection refused before its first request", "protocol", protocol, "peer", remote.String(), "outcome", outcome)
	}
}

// Failure kinds of a request; each maps to a gRPC code and an HTTP status.
var (
	errBadRequest  = errors.New("invalid request")
	errBusy        = errors.New("too many requests waiting for the TPM")
	errRateLimited = errors.New("too many requests from this caller")
	errIssue       = errors.New("issuing evidence failed")
)

// GetAttestation implements the gRPC service.
func (s *Server) GetAttestation(ctx context.Context, req *verifypb.GetAttestationRequest) (*verifypb.GetAttestationResponse, error) {
	var remote netip.Addr
	if p, ok := peer.FromContext(ctx); ok {
		remote = handshakelimit.AddrOf(p.Addr)
	}
	evidence, err := s.attest(ctx, "grpc", remote, req.GetNonce())
	if err != nil {
		code := codes.Internal
		switch {
		case errors.Is(err, errBadRequest):
			code = codes.InvalidArgument
		case errors.Is(err, errBusy), errors.Is(err, errRateLimited):
			code = codes.ResourceExhausted
		case errors.Is(err, errIssue):
			code = codes.Unavailable
		}
		return nil, status.Error(code, err.Error())
	}
	return &verifypb.GetAttestationResponse{Evidence: evidence, Variant: s.cfg.Issuer.Variant().String()}, nil
}

// HTTPResponse is the JSON body of a successful HTTP request.
type HTTPResponse struct {
	Variant string `json:"variant"`
	// Evidence is standard base64 (RFC 4648 section 4, with padding).
	Evidence string `json:"evidence"`
}

// HTTPError is the JSON body of a failed HTTP request.
type HTTPError struct {
	Error string `json:"error"`
}

// ServeHTTP serves GET HTTPPath?nonce=<hex>: 200 with an HTTPResponse, or 400 (bad nonce),
// 405 (not GET), 429 (too many requests from this caller), 503 (TPM busy or failing) with an
// HTTPError.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != HTTPPath {
		writeJSON(w, http.StatusNotFound, HTTPError{Error: fmt.Sprintf("no such endpoint %q; use GET %s?nonce=<hex>", r.URL.Path, HTTPPath)})
		return
	}
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		writeJSON(w, http.StatusMethodNotAllowed, HTTPError{Error: fmt.Sprintf("method %s not allowed; use GET %s?nonce=<hex>", r.Method, HTTPPath)})
		return
	}
	nonce, err := ParseNonceQuery(r.URL.RawQuery)
	if err != nil {
		s.count("http", "invalid-request", time.Now())
		writeJSON(w, http.StatusBadRequest, HTTPError{Error: fmt.Sprintf("%v: %v", errBadRequest, err)})
		return
	}
	var remote netip.Addr
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
		remote = ap.Addr().Unmap()
	}
	evidence, err := s.attest(r.Context(), "http", remote, nonce)
	if err != nil {
		code := http.StatusInternalServerError
		switch {
		case errors.Is(err, errBadRequest):
			code = http.StatusBadRequest
		case errors.Is(err, errRateLimited):
			code = http.StatusTooManyRequests
			w.Header().Set("Retry-After", "1")
		case errors.Is(err, errBusy), errors.Is(err, errIssue):
			code = http.StatusServiceUnavailable
			w.Header().Set("Retry-After", "1")
		}
		writeJSON(w, code, HTTPError{Error: err.Error()})
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, HTTPResponse{Variant: s.cfg.Issuer.Variant().String(), Evidence: base64.StdEncoding.EncodeToString(evidence)})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// attest checks nonce and issues evidence for it, within the server's bounds: the limiter
// decides before the TPM is touched.
func (s *Server) attest(ctx context.Context, protocol string, remote netip.Addr, nonce []byte) ([]byte, error) {
	start := time.Now()
	if err := CheckNonce(nonce); err != nil {
		s.count(protocol, "invalid-request", start)
		return nil, fmt.Errorf("%w: %w", errBadRequest, err)
	}
	release, err := s.limiter.AdmitAddr(ctx, remote)
	if err != nil {
		reason := handshakelimit.Reason(err)
		s.count(protocol, reason, start)
		// Debug, not Warn: a flood would flood the log; the counter has the numbers.
		s.cfg.Log.Debug("attestation refused", "protocol", protocol, "peer", remote.String(), "reason", reason, "error", err)
		if reason == "busy" || reason == "peer-table-full" {
			return nil, fmt.Errorf("%w (limit %d); retry later", errBusy, s.limiter.Limits().Concurrent)
		}
		return nil, fmt.Errorf("%w: %w", errRateLimited, err)
	}
	defer release()
	ctx, cancel := context.WithTimeout(ctx, s.cfg.IssueTimeout)
	defer cancel()
	evidence, err := s.cfg.Issuer.Issue(ctx, attestation.PurposeVerify, nonce)
	if err != nil {
		s.count(protocol, "issue-failed", start)
		s.cfg.Log.Error("issuing evidence failed", "protocol", protocol, "error", err)
		return nil, fmt.Errorf("%w: %w", errIssue, err)
	}
	s.count(protocol, "ok", start)
	s.cfg.Log.Debug("evidence issued", "protocol", protocol, "bytes", len(evidence), "duration", time.Since(start))
	return evidence, nil
}

func (s *Server) count(protocol, result string, start time.Time) {
	s.metrics.requests.WithLabelValues(protocol, result).Inc()
	s.metrics.latency.WithLabelValues(protocol).Observe(time.Since(start).Seconds())
}

// CheckNonce checks the size of a nonce (attestation.MinNonceSize..MaxNonceSize bytes).
func CheckNonce(nonce []byte) error {
	if len(nonce) < attestation.MinNonceSize || len(nonce) > attestation.MaxNonceSize {
		return fmt.Errorf("nonce of %d bytes, want %d..%d", len(nonce), attestation.MinNonceSize, attestation.MaxNonceSize)
	}
	return nil
}

// ParseNonceQuery parses the raw query of an HTTP request: exactly one parameter, nonce, whose
// value is the nonce in hex (either case), attestation.MinNonceSize..MaxNonceSize bytes.
func ParseNonceQuery(rawQuery string) ([]byte, error) {
	// Bound the work before parsing: a valid query is "nonce=" and at most 128 hex digits.
	if max := len("nonce=") + 2*attestation.MaxNonceSize; len(rawQuery) > max {
		return nil, fmt.Errorf("query of %d bytes is longer than a nonce query can be (%d)", len(rawQuery), max)
	}
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return nil, fmt.Errorf("malformed query: %w", err)
	}
	for k := range q {
		if k != "nonce" {
			return nil, fmt.Errorf("unknown query parameter %q (only nonce is accepted)", k)
		}
	}
	values := q["nonce"]
	switch len(values) {
	case 0:
		return nil, fmt.Errorf("no nonce: use ?nonce=<%d..%d bytes in hex>", attestation.MinNonceSize, attestation.MaxNonceSize)
	case 1:
	default:
		return nil, fmt.Errorf("nonce given %d times", len(values))
	}
	return ParseNonceHex(values[0])
}

// ParseNonceHex decodes a hex nonce and checks its size.
func ParseNonceHex(s string) ([]byte, error) {
	if len(s) > 2*attestation.MaxNonceSize {
		return nil, fmt.Errorf("nonce of %d hex digits, want at most %d", len(s), 2*attestation.MaxNonceSize)
	}
	nonce, err := hex.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("nonce is not hex: %w", err)
	}
	if err := CheckNonce(nonce); err != nil {
		return nil, err
	}
	return nonce, nil
}

type metrics struct {
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "constellation", Subsystem: "verificationservice", Name: "requests_total",
			Help: "Attestation requests by protocol (grpc, http) and result (ok, invalid-request, rate-limited, peer-busy, busy, peer-table-full, issue-failed), and connections closed before their first request (accept-peer-busy, accept-busy, accept-displaced, accept-timeout).",
		}, []string{"protocol", "result"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "constellation", Subsystem: "verificationservice", Name: "request_duration_seconds",
			Help:    "Time to answer an attestation request, including the wait for the TPM.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}, []string{"protocol"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.requests, m.latency} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("registering verification service metrics: %w", err)
			}
		}
	}
	return m, nil
}
