"""Wine as the launcher of many short runs whose output is captured.

A Wine process that finds no wineserver starts one, and the server starts Wine's
services (winedevice.exe, ...), which inherit that first process's standard
handles. A caller reading the process's output to its end then waits for the
services to exit, which they do only when the server does: about 3 s on every run
instead of 0.1 s. `warm` starts a server that outlives its clients by
`persist_s` seconds and boots its services with their output going nowhere, so
later runs reach the end of their output as soon as they exit.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

__all__ = ["warm"]

PERSIST_S = 60


def _server(launcher: Sequence[str]) -> str | None:
    """The wineserver of the Wine that `launcher` runs: beside it, else on PATH."""
    wine = shutil.which(launcher[0]) if launcher else None
    if wine:
        beside = Path(wine).resolve().parent / "wineserver"
        if beside.is_file():
            return str(beside)
    return shutil.which("wineserver")


def _quiet(argv: Sequence[str], timeout: float) -> int:
    """Runs argv with no handle of ours: the server detaches keeping its standard handles,
    and its services inherit theirs, so none of them may be a pipe someone reads."""
    dn = subprocess.DEVNULL
    return subprocess.run(list(argv), stdin=dn, stdout=dn, stderr=dn, timeout=timeout).returncode


def warm(launcher: Sequence[str], persist_s: int = PERSIST_S) -> None:
    """Makes sure a wineserver runs for `launcher` with its services booted. Cheap when
    one already runs (a few ms); never fails: a Wine that cannot be warmed is only slower."""
    server = _server(launcher)
    if not launcher or server is None:
        return
    try:
        # the server detaches and keeps its standard handles: none of them may be a pipe of ours
        if _quiet([server, f"-p{persist_s}"], 30) == 0:
            _quiet([*launcher, "cmd", "/c", "exit"], 120)  # a new server: its services start now
    except (OSError, subprocess.TimeoutExpired):
        pass
