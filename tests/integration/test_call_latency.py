"""tools/call_latency.c, the whole-call timer the GPU run uses, built here against
the reference backend itself (one executable, under the sanitizers): it times every
shape in both formats, and a wrong argument stops it with one line."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, SANITIZE, WARN, compile_ok, need_tool, without_cpu_kernels
from toolchain.command_data import REF_SOURCES

SHAPES = [(512, 2048), (1536, 512), (2048, 1024), (5632, 2048), (2048, 5632), (32000, 2048)]


@pytest.fixture(scope="module")
def timer(gen_dir: Path, asan_kernels: list[str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    need_tool("gcc")
    exe = tmp_path_factory.mktemp("call_latency") / "call_latency"
    compile_ok(
        ["gcc", *WARN, *SANITIZE, f"-I{gen_dir}", f"-I{ROOT / 'kernels'}",
         str(ROOT / "tools/call_latency.c"), *without_cpu_kernels(REF_SOURCES), *asan_kernels,
         "-o", str(exe), "-lm"]
    )  # fmt: skip
    return exe


def test_every_shape_in_both_formats(timer: Path) -> None:
    proc = subprocess.run([str(timer), "10"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "Sanitizer" not in proc.stderr, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [(r["format"], r["rows"], r["cols"]) for r in rows] == [
        (f, r, c) for f in ("int8", "int4") for r, c in SHAPES
    ]
    assert all(0 < r["p10_us"] <= r["median_us"] <= r["p90_us"] for r in rows)


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["x"], "CALLS must be a whole number from 10 to 100000, got 'x'"),
        (["9"], "got '9'"),
        (["100001"], "got '100001'"),
        (["10junk"], "got '10junk'"),
        ([""], "got ''"),
        (["10", "20"], "takes at most one argument, CALLS (got 2)"),
    ],
)
def test_a_wrong_argument_is_one_line(timer: Path, args: list[str], why: str) -> None:
    proc = subprocess.run([str(timer), *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("call_latency: ") and why in lines[0], proc.stderr
