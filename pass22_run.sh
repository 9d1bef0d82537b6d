#!/bin/bash
# pass 22, run 10: the tile layout from 2048 to 8192 rows: every S against COLI_GPU_TILE=0, then the checks
nvcc -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -Ibuild/gen -Ikernels bench/gpu_matmul_bench.cu -lcublas -o /tmp/b || exit 1
d=$(mktemp -d); w=$(mktemp -d)
inc="-Ibuild/gen -Ikernels -Iengine"
gcc -std=c11 -O2 -Wall -Wextra $inc engine/*.c kernels/cpu_ops.c -lm -lpthread -o $w/coli &
bash bench/build_cuda_backend.sh $w/libcoli_cuda.so -gencode arch=compute_80,code=sm_80 -gencode 'arch=compute_90,code=[sm_90,compute_90]' &
S=2048x14336,2048x12288,2048x8192,6144x14336,8192x14336,8192x12288,8192x8192
COLI_BENCH_SHAPES=$S COLI_BENCH_ONLY="auto" timeout 150 /tmp/b > $d/tile.jsonl 2> $d/tile.err
COLI_GPU_TILE=0 COLI_BENCH_SHAPES=$S COLI_BENCH_ONLY="auto" timeout 150 /tmp/b > $d/mma.jsonl 2> $d/mma.err
wait
$w/coli --backend $w/libcoli_cuda.so --selftest > $d/selftest.txt 2>&1; echo "selftest $?"
timeout 100 python3 bench/gpu_validate.py $w/coli $w/libcoli_cuda.so $d/validate.json > $d/validate.txt 2>&1; echo "validate $?"
timeout 120 compute-sanitizer --tool memcheck $w/coli --backend $w/libcoli_cuda.so --selftest > $d/memcheck.txt 2>&1; echo "memcheck $? $(tail -1 $d/memcheck.txt)"
tail -n 1 $d/*.err; tail -n 3 $d/selftest.txt; tail -n 4 $d/validate.txt
tar -C $d -czf $OUT/run10.tgz .
