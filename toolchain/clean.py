"""`doit clean-build`: the build and dist folders emptied, all but the task graph's own
state, which is forgotten instead. doit keeps that state in an SQLite file in the build
folder and writes to it once the clean has run; removed under it, the write fails."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Iterable
from contextlib import closing
from pathlib import Path

__all__ = ["DEP_FILE", "clean"]

DEP_FILE = ".doit.db"


def _remove(path: Path, kept: set[Path]) -> None:
    """`path` removed, or, where it holds a kept file, everything in it but that."""
    if path in kept:
        return
    if path.is_dir() and not path.is_symlink():
        if any(k.is_relative_to(path) for k in kept):
            for entry in path.iterdir():
                _remove(entry, kept)
        else:
            shutil.rmtree(path)
    else:
        path.unlink()


def clean(folders: Iterable[Path], dep: Path) -> None:
    """Empty `folders` but for the state file `dep` (and SQLite's files beside it), whose
    records are deleted: the next build finds nothing built and no task done."""
    kept = {dep, *(dep.with_name(dep.name + side) for side in ("-journal", "-wal", "-shm"))}
    for folder in folders:
        if folder.exists():
            _remove(folder, kept)
    if dep.is_file():
        with closing(sqlite3.connect(dep)) as conn:
            if conn.execute("select name from sqlite_master where type='table' and name='doit'").fetchone():
                conn.execute("delete from doit")
                conn.commit()
