"""Running a compile command so that its output appears whole or not at all."""

from __future__ import annotations

import os
import subprocess
import sys

from .atomic import replacing
from .commands import Command
from .errors import BuildError
from .staging import stage_files

__all__ = ["run_command"]


def run_command(cmd: Command, label: str) -> None:
    """Compile to `<output>.part`, then rename: a failed or killed compile leaves no artifact."""
    env = dict(os.environ)
    env.update(cmd.env)
    for name in cmd.unset:
        env.pop(name, None)
    for folder in cmd.mkdirs:
        folder.mkdir(parents=True, exist_ok=True)
    staged = stage_files(cmd.stage) if cmd.stage else cmd.cwd
    with replacing(cmd.output, fixed_name=True) as part:
        argv = [str(part) if a == str(cmd.output) else a for a in cmd.argv]
        steps = [(step, staged) for step in cmd.before] + [(tuple(argv), cmd.cwd)]
        for step, cwd in steps:
            try:
                proc = subprocess.run(list(step), capture_output=True, text=True, env=env, cwd=cwd)
            except OSError as exc:
                raise BuildError(f"{label}: cannot run {step[0]}: {exc}") from None
            if proc.returncode != 0:
                tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
                raise BuildError(f"{label}: {os.path.basename(step[0])} exited with {proc.returncode}:\n{tail}")
            if proc.stderr.strip():
                sys.stderr.write(proc.stderr)
