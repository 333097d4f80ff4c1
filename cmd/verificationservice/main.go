// Command verificationservice answers nonces with fresh evidence of its node, over gRPC and
// HTTP (internal/verify). It runs on every node of a cluster (DaemonSet
// constellation-verification-service, host network) and opens the node's TPM per request,
// sending the node's measured-boot event log (--event-log) with each evidence.
//
// Every flag can also be set by the environment variable CONSTELLATION_<FLAG> (upper case,
// '-' as '_'); the command line wins.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/time/rate"

	"github.com/openconstellation/constellation/internal/cmdutil"
	"github.com/openconstellation/constellation/internal/verifyservice"
	"github.com/openconstellation/constellation/pkg/attestation/choose"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "verificationservice:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	fs := flag.NewFlagSet("verificationservice", flag.ContinueOnError)
	fs.SetOutput(stderr)
	grpcAddr := fs.String("grpc-listen", ":30081", "gRPC listen address")
	httpAddr := fs.String("http-listen", ":30080", "HTTP listen address (GET /v1/attest?nonce=<hex>)")
	tpmAddr := fs.String("tpm", "unix:/run/constellation/tpm.sock", "TPM: unix:PATH, tcp:HOST:PORT or a device; opened per request")
	eventLogPath := fs.String("event-log", "", "the node's TCG event log, sent with every evidence (empty: none)")
	akName := fs.String("ak", "rsa", "attestation key: rsa (the node's AK) or ecc")
	variantName := fs.String("variant", "", "attestation variant of the node, from the cluster's record (deploy sets it); required")
	maxWaiting := fs.Int("max-waiting", verifyservice.DefaultMaxWaiting, "requests in progress at once, across callers; more are refused (503)")
	peerRate := fs.Float64("peer-rate", float64(verifyservice.DefaultPeerRate), "requests per second per caller address; more are refused (429)")
	peerBurst := fs.Int("peer-burst", verifyservice.DefaultPeerBurst, "requests a caller address may make at once after idling")
	maxPerPeer := fs.Int("max-per-peer", verifyservice.DefaultMaxPerPeer, "requests in progress per caller address")
	metricsAddr := fs.String("metrics-listen", "", "Prometheus metrics listen address (empty: none)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	if err := cmdutil.ParseFlags(fs, args, "CONSTELLATION_", getenv); err != nil {
		return err
	}
	log, err := cmdutil.Logger(stderr, *logLevel)
	if err != nil {
		return err
	}
	for name, v := range map[string]float64{"max-waiting": float64(*maxWaiting), "peer-rate": *peerRate, "peer-burst": float64(*peerBurst), "max-per-peer": float64(*maxPerPeer)} {
		if v <= 0 {
			return fmt.Errorf("--%s %v: must be positive", name, v)
		}
	}
	// The variant is the cluster's (its record names it): the service has no default, so
	// nothing here decides it.
	if *variantName == "" {
		return errors.New("--variant is required: the node's attestation variant, as the cluster record names it (for example qemu-vtpm)")
	}
	v, err := variant.FromString(*variantName)
	if err != nil {
		return err
	}
	var ak vtpm.AKAlgorithm
	switch *akName {
	case "rsa":
		ak = vtpm.AKRSA
	case "ecc":
		ak = vtpm.AKECC
	default:
		return fmt.Errorf("--ak %q: want rsa or ecc", *akName)
	}

	// Through the registry, as every issuer: the variant decides what the evidence holds.
	env := choose.IssuerEnv{TPM: vtpm.OpenAddr(*tpmAddr), AK: ak}
	if *eventLogPath != "" {
		env.EventLog = vtpm.ReadEventLog(*eventLogPath)
	}
	issuer, err := choose.NewIssuer(ctx, v, env)
	if err != nil {
		return fmt.Errorf("TPM: %w", err)
	}
	reg := cmdutil.Registry()
	srv, err := verifyservice.New(verifyservice.Config{
		Issuer: issuer, Log: log, Registerer: reg, MaxWaiting: *maxWaiting,
		PeerRate: rate.Limit(*peerRate), PeerBurst: *peerBurst, MaxPerPeer: *maxPerPeer,
	})
	if err != nil {
		return err
	}
	servers := []cmdutil.Server{cmdutil.GRPC("grpc", *grpcAddr, srv.NewGRPCServer()), cmdutil.HTTP("http", *httpAddr, srv, srv.HTTPAcceptLimiter())}
	if *metricsAddr != "" {
		servers = append(servers, cmdutil.Metrics(*metricsAddr, reg))
	}
	log.Info("verification service starting", "variant", v.String(), "ak", ak.String(), "tpm", *tpmAddr)
	return cmdutil.Run(ctx, log, servers...)
}
