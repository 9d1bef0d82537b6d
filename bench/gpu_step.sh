#!/usr/bin/env bash
# The whole step on a CUDA machine (the device tool), in one call: the host and the
# CUDA backend built, verified and validated by the task graph (bench/gpu_build.sh:
# the selftest's gpu shapes with every step op, and the engine through CUDA against
# the CPU path at f32/int8/int4, teacher forcing and a 20-token greedy decode); the
# selftest under compute-sanitizer (memcheck, racecheck); the greedy decode through
# CUDA against the oracle; then the large synthetic model: decode after a 12-token
# prompt (the step, the step without graphs, overlapped launches, fused ops or side
# streams, the matmuls-only tier), a 256-token prefill, and decode after a 4,000-token
# prompt, beside the device's copy bandwidth measured in the same run; and where the
# GPU time of a decode, of a prefill and of a decode after a long prompt goes. Results go to ${OUT:-bench/out}.
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/gpu_build.sh || exit 1
grep -E "^validate|^  (ok|FAIL)" "$out/build.txt"
rc=0
"$HOST" --backend "$LIB" --selftest > "$out/selftest.txt" || rc=1
grep -E "^  op |passed|FAILED" "$out/selftest.txt"
source bench/gpu_sanitize.sh
sanitize
python3 bench/gpu_validate.py "$HOST" "$LIB" "$out/validate.json" || rc=1
# the device's copy bandwidth (device to device, 1 GiB, median of 20), for the limits below
python3 - > "$out/copy.json" <<'EOF'
import json, statistics, torch
n = 1 << 28
a, b = torch.empty(n, device="cuda"), torch.empty(n, device="cuda")
ts = []
for _ in range(22):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); b.copy_(a); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e) / 1e3)
t = statistics.median(ts[2:])
print(json.dumps({"copy_GBps": 2 * 4 * n / t / 1e9, "bytes": 2 * 4 * n, "seconds": t}))
EOF
cat "$out/copy.json"
python3 bench/make_synthetic.py "$work/large" > /dev/null
prompt() { python3 -c "import random;random.seed($2);print(','.join(str(random.randrange(2,32000)) for _ in range($1)))"; }
run() { # label quant prompt_len generate extra-args...
  local label=$1 q=$2 n=$3 g=$4
  shift 4
  "$HOST" --model "$work/large" --ids "$(prompt "$n" 1)" --generate "$g" --quant "$q" --json "$@" \
    | python3 -c "
import json, sys
d = json.load(sys.stdin)
copy = json.load(open('$out/copy.json'))['copy_GBps'] * 1e9
keep = ('backend', 'tier', 'quant', 'positions', 'prefill_seconds', 'decode_seconds', 'decode_tokens_per_second',
        'decode_round_trips', 'step_ops', 'resident_bytes', 'resident_tensors', 'token_weight_bytes',
        'kv_bytes_per_position')
r = {k: d.get(k) for k in keep}
r['label'] = '$label'
r['prefill_tokens_per_second'] = d['positions'] / d['prefill_seconds']
r['generated'] = hash(tuple(d['generated'])) % 10**8
if d['tier'] == 'step':  # the limit: what a token reads (weights, and the cache at the mean position)
    per_token = d['token_weight_bytes'] + d['kv_bytes_per_position'] * ($n + $g / 2)
    r['limit_tokens_per_second'] = copy / per_token
print(json.dumps(r))" | tee -a "$out/step.jsonl"
}
for q in f32 int8 int4; do
  run step "$q" 12 128 --backend "$LIB"
  run cpu "$q" 12 128 --backend none --kv expanded  # the cache form the step keeps
done
COLI_GPU_GRAPHS=0 run step-no-graphs int8 12 128 --backend "$LIB"
COLI_GPU_CHAIN=0 run step-no-chain int8 12 128 --backend "$LIB"
COLI_GPU_FUSE=0 run step-no-fuse int8 12 128 --backend "$LIB"
for n in 1 2 4; do COLI_GPU_STREAMS=$n run "step-streams-$n" int8 12 128 --backend "$LIB"; done
run matmuls int4 12 128 --backend "$LIB" --offload matmuls
for q in int8 int4; do run prefill-256 "$q" 256 2 --backend "$LIB"; done
run long-4000 int4 4000 128 --backend "$LIB"
run long-4000 int8 4000 128 --backend "$LIB"
# where the decode's GPU time goes, op kind by op kind (each op timed alone between events)
COLI_GPU_PROFILE=1 "$HOST" --model "$work/large" --ids "$(prompt 12 1)" --generate 64 --quant int8 --backend "$LIB" \
  2> "$out/profile.txt" > /dev/null
cat "$out/profile.txt"
# and the 256-token prefill's (one step of 256, then one decoded token)
COLI_GPU_PROFILE=1 "$HOST" --model "$work/large" --ids "$(prompt 256 1)" --generate 1 --quant int8 --backend "$LIB" \
  2> "$out/profile-prefill.txt" > /dev/null
cat "$out/profile-prefill.txt"
# and a decoded token's after a 4,000-token prompt: 33 tokens less 1, so the prompt's
# prefill drops out
for g in 1 33; do
  COLI_GPU_PROFILE=1 "$HOST" --model "$work/large" --ids "$(prompt 4000 1)" --generate "$g" --quant int8 \
    --backend "$LIB" 2> "$out/profile-long-$g.txt" > /dev/null
done
python3 bench/gpu_profile_diff.py "$out/profile-long-1.txt" "$out/profile-long-33.txt" 32 | tee "$out/profile-long.txt"
exit "$rc"
