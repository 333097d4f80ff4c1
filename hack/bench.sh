#!/usr/bin/env bash
# Runs the benchmarks and prints a table. Results and their interpretation: docs/benchmarks.md.
# BENCHTIME sets -benchtime for the micro-benchmarks; JOINS the number of joins per join
# benchmark (each runs against a real kube-apiserver + etcd with fsync); JOINWAITS the number
# of nodes that wait for a join service to start (BenchmarkJoinAfterServiceStarts: swtpm and
# gocryptfs per node, needs root). MINI=0 skips the
# mini up benchmark (one control plane and two workers created and removed per run; needs
# root, make build images). COUNT runs each micro-benchmark that many times (default 5), so
# that benchstat can tell a change from noise; the join and cluster benchmarks run once.
#
# Every run is recorded in _output/bench/<UTC time>.txt (Go's benchmark format, with the
# commit, the machine and its load average before and after as comment lines), and compared
# with the run recorded before it (benchstat): the comparison is printed, then every figure
# that got significantly worse (p < 0.05, more than 5 % slower).
set -euo pipefail
cd "$(dirname "$0")/.."
benchtime=${BENCHTIME:-2s}
joins=${JOINS:-600}
count=${COUNT:-5}
mkdir -p _output/bench
previous=$(ls -1 _output/bench/*.txt 2>/dev/null | sort | tail -n 1 || true)
raw=_output/bench/$(date -u +%Y%m%dT%H%M%SZ).txt
{
  echo "# date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "# commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "# machine: $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo), $(uname -r)"
  echo "# load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$raw"
{
  # pkg/ is a module of its own: its benchmarks run from there.
  (cd pkg && go test -run '^$' -bench . -benchtime "$benchtime" -count "$count" ./attestation/qemu/ ./atls/ 2>/dev/null) || true
  go test -run '^$' -bench . -benchtime "$benchtime" -count "$count" ./internal/kms/ ./internal/kms/keyservice/ 2>/dev/null || true
  # Validation of every hardware variant with warm collateral, and event-log replay.
  (cd pkg && go test -run '^$' -bench 'BenchmarkCheck$|BenchmarkValidate|BenchmarkValidator|BenchmarkVerifyQuote|BenchmarkReplay' -benchtime "$benchtime" -count "$count" \
    ./attestation/snp/ ./attestation/awssnp/ ./attestation/gcpsnp/ ./attestation/azuresnp/ \
    ./attestation/tdx/ ./attestation/eventlog/ 2>/dev/null) || true
  # Encrypted volumes: staging (the node's share of a moved pod's start), and writes to a
  # volume against writes to the node's state storage (root: loop devices, gocryptfs).
  go test -run '^$' -bench . -benchtime 10x -count "$count" ./internal/csidriver/unlock/ 2>/dev/null || true
  go test -run '^$' -bench 'BenchmarkJoin$' -benchtime "${joins}x" ./internal/joinservice/ 2>/dev/null || true
  # 1,000 nodes asking for a join ticket at the same moment (one burst).
  go test -run '^$' -bench 'BenchmarkJoinBurst$' -benchtime 1x ./internal/joinservice/ 2>/dev/null || true
  # 10,000 connections that never complete TLS against the join service (one flood per run:
  # each waits for the 20 s handshake deadline).
  go test -run '^$' -bench BenchmarkStalledConnections -benchtime 1x ./internal/joinservice/ 2>/dev/null || true
  go test -run '^$' -bench BenchmarkJoinAfterServiceStarts -benchtime "${JOINWAITS:-20}x" ./internal/bootstrapper/joinclient/ 2>/dev/null || true
  if [ "${MINI:-1}" != 0 ]; then
    go test -run '^$' -bench 'BenchmarkMiniUp|BenchmarkDayTwo|BenchmarkPowerCut|BenchmarkControlPlaneScaleDown|BenchmarkUpgrade' -benchtime 1x -timeout 30m ./test/e2e/ 2>/dev/null || true
  fi
} | tee -a "$raw" | grep -E '^(Benchmark|ok|FAIL)' >&2
echo "# load average at end: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$raw"
# A benchmark that logs while it runs splits its result line (name, the log, then the figures):
# put the name back in front of its figures, so that benchstat reads every result.
awk '/^Benchmark[^ \t]*[ \t]+[0-9]+[ \t]/ { print; next }
  /^Benchmark/ { split($0, f, /[ \t]/); pending=f[1]; next }
  pending != "" && /^[ \t]*[0-9]+[ \t]+[0-9.]+ ns\/op/ { sub(/^[ \t]*/, ""); print pending "\t" $0; pending=""; next }
  { print }' "$raw" > "$raw.tmp" && mv "$raw.tmp" "$raw"
