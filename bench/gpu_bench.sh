#!/usr/bin/env bash
# Run by hand on a CUDA machine (the device tool), after bench/gpu_check.sh's
# correctness run: times the backend's kernels at decode and prefill shapes
# against the copy bandwidth, and PyTorch's f16 matmul at the same shapes.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-bench/out}
mkdir -p "$out"
nvcc -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -Ibuild/gen -Ikernels bench/gpu_matmul_bench.cu \
  -o /tmp/gpu_matmul_bench || exit 1
/tmp/gpu_matmul_bench | tee "$out/kernels.jsonl"
python3 bench/torch_f16_baseline.py | tee "$out/torch_f16.jsonl"
