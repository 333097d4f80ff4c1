#!/usr/bin/env bash
# make conformance: runs the Kubernetes conformance suite against a local cluster.
#
#   1. builds the suite and its images for the cluster's Kubernetes version
#      (hack/build-conformance.sh);
#   2. uses the cluster of `make up` (workspace _output) when it answers, else creates one with
#      `constellation mini up` there (1 control plane, 2 workers) and leaves it running for
#      inspection (`make down` removes it);
#   3. loads the images into every node (`constellation image load`; they stay across reboots);
#   4. runs the [Conformance] tests with ginkgo, CONFORMANCE_NODES (default 4) in parallel and
#      the [Serial] ones after them, skipping by name only the tests internal/conformance.Skips
#      lists; CONFORMANCE_FOCUS replaces the focus (CI's smoke subset: internal/conformance.Smoke);
#   5. writes the JUnit report, the suite's log and a summary (passed, failed, skipped, each
#      failure's first line) under _output/conformance/results/<UTC time>/ (CONFORMANCE_RESULTS
#      names another directory), and prints the summary.
#
# CONSTELLATION names the CLI to use (default _output/bin/constellation).
#
# It fails when a test fails. What each test needs and why a skipped one cannot pass here:
# docs/conformance.md.
set -euo pipefail
cd "$(dirname "$0")/.."
cli=${CONSTELLATION:-_output/bin/constellation}
ws=$(realpath -m "${CONFORMANCE_WORKSPACE:-_output}")
kubeconfig=$ws/constellation-admin.conf
version=$(KUBE_VERSIONS=default go run ./hack/kubeversions | cut -d' ' -f1)

# A workspace with a cluster's state is used as it is (a cluster that does not answer fails the
# run below, naming the request); one without gets a new cluster.
if ! [ -f "$ws/constellation-state.yaml" ]; then
  echo "conformance: no cluster in $ws: creating one (1 control plane, 2 workers)"
  "$cli" mini up --workspace "$ws"
fi
kubectl=_output/kube/$version/bin/kubectl
# The server's version (the JSON's last gitVersion; the client's comes first).
if ! info=$("$kubectl" --kubeconfig "$kubeconfig" version -o json 2>&1); then
  echo "conformance: the cluster in $ws does not answer: $info" >&2
  exit 1
fi
running=$(echo "$info" | sed -n 's/.*"gitVersion": *"\(v[^"]*\)".*/\1/p' | tail -1)
if [ -n "$running" ] && [ "$running" != "$version" ]; then
  version=$running
  kubectl=_output/kube/$version/bin/kubectl
fi
echo "conformance: the cluster runs Kubernetes $version"
./hack/build-conformance.sh "$version"
dir=_output/conformance/$version
"$cli" image load --workspace "$ws" "$dir"/images/*.tar

results=${CONFORMANCE_RESULTS:-_output/conformance/results/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$results"
# ginkgo runs e2e.test in the binary's directory: every path it gets is absolute.
results=$(realpath "$results")
focus=${CONFORMANCE_FOCUS:-'\[Conformance\]'}
skip=$(cat "$dir/skip.regex")
storage=()
if [ "${CONFORMANCE_STORAGE:-0}" = 1 ]; then
  # The storage test suites against the encrypted volume driver (hack/storage-testdriver.yaml):
  # those its capabilities select, but the disruptive and serial ones (they restart kubelets
  # and the like, which the sandbox does through the provider, not the way the suite does).
  storage=(--storage.testdriver="$PWD/hack/storage-testdriver.yaml")
  focus=${CONFORMANCE_FOCUS:-'External.Storage \[Driver: volumes.constellation.openconstellation.dev\]'}
  # "should not mount / map unused volumes" looks into the node through nsenter into PID 1's
  # mount namespace: PID 1 of a sandbox node's PID namespace is the machine's, not the node's.
  skip='\[Disruptive\]|\[Serial\]|\[Feature:|should not mount / map unused volumes in a pod'"${skip:+|$skip}"
fi
echo "conformance: running the suite (focus: $focus); results in $results"
set +e
KUBE_TEST_REPO_LIST=$PWD/$dir/repo-list.yaml "$dir/ginkgo" --nodes="${CONFORMANCE_NODES:-4}" \
  --focus="$focus" ${skip:+--skip="$skip"} --timeout="${CONFORMANCE_TIMEOUT:-3h}" \
  --junit-report=junit.xml --output-dir="$results" --no-color --poll-progress-after=60s \
  "$dir/e2e.test" -- --kubeconfig="$kubeconfig" --provider=skeleton --kubectl-path="$PWD/$kubectl" \
  --report-dir="$results" "${storage[@]}" 2>&1 | tee "$results/e2e.log"
rc=${PIPESTATUS[0]}
set -e
go run ./hack/conformance summary -junit "$results/junit.xml" -out "$results/summary.txt"
echo "conformance: Kubernetes $version, $(date -u +%F); report $results/junit.xml"
exit "$rc"
