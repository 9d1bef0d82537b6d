#!/usr/bin/env bash
# Run by hand on a CUDA machine (the device tool): builds the host and the CUDA
# backend there with nvcc/gcc, runs the host's selftest (every op against the
# CPU path, bad inputs, resident count) and, where it works, under
# compute-sanitizer. Needs build/gen from `doit codegen` here (carry it).
# Results go to ${OUT:-bench/out}.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-bench/out}
work=$(mktemp -d)
mkdir -p "$out"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nvcc --version | tail -1
} | tee "$out/device.txt"
inc="-Ibuild/gen -Ikernels -Iengine"
gcc -std=c11 -O2 -Wall -Wextra $inc engine/*.c \
  kernels/cpu_ops.c -lm -lpthread -o "$work/coli" || exit 1
nvcc -std=c++17 -O2 -shared -Xcompiler -fPIC,-fvisibility=hidden,-Wall,-Wextra \
  -Xlinker --version-script=build/gen/coli_backend.map \
  -gencode arch=compute_80,code=sm_80 -gencode 'arch=compute_90,code=[sm_90,compute_90]' \
  $inc kernels/backend_gpu.cu -o "$work/libcoli_cuda.so" || exit 1
"$work/coli" --backend "$work/libcoli_cuda.so" --selftest | tee "$out/selftest.txt"
rc=${PIPESTATUS[0]}
"$work/coli" --backend "$work/libcoli_cuda.so" --selftest --json > "$out/selftest.json"
if command -v compute-sanitizer >/dev/null; then
  compute-sanitizer --tool memcheck --leak-check full "$work/coli" --backend "$work/libcoli_cuda.so" --selftest \
    > "$out/memcheck.txt" 2>&1
  echo "memcheck exit $? ($(tail -1 "$out/memcheck.txt"))"
fi
echo "selftest exit $rc"
exit "$rc"
