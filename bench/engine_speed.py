"""The engine against transformers on the same model and threads, in one run.

    python bench/engine_speed.py --coli build/linux-x86_64/host/coli \
        --model tiny=tests/fixtures/models/glm_tiny --model large=/tmp/large --threads 2 --out bench/results/x.json

Runs with the oracle environment (tools/oracle/requirements.txt: torch, transformers).
For each model: teacher forcing over 32 and 256 positions (--positions) and greedy
decode of 32 tokens after a 12-token prompt; the engine at f32, int8 and int4 and
transformers at float32; medians of --repeat runs (with --baseline, the two builds' runs taken in
turn); the engine's peak RSS (/usr/bin/time) against
the size of the weights. In the same run, bench/read_bandwidth.c measures what the
engine's threads can stream, and each decode figure is given as a share of the
limit that sets: that bandwidth over what a decoded token reads (its weights, and
the caches at the decode's mean position). The probe runs once before the models and
again right before each round of decodes: this machine's bandwidth moves 10-20% from
one minute to the next, so each decode is set against the probe beside it, and the
share is the median of those ratios.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

PROMPT, DECODE = 12, 32


def cpu_model() -> str:
    """The CPU's name and the SIMD levels the loops choose among: the session machines
    differ (AMD and Intel), and the loops' rates with them."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "")
    flags = next((set(line.split(":", 1)[1].split()) for line in info.splitlines() if line.startswith("flags")), set())
    levels = [f for f in ("avx2", "fma", "avx512f", "avx512_vnni", "gfni", "amx_int8") if f in flags]
    return f"{name or platform.machine()} ({', '.join(levels) or 'no AVX2'})"


def engine(coli: Path, model: Path, args: list[str], threads: int) -> tuple[dict[str, Any], int]:
    argv = ["/usr/bin/time", "-f", "%M", str(coli), "--model", str(model), "--threads", str(threads), "--json", *args]
    proc = subprocess.run(argv, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout), int(proc.stderr.strip().splitlines()[-1])


class Probe:
    """bench/read_bandwidth.c, built once in a folder of its own (gone with the probe), run
    with the engine's threads over 1 GiB."""

    def __init__(self, threads: int) -> None:
        self.tmp = tempfile.TemporaryDirectory()
        self.exe, self.threads = Path(self.tmp.name) / "read_bandwidth", threads
        src = Path(__file__).with_name("read_bandwidth.c")
        subprocess.run(["gcc", "-std=c11", "-O2", "-march=native", "-pthread", str(src), "-o", str(self.exe)],
                       check=True)  # fmt: skip

    def run(self) -> dict[str, Any]:
        argv = [str(self.exe), "--threads", str(self.threads), "--mib", "1024", "--repeat", "7"]
        data: dict[str, Any] = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
        return data

    def bytes_per_second(self) -> float:
        return float(self.run()["read_GBps"]) * 1e9


def bench_engine(
    builds: list[Path], model: Path, ids: list[int], positions: list[int], threads: int, repeat: int, probe: Probe
) -> list[dict[str, Any]]:
    """Each build's figures; with several builds, each run of one is followed by the same run
    of the next, so that a machine that drifts during the run favours none. Each round of
    decodes follows a run of the probe, the limit its decodes are a share of."""
    outs: list[dict[str, Any]] = [{} for _ in builds]
    prompt = ",".join(map(str, ids[:PROMPT]))
    for quant in ("f32", "int8", "int4"):
        tf: list[dict[int, list[float]]] = [{p: [] for p in positions} for _ in builds]
        gen: list[list[float]] = [[] for _ in builds]
        beside: list[float] = []  # the probe before each round of decodes, bytes/s
        rss: list[list[int]] = [[] for _ in builds]
        per_token = [0.0 for _ in builds]  # each build's own: its cache form sets the cache's bytes
        kv = ["expanded" for _ in builds]  # a build from before --kv had only this form
        for _ in range(repeat):
            for p in positions:
                joined = ",".join(map(str, ids[:p]))
                for b, coli in enumerate(builds):
                    d, kb = engine(coli, model, ["--ids", joined, "--teacher-force", "--quant", quant], threads)
                    tf[b][p].append(d["tokens_per_second"])
                    rss[b].append(kb)
            beside.append(probe.bytes_per_second())
            for b, coli in enumerate(builds):
                d, kb = engine(coli, model, ["--ids", prompt, "--generate", str(DECODE), "--quant", quant], threads)
                gen[b].append(d["decode_tokens_per_second"])
                rss[b].append(kb)
                per_token[b] = d["token_weight_bytes"] + d["kv_bytes_per_position"] * (PROMPT + DECODE / 2)
                kv[b] = d.get("kv_cache", kv[b])
        for b in range(len(builds)):
            outs[b][quant] = {
                "teacher_forcing_tokens_per_second": {str(p): statistics.median(v) for p, v in tf[b].items()},
                "decode_tokens_per_second": statistics.median(gen[b]),
                "token_read_bytes": per_token[b],
                "decode_limit_tokens_per_second": statistics.median(beside) / per_token[b],
                "decode_share_of_limit": statistics.median(
                    [t * per_token[b] / bw for t, bw in zip(gen[b], beside, strict=True)]
                ),
                "read_GBps_beside_decodes": [bw / 1e9 for bw in beside],
                "peak_rss_bytes": max(rss[b]) * 1024,
                "kv_cache": kv[b],
            }
    return outs


