"""bench/gpu_ab_pack.sh, which packs commits for the GPU A/B run (bench/gpu_ab.sh runs
only on a GPU machine): bad input stops it with one line naming what was wrong and
what is allowed, leaving the pack folder alone; a good one writes a commit's tree, and
the working tree's commit and its files' hashes for bench/tree_report.sh, which names that
commit on the GPU machine only while the files there are those hashed (the device's copy
of the tree does not carry its history)."""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.conftest import ROOT, need_tool


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout.strip()


def pack(out: Path, *revs: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(ROOT / "bench/gpu_ab_pack.sh"), *revs], capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "AB_DIR": str(out)})  # fmt: skip


@pytest.mark.parametrize(
    ("revs", "why"),
    [
        (("HEAD", "no-such-rev"), "'no-such-rev' is not a commit"),
        (("main~100000",), "'main~100000' is not a commit"),
    ],
)
def test_bad_input_gets_one_line_and_keeps_the_folder(tmp_path: Path, revs: tuple[str, ...], why: str) -> None:
    need_tool("git")
    out = tmp_path / "ab"
    out.mkdir()
    (out / "kept.tar").write_bytes(b"x")
    proc = pack(out, *revs)
    assert proc.returncode == 2
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and why in lines[0], proc.stderr
    assert (out / "kept.tar").read_bytes() == b"x"


def test_a_commit_is_packed_under_its_short_hash(tmp_path: Path) -> None:
    need_tool("git")
    out = tmp_path / "ab"
    proc = pack(out, "HEAD")
    assert proc.returncode == 0, proc.stderr
    short = _git("rev-parse", "--short", "HEAD")
    assert {p.name for p in out.iterdir()} == {"files.sha256", f"{short}.tar", "tree.txt"}
    with tarfile.open(out / f"{short}.tar") as t:
        names = set(t.getnames())
    assert {"README.md", "bench/gpu_ab.sh", "kernels/gpu_steps.cuh"} <= names


def test_with_no_commit_only_the_trees_commit_is_written(tmp_path: Path) -> None:
    need_tool("git")
    out = tmp_path / "ab"
    out.mkdir()
    (out / "old.tar").write_bytes(b"x")
    proc = pack(out)
    assert proc.returncode == 0, proc.stderr
    head = _git("rev-parse", "HEAD")
    assert sorted(p.name for p in out.iterdir()) == ["files.sha256", "tree.txt"]
    assert (out / "tree.txt").read_text().startswith(head + " ")


def report(out: Path) -> str:
    proc = subprocess.run(["bash", "bench/tree_report.sh"], capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={"PATH": "/usr/bin:/bin", "AB_DIR": str(out)})  # fmt: skip
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout
    return lines[0]


def test_the_report_names_the_packed_commit_only_while_its_files_are_here(tmp_path: Path) -> None:
    need_tool("git", "sha256sum")
    out = tmp_path / "ab"
    assert report(out).startswith(f"tree: unknown (no {out}/tree.txt")
    assert pack(out).returncode == 0
    head = _git("rev-parse", "HEAD")
    assert report(out).startswith(f"tree: {head} ")
    sums = (out / "files.sha256").read_text().splitlines()
    assert "  README.md" in "\n".join(sums)
    # one file as it was when packed no longer: the report says so instead of a commit
    sums[0] = "0" * 64 + sums[0][64:]
    (out / "files.sha256").write_text("\n".join(sums) + "\n")
    line = report(out)
    assert line.startswith(f"tree: unknown (1 of the files packed with {head[:7]} differ here"), line
