#!/usr/bin/env bash
# The CUDA backend as the GPU scripts build it by hand (not the task graph's build):
#   bench/build_cuda_backend.sh OUT.so [-gencode ...]   (default: sm_90 only)
# From the repo root, with build/gen from `doit codegen`.
set -euo pipefail
out=$1
shift
gencode=("$@")
[[ ${#gencode[@]} -gt 0 ]] || gencode=(-gencode arch=compute_90,code=sm_90)
nvcc -std=c++17 -O2 -shared -Xcompiler -fPIC,-fvisibility=hidden,-Wall,-Wextra \
  -Xlinker --version-script=build/gen/coli_backend.map "${gencode[@]}" \
  -Ibuild/gen -Ikernels -Iengine kernels/backend_gpu.cu -o "$out"
