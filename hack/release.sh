#!/usr/bin/env bash
# Makes release $1 (a semantic version, e.g. v0.2.0) into _output/releases/$1, signed by the
# local release key _output/release-key.pem (made once by `make release-key`): the default node
# image of this checkout for Kubernetes $KUBERNETES (the default version when unset: the built
# bootstrapper, _output/kube/<version>/bin's kubelet and kubeadm, the services image of
# _output/images), stamped with the version (docs/releases.md). The further
# arguments name what the release upgrades from (its nodes trust their join services): a
# version in _output/releases, or a release or node image directory.
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:?usage: hack/release.sh VERSION}
bin=_output/bin
key=_output/release-key.pem
if [ ! -f "$key" ]; then
  "$bin/release" keygen "$key"
fi
base=$(mktemp -d)
trap 'rm -rf "$base"' EXIT
# config generate lays out the default node image (hard links to the build outputs).
kube=()
if [ -n "${KUBERNETES:-}" ]; then kube=(--kubernetes-version "$KUBERNETES"); fi
"$bin/constellation" config generate local --workspace "$base" "${kube[@]}" > /dev/null
from=()
for f in "${@:2}"; do
  if [ -d "_output/releases/$f" ]; then f="_output/releases/$f"; fi
  from+=(--from "$f")
done
"$bin/release" create --key "$key" --version "$version" --source _output/releases \
  --base-image "$base/node-image" --images _output/images "${from[@]}"
