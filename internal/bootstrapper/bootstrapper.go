// Package bootstrapper is the first service on every node (docs/design.md "1.2 The
// bootstrapper: init or join, decided once"). It brings the node into its cluster and then
// exits:
//
//   - a rebooted node (its state storage belongs to a cluster) asks a join service for a
//     rejoin ticket, re-enters (PCR 15, unlock) and restarts the kubelet. A rebooted
//     control plane also serves the recovery server: after a full-cluster shutdown no join
//     service answers, and `constellation recover` sends the keys instead. The node lock
//     decides which of the two re-enters the node; the other stops;
//   - a fresh node serves the init server (control-plane nodes only) and runs the join
//     client in parallel. The one-shot node lock decides which one commits the node; the
//     other stops (the join client as soon as the lock is taken, the init server when Run
//     returns).
//
// The parts: node (lock + storage commit order), nodelock, initserver, joinclient,
// recoveryserver.
package bootstrapper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/openconstellation/constellation/internal/bootstrapper/initserver"
	"github.com/openconstellation/constellation/internal/bootstrapper/joinclient"
	"github.com/openconstellation/constellation/internal/bootstrapper/node"
	"github.com/openconstellation/constellation/internal/bootstrapper/nodelock"
	"github.com/openconstellation/constellation/internal/bootstrapper/recoveryserver"
	"github.com/openconstellation/constellation/internal/metadata"
)

// Config is what Run drives.
type Config struct {
	Node *node.Node
	// InitServer and InitListener: fresh control-plane nodes only (nil on workers).
	InitServer   *initserver.Server
	InitListener net.Listener
	// RecoveryServer and RecoveryListener: rebooted control-plane nodes only (nil on
	// workers and fresh nodes).
	RecoveryServer   *recoveryserver.Server
	RecoveryListener net.Listener
	JoinClient       *joinclient.Client
	// Progress, when set, is told the node's phase as it changes (metadata.Phase constants), so
	// the platform can show it (for example "waiting-for-recovery" after a full-cluster
	// shutdown). It must not block.
	Progress func(phase string)
	// WaitingAfter is how long a rebooted node waits for its rejoin before it reports
	// that no join service answers (DefaultWaitingAfter).
	WaitingAfter time.Duration
	Log          *slog.Logger
}

// How a node came into its cluster.
const (
	ByInit    = "init"
	ByJoin    = "join"
	ByRejoin  = "rejoin"
	ByRecover = "recover"
)

// DefaultWaitingAfter: by then the join client's first attempt has failed and it has waited
// to try again (at most 0.6 s while nothing answers, 1 s after a refusal), with room for an
// attempt that is merely slow. A rejoin that has not taken the node lock by then found no
// join service answering.
const DefaultWaitingAfter = 2 * time.Second

// Run brings the node into its cluster and reports how (ByInit, ByJoin, ByRejoin,
// ByRecover). It returns an error if that failed (the node then needs to be recreated or
// rebooted), or when ctx ends first.
func Run(ctx context.Context, cfg Config) (string, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Progress == nil {
		cfg.Progress = func(string) {}
	}
	switch cfg.Node.State() {
	case node.Rebooted:
		return reenter(ctx, cfg)
	case node.Fresh:
		by, err := commit(ctx, cfg)
		if err == nil {
			cfg.Progress(map[string]string{ByInit: metadata.PhaseInitialized, ByJoin: metadata.PhaseJoined}[by])
		}
		return by, err
	default:
		return "", fmt.Errorf("node in unknown state %v", cfg.Node.State())
	}
}

// reenter brings a rebooted node back: by rejoin, or on a control plane by recovery,
// whichever delivers keys first (the node lock lets exactly one re-enter the node). In order:
//
//  1. on a control plane, serve the recovery server;
//  2. start the rejoin;
//  3. wait for whichever re-enters the node, saying after a while what it waits for.
func reenter(ctx context.Context, cfg Config) (string, error) {
	rejoinCtx, stopRejoin := context.WithCancel(ctx)
	defer stopRejoin()
	w, stopRecovery, err := serveRecovery(rejoinCtx, cfg)
	if err != nil {
		return "", err
	}
	// The recovery server stops when Run returns, whichever way the node came back.
	defer stopRecovery()
	rejoinErr := make(chan error, 1)
	go func() { rejoinErr <- cfg.JoinClient.Rejoin(rejoinCtx) }()
	return awaitReentry(ctx, cfg, w, rejoinErr, stopRejoin)
}

