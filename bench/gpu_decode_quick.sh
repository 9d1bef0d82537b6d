#!/usr/bin/env bash
# A short check of the step's decode on a CUDA machine (the device tool): the build
# as bench/gpu_build.sh makes it (validate included), then the large synthetic
# model's decode after a 12-token prompt at int8 and int4 (128 tokens), and the
# per-op profile of the int8 one. Lines in ${OUT:-bench/out}/quick.jsonl.
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/gpu_build.sh || exit 1
source bench/gpu_large.sh
for q in int8 int4; do
  "$HOST" --model "$work/large" --ids "$ids" --generate 128 --quant $q --backend "$LIB" --json | python3 -c "
import json, sys
d = json.load(sys.stdin)
print(json.dumps({k: d[k] for k in ('quant', 'tier', 'decode_tokens_per_second', 'decode_round_trips')} |
                 {'generated': hash(tuple(d['generated'])) % 10**8}))" | tee -a "$out/quick.jsonl"
done
COLI_GPU_PROFILE=1 "$HOST" --model "$work/large" --ids "$ids" --generate 64 --quant int8 --backend "$LIB" \
  2> "$out/profile.txt" > /dev/null
cat "$out/profile.txt"
