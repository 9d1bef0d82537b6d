#!/usr/bin/env bash
# The GPU run, by hand on a CUDA machine (the device tool; the task graph's Python
# packages carried as wheels in .whl, bench/gpu_build.sh): builds, checks (bench/gpu_check.sh: selftest, sanitizers,
# the engine's tokens, large-model decode) and times (bench/gpu_bench.sh: the
# kernels against the copy bandwidth and cuBLAS f16). The timing runs even when a
# check fails, so both are on record; the exit status is non-zero if either failed.
# Results go to ${OUT:-bench/out}.
set -uo pipefail
cd "$(dirname "$0")/.."
bash bench/gpu_check.sh
check=$?
bash bench/gpu_bench.sh
bench=$?
echo "gpu_check exit $check, gpu_bench exit $bench"
[[ $check == 0 && $bench == 0 ]]
