"""`doit release` killed at random points and started again: its own module, so that
pytest-xdist runs it beside the other release tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, copy_project, need_tool

pytestmark = pytest.mark.slow


def test_a_release_killed_at_random_points_restarts_to_the_same_bytes(tmp_path: Path) -> None:
    """Six kills spread over the whole release (tools/interrupt_release.py stratifies them), one
    in each sixth of it: the reference entry has every stage of a release (host, backend,
    verify, validate, package, publish) and takes seconds, so the kills land inside its stages.
    Each trial costs about a release's length, and the suite's time is budgeted."""
    need_tool("gcc")
    project = copy_project(tmp_path / "killed copy")
    script = ROOT / "tools" / "interrupt_release.py"
    proc = subprocess.run(
        [sys.executable, str(script), str(project), "--trials", "6", "--entry", "linux-x86_64-ref-cpu", "--seed", "7"],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "6 of 6 trials ended with the reference bytes" in proc.stdout
    # the kills land inside the build, not after it (the last strata may see a release that runs
    # faster than the reference did, on a machine less busy than when it was measured)
    assert proc.stdout.count("killed at") >= 4, proc.stdout
