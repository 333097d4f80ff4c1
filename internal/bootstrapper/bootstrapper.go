// Package bootstrapper is the first service on every node (DESIGN 1.2). It brings the node
// into its cluster and then exits:
//
//   - a rebooted node (its state storage belongs to a cluster) asks a join service for a
//     rejoin ticket, re-enters (PCR 15, unlock) and restarts the kubelet;
//   - a fresh node serves the init server (control-plane nodes only) and runs the join
//     client in parallel. The one-shot node lock decides which one commits the node; the
//     other stops (the join client as soon as the lock is taken, the init server when Run
//     returns).
//
// The parts: node (lock + storage commit order), nodelock, initserver, joinclient.
package bootstrapper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"

	"google.golang.org/grpc"

	"github.com/openconstellation/constellation/internal/bootstrapper/initserver"
	"github.com/openconstellation/constellation/internal/bootstrapper/joinclient"
	"github.com/openconstellation/constellation/internal/bootstrapper/node"
)

// Config is what Run drives.
type Config struct {
	Node *node.Node
	// InitServer and InitListener: control-plane nodes only (nil on workers).
	InitServer   *initserver.Server
	InitListener net.Listener
	JoinClient   *joinclient.Client
	Log          *slog.Logger
}

// How a node came into its cluster.
const (
	ByInit   = "init"
	ByJoin   = "join"
	ByRejoin = "rejoin"
)

// Run brings the node into its cluster and reports how (ByInit, ByJoin, ByRejoin). It
// returns an error if that failed (the node then needs to be recreated or rebooted), or
// when ctx ends first.
func Run(ctx context.Context, cfg Config) (string, error) {
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	switch cfg.Node.State() {
	case node.Rebooted:
		log.Info("state storage belongs to a cluster: rejoining")
		if err := cfg.JoinClient.Rejoin(ctx); err != nil {
			return "", fmt.Errorf("rejoin: %w", err)
		}
		return ByRejoin, nil
	case node.Fresh:
	default:
		return "", fmt.Errorf("node in unknown state %v", cfg.Node.State())
	}

	initDone := make(chan struct{}) // never closed on workers
	if cfg.InitServer != nil {
		if cfg.InitListener == nil {
			return "", errors.New("init server without a listener")
		}
		g := grpc.NewServer(grpc.Creds(cfg.InitServer.Credentials()))
		cfg.InitServer.Register(g)
		serveErr := make(chan error, 1)
		go func() { serveErr <- g.Serve(cfg.InitListener) }()
		// GracefulStop lets a running Init send its last messages.
		defer g.GracefulStop()
		initDone = make(chan struct{})
		go func() {
			select {
			case <-cfg.InitServer.Finished():
				close(initDone)
			case err := <-serveErr:
				log.Error("init server stopped", "err", err)
			case <-ctx.Done():
			}
		}()
		log.Info("serving init", "addr", cfg.InitListener.Addr().String())
	}

	joinErr := make(chan error, 1)
	go func() { joinErr <- cfg.JoinClient.Join(ctx) }()
	select {
	case err := <-joinErr:
		if err == nil {
			log.Info("joined the cluster")
			return ByJoin, nil
		}
		if !errors.Is(err, joinclient.ErrInitWon) {
			return "", fmt.Errorf("join: %w", err)
		}
		log.Info("init took the node lock: waiting for it to finish")
		select {
		case <-initDone:
		case <-ctx.Done():
			return "", ctx.Err()
		}
	case <-initDone:
		// The join client stops by itself once the lock is taken.
		<-joinErr
	}
	if err := cfg.InitServer.Err(); err != nil {
		return "", fmt.Errorf("init: %w", err)
	}
	log.Info("initialized the cluster")
	return ByInit, nil
}