// reentryWait is what a rebooted node waits for besides its rejoin.
type reentryWait struct {
	// committed and finished are the recovery server's; never closed on workers.
	committed, finished <-chan struct{}
	// phase and msg are reported when neither came after Config.WaitingAfter.
	phase, msg string
}

// serveRecovery serves the recovery server of a control plane until rejoinCtx ends; the
// returned stop lets a running Recover answer. On a worker it serves nothing.
func serveRecovery(rejoinCtx context.Context, cfg Config) (reentryWait, func(), error) {
	log := cfg.Log
	rs := cfg.RecoveryServer
	if rs == nil {
		log.Info("state storage belongs to a cluster: rejoining")
		return reentryWait{
			phase: metadata.PhaseWaitingForJoinService,
			msg:   "no join service answers: waiting for the control planes to come back (the rejoin keeps retrying)",
		}, func() {}, nil
	}
	if cfg.RecoveryListener == nil {
		return reentryWait{}, nil, errors.New("recovery server without a listener")
	}
	g := rs.NewGRPCServer()
	serveErr := make(chan error, 1)
	go func() { serveErr <- g.Serve(cfg.RecoveryListener) }()
	go func() {
		select {
		case err := <-serveErr:
			if err != nil {
				log.Error("recovery server stopped", "err", err)
			}
		case <-rejoinCtx.Done():
		}
	}()
	log.Info("state storage belongs to a cluster: rejoining; serving recovery", "addr", cfg.RecoveryListener.Addr().String())
	return reentryWait{
		committed: rs.Committed(), finished: rs.Finished(),
		phase: metadata.PhaseWaitingForRecovery,
		msg:   "no join service answers: waiting for rejoin or for `constellation recover`",
	}, g.GracefulStop, nil
}

// awaitReentry waits until the rejoin (rejoinErr) or the recovery re-entered the node, and
// returns which. When the recovery takes the node lock first, it stops the rejoin.
func awaitReentry(ctx context.Context, cfg Config, w reentryWait, rejoinErr <-chan error, stopRejoin func()) (string, error) {
	log := cfg.Log
	waitingAfter := cfg.WaitingAfter
	if waitingAfter <= 0 {
		waitingAfter = DefaultWaitingAfter
	}
	waiting := time.NewTimer(waitingAfter)
	defer waiting.Stop()
	recovered := func() (string, error) {
		select {
		case <-w.finished:
		case <-ctx.Done():
			return "", ctx.Err()
		}
		if err := cfg.RecoveryServer.Err(); err != nil {
			return "", fmt.Errorf("recover: %w", err)
		}
		log.Info("recovered into the cluster")
		cfg.Progress(metadata.PhaseRecovered)
		return ByRecover, nil
	}
	for {
		select {
		case err := <-rejoinErr:
			if err == nil {
				log.Info("rejoined the cluster")
				cfg.Progress(metadata.PhaseRejoined)
				return ByRejoin, nil
			}
			// Lost the node lock to the recovery (or stopped because of it).
			if cfg.RecoveryServer != nil && errors.Is(err, nodelock.ErrLocked) {
				return recovered()
			}
			select {
			case <-w.committed:
				return recovered()
			default:
			}
			if ctx.Err() != nil {
				return "", ctx.Err()
			}
			return "", fmt.Errorf("rejoin: %w", err)
		case <-w.committed:
			log.Info("the recovery took the node lock: stopping the rejoin")
			stopRejoin()
			<-rejoinErr
			return recovered()
		case <-waiting.C:
			select {
			case <-cfg.Node.Claimed():
			default:
				log.Warn(w.msg)
				cfg.Progress(w.phase)
			}
		}
	}
}

// commit brings a fresh node into a cluster: by init, or by join, whichever takes the node
// lock first.
func commit(ctx context.Context, cfg Config) (string, error) {
	log := cfg.Log

	initDone := make(chan struct{}) // never closed on workers
	if cfg.InitServer != nil {
		if cfg.InitListener == nil {
			return "", errors.New("init server without a listener")
		}
		g := cfg.InitServer.NewGRPCServer()
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
