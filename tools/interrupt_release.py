#!/usr/bin/env python3
"""Kill `doit release` at random points and start it again: the second run must
finish with the same bytes as an uninterrupted release, and no partial package
or release folder may ever be visible.

    python3 tools/interrupt_release.py PROJECT [--trials 20] [--config F] [--entry ID,...] [--seed N]

PROJECT is a project copy this script may clean and build in (tests use a copy).
Each trial starts from a clean build, sends SIGKILL to doit's whole process group
(compilers included) at a random time within the measured length of a full
release, checks what is visible, then runs the release again and compares. The
kill times are stratified: trial i of N draws its time uniformly from the i-th
N-th of the release, so a few trials still cover the whole run. A release that
ends before its kill was faster than the one measured (a machine less busy
now): its length becomes the release's, and the trial is drawn again on it
(once), so the kills still land inside. Prints one line per trial and a
summary; exits 1 on any violation.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

VERSIONED = "release-"


def doit_argv(config: str, entry: str | None) -> list[str]:
    argv = [sys.executable, "-m", "doit", "-n", "2", "release", f"config={config}"]
    return argv + ([f"entry={entry}"] if entry else [])


def clean(project: Path) -> None:
    for d in ("build", "dist"):
        shutil.rmtree(project / d, ignore_errors=True)


def snapshot(dist: Path) -> dict[str, str]:
    """sha256 of every visible file under dist/ (hidden staging names excluded)."""
    out: dict[str, str] = {}
    if not dist.is_dir():
        return out
    for p in sorted(dist.rglob("*")):
        rel = p.relative_to(dist)
        if p.is_file() and not any(part.startswith(".") for part in rel.parts):
            out[rel.as_posix()] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def violations(seen: dict[str, str], reference: dict[str, str], dist: Path) -> list[str]:
    """Visible files must be complete (the reference's bytes), and a release folder whole."""
    bad = [f"{name}: partial or different bytes" for name, h in seen.items() if reference.get(name) != h]
    bad += [f"{name}: not in the reference" for name in seen if name not in reference]
    for folder in {n.split("/")[0] for n in seen if n.startswith(VERSIONED) and "/" in n}:
        manifest = dist / folder / "release-manifest.json"
        if not manifest.is_file():
            bad.append(f"{folder}: visible without its manifest")
            continue
        listed = [e["package"] for e in json.loads(manifest.read_text())["entries"] if e.get("package")]
        missing = [p for p in listed if f"{folder}/{p}" not in seen]
        if missing:
            bad.append(f"{folder}: manifest lists missing {', '.join(missing)}")
    return bad


def run(project: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=project, capture_output=True, text=True, timeout=1800)


def interrupted_release(project: Path, argv: list[str], delay: float) -> tuple[bool, float]:
    """A release killed (its whole process group) after `delay` seconds: whether it had
    finished by then, and how long it ran."""
    start = time.monotonic()
    child = subprocess.Popen(
        argv, cwd=project, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        child.wait(timeout=delay)
        return True, time.monotonic() - start
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        return False, delay


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("project", type=Path)
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--config", default="configs/release-local.toml")
    ap.add_argument("--entry", default=None, help="entry ids, comma-separated (default: every entry)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    project = args.project.resolve()
    argv = doit_argv(args.config, args.entry)
    rng = random.Random(args.seed)

    # once: its bytes are what every restarted release must give (so a release that is not
    # reproducible fails its first trial), and its length is what the kills are spread over
    # (it also wrote Python's bytecode caches, so a trial's release may end sooner: the
    # redraw below)
    clean(project)
    start = time.monotonic()
    proc = run(project, argv)
    full = time.monotonic() - start
    if proc.returncode != 0:
        print(proc.stdout + proc.stderr)
        return 1
    reference = snapshot(project / "dist")
    print(f"reference release: {full:.1f} s, {len(reference)} files")

    failures = 0
    for trial in range(1, args.trials + 1):
        for _ in range(2):
            clean(project)
            delay = rng.uniform((trial - 1) * full / args.trials, trial * full / args.trials)
            finished, took = interrupted_release(project, argv, delay)
            if not finished:
                break
            full = min(full, took)
        seen = snapshot(project / "dist")
        problems = violations(seen, reference, project / "dist")
        again = run(project, argv)
        final = snapshot(project / "dist")
        if again.returncode != 0:
            problems.append(f"the restarted release failed: {(again.stdout + again.stderr).strip()[-400:]}")
        elif final != reference:
            diff = sorted(n for n in set(final) | set(reference) if final.get(n) != reference.get(n))
            problems.append(f"the restarted release differs in {', '.join(diff)}")
        state = "finished before the kill" if finished else f"killed at {delay:.2f} s"
        print(f"trial {trial:2d}: {state}, {len(seen)} complete files visible: {'ok' if not problems else 'FAIL'}")
        for p in problems:
            print(f"    {p}")
        failures += bool(problems)
    print(
        f"{args.trials - failures} of {args.trials} trials ended with the reference bytes and nothing partial visible"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
