#!/usr/bin/env bash
# Makes release $1 (a semantic version, e.g. v0.2.0) into _output/releases/$1, signed by the
# local release key _output/release-key.pem (made once by `make release-key`): the default node
# image of this checkout for Kubernetes $KUBERNETES (the default version when unset: the built
# bootstrapper, _output/kube/<version>/bin's kubelet and kubeadm, the services image of
# _output/images), stamped with the version (docs/releases.md). The further
# arguments (make's FROM) name what the release upgrades from (its nodes trust their join
# services): a version in _output/releases, or a release or node image directory (the cluster
# of `make up` boots _output/mini/image). Without them the release can create clusters but
# upgrade none: its first node would refuse every join service of a running cluster
# (docs/upgrades.md "A new node trusts the previous release's join services").
# CLOUD_IMAGES (make's CLOUD_IMAGES), space-separated PROVIDER=REF@sha256:HEX, names the
# release's images in clouds' image stores (docs/releases.md "Cloud images").
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
if [ $# -lt 2 ]; then
  echo "release: $version names no FROM: its nodes trust only their own image's join services, so it can create clusters but upgrade none (make release VERSION=$version FROM=<the running release, or _output/mini/image for make up's cluster>)" >&2
fi
for f in "${@:2}"; do
  if [ -d "_output/releases/$f" ]; then f="_output/releases/$f"; fi
  from+=(--from "$f")
done
clouds=()
for c in ${CLOUD_IMAGES:-}; do
  clouds+=(--cloud-image "$c")
done
"$bin/release" create --key "$key" --version "$version" --source _output/releases \
  --base-image "$base/node-image" --images _output/images "${from[@]}" "${clouds[@]}"
