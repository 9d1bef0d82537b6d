#!/usr/bin/env bash
# Where a decoded token's time goes on the device's own clock, on a CUDA machine (the
# device tool): the build as bench/gpu_build.sh makes it, the CUPTI tracer
# (bench/gpu_trace.c) built against the toolkit, and the large synthetic model's
# decode (12-token prompt, 128 tokens; QUANTS, "int8 int4") traced, then the same
# after a 4,000-token prompt (LONG, "int8"). bench/gpu_timeline.py charges each
# replay's span to the kernels that ended in it: $out/timeline-<label>.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/gpu_build.sh || exit 1
source bench/gpu_large.sh
# the toolkit nvcc runs from (nvcc may be a wrapper elsewhere): its dry run names it
cuda=$(nvcc -dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p')
cupti=$(find "$cuda/" -name 'libcupti.so' -print -quit)
inc=$(dirname "$(find "$cuda/" -name cupti.h -print -quit)")
cc -O2 -shared -fPIC -I"$inc" -I"$cuda/include" bench/gpu_trace.c -o "$work/gpu_trace.so" \
  -L"$(dirname "$cupti")" -lcupti -Wl,-rpath,"$(dirname "$cupti")" || exit 1
trace() { # label quant prompt-ids
  COLI_TRACE_OUT="$work/$1.trace" LD_PRELOAD="$work/gpu_trace.so" \
    "$HOST" --model "$work/large" --ids "$3" --generate 128 --quant "$2" --backend "$LIB" --json > "$work/$1.json"
  python3 -c "import json; d = json.load(open('$work/$1.json')); print('$1', d['decode_tokens_per_second'])"
  python3 bench/gpu_timeline.py "$work/$1.trace" --dump "$out/replay-$1.txt" | tee "$out/timeline-$1.txt"
}
for q in ${QUANTS:-int8 int4}; do trace "$q" "$q" "$ids"; done
long=$(python3 -c "import random;random.seed(1);print(','.join(str(random.randrange(2,32000)) for _ in range(4000)))")
for q in ${LONG:-int8}; do trace "long-$q" "$q" "$long"; done
