"""toolchain/clean.py, the folders `doit clean-build` empties (run for real in
tests/integration/test_clean_build.py)."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

from toolchain.clean import DEP_FILE, clean


def test_clean_keeps_the_state_file_wherever_the_folders_nest(tmp_path: Path) -> None:
    """dist_dir=out with build_dir=out/build: emptying out keeps the state file below it."""
    out, build = tmp_path / "out", tmp_path / "out" / "build"
    (build / "gen").mkdir(parents=True)
    (build / "gen" / "h.h").write_text("x")
    (out / "coli.tar.gz").write_text("x")
    dep = build / DEP_FILE
    with closing(sqlite3.connect(dep)) as conn:
        conn.execute("create table doit (task_id text not null primary key, task_data json)")
        conn.execute("insert into doit values ('codegen', '{}')")
        conn.commit()
    clean([build, out], dep)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in out.rglob("*")) == ["out/build", f"out/build/{DEP_FILE}"]
    with closing(sqlite3.connect(dep)) as conn:
        assert conn.execute("select count(*) from doit").fetchone() == (0,)
    clean([tmp_path / "absent"], tmp_path / "absent" / DEP_FILE)  # nothing there: nothing to do
