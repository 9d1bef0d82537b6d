#!/usr/bin/env bash
# Builds compared on one CUDA machine (the device tool), their runs alternating so that
# every side of a comparison sees the same machine: the working tree as
# bench/gpu_build.sh builds it (validate included; FAST=1: host and backend only),
# labelled "tree", and each commit bench/gpu_ab_pack.sh put in .ab/ (AB_DIR; carried),
# built from its tarball by its own task graph (host and backend; VALIDATE=1: its whole
# build, validate included), all side by side. Then the
# large synthetic model's decode: 128 tokens after the 12-token prompt at each of
# QUANTS ("int8 int4"), REPEAT times (3), and 64 tokens after a 4,000-token prompt at
# each of LONG ("int8"), LONG_REPEAT times (2). Lines in ${OUT:-bench/out}/ab.jsonl
# (build, quant, prompt, tok/s, prefill seconds, the generated tokens' hash), then
# each build's medians (decode tok/s and prefill seconds). CHECKS=1 then runs the
# tree's selftest (gpu shapes) alone and under compute-sanitizer (bench/gpu_sanitize.sh),
# and the script exits 1 where any of them fails.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-bench/out} work=$(mktemp -d) arch=${COLI_GPU_ARCH:-sm_90}
mkdir -p "$out"
source bench/device_wheels.sh || exit 1
# the packed commits build side by side, and beside the tree's (each build is mostly
# one nvcc on one core)
revs=() pids=()
for tarball in "${AB_DIR:-.ab}"/*.tar; do
  [[ -e $tarball ]] || continue
  rev=$(basename "$tarball" .tar) dir=$work/ab-$rev
  mkdir -p "$dir" && tar -xf "$tarball" -C "$dir"
  targets=(host backend)
  [[ -n ${VALIDATE:-} ]] && targets=(build)
  (cd "$dir" && python3 -m doit -n "$(nproc)" "${targets[@]}" "arch=$arch") > "$out/build-$rev.txt" 2>&1 &
  revs+=("$rev") pids+=("$!")
done
source bench/gpu_build.sh || exit 1
source bench/gpu_large.sh
labels=(tree) hosts=("$HOST") libs=("$LIB")
for i in "${!revs[@]}"; do
  rev=${revs[$i]} dir=$work/ab-$rev
  wait "${pids[$i]}" || { tail -20 "$out/build-$rev.txt"; exit 1; }
  grep -E "^validate" "$out/build-$rev.txt"
  labels+=("$rev") hosts+=("$dir/build/linux-x86_64/host/coli") libs+=("$dir/build/linux-x86_64/cuda-$arch/libcoli_cuda.so")
done
long=$(python3 -c "import random;random.seed(1);print(','.join(str(random.randrange(2,32000)) for _ in range(4000)))")
decode() { # build-index quant prompt-ids tokens
  "${hosts[$1]}" --model "$work/large" --ids "$3" --generate "$4" --quant "$2" --backend "${libs[$1]}" --json |
    python3 -c "
import json, sys
d = json.load(sys.stdin)
print(json.dumps({'build': '${labels[$1]}', 'quant': '$2', 'prompt': len('$3'.split(',')), 'tok_s': d['decode_tokens_per_second'],
                  'prefill_s': d['prefill_seconds'], 'generated': hash(tuple(d['generated'])) % 10**8}))" | tee -a "$out/ab.jsonl"
}
for _ in $(seq "${REPEAT:-3}"); do
  for q in ${QUANTS:-int8 int4}; do
    for b in "${!labels[@]}"; do decode "$b" "$q" "$ids" 128; done
  done
done
for _ in $(seq "${LONG_REPEAT:-2}"); do
  for q in ${LONG:-int8}; do
    for b in "${!labels[@]}"; do decode "$b" "$q" "$long" 64; done
  done
done
python3 bench/decode_medians.py "$out/ab.jsonl" --by quant,prompt,build --value tok_s --also prefill_s
if [[ -n ${CHECKS:-} ]]; then
  rc=0
  "$HOST" --backend "$LIB" --selftest --shapes gpu > "$out/selftest.txt" 2>&1 || rc=1
  grep -E "passed|FAIL" "$out/selftest.txt"
  source bench/gpu_sanitize.sh
  sanitize --shapes gpu
  exit "$rc"
fi
