"""The GPU backend's step planner (kernels/step_plan.h: which recorded ops may run
side by side on several streams), compiled with gcc under ASan/UBSan and run on
random units: every conflicting pair is ordered, one queue never waits, a
fan-out spreads over the queues, and a span no unit writes is told from one some unit
writes."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.conftest import ROOT, SANITIZE, compile_ok


def test_the_plan_orders_every_conflict_and_spreads_the_rest(tmp_path: Path) -> None:
    exe = tmp_path / "step_plan_check"
    compile_ok(["gcc", "-std=c11", "-Wall", "-Wextra", "-Werror", *SANITIZE, f"-I{ROOT / 'kernels'}",
                str(ROOT / "tests/c/step_plan_check.c"), "-o", str(exe)])  # fmt: skip
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "every conflicting pair ordered" in proc.stdout
    assert "a fan-out of 4 takes 4 queues and the join waits for all" in proc.stdout
    assert "unwritten spans found" in proc.stdout
