#!/usr/bin/env bash
# Fails when `go mod tidy` would change go.mod or go.sum of any module in the repo.
set -euo pipefail
cd "$(dirname "$0")/.."
rc=0
for mod in . pkg tools/devtools tools/local-path-provisioner tools/csi-provisioner tools/csi-attacher tools/csi-resizer tools/kube/*/ tools/etcd/*/ tools/coredns/*/ tools/conformance/*/; do
  [ -f "$mod/go.mod" ] || continue # tools/conformance/busybox pins a source tarball, no module
  (cd "$mod" && cp go.mod /tmp/tidy.mod.$$ && cp go.sum /tmp/tidy.sum.$$ 2>/dev/null || true
   go mod tidy
   if ! cmp -s go.mod /tmp/tidy.mod.$$ || ! cmp -s go.sum /tmp/tidy.sum.$$; then
     echo "go mod tidy changes $mod/go.mod or go.sum: run 'go mod tidy' there and commit"
     cp /tmp/tidy.mod.$$ go.mod; cp /tmp/tidy.sum.$$ go.sum; exit 1
   fi) || rc=1
  rm -f /tmp/tidy.mod.$$ /tmp/tidy.sum.$$
done
exit $rc
