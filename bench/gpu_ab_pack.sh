#!/usr/bin/env bash
# Packs commits for bench/gpu_ab.sh, on this machine (the device has no history):
# `git archive` of each REV into $AB_DIR/<short hash>.tar (AB_DIR: .ab in the
# repository), the folder emptied first, and the working tree's commit into
# $AB_DIR/tree.txt with its tracked files' hashes (files.sha256), which
# bench/tree_report.sh checks and reports for the GPU scripts. Carry .ab (and .whl)
# to the device, then run bench/gpu_ab.sh there; with no REV, before any GPU script,
# only the tree's commit and hashes are written.
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
# and the tracked files' hashes, by which bench/tree_report.sh tells there whether the
# tree it runs on is still this one
git ls-files -z | while IFS= read -r -d '' f; do if [[ -f $f ]]; then printf '%s\0' "$f"; fi; done |
  xargs -0 sha256sum > "$dir/files.sha256"
