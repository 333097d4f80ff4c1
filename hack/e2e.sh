#!/usr/bin/env bash
# Runs the end-to-end tier (test/e2e) verbosely into _output/e2e/test.log and prints, as they
# happen, each top-level test's start and result with its duration: CI's log says where the
# tier's time goes. A failing test's whole output is printed when it ends, as without -v.
set -euo pipefail
cd "$(dirname "$0")/.."
timeout=${1:-75m}
mkdir -p _output/e2e
log=_output/e2e/test.log
echo "e2e: the whole output goes to $log"
set +e
# One package (test/e2e/hello has no tests): go test streams a single package's output as it
# comes, and buffers it per package when it runs several.
go test -count=1 -timeout "$timeout" -v ./test/e2e/ 2>&1 | tee "$log" | awk '
  /^=== RUN   [^\/ ]+$/ { buf = ""; print; fflush(); next }
  /^ +--- FAIL: / { print; fflush(); next }
  { buf = buf $0 "\n" }
  /^--- (PASS|SKIP): / { print; fflush(); buf = ""; next }
  /^--- FAIL: / { printf "%s", buf; fflush(); buf = ""; next }
  /^panic: / { printf "%s", buf; fflush(); buf = ""; next }
  /^(ok|FAIL|PASS)([ \t]|$)/ { print; fflush(); buf = "" }
  END { printf "%s", buf }
'
rc=${PIPESTATUS[0]}
exit "$rc"
