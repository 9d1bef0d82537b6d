"""Where a build and its packages may go. `doit clean-build` empties both folders
(toolchain/clean.py), and a build writes its own folders into them, so neither may be the
project's folder, hold it, or hold files of the project (those git tracks)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from .load import ResolvedConfig
from .schema import BuildSection

__all__ = ["folder_problems"]


def _tracked(root: Path, folder: Path) -> list[str]:
    """Files under `folder` that git tracks in the project at `root`; none where the
    project is not a git checkout (a release tarball) or git is absent."""
    if not folder.is_dir() or not folder.is_relative_to(root):
        return []
    try:
        proc = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z", "--", str(folder.relative_to(root))],
            capture_output=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    if proc.returncode != 0:
        return []
    return [p for p in proc.stdout.decode(errors="replace").split("\0") if p]


def folder_problems(rc: ResolvedConfig, root: Path) -> list[str]:
    """One line for each of build_dir and dist_dir that may not be used, naming what it
    holds and what to write instead."""
    problems = []
    base = root.resolve()
    for name in ("build_dir", "dist_dir"):
        key = f"build.{name}"
        value = getattr(rc.config.build, name)
        folder = (root / value).resolve()
        where = f"{rc.origin(key)}: {key}: '{value}'"
        instead = f"name a folder of its own (the default is '{BuildSection.model_fields[name].default}')"
        if folder == base or base.is_relative_to(folder):
            problems.append(f"{where} is the project's folder or holds it; {instead}")
            continue
        if folder.exists() and not folder.is_dir():
            problems.append(f"{where} is a file, not a folder; {instead}")
            continue
        tracked = _tracked(base, folder)
        if tracked:
            problems.append(
                f"{where} holds files of the project (git tracks {len(tracked)} there, e.g. {tracked[0]}); {instead}"
            )
    return problems
