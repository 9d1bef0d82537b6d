#!/usr/bin/env bash
# The tree line of a GPU script's report: the commit bench/gpu_ab_pack.sh wrote to
# $AB_DIR/tree.txt (AB_DIR: .ab), where the files it hashed then (files.sha256) are
# still those here; else "unknown". The device's copy of the tree carries its files,
# not its history (a .git there may be an older one), and a pack made before the tree
# changed would name the wrong commit.
set -uo pipefail
dir=${AB_DIR:-.ab}
if [[ ! -f $dir/tree.txt || ! -f $dir/files.sha256 ]]; then
  echo "tree: unknown (no $dir/tree.txt and files.sha256: run bash bench/gpu_ab_pack.sh before the call, and carry $dir)"
  exit 0
fi
differ=$(sha256sum --check --quiet "$dir/files.sha256" 2>/dev/null | grep -c 'FAILED')
if [[ $differ == 0 ]]; then
  echo "tree: $(cat "$dir/tree.txt")"
else
  echo "tree: unknown ($differ of the files packed with $(cut -c1-7 "$dir/tree.txt") differ here: run bash bench/gpu_ab_pack.sh before the call)"
fi
