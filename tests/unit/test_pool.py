"""The engine's thread pool (engine/pool.c), compiled with gcc under ASan/UBSan: every
row of a job runs once for any count of rows and threads, a thread done first takes the
rest of a slower one's share, and the share a thread starts from follows its speed
(tests/c/pool_check.c)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.conftest import ROOT, SANITIZE, compile_ok


def test_every_row_runs_once_and_a_slow_thread_is_helped(tmp_path: Path) -> None:
    exe = tmp_path / "pool_check"
    sources = [str(ROOT / "tests/c/pool_check.c"), str(ROOT / "engine/pool.c"), str(ROOT / "engine/clock.c")]
    compile_ok(["gcc", "-std=c11", "-Wall", "-Wextra", "-Werror", *SANITIZE, f"-I{ROOT / 'engine'}", *sources,
                "-o", str(exe), "-lpthread"])  # fmt: skip
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "every row once, 0 to 70 rows on 1 to 4 threads" in proc.stdout
    assert "a slow caller: 24 of 64 rows from an even share (its first call 24)" in proc.stdout
    assert "24 once forgotten" in proc.stdout
