#!/usr/bin/env bash
# The CPU path of several builds on the device machine's cores (16 of them, shared), in
# turn: each commit bench/gpu_ab_pack.sh put in .ab/ (AB_DIR) built by its own task
# graph (the host only), then the large synthetic model's decode of 128 tokens after the
# 12-token prompt at int4 and int8 on every core (coli's default threads), REPEAT times
# (4). One line a decode: round, format, build, threads, tok/s, the tokens' hash.
# MODEL: a large synthetic model already made (else one is made for the run).
#   here: bash bench/gpu_ab_pack.sh REV...; there (carry .whl and .ab): bash bench/cpu_ab_device.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/device_wheels.sh || exit 1
work=$(mktemp -d)
model=${MODEL:-$work/large} # MODEL: a large synthetic model already made
[[ -n ${MODEL:-} ]] || python3 bench/make_synthetic.py "$model" > /dev/null &
made=$!
revs=() pids=()
for t in "${AB_DIR:-.ab}"/*.tar; do
  r=$(basename "$t" .tar); mkdir -p "$work/$r" && tar -xf "$t" -C "$work/$r"
  (cd "$work/$r" && python3 -m doit -n 4 host > "$work/$r.log" 2>&1) & revs+=("$r") pids+=("$!")
done
for i in "${!revs[@]}"; do wait "${pids[$i]}" || { tail -20 "$work/${revs[$i]}.log"; exit 1; }; done
wait "$made" || { echo "cpu_ab_device.sh: the synthetic model was not made" >&2; exit 1; }
ids=$(python3 -c "import random;random.seed(1);print(','.join(str(random.randrange(2,32000)) for _ in range(12)))")
echo "cores: $(nproc)"
for i in $(seq "${REPEAT:-4}"); do
  for q in int4 int8; do
    for r in "${revs[@]}"; do
      "$work/$r/build/linux-x86_64/host/coli" --model "$model" --ids "$ids" --generate 128 --quant $q --json 2>/dev/null |
        python3 -c "import json,sys; d=json.load(sys.stdin); print('$i $q $r', d['threads'], d['decode_tokens_per_second'], hash(tuple(d['generated']))%10**8)"
    done
  done
done
