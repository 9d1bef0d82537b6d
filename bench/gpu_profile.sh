#!/usr/bin/env bash
# Where a decoded token's GPU time goes, kernel by kernel (the device tool): the
# host and CUDA backend as bench/gpu_build.sh builds them, then the large synthetic
# model's decode (int8, 12-token prompt, 64 tokens) with COLI_GPU_PROFILE=1: each op
# timed between events, the time per op kind in ${OUT:-bench/out}/profile.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-bench/out}
work=$(mktemp -d)
mkdir -p "$out"
source bench/gpu_build.sh || exit 1
python3 bench/make_synthetic.py "$work/large" > /dev/null
ids=$(python3 -c "import random;random.seed(1);print(','.join(str(random.randrange(2,32000)) for _ in range(12)))")
COLI_GPU_PROFILE=1 "$HOST" --model "$work/large" --ids "$ids" --generate 64 --quant "${QUANT:-int8}" \
  --backend "$LIB" 2>&1 | tee "$out/profile.txt"
python3 bench/gpu_validate.py "$HOST" "$LIB" "$out/validate.json" > "$out/validate.txt" 2>&1; tail -3 "$out/validate.txt"
