#!/usr/bin/env bash
# The GPU selftest against wrong backends, on a CUDA machine (the device tool): the tree's
# host and backend built (bench/gpu_build.sh; FAST=1 unless FAST is set, even empty), the
# tree's own selftest, which must pass, then bench/gpu_mutants.py: each mutant of
# bench/gpu_mutants.toml built from its own copy and its selftest expected to fail.
# Results in ${OUT:-bench/out} (mutants.json, and the build log of a mutant whose build
# failed); exits 1 where the tree fails or a mutant survives. Arguments go to
# gpu_mutants.py (--baseline-host, --mutants).
set -uo pipefail
cd "$(dirname "$0")/.."
FAST=${FAST-1}
source bench/gpu_build.sh || exit 1
if ! "$HOST" --backend "$LIB" --selftest > "$out/selftest.txt" 2>&1; then
  grep -E "FAIL" "$out/selftest.txt"
  echo "gpu_mutants.sh: the tree's own selftest failed; its mutants would say nothing"
  exit 1
fi
grep -E "passed" "$out/selftest.txt"
python3 bench/gpu_mutants.py --host "$HOST" --arch "$arch" --out "$out" "$@"