def bench_transformers(model: Path, ids: list[int], positions: list[int], threads: int, repeat: int) -> dict[str, Any]:
    import torch
    from transformers import GlmMoeDsaForCausalLM

    torch.set_num_threads(threads)
    m = GlmMoeDsaForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    p = torch.tensor([ids[:PROMPT]])
    tf: dict[int, list[float]] = {n: [] for n in positions}
    gen = []
    with torch.no_grad():
        for n in positions:
            m(torch.tensor([ids[:n]]))  # warm-up
        for _ in range(repeat):
            for n in positions:
                x = torch.tensor([ids[:n]])
                t = time.perf_counter()
                m(x)
                tf[n].append(n / (time.perf_counter() - t))
            t = time.perf_counter()
            m.generate(p, max_new_tokens=1, do_sample=False)
            first = time.perf_counter() - t
            t = time.perf_counter()
            m.generate(p, max_new_tokens=DECODE, do_sample=False, min_new_tokens=DECODE)
            total = time.perf_counter() - t
            gen.append((DECODE - 1) / (total - first))
    return {
        "teacher_forcing_tokens_per_second": {str(n): statistics.median(v) for n, v in tf.items()},
        "decode_tokens_per_second": statistics.median(gen),
        "versions": f"transformers {__import__('transformers').__version__}, torch {torch.__version__}",
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--coli", type=Path, required=True)
    ap.add_argument("--model", action="append", required=True, help="name=DIR")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--positions", default="32,256", help="teacher forcing lengths, comma-separated")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--baseline", type=Path, help="another coli build, run beside --coli in the same run")
    ap.add_argument("--engine-only", action="store_true", help="leave transformers out (no oracle environment)")
    args = ap.parse_args()
    probe = Probe(args.threads)
    results: dict[str, Any] = {
        "machine": f"{platform.processor() or platform.machine()}, {subprocess.getoutput('nproc')} cores",
        "cpu": cpu_model(),
        "command": "python " + " ".join(__import__("sys").argv),
        "threads": args.threads,
        "read_bandwidth": probe.run(),
        "models": {},
    }
    positions = [int(p) for p in args.positions.split(",")]
    for spec in args.model:
        name, path = spec.split("=", 1)
        model = Path(path)
        vocab = json.loads((model / "config.json").read_text())["vocab_size"]
        rng = random.Random(1)
        ids = [rng.randrange(2, vocab) for _ in range(max(positions))]
        weights = sum(f.stat().st_size for f in model.glob("*.safetensors"))
        builds = [args.coli, *([args.baseline] if args.baseline else [])]
        engines = bench_engine(builds, model, ids, positions, args.threads, args.repeat, probe)
        eng = engines[0]
        row: dict[str, Any] = {"weights_bytes": weights, "engine": eng}
        if args.baseline:
            row["baseline"] = engines[1]
        row["peak_rss_over_weights_f32"] = eng["f32"]["peak_rss_bytes"] / weights
        if not args.engine_only:
            hf = row["transformers"] = bench_transformers(model, ids, positions, args.threads, args.repeat)
            row["decode_speedup_f32"] = eng["f32"]["decode_tokens_per_second"] / hf["decode_tokens_per_second"]
            tf_key = "teacher_forcing_tokens_per_second"
            row["tf_speedup"] = {
                q: {p: eng[q][tf_key][p] / hf[tf_key][p] for p in hf[tf_key]} for q in ("f32", "int8", "int4")
            }
        results["models"][name] = row
        print(json.dumps({name: row}, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
