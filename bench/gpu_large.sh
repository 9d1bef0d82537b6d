#!/usr/bin/env bash
# Sourced by the decode scripts after bench/gpu_build.sh: the build's validate lines,
# the large synthetic model in $work/large, and ids, the 12-token prompt they decode after.
grep -E "^validate" "$out/build.txt"
python3 bench/make_synthetic.py "$work/large" > /dev/null
ids=$(python3 -c "import random;random.seed(1);print(','.join(str(random.randrange(2,32000)) for _ in range(12)))")
