#!/usr/bin/env bash
# Run by hand on a CUDA machine (the device tool), after bench/gpu_check.sh's
# correctness run: times the backend's kernels (and each S = 1 variant) at decode
# and prefill shapes against the copy bandwidth, PyTorch's f16 matmul at the same
# shapes and a whole backend call at S = 1 (tools/call_latency.c), then prints
# the tables (bench/gpu_summary.py).
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/gpu_build.sh || exit 1 # the backend for call_latency, and build/gen for the bench
# the bench itself, through the project's command builder (nvcc, includes, -gencode)
python3 -m toolchain.program bench/gpu_matmul_bench.cu /tmp/gpu_matmul_bench "arch=$arch" -- -O3 -Xptxas -v -Itools \
  2> "$out/ptxas.txt" || { cat "$out/ptxas.txt"; exit 1; }
# a wrong setting stops the bench with one line before it touches the GPU
rc=0
while IFS='|' read -r setting arg want; do
  got=$(env -u COLI_BENCH_SHAPES -u COLI_BENCH_ONLY -u COLI_BENCH_S1 -u COLI_BENCH_TILE ${setting:+"$setting"} \
    /tmp/gpu_matmul_bench $arg 2>&1 >/dev/null)
  code=$?
  if [[ $code != 2 || $(wc -l <<< "$got") != 1 || $got != "gpu_matmul_bench: $want"* ]]; then
    echo "bench settings check: ${setting:-$arg}: exit $code, '$got' (want exit 2, 'gpu_matmul_bench: $want')"
    rc=1
  fi
done <<'CASES'
COLI_BENCH_SHAPES=4096x||COLI_BENCH_SHAPES: '4096x' is not a shape
COLI_BENCH_ONLY=decode bulkk||COLI_BENCH_ONLY: 'decode bulkk' is part of no
COLI_BENCH_S1=yes||COLI_BENCH_S1: 'yes' is not 0 or 1
COLI_BENCH_TILE=2||COLI_BENCH_TILE: '2' is not 0 or 1
|profil|unknown argument 'profil' (allowed: none, or `profile`)
CASES
/tmp/gpu_matmul_bench > "$out/kernels.jsonl" || rc=1
# a whole backend call at S = 1, as the engine's decode makes it (copies and the wait included),
# through the backend the task graph built
work=$(mktemp -d)
gcc -std=c11 -O2 -Wall -Wextra -Ibuild/gen tools/call_latency.c -L"$(dirname "$LIB")" -l:libcoli_cuda.so \
    -o "$work/call_latency" &&
  LD_LIBRARY_PATH="$(dirname "$LIB")" "$work/call_latency" > "$out/call_latency.jsonl" || rc=1
if [[ ${COLI_BENCH_TORCH:-1} == 1 ]]; then python3 bench/torch_f16_baseline.py > "$out/torch_f16.jsonl" || rc=1; fi
python3 bench/gpu_summary.py "$out" || rc=1
# where the S = 1 kernels spend their time (hardware counters; the clocks left alone)
if [[ ${COLI_BENCH_NCU:-0} == 1 ]] && command -v ncu >/dev/null; then
  ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats \
    --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section SchedulerStats --section LaunchStats \
    -k regex:'gemv|decode' /tmp/gpu_matmul_bench profile > "$out/ncu.txt" 2>&1
  echo "ncu exit $?"
fi
exit "$rc"
