"""The read-bandwidth probe (bench/read_bandwidth.c, the CPU limit bench/engine_speed.py
gives each decode figure a share of), built with gcc and run small: one JSON line
with the median pass inside the passes' range, and bad settings refused in one line."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import build_bench_probe, refusal_line


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_bench_probe("read_bandwidth", tmp_path_factory.mktemp("probe"))


def test_the_probe_reports_the_median_pass(probe: Path) -> None:
    proc = subprocess.run(
        [str(probe), "--threads", "2", "--mib", "32", "--repeat", "5"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    assert d["threads"] == 2 and d["bytes"] == 32 << 20 and d["repeat"] == 5
    assert 0 < d["min_GBps"] <= d["read_GBps"] <= d["max_GBps"]


@pytest.mark.parametrize("args", [["--threads", "0"], ["--mib", "lots"], ["--repeat"], ["--bogus", "1"]])
def test_bad_settings_are_one_line_and_exit_2(probe: Path, args: list[str]) -> None:
    line = refusal_line(probe, args)
    assert line.startswith(f"read_bandwidth: {args[0]} ") and "want --threads 1..256" in line
