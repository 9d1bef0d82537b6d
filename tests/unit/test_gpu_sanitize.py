"""bench/gpu_sanitize.sh's verdict (the GPU scripts run it only on a CUDA machine):
memcheck may list the selftest's deliberate API errors and nothing more, racecheck no
hazard, and a machine without compute-sanitizer is told so. A stand-in compute-sanitizer
prints what the real one's summaries look like; the verdict's own bash really runs."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT

MEMCHECK = "========= Program hit cudaErrorMemoryAllocation\n" * 2
PASSING = {"memcheck": MEMCHECK + "========= ERROR SUMMARY: 2 errors\n",
           "racecheck": "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n"}  # fmt: skip


def verdict(tmp_path: Path, outputs: dict[str, str] | None) -> subprocess.CompletedProcess[str]:
    """`sanitize --shapes gpu` with a stand-in compute-sanitizer printing outputs[tool] (None: no tool)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if outputs is not None:
        cases = "".join(f"  *--tool\\ {tool}*) printf '%s' '{text}' ;;\n" for tool, text in outputs.items())
        fake = bin_dir / "compute-sanitizer"
        fake.write_text(f'#!/bin/bash\ncase "$*" in\n{cases}esac\n')
        fake.chmod(0o755)
    script = f'rc=0 out={tmp_path} HOST=coli LIB=lib.so; . bench/gpu_sanitize.sh; sanitize --shapes gpu; echo "rc=$rc"'
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}
    return subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)


def test_the_deliberate_api_errors_and_no_hazard_pass(tmp_path: Path) -> None:
    proc = verdict(tmp_path, PASSING)
    assert proc.stdout.splitlines() == [
        "memcheck: 2 error(s), 2 of them the deliberate API errors",
        "racecheck: ========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)",
        "rc=0",
    ], proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("tool", "text"),
    [
        ("memcheck", MEMCHECK + "========= Invalid __global__ read of size 4\n========= ERROR SUMMARY: 3 errors\n"),
        ("memcheck", "the run died before its summary\n"),
        ("racecheck", "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)\n"),
    ],
)
def test_more_than_that_fails(tmp_path: Path, tool: str, text: str) -> None:
    proc = verdict(tmp_path, {**PASSING, tool: text})
    assert proc.stdout.splitlines()[-1] == "rc=1", proc.stdout + proc.stderr


def test_without_the_tool_it_says_so(tmp_path: Path) -> None:
    proc = verdict(tmp_path, None)
    assert proc.stdout.splitlines() == ["sanitizers: compute-sanitizer not found, not run", "rc=0"], proc.stdout
