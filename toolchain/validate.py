"""Running the engine against a backend and judging the answer.

A backend that cannot start here (no GPU) is reported as not run, with the
engine's own reason; only a wrong answer fails the build.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["VALIDATE_VERSION", "Validation", "run_selftest"]

VALIDATE_VERSION = 1
UNAVAILABLE = 3


@dataclass(frozen=True)
class Validation:
    backend: str
    status: str  # passed, failed, not-run
    reason: str
    detail: dict[str, object]

    def to_json(self) -> str:
        return json.dumps({"version": VALIDATE_VERSION, **asdict(self)}, indent=2, sort_keys=True) + "\n"

    def summary(self) -> str:
        return f"{self.backend}: {self.status}" + (f" ({self.reason})" if self.reason else "")


def run_selftest(launcher: Sequence[str], host: Path, lib: str, label: str, timeout: float = 600) -> Validation:
    """`launcher` prefixes the host (e.g. wine); `lib` is absolute as the host sees it."""
    argv = [*launcher, str(host), "--backend", lib, "--selftest", "--json"]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Validation(label, "failed", f"cannot run {host.name}: {exc}", {})
    reason = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""
    try:
        detail = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.stdout.strip() else {}
    except (ValueError, IndexError):
        return Validation(label, "failed", f"{host.name} printed no JSON (exit {proc.returncode}): {reason}", {})
    if proc.returncode == UNAVAILABLE:
        return Validation(label, "not-run", reason or "backend unavailable", detail)
    if proc.returncode == 0 and detail.get("passed") is True:
        return Validation(label, "passed", "", detail)
    bad = [c for c in detail.get("checks", []) if not c.get("ok")]
    bad += [c for c in detail.get("bad_input", []) if not c.get("ok")]
    what = "; ".join(
        f"{c.get('format', c.get('case'))} {c.get('rows', '')}x{c.get('cols', '')} err={c.get('max_rel_err')} "
        f"{c.get('message', '')}".strip()
        for c in bad[:3]
    )
    return Validation(label, "failed", what or f"exit {proc.returncode}: {reason}", detail)
