"""The safetensors reader's scaling bench (bench/safetensors_lookup.c, RESULTS.md "Loading
a model of many tensors"), built with gcc against the engine's reader and run on small
counts: every tensor found, one JSON line a count, bad counts refused in one line."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, build_bench_probe, refusal_line


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Path:
    engine = ROOT / "engine"
    sources = [str(engine / f) for f in ("safetensors.c", "json.c", "utf8.c")]
    return build_bench_probe("safetensors_lookup", tmp_path_factory.mktemp("st"), f"-I{engine}", *sources)


def test_every_tensor_is_found_at_each_count(bench: Path, tmp_path: Path) -> None:
    proc = subprocess.run(
        [str(bench), str(tmp_path / "m.safetensors"), "1", "769", "3000"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [(r["tensors"], r["found"]) for r in rows] == [(1, 1), (769, 769), (3000, 3000)]
    assert all(r["open_seconds"] >= 0 and r["find_all_seconds"] >= 0 for r in rows)
    assert not (tmp_path / "m.safetensors").exists()


@pytest.mark.parametrize("args", [[], ["f"], ["f", "0"], ["f", "12x"], ["f", "2000000"]])
def test_bad_counts_are_one_line_and_exit_2(bench: Path, args: list[str]) -> None:
    assert refusal_line(bench, args).startswith("safetensors_lookup: ")
