#!/usr/bin/env bash
# A short check of the step's decode on a CUDA machine (the device tool): the build
# as bench/gpu_build.sh makes it (validate included), then the large synthetic
# model's decode after a 12-token prompt at int8 and int4 (128 tokens), REPEAT
# times (3), each time once as built and once with each setting of COMPARE (say
# COMPARE="COLI_GPU_STREAMS=4 COLI_GPU_CHAIN=0"), alternating, so that both sides
# of a comparison see the same machine; then the per-op profile of the int8 one.
# Lines in ${OUT:-bench/out}/quick.jsonl; the generated tokens' hash in each, so a
# setting that changes the tokens shows.
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/gpu_build.sh || exit 1
source bench/gpu_large.sh
decode() { # quant setting ("" for as built)
  env ${2:+"$2"} "$HOST" --model "$work/large" --ids "$ids" --generate 128 --quant "$1" --backend "$LIB" --json |
    python3 -c "
import json, sys
d = json.load(sys.stdin)
print(json.dumps({'setting': '${2:-as built}'} | {k: d[k] for k in ('quant', 'tier', 'decode_tokens_per_second', 'decode_round_trips')} |
                 {'generated': hash(tuple(d['generated'])) % 10**8}))" | tee -a "$out/quick.jsonl"
}
for _ in $(seq "${REPEAT:-3}"); do
  for q in int8 int4; do
    decode "$q" ""
    for c in ${COMPARE:-}; do decode "$q" "$c"; done
  done
done
python3 bench/decode_medians.py "$out/quick.jsonl" --by quant,setting --value decode_tokens_per_second
COLI_GPU_PROFILE=1 "$HOST" --model "$work/large" --ids "$ids" --generate 64 --quant int8 --backend "$LIB" \
  2> "$out/profile.txt" > /dev/null
cat "$out/profile.txt"
