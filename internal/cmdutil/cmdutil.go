// Package cmdutil is what the service mains share: flags that may also come from the
// environment, JSON logs, the optional metrics endpoint, and running servers until the
// process is told to stop.
package cmdutil

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/openconstellation/constellation/internal/handshakelimit"
)

// EnvName is the environment variable of a flag: prefix + the flag's name in upper case with
// '-' as '_' (prefix "CONSTELLATION_", flag "tpm" → CONSTELLATION_TPM).
func EnvName(prefix, flagName string) string {
	return prefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// ParseFlags parses args into fs. A flag not given on the command line takes the value of
// its environment variable (EnvName) when that is set; the command line wins.
func ParseFlags(fs *flag.FlagSet, args []string, envPrefix string, getenv func(string) string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var problems []error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] {
			return
		}
		env := EnvName(envPrefix, f.Name)
		if v := getenv(env); v != "" {
			if err := fs.Set(f.Name, v); err != nil {
				problems = append(problems, fmt.Errorf("%s: %w", env, err))
			}
		}
	})
	return errors.Join(problems...)
}

// Logger returns a JSON logger at level (debug, info, warn, error) writing to w.
func Logger(w io.Writer, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: %w", level, err)
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: l})), nil
}

// Registry returns a metrics registry with the Go runtime and process collectors.
func Registry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// Server is one listener's server, run by Run.
type Server struct {
	Name string
	Addr string
	// Serve serves on ln until it fails or Stop is called.
	Serve func(ln net.Listener) error
	// Stop ends Serve, gracefully within ctx.
	Stop func(ctx context.Context)
}

// GRPCServer is what GRPC serves: a *grpc.Server, or a server whose Serve guards its
// listener (handshakelimit.GRPCServer).
type GRPCServer interface {
	Serve(ln net.Listener) error
	GracefulStop()
	Stop()
}

// GRPC returns a Server for g.
func GRPC(name, addr string, g GRPCServer) Server {
	return Server{Name: name, Addr: addr, Serve: g.Serve, Stop: func(ctx context.Context) {
		done := make(chan struct{})
		go func() { g.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
			g.Stop()
		}
	}}
}

// HTTP returns a Server for h, with timeouts fit for small requests. When accept is set, its
// listener passes accept (handshakelimit.NewHTTPServer): connections that have not sent a
// request header yet are bounded when they are accepted.
func HTTP(name, addr string, h http.Handler, accept *handshakelimit.AcceptLimiter) Server {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    16 << 10,
	}
	serve := srv.Serve
	if accept != nil {
		serve = handshakelimit.NewHTTPServer(accept, srv).Serve
	}
	return Server{Name: name, Addr: addr, Serve: func(ln net.Listener) error {
		if err := serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}, Stop: func(ctx context.Context) { _ = srv.Shutdown(ctx) }}
}

// Metrics returns a Server of reg's metrics at /metrics.
func Metrics(addr string, reg *prometheus.Registry) Server {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	return HTTP("metrics", addr, mux, nil)
}

// StopTimeout bounds a graceful stop.
const StopTimeout = 10 * time.Second

// Run listens on every server's address, then serves until ctx ends (a clean stop: nil) or
// a server fails (its error), and stops all servers. A listen failure stops the others
// before anything is served.
func Run(ctx context.Context, log *slog.Logger, servers ...Server) error {
	lns := make([]net.Listener, 0, len(servers))
	for _, s := range servers {
		ln, err := net.Listen("tcp", s.Addr)
		if err != nil {
			for _, l := range lns {
				l.Close()
			}
			return fmt.Errorf("%s: %w", s.Name, err)
		}
		lns = append(lns, ln)
	}
	errs := make(chan error, len(servers))
	for i, s := range servers {
		log.Info("serving", "server", s.Name, "addr", lns[i].Addr().String())
		go func() {
			err := s.Serve(lns[i])
			if err == nil {
				err = errors.New("stopped serving")
			}
			errs <- fmt.Errorf("%s: %w", s.Name, err)
		}()
	}
	var err error
	select {
	case <-ctx.Done():
		log.Info("stopping")
	case err = <-errs:
		log.Error("server failed; stopping", "error", err)
	}
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), StopTimeout)
	defer cancel()
	for _, s := range servers {
		s.Stop(stopCtx)
	}
	return err
}
