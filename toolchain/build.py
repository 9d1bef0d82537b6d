"""Running a compile command so that its output appears whole or not at all."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .atomic import replacing
from .commands import Command
from .errors import BuildError
from .staging import stage_files

__all__ = ["run_command"]


def _cpus() -> int:
    """The CPUs this process may run on (a container's or a CI runner's share, not the host's)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _run_step(
    step: tuple[str, ...], env: dict[str, str], cwd: Path | None, label: str
) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(list(step), capture_output=True, text=True, env=env, cwd=cwd)
    except OSError as exc:
        raise BuildError(f"{label}: cannot run {step[0]}: {exc}") from None


def _check(proc: subprocess.CompletedProcess[str], step: tuple[str, ...], label: str) -> None:
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise BuildError(f"{label}: {os.path.basename(step[0])} exited with {proc.returncode}:\n{tail}")
    if proc.stderr.strip():
        sys.stderr.write(proc.stderr)


def run_command(cmd: Command, label: str) -> None:
    """Compile to `<output>.part`, then rename: a failed or killed compile leaves no artifact.
    The `before` steps (one compile a source) run side by side, as many at once as this
    process has CPUs, so that a host's or a reference backend's sources do not compile one
    by one; their messages and the first failure are reported in the steps' order."""
    env = dict(os.environ)
    env.update(cmd.env)
    for name in cmd.unset:
        env.pop(name, None)
    for folder in cmd.mkdirs:
        folder.mkdir(parents=True, exist_ok=True)
    staged = stage_files(cmd.stage) if cmd.stage else cmd.cwd
    with replacing(cmd.output, fixed_name=True) as part:
        argv = tuple(str(part) if a == str(cmd.output) else a for a in cmd.argv)
        with ThreadPoolExecutor(max_workers=min(_cpus(), max(1, len(cmd.before)))) as pool:
            running = [(step, pool.submit(_run_step, step, env, staged, label)) for step in cmd.before]
            for step, future in running:
                _check(future.result(), step, label)
        _check(_run_step(argv, env, cmd.cwd, label), argv, label)
