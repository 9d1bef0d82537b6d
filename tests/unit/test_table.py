"""The backends' handle table (kernels/backend_common.h), compiled with gcc under
ASan/UBSan: an add takes the lowest free slot, a freed or stale handle is refused, and a
long run of adds takes each next slot (tests/c/table_check.c)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.conftest import ROOT, SANITIZE, compile_ok


def test_the_lowest_free_slot_and_stale_handles_refused(gen_dir: Path, tmp_path: Path) -> None:
    exe = tmp_path / "table_check"
    inc = [f"-I{gen_dir}", f"-I{ROOT / 'kernels'}"]
    compile_ok(["gcc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-Wno-unused-function", *SANITIZE, *inc,
                str(ROOT / "tests/c/table_check.c"), "-o", str(exe)])  # fmt: skip
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "random adds and removes: the lowest free slot each time" in proc.stdout
    assert "100000 adds in a row: slots 0 to 99999" in proc.stdout
