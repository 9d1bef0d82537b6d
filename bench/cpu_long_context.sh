#!/usr/bin/env bash
# The CPU after a long prompt: the larger synthetic model (MODEL, default /tmp/large;
# bench/make_synthetic.py makes it) decoding GENERATE tokens (default 16) after prompts
# of each length in PROMPTS (default "128 4000"; seeded random ids), at QUANT (default
# int4) on THREADS (default 2) threads,
# with each cache form in KV (default "expanded latent"; coli --kv): the prefill's
# seconds, the decode's tok/s and where the decode's time went.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${MODEL:-/tmp/large} quant=${QUANT:-int4} threads=${THREADS:-2}
coli=${COLI:-build/linux-x86_64/host/coli}
ids() { python3 -c "import random;random.seed(1);print(','.join(str(random.randrange(2,32000)) for _ in range($1)))"; }
for n in ${PROMPTS:-128 4000}; do
  for kv in ${KV:-expanded latent}; do
    "$coli" --model "$model" --ids "$(ids "$n")" --generate "${GENERATE:-16}" --quant "$quant" --threads "$threads" --kv "$kv" --json |
      python3 -c "import json,sys; d=json.load(sys.stdin); print(json.dumps({'prompt': $n, 'kv': d['kv_cache'], 'prefill_seconds': d['prefill_seconds'], 'decode_tokens_per_second': d['decode_tokens_per_second'], 'decode_phase_seconds': d['decode_phase_seconds'], 'generated': hash(tuple(d['generated'])) % 10**8}))"
  done
done
