#!/usr/bin/env bash
# Where a step's time goes, on a CUDA machine (the device tool): the host and the
# CUDA backend built by the task graph (bench/gpu_build.sh), then the large
# synthetic model decoding 128 tokens after a 12-token prompt (f32, int8, int4) and
# after a 3,900-token prompt (int4), on the CPU and through CUDA with ABI 1's split
# (--offload matmuls: the forward on the CPU, its dense matmuls in CUDA). Each line of
# $out/phases.jsonl is one run: the prefill's and the decode's seconds split into
# the engine's phases (coli --json: linears, routed_experts, attention, indexer,
# other), with the backend's share of the linears.
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/gpu_build.sh || exit 1
python3 bench/make_synthetic.py "$work/large" > /dev/null
prompt() { python3 -c "import random;random.seed($2);print(','.join(str(random.randrange(2,32000)) for _ in range($1)))"; }
run() { # backend quant prompt_len
  "$HOST" --model "$work/large" --ids "$(prompt "$3" 1)" --generate 128 --quant "$2" --backend "$1" --offload matmuls --json \
    | python3 -c "
import json, sys
d = json.load(sys.stdin)
keep = ('backend', 'quant', 'threads', 'positions', 'prefill_seconds', 'decode_seconds', 'decode_tokens_per_second',
        'prefill_phase_seconds', 'decode_phase_seconds', 'backend_calls', 'backend_seconds', 'resident_tensors')
print(json.dumps({k: d[k] for k in keep}))" | tee -a "$out/phases.jsonl"
}
for backend in none "$LIB"; do
  for q in f32 int8 int4; do run "$backend" "$q" 12; done
done
for backend in "$LIB" none; do run "$backend" int4 3900; done
