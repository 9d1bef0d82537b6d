#!/usr/bin/env bash
# Packs commits for bench/gpu_ab.sh, on this machine (the device has no history):
# `git archive` of each REV into $AB_DIR/<short hash>.tar (AB_DIR: .ab in the
# repository), the folder emptied first, and the working tree's commit into
# $AB_DIR/tree.txt, which bench/gpu_build.sh reports. Carry .ab (and .whl) to the
# device, then run bench/gpu_ab.sh there; with no REV, before any GPU script, only
# the tree's commit is written.
#   bash bench/gpu_ab_pack.sh [REV...]
set -euo pipefail
cd "$(dirname "$0")/.."
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
# the working tree's own commit, which bench/gpu_build.sh reports: the device's copy of
# the tree carries its files, not necessarily its history
changed=$(git status --porcelain --untracked-files=no | wc -l)
echo "$(git rev-parse HEAD) $(git log -1 --format=%s), $changed tracked files changed" > "$dir/tree.txt"
