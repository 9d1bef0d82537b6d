"""The GPU backend's int8/int4 path (kernels/gpu_matmul.cuh) checked on the host:
the same header the kernels use, compiled by nvcc and run without a GPU, with the
tensor cores' mma written out from its documented fragment layout. The kernels
themselves run on a GPU only (bench/gpu_check.sh)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.conftest import ROOT, compile_ok, need_tool


def test_the_mma_path_sums_w_times_each_digit_exactly(gen_dir: Path, tmp_path: Path) -> None:
    need_tool("nvcc")
    exe = tmp_path / "gpu_mma_check"
    warnings = "-Wall,-Wextra,-Werror,-Wno-unused-function"  # the shared headers' helpers go unused here
    # nvcc's and ptxas's own warnings fail it too (a launch bound no SM can meet); for sm_90, the
    # arch the kernels are tuned for (ptxas for nvcc's default, sm_75, takes minutes over them)
    compile_ok(
        ["nvcc", "-std=c++17", "-arch=sm_90", "--Werror", "all-warnings", "-Xcompiler", warnings,
         f"-I{gen_dir}", f"-I{ROOT / 'kernels'}", str(ROOT / "tests/c/gpu_mma_check.cu"), "-o", str(exe)]
    )  # fmt: skip
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "mma path check passed" in proc.stdout
