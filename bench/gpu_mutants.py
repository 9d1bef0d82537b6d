"""Whether the GPU selftest rejects wrong backends: each mutant of bench/gpu_mutants.toml
(one replacement in one kernel source) is built from its own copy of the tree by the
task graph, side by side, and the selftest of HOST with that backend must fail, with the
mutant's named op check among its failures. A mutant the selftest passes (or that fails
only other checks) is a mistake the selftest would let through. Run on a CUDA machine
after bench/gpu_build.sh (bench/gpu_mutants.sh); exits 1 if any mutant survives or any
build fails.

    python3 bench/gpu_mutants.py --host build/linux-x86_64/host/coli [--arch sm_90] [--out DIR]
        [--mutants FILE] [--baseline-host OLD]

--baseline-host: another tree's host (an older selftest), whose verdict on each mutant is
reported beside this one's, to show what a change to the selftest made it catch.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from contextlib import ExitStack
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parent.parent
# what a mutant's copy of the tree leaves out: builds, environments, caches, carried wheels
SKIP = {".git", "build", "dist", ".nox", ".venv", ".ab", ".whl", "bench/out"}
SKIP |= {".mypy_cache", ".pytest_cache", ".ruff_cache"}


class Mutant(NamedTuple):
    name: str
    file: str
    old: str
    new: str
    check: str


def load(path: Path) -> list[Mutant]:
    """The mutants of a TOML file; ValueError in one line where it is not one or an entry
    lacks a field."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ValueError(f"{path}: {e}") from None
    mutants = []
    for i, m in enumerate(data.get("mutant", [])):
        missing = [k for k in ("name", "file", "from", "to", "check") if not isinstance(m.get(k), str)]
        if missing:
            raise ValueError(f"{path}: mutant {i} lacks {', '.join(missing)} (each needs name, file, from, to, check)")
        mutants.append(Mutant(m["name"], m["file"], m["from"], m["to"], m["check"]))
    if not mutants:
        raise ValueError(f"{path}: no [[mutant]] entries")
    return mutants


def mutate(text: str, m: Mutant) -> str:
    """text with m's one replacement; ValueError naming the mutant where `from` is not
    there exactly once (the source moved on and the mutant no longer says what it meant)."""
    n = text.count(m.old)
    if n != 1:
        raise ValueError(f"mutant '{m.name}': {m.file} holds its 'from' {n} times, not once")
    return text.replace(m.old, m.new)


def verdict(report: dict[str, Any], check: str) -> tuple[bool, list[str]]:
    """(caught, the failed checks) from a selftest's JSON: caught where the selftest failed
    and a failed check is `check` or `check` then its shape ("matmul int8" names every
    int8 matmul shape)."""
    failed = [c["op"] for c in report.get("op_checks", []) if not c.get("ok")]
    failed += [f"matmul {c['format']} {c['rows']}x{c['cols']} s={c['s']}" for c in report.get("checks", [])
               if not c.get("ok")]  # fmt: skip
    named = any(f == check or f.startswith(check + " ") for f in failed)
    return (not report.get("passed", True)) and named, failed


def said(caught: bool, failed: list[str]) -> str:
    return f"{'caught' if caught else 'SURVIVED'} (failed: {', '.join(failed) or 'none'})"


def copy_tree(dest: Path) -> None:
    def ignore(folder: str, names: list[str]) -> set[str]:
        rel = Path(folder).resolve().relative_to(ROOT)
        return {n for n in names if (rel / n).as_posix() in SKIP}

    shutil.copytree(ROOT, dest, ignore=ignore, symlinks=True)


def selftest(host: Path, lib: Path) -> dict[str, Any]:
    proc = subprocess.run([str(host), "--backend", str(lib), "--selftest", "--json"], capture_output=True, text=True)
    try:
        report: dict[str, Any] = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return {"passed": False, "op_checks": [], "error": (proc.stderr or proc.stdout).strip()[-300:]}
    return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", type=Path, required=True, help="the tree's host (coli)")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--mutants", type=Path, default=ROOT / "bench/gpu_mutants.toml")
    ap.add_argument("--out", type=Path, default=ROOT / "bench/out")
    ap.add_argument("--baseline-host", type=Path, help="another tree's host, its verdicts reported beside")
    args = ap.parse_args()
    if args.baseline_host and not args.baseline_host.is_file():
        ap.error(f"--baseline-host {args.baseline_host}: no such file")
    try:  # every mutant made first: one that no longer applies stops the run before any build
        mutants = load(args.mutants)
        texts = [mutate((ROOT / m.file).read_text(), m) for m in mutants]
    except (OSError, ValueError) as e:
        print(f"gpu_mutants.py: {e}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    rows, ok = [], True
    with tempfile.TemporaryDirectory(prefix="coli-mutants-") as scratch, ExitStack() as logs:
        work, builds = Path(scratch), []
        for i, (m, text) in enumerate(zip(mutants, texts, strict=True)):
            tree = work / f"m{i}"
            copy_tree(tree)
            (tree / m.file).write_text(text)
            # in the scratch folder, kept only where the build fails: the device tool brings
            # back few files from a run's output folder
            log = logs.enter_context(open(work / f"mutant-{i}-build.txt", "w"))
            cmd = [sys.executable, "-m", "doit", "-n", "1", "backend", f"arch={args.arch}"]
            builds.append((tree, subprocess.Popen(cmd, cwd=tree, stdout=log, stderr=subprocess.STDOUT, env=os.environ)))
        for i, (m, (tree, proc)) in enumerate(zip(mutants, builds, strict=True)):
            if proc.wait() != 0:
                shutil.copy(work / f"mutant-{i}-build.txt", args.out)
                print(f"mutant {i} ({m.name}): build failed, see mutant-{i}-build.txt")
                rows.append({"mutant": m.name, "built": False})
                ok = False
                continue
            lib = tree / "build/linux-x86_64" / f"cuda-{args.arch}" / "libcoli_cuda.so"
            caught, failed = verdict(selftest(args.host, lib), m.check)
            ok &= caught
            row = {"mutant": m.name, "built": True, "check": m.check, "caught": caught, "failed": failed}
            line = f"mutant {i} ({m.name}): {said(caught, failed)}"
            if args.baseline_host:
                was, was_failed = verdict(selftest(args.baseline_host, lib), m.check)
                row |= {"baseline_caught": was, "baseline_failed": was_failed}
                line += f"; the baseline host: {said(was, was_failed)}"
            print(line)
            rows.append(row)
    (args.out / "mutants.json").write_text(json.dumps(rows, indent=1) + "\n")
    print(f"{sum(bool(r.get('caught')) for r in rows)} of {len(rows)} mutants caught")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
