#!/usr/bin/env bash
# Run by hand on a CUDA machine (the device tool): builds, verifies and validates
# the host and the CUDA backend with the task graph (bench/gpu_build.sh), then runs
# the selftest's gpu shapes (every op against the CPU path, bad inputs, resident
# count) under compute-sanitizer, the greedy decode through CUDA, and the larger
# synthetic model's decode and prefill with ABI 1's split (--offload matmuls; the
# whole step is bench/gpu_step.sh's). Results go to ${OUT:-bench/out}.
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/gpu_build.sh || exit 1
grep -E "^validate|^  (ok|FAIL)" "$out/build.txt"
"$HOST" --backend "$LIB" --selftest --shapes gpu | tee "$out/selftest.txt"
rc=${PIPESTATUS[0]}
source bench/gpu_sanitize.sh
sanitize --shapes gpu
echo "selftest and sanitizers exit $rc"
# the engine on the reference models: CPU vs oracle, CUDA vs CPU at f32/int8/int4, greedy via CUDA
python3 bench/gpu_validate.py "$HOST" "$LIB" "$out/validate.json" || rc=1
# decode speed, GPU vs CPU, on the larger synthetic model
if [[ ${COLI_BENCH_LARGE:-1} == 1 ]]; then
  python3 bench/make_synthetic.py "$work/large" > /dev/null
  ids=$(python3 -c "import random;random.seed(1);print(','.join(str(random.randrange(2,32000)) for _ in range(12)))")
  for backend in none "$LIB"; do
    for q in f32 int8 int4; do
      "$HOST" --model "$work/large" --ids "$ids" --generate 64 --quant $q --backend "$backend" --offload matmuls --kv expanded --json \
        | python3 -c "import json,sys;d=json.load(sys.stdin);print(json.dumps({'backend':d['backend'],'quant':d['quant'],'decode_tok_s':d['decode_tokens_per_second'],'resident':d['resident_tensors'],'threads':d['threads'],'backend_calls':d['backend_calls'],'backend_matmuls':d['backend_matmuls'],'backend_seconds':d['backend_seconds'],'decode_seconds':d['decode_seconds']}))" \
        | tee -a "$out/large_decode.jsonl"
    done
  done
  # prefill: 256 positions teacher-forced in one forward (the matmuls take all 256 tokens at once)
  ids=$(python3 -c "import random;random.seed(2);print(','.join(str(random.randrange(2,32000)) for _ in range(256)))")
  for backend in none "$LIB"; do
    for q in f32 int8 int4; do
      "$HOST" --model "$work/large" --ids "$ids" --teacher-force --quant $q --backend "$backend" --offload matmuls --kv expanded --json \
        | python3 -c "import json,sys;d=json.load(sys.stdin);print(json.dumps({'backend':d['backend'],'quant':d['quant'],'positions':d['positions'],'prefill_tok_s':d['tokens_per_second'],'seconds':d['seconds'],'backend_seconds':d['backend_seconds'],'resident':d['resident_tensors'],'threads':d['threads'],'tf_pred_hash':hash(tuple(d['tf_pred']))%10**8}))" \
        | tee -a "$out/large_prefill.jsonl"
    done
  done
fi
exit "$rc"
