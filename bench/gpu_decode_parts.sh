#!/usr/bin/env bash
# Where a decoded token's time goes inside the step's graph, on a CUDA machine (the
# device tool): the build as bench/gpu_build.sh makes it, then the large synthetic
# model's decode (12-token prompt, 128 tokens) with each op kind left out of every run
# (COLI_GPU_OMIT) and with an empty one-block kernel in each one's place
# (COLI_GPU_OMIT_AS=empty). A kind's "left out" difference is what it adds to a token
# (its work and its launches on the graph's critical path); "empty" keeps the launches,
# so the two differ by the kind's work past a launch. The tokens are wrong while a kind
# is left out; only the times count. QUANT (int8) picks the format, KINDS the kinds
# (every kind), MODES which runs ("out empty"). Lines in
# ${OUT:-bench/out}/parts.jsonl, a table in parts.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/gpu_build.sh || exit 1
source bench/gpu_large.sh
q=${QUANT:-int8}
run() { # label, then the environment's assignments
  local label=$1
  shift
  env "$@" "$HOST" --model "$work/large" --ids "$ids" --generate 128 --quant "$q" --backend "$LIB" --json |
    python3 -c "
import json, sys
d = json.load(sys.stdin)
print(json.dumps({'label': '$label', 'quant': d['quant'], 'step_ops': d.get('step_ops'),
                  'decode_tokens_per_second': d['decode_tokens_per_second']}))" | tee -a "$out/parts.jsonl"
}
for i in 1 2 3; do run all; done
kinds=${KINDS:-rmsnorm layernorm rope write_rows add silu_mul indexer attend route moe matmul-f32 matmul-$q add_rmsnorm}
modes=${MODES:-out empty}
for k in $kinds; do
  [[ $modes == *out* ]] && run "$k out" COLI_GPU_OMIT="$k"
  [[ $modes == *empty* ]] && run "$k empty" COLI_GPU_OMIT="$k" COLI_GPU_OMIT_AS=empty
done
small="rmsnorm,layernorm,rope,write_rows,add,silu_mul,add_rmsnorm"
run "small ops out" COLI_GPU_OMIT="$small"
run "small ops empty" COLI_GPU_OMIT="$small" COLI_GPU_OMIT_AS=empty
run "matmuls out" COLI_GPU_OMIT="matmul-f32,matmul-$q"
run "all but matmuls out" COLI_GPU_OMIT="$small,indexer,attend,route,moe"
for i in 1 2 3; do run all; done
python3 - "$out/parts.jsonl" > "$out/parts.txt" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
base = statistics.median(r["decode_tokens_per_second"] for r in rows if r["label"] == "all")
print(f"{rows[0]['quant']}: all ops {1e3 / base:.3f} ms a token ({base:.1f} tok/s, median of the 'all' runs)")
print(f"{'run':24} {'tok/s':>8} {'ms/token':>9} {'saved':>8}")
for r in rows:
    t = 1e3 / r["decode_tokens_per_second"]
    print(f"{r['label']:24} {r['decode_tokens_per_second']:8.1f} {t:9.3f} {1e3 / base - t:8.3f}")
PY
cat "$out/parts.txt"
