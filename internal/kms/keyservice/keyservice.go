// Package keyservice serves keys derived from the master secret (docs/design.md "2.2 Derived
// keys") over gRPC with mutual TLS: only callers with a client certificate from the cluster's
// key-service client CA are served, and each only for the key ids its Policy grants
// (docs/design.md "1.9 The key service answers only whom it must").
package keyservice

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/openconstellation/constellation/api/kms/kmspb"
	"github.com/openconstellation/constellation/internal/kms"
)

// Key lengths a caller may ask for. Below 16 bytes a key is too weak for anything we derive;
// 512 bytes covers every key (a LUKS2 XTS+HMAC key is 128 bytes) with room to spare.
const (
	MinKeyLength = 16
	MaxKeyLength = 512
)

// Server implements kmspb.KeyServiceServer.
type Server struct {
	kmspb.UnimplementedKeyServiceServer
	secret  kms.MasterSecret
	policy  Policy
	log     *slog.Logger
	metrics *metrics
}

// NewServer checks the secret and policy and returns a server. Metrics are registered with reg
// when it is not nil.
func NewServer(secret kms.MasterSecret, policy Policy, log *slog.Logger, reg prometheus.Registerer) (*Server, error) {
	if err := secret.Validate(); err != nil {
		return nil, err
	}
	if err := policy.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	return &Server{secret: secret, policy: policy, log: log, metrics: m}, nil
}

// GetDataKey derives the requested key for an authorized caller.
func (s *Server) GetDataKey(ctx context.Context, req *kmspb.GetDataKeyRequest) (*kmspb.GetDataKeyResponse, error) {
	start := time.Now()
	client, key, err := s.getDataKey(ctx, req)
	result := "ok"
	if err != nil {
		result = status.Code(err).String()
		s.log.Warn("key request refused", "client", client, "keyID", req.GetDataKeyId(), "length", req.GetLength(), "error", err)
	}
	s.metrics.requests.WithLabelValues(result).Inc()
	s.metrics.latency.Observe(time.Since(start).Seconds())
	if err != nil {
		return nil, err
	}
	return &kmspb.GetDataKeyResponse{DataKey: key}, nil
}

func (s *Server) getDataKey(ctx context.Context, req *kmspb.GetDataKeyRequest) (string, []byte, error) {
	client, err := clientName(ctx)
	if err != nil {
		return "", nil, status.Error(codes.Unauthenticated, err.Error())
	}
	if err := ValidKeyID(req.GetDataKeyId()); err != nil {
		return client, nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if n := req.GetLength(); n < MinKeyLength || n > MaxKeyLength {
		return client, nil, status.Errorf(codes.InvalidArgument, "key length %d out of range %d..%d", n, MinKeyLength, MaxKeyLength)
	}
	if !s.policy.Allows(client, req.GetDataKeyId()) {
		return client, nil, status.Errorf(codes.PermissionDenied, "client %q may not derive key %q", client, req.GetDataKeyId())
	}
	key, err := s.secret.DeriveKey(req.GetDataKeyId(), int(req.GetLength()))
	if err != nil {
		return client, nil, status.Error(codes.Internal, err.Error())
	}
	return client, key, nil
}

// clientName is the common name of the caller's verified client certificate.
func clientName(ctx context.Context) (string, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return "", errors.New("no peer")
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return "", errors.New("no verified client certificate")
	}
	return info.State.VerifiedChains[0][0].Subject.CommonName, nil
}

// ServerTLS returns the server's TLS configuration: TLS 1.3, a client certificate from
// clientCAs required and verified.
func ServerTLS(cert tls.Certificate, clientCAs *x509.CertPool) *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    clientCAs,
	}
}

// Register adds the server to a gRPC server.
func (s *Server) Register(g *grpc.Server) { kmspb.RegisterKeyServiceServer(g, s) }

type metrics struct {
	requests *prometheus.CounterVec
	latency  prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "constellation", Subsystem: "keyservice", Name: "requests_total",
			Help: "Key requests by result (ok or the gRPC status code).",
		}, []string{"result"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "constellation", Subsystem: "keyservice", Name: "request_duration_seconds",
			Help: "Time to answer a key request.", Buckets: prometheus.ExponentialBuckets(0.00001, 4, 10),
		}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.requests, m.latency} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("registering key service metrics: %w", err)
			}
		}
	}
	return m, nil
}

// Client asks a key service for keys.
type Client struct {
	conn *grpc.ClientConn
	api  kmspb.KeyServiceClient
}

// NewClient connects (lazily) to the key service at addr with the caller's client certificate,
// trusting serverCAs for the service's certificate with serverName.
func NewClient(addr, serverName string, cert tls.Certificate, serverCAs *x509.CertPool) (*Client, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		RootCAs:      serverCAs,
		ServerName:   serverName,
	})))
	if err != nil {
		return nil, fmt.Errorf("key service client: %w", err)
	}
	return &Client{conn: conn, api: kmspb.NewKeyServiceClient(conn)}, nil
}

// DefaultTimeout bounds a key request when the context has no deadline.
const DefaultTimeout = 10 * time.Second

// DataKey returns the key with id and length.
func (c *Client) DataKey(ctx context.Context, id string, length int) ([]byte, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	resp, err := c.api.GetDataKey(ctx, &kmspb.GetDataKeyRequest{DataKeyId: id, Length: uint32(length)})
	if err != nil {
		return nil, fmt.Errorf("key service: key %q: %w", id, err)
	}
	if len(resp.DataKey) != length {
		return nil, fmt.Errorf("key service: key %q has %d bytes, asked for %d", id, len(resp.DataKey), length)
	}
	return resp.DataKey, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// LoadCertAndCA reads one side's TLS material from dir (where Secret
// constellation-keyservice-tls is mounted): its pair certFile/keyFile and the CA caFile that
// issued both sides' certificates.
func LoadCertAndCA(dir, certFile, keyFile, caFile string) (tls.Certificate, *x509.CertPool, error) {
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, certFile), filepath.Join(dir, keyFile))
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("key service TLS pair in %s: %w", dir, err)
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, caFile))
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("key service TLS CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return tls.Certificate{}, nil, fmt.Errorf("key service TLS CA %s: no PEM certificate", filepath.Join(dir, caFile))
	}
	return cert, pool, nil
}
