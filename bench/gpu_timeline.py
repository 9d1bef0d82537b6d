"""Where a decoded token's time goes, from a kernel timeline (bench/gpu_trace.c).

    python3 bench/gpu_timeline.py TRACE [--skip N]

Each token's step starts with set_position_kernel; the tokens whose kernels came
from a graph replay (graph id set) and number as many as most do are the decode's
replays. For each, its span (first start to last end) is cut at every kernel's end,
in end order, and each piece is charged to the kernel that ended there: what the
device was finishing at that moment, so the pieces add up to the token's time and
parallel streams are not counted twice. Printed: per kernel name, kernels a token,
their mean duration, and the median of each replay's charged time; also the time in
each span with no kernel running, and the median time from one replay's start to the
next's (the span and the wait between tokens). With --dump FILE, the replay of median span is
written there kernel by kernel in start order (start and end from the span's
start, duration, stream, name), to read a token's critical path off it.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import re
import shutil
import statistics
import subprocess
from pathlib import Path

Kernel = tuple[int, int, int, int, str]  # start, end, stream, graph, name


def short_names(mangled: list[str]) -> dict[str, str]:
    """Demangled names without templates or parameters (c++filt where present)."""
    plain = list(mangled)
    if shutil.which("c++filt"):
        out = subprocess.run(["c++filt"], input="\n".join(mangled), capture_output=True, text=True, check=True)
        plain = out.stdout.splitlines()
    names = {}
    for m, p in zip(mangled, plain, strict=True):
        base = re.split(r"[<(]", p, maxsplit=1)[0].strip()
        names[m] = base.split()[-1] if base else m
    return names


def read(path: Path) -> list[Kernel]:
    rows = []
    for line in path.read_text().splitlines():
        start, end, stream, graph, name = line.split(" ", 4)
        rows.append((int(start), int(end), int(stream), int(graph), name))
    names = short_names(sorted({r[4] for r in rows}))
    return sorted((s, e, st, g, names[n]) for s, e, st, g, n in rows)


def tokens(kernels: list[Kernel]) -> list[list[Kernel]]:
    """The kernels after each set_position_kernel, up to the next."""
    out: list[list[Kernel]] = []
    for k in kernels:
        if k[4] == "set_position_kernel":
            out.append([])
        elif out:
            out[-1].append(k)
    return out


def charged(token: list[Kernel]) -> tuple[dict[str, float], float, float]:
    """Per name the pieces of the span it ended, the span and its idle time (ns)."""
    by_end = sorted(token, key=lambda k: k[1])
    first = min(k[0] for k in token)
    pieces: dict[str, float] = collections.defaultdict(float)
    last = first
    for k in by_end:
        if k[1] > last:
            pieces[k[4]] += k[1] - last
            last = k[1]
    idle, reach = 0.0, first
    for s, e, *_ in sorted(token):
        if s > reach:
            idle += s - reach
        reach = max(reach, e)
    return pieces, float(last - first), idle


def dump(token: list[Kernel], out: Path) -> None:
    """One replay's kernels in start order, times in us from its first start."""
    first = min(k[0] for k in token)
    streams = {st: i for i, st in enumerate(sorted({k[2] for k in token}))}
    lines = [f"{'start':>8} {'end':>8} {'us':>6} {'stream':>6}  kernel"]
    for s, e, st, _, name in sorted(token):
        lines.append(f"{(s - first) / 1e3:8.2f} {(e - first) / 1e3:8.2f} {(e - s) / 1e3:6.2f} {streams[st]:6d}  {name}")
    out.write_text("\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--skip", type=int, default=4, help="replays to leave out at the start")
    ap.add_argument("--dump", type=Path, help="write the median replay's kernels here")
    args = ap.parse_args()
    steps = [t for t in tokens(read(args.trace)) if t and all(k[3] for k in t)]
    if not steps:
        raise SystemExit(f"{args.trace}: no graph replays after a set_position_kernel")
    size = collections.Counter(len(t) for t in steps).most_common(1)[0][0]
    replays = [t for t in steps if len(t) == size][args.skip :]
    # start to start of consecutive replays: the span plus the device's wait between two tokens
    starts = [min(k[0] for k in t) if len(t) == size else None for t in steps][args.skip :]
    periods = [b - a for a, b in itertools.pairwise(starts) if a is not None and b is not None]
    if not replays:
        raise SystemExit(f"{args.trace}: fewer than {args.skip + 1} replays of {size} kernels")
    per_name: dict[str, list[float]] = collections.defaultdict(list)
    durations: dict[str, list[int]] = collections.defaultdict(list)
    spans, idles = [], []
    for t in replays:
        pieces, span, idle = charged(t)
        spans.append(span)
        idles.append(idle)
        for name in {k[4] for k in t}:
            per_name[name].append(pieces.get(name, 0.0))
        for k in t:
            durations[k[4]].append(k[1] - k[0])
    span = statistics.median(spans)
    if args.dump:
        dump(replays[sorted(range(len(spans)), key=spans.__getitem__)[len(spans) // 2]], args.dump)
    print(
        f"{len(replays)} replays of {size} kernels on {len({k[2] for k in replays[0]})} streams: "
        f"median span {span / 1e3:.1f} us, idle {statistics.median(idles) / 1e3:.1f} us"
    )
    if periods:
        period = statistics.median(periods)
        print(f"median start to start {period / 1e3:.1f} us: {(period - span) / 1e3:.1f} us between replays")
    print(f"{'kernel':34} {'a token':>7} {'mean us':>8} {'charged us':>10} {'share':>6}")
    rows = sorted(per_name, key=lambda n: -statistics.median(per_name[n]))
    for name in rows:
        c = statistics.median(per_name[name])
        print(
            f"{name[:34]:34} {len(durations[name]) / len(replays):7.1f} "
            f"{statistics.mean(durations[name]) / 1e3:8.2f} {c / 1e3:10.1f} {100 * c / span:5.1f}%"
        )


if __name__ == "__main__":
    main()
