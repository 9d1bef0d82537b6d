"""The progress line (engine/progress.c), compiled with gcc under ASan/UBSan: each line
drawn over the one before shows its own text alone on a terminal, however the lengths
go, and the line is cleared at the end (tests/c/progress_check.c)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.conftest import ROOT, SANITIZE, compile_ok, terminal_lines


def test_each_line_shows_alone_and_the_last_is_cleared(tmp_path: Path) -> None:
    exe = tmp_path / "progress_check"
    sources = [str(ROOT / "tests/c/progress_check.c"), str(ROOT / "engine/progress.c"), str(ROOT / "engine/clock.c")]
    compile_ok(["gcc", "-std=c11", "-Wall", "-Wextra", "-Werror", *SANITIZE, f"-I{ROOT / 'engine'}", *sources,
                "-o", str(exe)])  # fmt: skip
    # longer, then shorter twice running (what a line drawn without padding would leave behind), then longer
    lines = [
        "decode: 9 of 20 tokens, 1000.5 tokens/s",
        "decode: 10 of 20, 99.5/s",
        "decode: 11, 9/s",
        "a much longer line than any before it",
    ]
    env = {**os.environ, "COLI_PROGRESS": "1"}
    # bytes: text mode would read each carriage return as a new line
    proc = subprocess.run([str(exe), *lines], capture_output=True, env=env, timeout=60)
    stderr = proc.stderr.decode()
    assert proc.returncode == 0 and proc.stdout == b"" and "\n" not in stderr, stderr
    assert terminal_lines(stderr) == [*lines, "", ""]  # each line alone, then blanked, the cursor at its start
    quiet = subprocess.run([str(exe), *lines], capture_output=True, env={**env, "COLI_PROGRESS": "0"}, timeout=60)
    assert quiet.returncode == 0 and quiet.stderr == b""
