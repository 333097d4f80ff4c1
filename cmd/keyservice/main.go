// Command keyservice derives keys from the cluster's master secret for authorized in-cluster
// callers over mutual TLS (internal/kms/keyservice). It runs on every control-plane node
// (DaemonSet constellation-key-service, host network) bound to 127.0.0.1, where the join
// service of the same node reaches it.
//
// Inputs: the master secret file (Secret constellation-mastersecret, key mastersecret.json)
// and a directory with the TLS material (Secret constellation-keyservice-tls: ca.crt, the CA
// of client certificates, and keyservice.crt/.key, the server pair). Every flag can also be
// set by the environment variable CONSTELLATION_<FLAG> (upper case, '-' as '_').
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/openconstellation/constellation/internal/clusterrecord"
	"github.com/openconstellation/constellation/internal/cmdutil"
	"github.com/openconstellation/constellation/internal/kms"
	"github.com/openconstellation/constellation/internal/kms/keyservice"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "keyservice:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	fs := flag.NewFlagSet("keyservice", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:9001", "listen address (mutual TLS gRPC)")
	secretPath := fs.String("master-secret", "/etc/constellation/mastersecret/"+clusterrecord.MasterSecretKey, "master secret file (JSON)")
	tlsDir := fs.String("tls-dir", "/etc/constellation/keyservice-tls", "directory of ca.crt (client CA), keyservice.crt and keyservice.key")
	policyPath := fs.String("policy", "", "policy file (JSON); empty: the join service may derive the measurement secret and state-disk keys")
	metricsAddr := fs.String("metrics-listen", "", "Prometheus metrics listen address (empty: none)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	if err := cmdutil.ParseFlags(fs, args, "CONSTELLATION_", getenv); err != nil {
		return err
	}
	log, err := cmdutil.Logger(stderr, *logLevel)
	if err != nil {
		return err
	}
	secret, err := kms.ReadMasterSecretFile(*secretPath)
	if err != nil {
		return err
	}
	policy := keyservice.DefaultPolicy()
	if *policyPath != "" {
		data, err := os.ReadFile(*policyPath)
		if err != nil {
			return fmt.Errorf("policy: %w", err)
		}
		if policy, err = keyservice.ParsePolicy(data); err != nil {
			return fmt.Errorf("%s: %w", *policyPath, err)
		}
	}
	cert, clientCAs, err := keyservice.LoadCertAndCA(*tlsDir, clusterrecord.KeyServiceCertKey, clusterrecord.KeyServiceKeyKey, clusterrecord.KeyServiceCAKey)
	if err != nil {
		return err
	}
	reg := cmdutil.Registry()
	srv, err := keyservice.NewServer(secret, policy, log, reg)
	if err != nil {
		return err
	}
	g := grpc.NewServer(grpc.Creds(credentials.NewTLS(keyservice.ServerTLS(cert, clientCAs))))
	srv.Register(g)
	servers := []cmdutil.Server{cmdutil.GRPC("keyservice", *listen, g)}
	if *metricsAddr != "" {
		servers = append(servers, cmdutil.Metrics(*metricsAddr, reg))
	}
	clients := make([]string, 0, len(policy.Clients))
	for name := range policy.Clients {
		clients = append(clients, name)
	}
	log.Info("key service starting", "clients", clients)
	return cmdutil.Run(ctx, log, servers...)
}
