"""The one-matmul benchmark (bench/cpu_matmul.c, whose figures RESULTS.md quotes for
the CPU loops), built with gcc against kernels/cpu_ops.c and run small at each
format: one JSON line with a positive time and rates, copies of the matrix giving its
product, and bad settings refused in one line."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, build_bench_probe, refusal_line


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Path:
    kernels = ROOT / "kernels"
    return build_bench_probe(
        "cpu_matmul", tmp_path_factory.mktemp("mm"), f"-I{kernels}", str(kernels / "cpu_ops.c"), "-lm"
    )


@pytest.mark.parametrize("fmt", ["f32", "int8", "int4"])
def test_the_bench_times_a_matmul(bench: Path, fmt: str) -> None:
    argv = [str(bench), "--rows", "37", "--cols", "64", "--tokens", "5", "--format", fmt, "--repeat", "3"]
    proc = subprocess.run(argv, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    assert (d["rows"], d["cols"], d["tokens"], d["format"]) == (37, 64, 5, fmt)
    assert d["best_us"] > 0 and d["weight_GBps"] > 0 and d["gmacs"] > 0
    # copies of the matrix, each its own memory, one call each: the same product
    many = json.loads(subprocess.run([*argv, "--matrices", "3"], capture_output=True, text=True).stdout)
    assert many["matrices"] == 3 and many["check"] == d["check"] and many["best_us"] > 0


@pytest.mark.parametrize(
    "args",
    [
        ["--rows", "0"],
        ["--cols", "33", "--rows", "2", "--format", "int4"],
        ["--format", "int3"],
        ["--rows"],
        ["--rows", "2", "--cols", "4", "--format", "f32", "--matrices", "0"],
    ],
)
def test_bad_settings_are_one_line_and_exit_2(bench: Path, args: list[str]) -> None:
    line = refusal_line(bench, args)
    assert line.startswith("cpu_matmul: --") and "want --rows and --cols 1..65536" in line
