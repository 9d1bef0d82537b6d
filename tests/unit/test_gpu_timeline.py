"""The kernel timeline (bench/gpu_trace.c, bench/gpu_timeline.py): the tracer builds
warning-free against the CUDA toolkit's CUPTI (it runs only on a GPU machine), and
the reader charges each replay's span to the kernels that ended in it, pieces that
add up to the span, with the idle time apart."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType

from tests.conftest import ROOT, bench_module, compile_ok


def timeline() -> ModuleType:
    return bench_module("gpu_timeline")


def test_the_pieces_add_up_to_the_span_and_overlap_is_not_counted_twice() -> None:
    # b overlaps a on another stream; c starts after a gap of 5
    token = [(0, 10, 1, 7, "a"), (2, 14, 2, 7, "b"), (19, 25, 1, 7, "c")]
    pieces, span, idle = timeline().charged(token)
    assert span == 25 and idle == 5
    assert pieces == {"a": 10, "b": 4, "c": 11}
    assert sum(pieces.values()) == span


def write_trace(path: Path, tokens: int) -> None:
    lines, t = [], 1000
    for k in range(tokens):
        graph = 0 if k == 0 else 9  # the first run launches directly, the rest replay a graph
        lines.append(f"{t} {t + 500} 3 0 _Z19set_position_kernelPll")
        lines.append(f"{t + 1000} {t + 4000} 3 {graph} _Z14rmsnorm_kernelPKfS0_Pflllf")
        lines.append(f"{t + 1500} {t + 9000} 4 {graph} _Z13moe_up_kernelILi1ELb1EEvPK10dev_weight")
        t += 20000
    path.write_text("\n".join(lines) + "\n")


def test_the_report_takes_the_replays_only(tmp_path: Path) -> None:
    trace = tmp_path / "t.trace"
    write_trace(trace, 8)
    out = subprocess.run([sys.executable, str(ROOT / "bench/gpu_timeline.py"), str(trace), "--skip", "2"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    first = out.splitlines()[0]
    assert first.startswith("5 replays of 2 kernels on 2 streams: median span 8.0 us, idle 0.0 us"), out
    rows = {line.split()[0]: line.split() for line in out.splitlines()[2:]}
    assert rows["moe_up_kernel"][1:4] == ["1.0", "7.50", "5.0"]
    assert rows["rmsnorm_kernel"][1:4] == ["1.0", "3.00", "3.0"]


def test_a_trace_with_no_replays_is_refused_in_one_line(tmp_path: Path) -> None:
    trace = tmp_path / "t.trace"
    write_trace(trace, 1)
    proc = subprocess.run([sys.executable, str(ROOT / "bench/gpu_timeline.py"), str(trace)],
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 1 and proc.stderr.strip() == f"{trace}: no graph replays after a set_position_kernel"


def test_the_tracer_builds_against_cupti(tmp_path: Path) -> None:
    dry = subprocess.run(["nvcc", "-dryrun", "-x", "cu", "-c", "/dev/null", "-o", "/dev/null"],
                         capture_output=True, text=True)  # fmt: skip
    top = next(line.split("=", 1)[1] for line in dry.stderr.splitlines() if line.startswith("#$ TOP="))
    cuda = Path(top).resolve()
    header = next(cuda.rglob("cupti.h"))
    library = next(cuda.rglob("libcupti.so"))
    compile_ok(["cc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-O2", "-shared", "-fPIC", f"-I{header.parent}",
                f"-I{cuda / 'include'}", str(ROOT / "bench/gpu_trace.c"), "-o", str(tmp_path / "gpu_trace.so"),
                f"-L{library.parent}", "-lcupti"])  # fmt: skip
