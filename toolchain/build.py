"""Running a compile command so that its output appears whole or not at all."""

from __future__ import annotations

import os
import subprocess
import sys

from .commands import Command
from .errors import BuildError

__all__ = ["run_command"]


def run_command(cmd: Command, label: str) -> None:
    """Compile to `<output>.part`, then rename: a failed or killed compile leaves no artifact."""
    part = cmd.output.with_name(cmd.output.name + ".part")
    argv = [str(part) if a == str(cmd.output) else a for a in cmd.argv]
    env = dict(os.environ)
    env.update(cmd.env)
    for name in cmd.unset:
        env.pop(name, None)
    cmd.output.parent.mkdir(parents=True, exist_ok=True)
    for folder in cmd.mkdirs:
        folder.mkdir(parents=True, exist_ok=True)
    for step in (*cmd.before, tuple(argv)):
        try:
            proc = subprocess.run(list(step), capture_output=True, text=True, env=env, cwd=cmd.cwd)
        except OSError as exc:
            part.unlink(missing_ok=True)
            raise BuildError(f"{label}: cannot run {step[0]}: {exc}") from None
        if proc.returncode != 0:
            part.unlink(missing_ok=True)
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
            raise BuildError(f"{label}: {os.path.basename(step[0])} exited with {proc.returncode}:\n{tail}")
        if proc.stderr.strip():
            sys.stderr.write(proc.stderr)
    os.replace(part, cmd.output)
