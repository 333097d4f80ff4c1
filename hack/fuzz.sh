#!/usr/bin/env bash
# Runs every Go fuzz target in the repo for a short time each (default 8s). The seed corpora
# (f.Add and testdata/fuzz) always run as part of `go test`; this adds a brief coverage-guided
# search so CI notices a decoder that panics on new input.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${1:-8s}
status=0
count=0
# deadline_race reports whether a failed run's log is only Go's boundary race: the failure is a
# bare "context deadline exceeded", no input was written and nothing panicked.
deadline_race() {
  grep -A1 -- '--- FAIL: Fuzz' "$1" | grep -qx '    context deadline exceeded' &&
    ! grep -qE 'Failing input written|panic:' "$1"
}
while IFS= read -r line; do
  file=${line%%:*}
  target=$(sed -E 's/.*func (Fuzz[A-Za-z0-9_]*).*/\1/' <<<"$line")
  # A target under pkg/ belongs to the module there (pkg/go.mod): run it from that module.
  mod=.
  case "$file" in pkg/*) mod=pkg; file=${file#pkg/} ;; esac
  pkg=./$(dirname "$file")
  echo "fuzz: $mod $pkg $target ($fuzztime)"
  if ! (cd "$mod" && go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "$pkg") > /tmp/fuzz.$$.log 2>&1; then
    # Go 1.26's fuzz coordinator can report a bare "context deadline exceeded" when -fuzztime
    # expires while a worker is mid-call (golang/go#75804, fixed in Go 1.27): no input failed.
    # A real finding always writes its input ("Failing input written to") and fails here.
    if deadline_race /tmp/fuzz.$$.log; then
      echo "fuzz: $target stopped at the fuzztime boundary by Go's coordinator race (golang/go#75804); no input failed"
    else
      cat /tmp/fuzz.$$.log; status=1
    fi
  fi
  count=$((count + 1))
done < <(git ls-files '*_test.go' | xargs grep -H -E '^func Fuzz[A-Za-z0-9_]*\(f \*testing\.F\)' | sort)
rm -f /tmp/fuzz.$$.log
echo "fuzz: $count targets run"
exit $status
