#!/usr/bin/env bash
# Runs the benchmarks and prints a table. Results and their interpretation: docs/benchmarks.md.
# BENCHTIME sets -benchtime for the micro-benchmarks; JOINS the number of joins per join
# benchmark (each runs against a real kube-apiserver + etcd with fsync); JOINWAITS the number
# of nodes that wait for a join service to start (BenchmarkJoinAfterServiceStarts: swtpm and
# gocryptfs per node, needs root). MINI=0 skips the
# mini up benchmark (one control plane and two workers created and removed per run; needs
# root, make build images).
set -euo pipefail
cd "$(dirname "$0")/.."
benchtime=${BENCHTIME:-2s}
joins=${JOINS:-600}
raw=$(mktemp); trap 'rm -f "$raw"' EXIT
{
  # pkg/ is a module of its own: its benchmarks run from there.
  (cd pkg && go test -run '^$' -bench . -benchtime "$benchtime" ./attestation/qemu/ ./atls/ 2>/dev/null) || true
  go test -run '^$' -bench . -benchtime "$benchtime" ./internal/kms/ ./internal/kms/keyservice/ 2>/dev/null || true
  # Validation of every hardware variant with warm collateral, and event-log replay.
  (cd pkg && go test -run '^$' -bench 'BenchmarkCheck$|BenchmarkValidate|BenchmarkValidator|BenchmarkVerifyQuote|BenchmarkReplay' -benchtime "$benchtime" \
    ./attestation/snp/ ./attestation/awssnp/ ./attestation/gcpsnp/ ./attestation/azuresnp/ \
    ./attestation/tdx/ ./attestation/eventlog/ 2>/dev/null) || true
  go test -run '^$' -bench BenchmarkJoin -benchtime "${joins}x" ./internal/joinservice/ 2>/dev/null || true
  # 10,000 connections that never complete TLS against the join service (one flood per run:
  # each waits for the 20 s handshake deadline).
  go test -run '^$' -bench BenchmarkStalledConnections -benchtime 1x ./internal/joinservice/ 2>/dev/null || true
  go test -run '^$' -bench BenchmarkJoinAfterServiceStarts -benchtime "${JOINWAITS:-20}x" ./internal/bootstrapper/joinclient/ 2>/dev/null || true
  if [ "${MINI:-1}" != 0 ]; then
    go test -run '^$' -bench 'BenchmarkMiniUp|BenchmarkDayTwo|BenchmarkPowerCut|BenchmarkControlPlaneScaleDown|BenchmarkUpgrade' -benchtime 1x -timeout 30m ./test/e2e/ 2>/dev/null || true
  fi
} | tee "$raw" | grep -E '^(Benchmark|ok|FAIL)' >&2
echo
printf '| %-44s | %11s | %-50s |\n' benchmark "time/op" "reported"
printf '|%s|%s|%s|\n' "$(printf -- '-%.0s' {1..46})" "$(printf -- '-%.0s' {1..13})" "$(printf -- '-%.0s' {1..52})"
awk '/^Benchmark/ {
  name=$1; sub(/-[0-9]+$/, "", name); sub(/^Benchmark/, "", name)
  t=$3/1000; unit="µs"; if (t >= 1000) { t=t/1000; unit="ms" }
  extra=""
  for (i=5; i<NF; i+=2) if ($(i+1) != "B/op" && $(i+1) != "allocs/op") extra=extra sprintf("%s %s  ", $i, $(i+1))
  printf "| %-44s | %8.1f %s | %-50s |\n", name, t, unit, extra
}' "$raw"
grep -q '^FAIL' "$raw" && exit 1 || true
