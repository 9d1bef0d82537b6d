#!/usr/bin/env bash
# On a CUDA machine (the device tool): the host and the CUDA backend built and
# validated by the task graph (bench/gpu_build.sh), then the larger synthetic
# model's tokens through CUDA and on the CPU, side by side: a 128-token greedy
# decode at f32, int8 and int4, and teacher forcing of 64 positions at int8 and
# int4. Each line: format, tier, decode tok/s, a hash of the tokens; the two
# tiers of a format must print the same hash.
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/gpu_build.sh || exit 1
grep -E "^validate|FAIL" "$out/build.txt"
python3 bench/make_synthetic.py "$work/large" > /dev/null
prompt() { python3 -c "import random;random.seed(1);print(','.join(str(random.randrange(2,32000)) for _ in range($1)))"; }
for q in f32 int8 int4; do
  for b in "$LIB" none; do
    "$HOST" --model "$work/large" --ids "$(prompt 12)" --generate 128 --quant "$q" --backend "$b" --kv expanded --json |
      python3 -c "import json,sys; d=json.load(sys.stdin); print('$q', d['tier'], round(d['decode_tokens_per_second'],1), hash(tuple(d['generated'])))"
  done
done
for q in int8 int4; do
  for b in "$LIB" none; do
    "$HOST" --model "$work/large" --ids "$(prompt 64)" --teacher-force --quant "$q" --backend "$b" --kv expanded --json |
      python3 -c "import json,sys; d=json.load(sys.stdin); print('$q tf', d['tier'], hash(tuple(d['tf_pred'])))"
  done
done
