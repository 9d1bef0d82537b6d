#!/usr/bin/env bash
# On a CUDA machine: large-model decode through the CUDA backend with its fast kernels
# and with COLI_GPU_SIMPLE=1 (the simple kernel), side by side. build/gen carried.
set -uo pipefail
work=$(mktemp -d)
inc="-Ibuild/gen -Ikernels -Iengine"
gcc -std=c11 -O2 $inc engine/*.c kernels/cpu_ops.c -lm -lpthread -o $work/coli
bash bench/build_cuda_backend.sh $work/libcoli_cuda.so
python3 bench/make_synthetic.py $work/large > /dev/null
ids=$(python3 -c "import random;random.seed(1);print(','.join(str(random.randrange(2,32000)) for _ in range(12)))")
for simple in 0 1; do for q in f32 int8 int4; do
  if [ $simple = 1 ]; then export COLI_GPU_SIMPLE=1; else unset COLI_GPU_SIMPLE; fi
  $work/coli --model $work/large --ids $ids --generate 64 --quant $q --backend $work/libcoli_cuda.so --json | python3 -c "import json,sys;d=json.load(sys.stdin);print('simple=$simple', '$q', d['decode_tokens_per_second'], 'prefill', round(d['prefill_seconds'],3))"
done; done
nsys --version 2>/dev/null | head -1
