#!/usr/bin/env bash
# Runs the benchmarks and prints a table. Results and their interpretation: docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
benchtime=${BENCHTIME:-2s}
raw=$(mktemp); trap 'rm -f "$raw"' EXIT
go test -run '^$' -bench . -benchtime "$benchtime" \
  ./internal/attestation/qemu/ ./internal/atls/ 2>/dev/null | tee "$raw" | grep -E '^(Benchmark|ok|FAIL)' >&2 || true
echo
printf '| %-48s | %12s | %14s |\n' benchmark "time/op" "handshakes/s"
printf '|%s|%s|%s|\n' "$(printf -- '-%.0s' {1..50})" "$(printf -- '-%.0s' {1..14})" "$(printf -- '-%.0s' {1..16})"
awk '/^Benchmark/ {
  name=$1; sub(/-[0-9]+$/, "", name); sub(/^Benchmark/, "", name)
  t=$3/1000; unit="µs"; if (t >= 1000) { t=t/1000; unit="ms" }
  rate=""; for (i=5; i<=NF; i++) if ($(i+1)=="handshakes/s") rate=$i
  printf "| %-48s | %9.1f %s | %14s |\n", name, t, unit, rate
}' "$raw"
grep -q '^FAIL' "$raw" && exit 1 || true
