"""The arithmetic-ceiling probe (bench/fp_peak.c, what RESULTS.md weighs a prefill
against), built with gcc and run briefly: one JSON line with each mode this CPU has,
and bad settings refused in one line."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import build_bench_probe, refusal_line


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_bench_probe("fp_peak", tmp_path_factory.mktemp("peak"))


def test_the_probe_reports_each_mode_of_this_cpu(probe: Path) -> None:
    proc = subprocess.run([str(probe), "--threads", "1", "--repeat", "1"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    flags = set(Path("/proc/cpuinfo").read_text().split())
    want = {"mul_add_gflops"} | ({"fma_gflops"} if "fma" in flags else set())
    if {"avx512_vnni", "avx512vl"} <= flags:
        want.add("vnni_giga_byte_macs")
    assert d["threads"] == 1 and set(d) - {"threads"} == want
    assert all(d[k] > 0 for k in want)


@pytest.mark.parametrize("args", [["--threads", "0"], ["--repeat", "3x"], ["--repeat"], ["--bogus", "1"]])
def test_bad_settings_are_one_line_and_exit_2(probe: Path, args: list[str]) -> None:
    line = refusal_line(probe, args)
    assert line.startswith(f"fp_peak: {args[0]} ") and "want --threads 1..256 --repeat 1..100" in line
