"""The source revision and SOURCE_DATE_EPOCH that packages record."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Revision", "source_revision"]


@dataclass(frozen=True)
class Revision:
    commit: str  # full hash, or "unknown" outside git
    dirty: bool
    epoch: int  # SOURCE_DATE_EPOCH: the env value, else the commit time, else 0

    @property
    def label(self) -> str:
        return self.commit + ("-dirty" if self.dirty else "")


def _git(root: Path, *args: str) -> str | None:
    try:
        proc = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def source_revision(root: Path, env: Mapping[str, str]) -> Revision:
    commit = _git(root, "rev-parse", "HEAD") if (root / ".git").exists() else None
    status = _git(root, "status", "--porcelain", "--untracked-files=no") if commit else None
    when = _git(root, "log", "-1", "--format=%ct") if commit else None
    epoch = int(env["SOURCE_DATE_EPOCH"]) if env.get("SOURCE_DATE_EPOCH", "").isdigit() else int(when or 0)
    return Revision(commit or "unknown", bool(status), epoch)
