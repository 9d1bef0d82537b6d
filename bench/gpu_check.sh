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
bash bench/build_cuda_backend.sh "$work/libcoli_cuda.so" \
  -gencode arch=compute_80,code=sm_80 -gencode 'arch=compute_90,code=[sm_90,compute_90]' || exit 1
"$work/coli" --backend "$work/libcoli_cuda.so" --selftest --shapes gpu | tee "$out/selftest.txt"
rc=${PIPESTATUS[0]}
"$work/coli" --backend "$work/libcoli_cuda.so" --selftest --shapes gpu --json > "$out/selftest.json"
if command -v compute-sanitizer >/dev/null; then
  compute-sanitizer --tool memcheck --leak-check full "$work/coli" --backend "$work/libcoli_cuda.so" --selftest --shapes gpu \
    > "$out/memcheck.txt" 2>&1
  # the selftest's out-of-memory case makes cudaMalloc fail on purpose: API errors are listed, not memory
  # errors; any error beyond them fails the check
  errors=$(grep -o 'ERROR SUMMARY: [0-9]* error' "$out/memcheck.txt" | grep -o '[0-9]*')
  api=$(grep -c 'Program hit' "$out/memcheck.txt")
  echo "memcheck: ${errors:-no summary} error(s), $api of them the deliberate API errors"
  [[ -n $errors && $errors == "$api" ]] || rc=1
  compute-sanitizer --tool racecheck "$work/coli" --backend "$work/libcoli_cuda.so" --selftest --shapes gpu \
    > "$out/racecheck.txt" 2>&1
  summary=$(grep -m1 'RACECHECK SUMMARY' "$out/racecheck.txt")
  echo "racecheck: ${summary:-no summary}"
  [[ $summary == *": 0 hazards displayed (0 errors, 0 warnings)"* ]] || rc=1
fi
echo "selftest and sanitizers exit $rc"
# the engine on the reference models: CPU vs oracle, CUDA vs CPU at f32/int8/int4, greedy via CUDA
python3 bench/gpu_validate.py "$work/coli" "$work/libcoli_cuda.so" "$out/validate.json" || rc=1
# decode speed, GPU vs CPU, on the larger synthetic model
if [[ ${COLI_BENCH_LARGE:-1} == 1 ]]; then
  python3 bench/make_synthetic.py "$work/large" > /dev/null
  ids=$(python3 -c "import random;random.seed(1);print(','.join(str(random.randrange(2,32000)) for _ in range(12)))")
  for backend in none "$work/libcoli_cuda.so"; do
    for q in f32 int8 int4; do
      "$work/coli" --model "$work/large" --ids "$ids" --generate 64 --quant $q --backend "$backend" --json \
        | python3 -c "import json,sys;d=json.load(sys.stdin);print(json.dumps({'backend':d['backend'],'quant':d['quant'],'decode_tok_s':d['decode_tokens_per_second'],'resident':d['resident_tensors'],'threads':d['threads'],'backend_calls':d['backend_calls'],'backend_matmuls':d['backend_matmuls'],'backend_seconds':d['backend_seconds'],'decode_seconds':d['decode_seconds']}))" \
        | tee -a "$out/large_decode.jsonl"
    done
  done
  # prefill: 256 positions teacher-forced in one forward (the matmuls take all 256 tokens at once)
  ids=$(python3 -c "import random;random.seed(2);print(','.join(str(random.randrange(2,32000)) for _ in range(256)))")
  for backend in none "$work/libcoli_cuda.so"; do
    for q in f32 int8 int4; do
      "$work/coli" --model "$work/large" --ids "$ids" --teacher-force --quant $q --backend "$backend" --json \
        | python3 -c "import json,sys;d=json.load(sys.stdin);print(json.dumps({'backend':d['backend'],'quant':d['quant'],'positions':d['positions'],'prefill_tok_s':d['tokens_per_second'],'seconds':d['seconds'],'backend_seconds':d['backend_seconds'],'resident':d['resident_tensors'],'threads':d['threads'],'tf_pred_hash':hash(tuple(d['tf_pred']))%10**8}))" \
        | tee -a "$out/large_prefill.jsonl"
    done
  done
fi
exit "$rc"
