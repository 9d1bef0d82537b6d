#!/usr/bin/env bash
# Packs commits for bench/gpu_ab.sh, on this machine (the device has no history):
# `git archive` of each REV into $AB_DIR/<short hash>.tar (AB_DIR: .ab in the
# repository), the folder emptied first. Carry .ab (and .whl) to the device, then run
# bench/gpu_ab.sh there.
#   bash bench/gpu_ab_pack.sh REV [REV...]
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $# -eq 0 ]]; then
  echo "gpu_ab_pack.sh: no revision given; allowed: one or more commits, e.g. main 7739cdf" >&2
  exit 2
fi
for rev in "$@"; do
  git rev-parse --verify --quiet "$rev^{commit}" > /dev/null ||
    { echo "gpu_ab_pack.sh: '$rev' is not a commit of this repository" >&2; exit 2; }
done
dir=${AB_DIR:-.ab}
rm -rf "$dir" && mkdir -p "$dir"
for rev in "$@"; do
  short=$(git rev-parse --short "$rev^{commit}")
  git archive "$rev" -o "$dir/$short.tar"
  echo "$rev -> $dir/$short.tar"
done
