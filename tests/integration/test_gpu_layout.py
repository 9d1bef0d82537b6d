"""The GPU backend's interleaved weight layout (kernels/gpu_matmul.cuh), checked
on the host: the same header the kernels use, compiled by nvcc and run without a
GPU. The kernels themselves run on a GPU only (bench/gpu_check.sh)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.conftest import ROOT, compile_ok, need_tool


def test_the_interleaved_layout_moves_words_and_keeps_every_value(gen_dir: Path, tmp_path: Path) -> None:
    need_tool("nvcc")
    exe = tmp_path / "gpu_layout_check"
    warnings = "-Wall,-Wextra,-Werror,-Wno-unused-function"  # the shared headers' helpers go unused here
    compile_ok(
        ["nvcc", "-std=c++17", "-Xcompiler", warnings, f"-I{gen_dir}", f"-I{ROOT / 'kernels'}",
         str(ROOT / "tests/c/gpu_layout_check.cu"), "-o", str(exe)]
    )  # fmt: skip
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "layout check passed" in proc.stdout
