#!/usr/bin/env bash
# Runs every Go fuzz target in the repo for a short time each (default 8s). The seed corpora
# (f.Add and testdata/fuzz) always run as part of `go test`; this adds a brief coverage-guided
# search so CI notices a decoder that panics on new input.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${1:-8s}
status=0
count=0
while IFS= read -r line; do
  file=${line%%:*}
  target=$(sed -E 's/.*func (Fuzz[A-Za-z0-9_]*).*/\1/' <<<"$line")
  pkg=./$(dirname "$file")
  echo "fuzz: $pkg $target ($fuzztime)"
  if ! go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "$pkg" > /tmp/fuzz.$$.log 2>&1; then
    cat /tmp/fuzz.$$.log; status=1
  fi
  count=$((count + 1))
done < <(git ls-files '*_test.go' | xargs grep -H -E '^func Fuzz[A-Za-z0-9_]*\(f \*testing\.F\)' | sort)
rm -f /tmp/fuzz.$$.log
echo "fuzz: $count targets run"
exit $status
