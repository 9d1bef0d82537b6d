"""transformers on the GPU beside the step's figures (bench/RESULTS.md, "The whole step"):
the same model and the same runs as bench/gpu_step.sh's, eager, in bfloat16 and float32.

    python3 bench/gpu_transformers.py MODEL_DIR [--repeat 3] > out.jsonl

A greedy decode of 128 tokens after the 12-token prompt bench/gpu_large.sh makes (the
first token's time, its prefill, taken off), and a 256-position forward (a prefill);
medians of --repeat after one warm-up each. One JSON line a dtype. Needs torch with
CUDA and transformers (on the device tool: its wheels carried, README "The GPU run").
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

PROMPT, DECODE, PREFILL = 12, 128, 256


def seeded_ids(n: int) -> list[int]:
    """bench/gpu_step.sh's prompt(): seed 1, ids in [2, 32000)."""
    random.seed(1)
    return [random.randrange(2, 32000) for _ in range(n)]


def timed(fn: Any, sync: Any) -> float:
    sync()
    t = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t


def bench(model_dir: Path, dtype_name: str, repeat: int) -> dict[str, Any]:
    import torch
    from transformers import GlmMoeDsaForCausalLM

    dtype = getattr(torch, dtype_name)
    m = GlmMoeDsaForCausalLM.from_pretrained(model_dir, dtype=dtype).to("cuda").eval()
    sync = torch.cuda.synchronize
    prompt = torch.tensor([seeded_ids(PROMPT)], device="cuda")
    long = torch.tensor([seeded_ids(PREFILL)], device="cuda")
    decode, prefill = [], []
    with torch.no_grad():
        m.generate(prompt, max_new_tokens=2, do_sample=False)  # warm-up
        m(long)
        for _ in range(repeat):
            first = timed(lambda: m.generate(prompt, max_new_tokens=1, do_sample=False), sync)
            total = timed(
                lambda: m.generate(prompt, max_new_tokens=DECODE, min_new_tokens=DECODE, do_sample=False), sync
            )
            decode.append((DECODE - 1) / (total - first))
            prefill.append(PREFILL / timed(lambda: m(long), sync))
    return {
        "dtype": dtype_name,
        "decode_tokens_per_second": statistics.median(decode),
        "decode_runs": decode,
        "prefill_256_tokens_per_second": statistics.median(prefill),
        "device": torch.cuda.get_device_name(),
        "versions": f"transformers {__import__('transformers').__version__}, torch {torch.__version__}",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dtypes", default="bfloat16,float32")
    args = ap.parse_args()
    for name in args.dtypes.split(","):
        print(json.dumps(bench(args.model, name, args.repeat)), flush=True)


if __name__ == "__main__":
    main()
