"""The GPU bench's settings (tools/bench_env.h): a wrong COLI_BENCH_* value stops the
run with one line that names the setting, what was wrong and what is allowed, before
the GPU is touched. The header is checked on the host under the sanitizers;
bench/gpu_bench.sh checks that the bench itself refuses them before it needs a GPU."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, SANITIZE, compile_ok, need_tool


@pytest.fixture(scope="module")
def check_exe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    need_tool("g++")
    exe = tmp_path_factory.mktemp("bench_env") / "bench_env_check"
    compile_ok(
        ["g++", "-std=c++17", "-Wall", "-Wextra", "-Werror", *SANITIZE, f"-I{ROOT / 'tools'}",
         str(ROOT / "tests/c/bench_env_check.cpp"), "-o", str(exe)]
    )  # fmt: skip
    return exe


def run(exe: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("value", "taken"),
    [
        ("4096x4096", "shapes 4096 4096"),
        ("4096x14336,14336x4096,28672x2048", "shapes 4096 14336; 14336 4096; 28672 2048"),
        ("1x32", "shapes 1 32"),
        ("1048576x1024", "shapes 1048576 1024"),  # 2^30 weights: the most allowed
    ],
)
def test_good_shapes_are_taken_in_order(check_exe: Path, value: str, taken: str) -> None:
    proc = run(check_exe, "shapes", value)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == taken


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("4096x", "'4096x' is not a shape"),
        ("4096", "'4096' is not a shape"),
        ("4096X4096", "'4096X4096' is not a shape"),
        (" 4096x4096", "' 4096x4096' is not a shape"),
        ("4096x4096,", "'' is not a shape"),
        ("4096x4096,,64x64", "'' is not a shape"),
        ("0x4096", "'0x4096' is not a shape"),
        ("-1x4096", "'-1x4096' is not a shape"),
        ("4096x4096junk", "'4096x4096junk' is not a shape"),
        ("4096x100", "'4096x100' has columns that are not a multiple of 32"),
        ("2000000x32", "'2000000x32' has a count above 1048576"),
        ("99999999999999999999999x32", "has a count above 1048576"),
        ("65536x32768", "'65536x32768' is too large"),
    ],
)
def test_bad_shapes_get_one_line_naming_the_item_and_the_rule(check_exe: Path, value: str, why: str) -> None:
    proc = run(check_exe, "shapes", value)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("COLI_BENCH_SHAPES: ")
    assert why in lines[0]
    assert "allowed: ROWSxCOLS[,ROWSxCOLS...]" in lines[0]


def test_only_takes_parts_of_variant_names_and_names_them_when_none_match(check_exe: Path) -> None:
    names = ["decode bulk", "decode bulk two", "gemv R1 D2 T1"]
    assert run(check_exe, "only", "bulk two,gemv", *names).returncode == 0
    proc = run(check_exe, "only", "decode bulk,bulkk", *names)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "COLI_BENCH_ONLY: 'bulkk' is part of no variant's name "
        "(the variants: decode bulk, decode bulk two, gemv R1 D2 T1)"
    )
    assert "'' is part of no variant's name" in run(check_exe, "only", "gemv,", *names).stderr


@pytest.mark.parametrize(("value", "code"), [("1", 0), ("0", 0), ("yes", 2), ("10", 2), ("", 2)])
def test_s1_is_0_or_1(check_exe: Path, value: str, code: int) -> None:
    proc = run(check_exe, "s1", value)
    assert proc.returncode == code
    if code:
        assert proc.stderr.strip() == f"COLI_BENCH_S1: '{value}' is not 0 or 1 (1: time S = 1 only)"


@pytest.mark.parametrize(("value", "code"), [("1", 0), ("0", 0), ("on", 2), ("", 2)])
def test_tile_is_0_or_1(check_exe: Path, value: str, code: int) -> None:
    proc = run(check_exe, "tile", value)
    assert proc.returncode == code
    if code:
        assert proc.stderr.strip() == (
            f"COLI_BENCH_TILE: '{value}' is not 0 or 1 "
            "(1: int4 tile by tile at every width, decode tiled variants only)"
        )
