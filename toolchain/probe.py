"""Running a tool to ask its version, cached by the tool's identity on disk.

Discovery runs when the task graph loads; caching by (path, size, mtime) keeps a
no-op `doit build` fast, and a changed tool (new SDK) is asked again.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from .atomic import write_atomic

__all__ = ["Prober", "which"]


def which(name: str, path: str | None = None) -> Path | None:
    found = shutil.which(name, path=path)
    return Path(found).absolute() if found else None


class Prober:
    """Runs `tool args...` and caches its output in a JSON file."""

    def __init__(self, cache_file: Path | None) -> None:
        self.cache_file = cache_file
        self._cache: dict[str, str] = {}
        self._dirty = False
        if cache_file and cache_file.is_file():
            try:
                self._cache = json.loads(cache_file.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                self._cache = {}

    def run(self, tool: Path, *args: str) -> str | None:
        """stdout+stderr of the command, or None when it cannot run or fails."""
        try:
            st = tool.stat()
        except OSError:
            return None
        key = json.dumps([str(tool.resolve()), st.st_size, st.st_mtime_ns, list(args)])
        if key in self._cache:
            return self._cache[key]
        try:
            proc = subprocess.run(
                [str(tool), *args], capture_output=True, text=True, timeout=60, env={**os.environ, "LC_ALL": "C"}
            )
        except (OSError, subprocess.SubprocessError):
            return None
        if proc.returncode != 0:
            return None
        out = proc.stdout + proc.stderr
        self._cache[key] = out
        self._dirty = True
        return out

    def save(self) -> None:
        if not (self._dirty and self.cache_file):
            return
        write_atomic(self.cache_file, json.dumps(self._cache, indent=1, sort_keys=True))
        self._dirty = False