echo
printf '| %-44s | %11s | %-50s |\n' benchmark "time/op" "reported"
printf '|%s|%s|%s|\n' "$(printf -- '-%.0s' {1..46})" "$(printf -- '-%.0s' {1..13})" "$(printf -- '-%.0s' {1..52})"
# One row per benchmark: the median time/op of its runs, and the metrics of its last run.
awk '/^Benchmark/ {
  name=$1; sub(/-[0-9]+$/, "", name); sub(/^Benchmark/, "", name)
  if (!(name in n)) order[++names]=name
  v[name, ++n[name]]=$3
  extra=""
  for (i=5; i<NF; i+=2) if ($(i+1) != "B/op" && $(i+1) != "allocs/op") extra=extra sprintf("%s %s  ", $i, $(i+1))
  ex[name]=extra
}
END {
  for (k=1; k<=names; k++) {
    name=order[k]; c=n[name]
    # insertion sort of the runs, then the median
    for (i=1; i<=c; i++) s[i]=v[name, i]
    for (i=2; i<=c; i++) { x=s[i]; j=i-1; while (j>0 && s[j]+0>x+0) { s[j+1]=s[j]; j-- }; s[j+1]=x }
    med=(c%2) ? s[(c+1)/2] : (s[c/2]+s[c/2+1])/2
    t=med/1000; unit="µs"; if (t >= 1000) { t=t/1000; unit="ms" }
    printf "| %-44s | %8.1f %s | %-50s |\n", name (c>1 ? " (" c " runs)" : ""), t, unit, ex[name]
  }
}' "$raw"
echo
echo "recorded in $raw ($(grep '^# load' "$raw" | tr '\n' ' '))"
benchstat=_output/bin/benchstat
if [ -n "$previous" ] && [ -x "$benchstat" ]; then
  echo "compared with the run before, $previous ($(grep '^# commit' "$previous" | cut -d' ' -f3-)):"
  "$benchstat" "$previous" "$raw" || true
  # CSV rows: name, old, CI, new, CI, vs base, P. A regression: slower by more than 5 %, p < 0.05.
  regressions=$("$benchstat" -format csv "$previous" "$raw" 2>/dev/null | awk -F, '
    /^,/ { unit=$2 }
    unit ~ /sec\/op|ms|µs|ns/ && $6 ~ /^\+[0-9.]+%$/ && $7 ~ /^p=/ {
      delta=$6; sub(/%/, "", delta); p=$7; sub(/^p=/, "", p); sub(/ .*/, "", p)
      if (delta+0 > 5 && p+0 < 0.05) printf "  %s: %s (%s)\n", $1, $6, $7
    }')
  if [ -n "$regressions" ]; then
    echo "REGRESSIONS against the run before:"
    echo "$regressions"
  else
    echo "no regression against the run before (slower by more than 5 % at p < 0.05)"
  fi
elif [ -z "$previous" ]; then
  echo "no earlier run recorded in _output/bench: nothing to compare with"
fi
grep -q '^FAIL' "$raw" && exit 1 || true
