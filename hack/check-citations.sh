#!/usr/bin/env bash
# Code and docs cite only what is in this repository. Fails if
#  - a comment or doc cites the design brief that lives outside the repository (its numbered
#    sections, "DESIGN <n>"): the design facts code relies on are in docs/design.md;
#  - a citation of the form docs/<file>.md "<Section>" names a file or heading that does not exist.
set -euo pipefail
cd "$(dirname "$0")/.."
fail=0

# The pattern is spelled with a bracket so that this script does not match itself.
if git grep -nIE --untracked 'DESIG[N]( section)? [0-9]' -- ':(exclude)_output'; then
  echo "cite docs/<file>.md \"<Section>\" instead of the design brief outside the repository" >&2
  fail=1
fi

while IFS= read -r hit; do
  loc=${hit%%:docs/*}
  cite=${hit#"$loc":}
  file=${cite%% *}
  section=${cite#* \"}; section=${section%\"}
  if [ ! -f "$file" ]; then
    echo "$loc: cites $file, which does not exist" >&2; fail=1; continue
  fi
  if ! grep -qxF -- "$(printf '%s' "$section")" <(sed -nE 's/^#+ +//p' "$file"); then
    echo "$loc: cites $file \"$section\", which has no such heading" >&2; fail=1
  fi
done < <(git grep -nIoE --untracked 'docs/[a-z0-9-]+\.md "[^"]+"' -- ':(exclude)_output' | sed -E 's/^([^:]+:[0-9]+):/\1:/')
exit $fail
