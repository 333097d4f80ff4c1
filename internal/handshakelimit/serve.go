package handshakelimit

import (
	"context"
	"net"
	"net/http"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/stats"
)

// GRPCServer is a gRPC server whose listeners pass an AcceptLimiter. Every server of a node
// that faces anonymous peers is built by NewGRPCServer (through its service's constructor),
// so no connection skips step 0.
type GRPCServer struct {
	*grpc.Server
	accept *AcceptLimiter
}

// NewGRPCServer returns a gRPC server with creds (nil: plaintext) whose listeners pass accept.
// A connection stays pending until gRPC has set up its transport: the credentials' handshake
// (for aTLS the attested one, Admit included) and the HTTP/2 preface. gRPC's own deadline
// for that (ConnectionTimeout, 120 s by default) is set to accept's Timeout, which the
// limiter enforces anyway.
func NewGRPCServer(accept *AcceptLimiter, creds credentials.TransportCredentials, opts ...grpc.ServerOption) *GRPCServer {
	base := []grpc.ServerOption{
		grpc.StatsHandler(establishedHandler{accept}), grpc.ConnectionTimeout(accept.limits.Timeout),
		// No read buffer of gRPC's own (32 KiB per connection by default): the transport
		// below is TLS, whose connection already holds a decrypted record, and these
		// servers' peers send a request or two per connection. Measured on the join path:
		// about a sixth of the service's allocations per join (docs/benchmarks.md).
		grpc.ReadBufferSize(0),
	}
	if creds != nil {
		base = append(base, grpc.Creds(creds))
	}
	return &GRPCServer{Server: grpc.NewServer(append(base, opts...)...), accept: accept}
}

// Serve serves on ln through the server's AcceptLimiter.
func (s *GRPCServer) Serve(ln net.Listener) error { return s.Server.Serve(s.accept.Listener(ln)) }

// AcceptLimiter returns the limiter the server's listeners pass.
func (s *GRPCServer) AcceptLimiter() *AcceptLimiter { return s.accept }

// establishedHandler ends a connection's pending state when gRPC tags it: gRPC does so once
// the transport is up (credentials handshake and HTTP/2 preface done), before any stream.
type establishedHandler struct{ l *AcceptLimiter }

func (h establishedHandler) TagConn(ctx context.Context, info *stats.ConnTagInfo) context.Context {
	h.l.EstablishedAddrs(info.LocalAddr, info.RemoteAddr)
	return ctx
}

func (establishedHandler) HandleConn(context.Context, stats.ConnStats) {}

func (establishedHandler) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context {
	return ctx
}

func (establishedHandler) HandleRPC(context.Context, stats.RPCStats) {}

// HTTPServer is an HTTP server whose listeners pass an AcceptLimiter.
type HTTPServer struct {
	*http.Server
	accept *AcceptLimiter
}

// NewHTTPServer makes srv's listeners pass accept. A connection stays pending until the
// header of its first request has been read (http.StateActive), or it is closed; keep
// srv.ReadHeaderTimeout at most accept's Timeout, which the limiter enforces anyway.
func NewHTTPServer(accept *AcceptLimiter, srv *http.Server) *HTTPServer {
	next := srv.ConnState
	srv.ConnState = func(c net.Conn, state http.ConnState) {
		if state == http.StateActive {
			accept.Established(c)
		}
		if next != nil {
			next(c, state)
		}
	}
	return &HTTPServer{Server: srv, accept: accept}
}

// Serve serves on ln through the server's AcceptLimiter.
func (s *HTTPServer) Serve(ln net.Listener) error { return s.Server.Serve(s.accept.Listener(ln)) }
