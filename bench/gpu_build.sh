#!/usr/bin/env bash
# Sourced by the GPU scripts on a CUDA machine (the device tool): the host and the
# CUDA backend built by the task graph, as `doit build` builds them everywhere
# (the project's own compile lines, verify, and validate: the selftest's gpu shapes
# and the engine through CUDA against the CPU path at every format). The Python
# packages the task graph needs travel as wheels in .whl (README.md, "The GPU run"); sets
# out (the results folder: $OUT, else bench/out), work (a scratch folder, unless the
# caller made one), HOST and LIB, and writes the device's name, the toolkit and the
# commit to $out/device.txt and the build's output to $out/build.txt. FAST=1 builds
# the host and the backend only (no verify, no validate): for a first look at a
# change's speed when device time is short; a change is kept only after a run with
# validate.
out=${OUT:-bench/out}
work=${work:-$(mktemp -d)}
mkdir -p "$out"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nvcc --version | tail -1
  bash bench/tree_report.sh
} | tee "$out/device.txt"
source bench/device_wheels.sh || return 1
arch=${COLI_GPU_ARCH:-sm_90}
targets=(build)
[[ -n ${FAST:-} ]] && targets=(host backend)
python3 -m doit -n "$(nproc)" "${targets[@]}" "arch=$arch" > "$out/build.txt" 2>&1 || { tail -30 "$out/build.txt"; return 1; }
HOST=$PWD/build/linux-x86_64/host/coli
LIB=$PWD/build/linux-x86_64/cuda-$arch/libcoli_cuda.so
[[ -n ${FAST:-} ]] || cp "build/linux-x86_64/reports/validate-cuda-$arch.json" "$out/validate-build.json"
