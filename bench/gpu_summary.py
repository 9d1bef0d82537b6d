"""The short tables at the end of a GPU run: the kernels' times from
gpu_matmul_bench (kernels.jsonl) beside PyTorch's f16 (torch_f16.jsonl), the
dispatch table's pick beside the fastest variant timed at each shape, and a
whole backend call's latency from call_latency (call_latency.jsonl).

    python3 bench/gpu_summary.py OUT_DIR
"""

import json
import sys
from pathlib import Path
from typing import Any

FORMATS = ("f32", "int8", "int4")


def load(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def main(out: Path) -> int:
    kernels, torch = load(out / "kernels.jsonl"), load(out / "torch_f16.jsonl")
    head = next((r for r in kernels if "copy_gbps" in r), {})
    copy = head.get("copy_gbps")
    rows = [r for r in kernels if "us" in r]
    auto = {(r["rows"], r["cols"], r["s"], r["format"]): r for r in rows if r["kernel"] == "auto"}
    f16 = {(r["rows"], r["cols"], r["s"]): r["us"] for r in torch if r["format"] == "torch-f16"}
    f32 = {(r["rows"], r["cols"], r["s"]): r["us"] for r in torch if r["format"] == "torch-f32"}
    shapes = sorted({(r["rows"], r["cols"]) for r in rows}, key=lambda sh: (sh[0] * sh[1], sh))
    print(f"copy bandwidth {copy} GB/s (memcpy, 2 GiB); copy kernel, 1 GiB: {head.get('copy_kernel_1gib_gbps')} GB/s")
    print("S = 1: us (of copy bandwidth / of a copy of the same bytes / of a read of them)")
    print(f"{'shape':>13} " + " ".join(f"{f:>26}" for f in FORMATS) + f" {'torch f16':>10}")
    for sh in shapes:
        cells = []
        for f in FORMATS:
            r = auto.get((*sh, 1, f))
            read = f"/{r['of_same_size_read']:.0%}" if r and "of_same_size_read" in r else ""
            cells.append(f"{r['us']:7.2f} ({r['of_copy']:.0%}/{r['of_same_size_copy']:.0%}{read})" if r else "-")
        print(f"{sh[0]:>6}x{sh[1]:<6} " + " ".join(f"{c:>26}" for c in cells) + f" {f16.get((*sh, 1), '-'):>10}")
    print("the dispatch table's pick beside the fastest variant timed (calls back to back, us)")
    for sh in shapes:
        for f in FORMATS:
            for s in sorted({r["s"] for r in rows if (r["rows"], r["cols"], r["format"]) == (*sh, f)}):
                pick = auto.get((*sh, s, f))
                vs = [
                    r
                    for r in rows
                    if (r["rows"], r["cols"], r["s"], r["format"]) == (*sh, s, f) and not r["kernel"].startswith("auto")
                ]
                if not pick or not vs:
                    continue
                best = min(vs, key=lambda r: r["us"])
                print(
                    f"{sh[0]:>6}x{sh[1]:<6} {f:>5} s={s:<3} pick {pick.get('pick', '?'):<34} {pick['us']:8.2f}   "
                    f"fastest {best['kernel']:<34} {best['us']:8.2f}   pick/fastest {pick['us'] / best['us']:.2f}"
                )
    print("variants, us (best marked *)")
    for sh in shapes:
        for f in FORMATS:
            vs = [r for r in rows if (r["rows"], r["cols"], r["format"]) == (*sh, f) and r["kernel"] != "auto"]
            for s in sorted({r["s"] for r in vs}):
                at = [r for r in vs if r["s"] == s]
                best = min(at, key=lambda r: r["us"])
                text = "  ".join(f"{r['kernel']}{'*' if r is best else ''} {r['us']:.2f}" for r in at)
                print(f"{sh[0]:>6}x{sh[1]:<6} {f:>5} s={s:<3}: {text}")
    sizes = sorted({r["s"] for r in auto.values() if r["s"] > 1})
    print("S > 1: f32 int8 int4 us (torch f16 us, torch f32 us without TF32)")
    for sh in shapes:
        for s in sizes:
            cells = [f"{auto[(*sh, s, f)]['us']:9.1f}" if (*sh, s, f) in auto else "-" for f in FORMATS]
            theirs = f"({f16.get((*sh, s), '-')}, {f32.get((*sh, s), '-')})"
            print(f"{sh[0]:>6}x{sh[1]:<6} s={s:<4} " + " ".join(cells) + "  " + theirs)
    calls = load(out / "call_latency.jsonl")
    if calls:
        print("a whole backend call at S = 1 (x in, kernel, y out, wait): median us (10th-90th percentile)")
        for r in calls:
            print(f"{r['rows']:>6}x{r['cols']:<6} {r['format']:>5} {r['median_us']:7.1f} ({r['p10_us']}-{r['p90_us']})")
    bad = [r for r in rows if not r["ok"]]
    for r in bad:
        print(f"WRONG: {r}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
