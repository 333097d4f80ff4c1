#!/usr/bin/env bash
# Regenerates the protobuf code into a scratch copy and fails if it differs from what is committed.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for p in $(find api pkg/api -name '*.proto'); do
  protoc -I . --go_out="$tmp" --go_opt=paths=source_relative \
    --go-grpc_out="$tmp" --go-grpc_opt=paths=source_relative "$p"
done
stale=0
while IFS= read -r f; do
  rel=${f#"$tmp"/}
  if ! cmp -s "$f" "$rel"; then echo "stale generated file: $rel (run 'make proto')"; stale=1; fi
done < <(find "$tmp" -type f)
exit $stale
