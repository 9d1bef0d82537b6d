#!/usr/bin/env bash
# On a CUDA machine (the device tool): the host and the CUDA backend built and
# validated by the task graph (bench/gpu_build.sh), then a synthetic model's tokens
# through CUDA and on the CPU, side by side: a 128-token greedy decode at f32, int8
# and int4, and teacher forcing of 64 positions at int8 and int4. Each line: format,
# tier, decode tok/s, the load's seconds (every tensor quantised and, through CUDA,
# uploaded), the tensors resident in the backend, a hash of the tokens; the two tiers
# of a format must print the same hash. PRESET picks make_synthetic.py's model
# (large, the default; many-tensors: about 44,000 tensors, for how an upload scales
# with their count).
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/gpu_build.sh || exit 1
grep -E "^validate|FAIL" "$out/build.txt"
model=$work/${PRESET:=large}
python3 bench/make_synthetic.py "$model" --preset "$PRESET" > /dev/null
vocab=$(python3 -c "import json;print(json.load(open('$model/config.json'))['vocab_size'])")
prompt() { python3 -c "import random;random.seed(1);print(','.join(str(random.randrange(2,$vocab)) for _ in range($1)))"; }
show() { # label: one line from coli's JSON on stdin
  python3 -c "import json,sys; d=json.load(sys.stdin); t=d.get('generated', d.get('tf_pred'));
print('$1', d['tier'], round(d.get('decode_tokens_per_second') or 0, 1), 'load', round(d['load_seconds'], 3),
      'resident', d['resident_tensors'], hash(tuple(t)))"
}
for q in f32 int8 int4; do
  for b in "$LIB" none; do
    "$HOST" --model "$model" --ids "$(prompt 12)" --generate 128 --quant "$q" --backend "$b" --kv expanded --json | show "$q"
  done
done
for q in int8 int4; do
  for b in "$LIB" none; do
    "$HOST" --model "$model" --ids "$(prompt 64)" --teacher-force --quant "$q" --backend "$b" --kv expanded --json | show "$q tf"
  done
done
