"""`doit clean-build` for real, on the cheapest stage (codegen): the build and dist folders
emptied, the task graph's state forgotten rather than removed from under doit, and the next
run doing the work again."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import copy_project, executed, need_tool, run_doit


def test_clean_build_empties_both_folders_and_the_next_run_does_the_work(tmp_path: Path) -> None:
    need_tool("gcc")
    root = copy_project(tmp_path / "clean copy")
    assert executed(run_doit(root, "codegen")) == ["codegen"]
    (root / "dist").mkdir()
    (root / "dist" / "coli-0.0.0-stale.tar.gz").write_bytes(b"x")
    proc = run_doit(root, "clean-build")
    assert proc.returncode == 0 and "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert [p.name for p in (root / "build").iterdir()] == [".doit.db"] and not (root / "dist").exists()
    assert executed(run_doit(root, "codegen")) == ["codegen"]  # nothing remembered as done
    assert executed(run_doit(root, "codegen")) == []  # and the state kept again after it
