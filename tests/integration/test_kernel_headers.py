"""Each GPU kernel header compiles on its own, for HIP (clang, the host and gfx90a
sides) and for CUDA (nvcc, sm_90's PTX: the sm_90-only kernels are compiled only
there): a header includes what it uses and works wherever it is included."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, need_tool

pytestmark = pytest.mark.slow

KERNELS = ROOT / "kernels"
HEADERS = sorted(p.name for p in KERNELS.glob("gpu_*.cuh"))
WARNINGS = ["-Wall", "-Wextra", "-Werror", "-Wno-unused-function"]  # a header alone leaves its helpers unused


def _compile(argv: list[str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(argv)}\n{proc.stdout}{proc.stderr}"


@pytest.mark.parametrize("header", HEADERS)
def test_a_kernel_header_compiles_alone(header: str, gen_dir: Path, tmp_path: Path) -> None:
    need_tool("clang++-19", "nvcc")
    src = tmp_path / "alone.cu"
    src.write_text(f'#include "{header}"\n')
    inc = [f"-I{gen_dir}", f"-I{KERNELS}"]
    _compile(
        ["clang++-19", "-x", "hip", "-std=c++17", "-fsyntax-only", *WARNINGS, "--offload-arch=gfx90a",
         "--rocm-path=/usr", "-nogpulib", *inc, str(src)]
    )  # fmt: skip
    if header != "gpu_dispatch.cuh":  # its table instantiates every kernel: the backend's own build compiles it
        # the device code unoptimised (-Xcicc -O0): what a header needs is found before any
        # optimisation, and the step's headers, which instantiate most kernels, compile fast
        _compile(
            ["nvcc", "-std=c++17", "-x", "cu", "-arch=compute_90", "-code=compute_90", "-Xcicc", "-O0",
             "-Xcompiler", ",".join(WARNINGS), "--Werror", "all-warnings", *inc, "-c", str(src), "-o",
             str(tmp_path / "alone.o")]
        )  # fmt: skip


def test_the_headers_are_the_ones_the_build_tracks() -> None:
    """Every kernel header is a file dependency of the backend builds (a changed header rebuilds them)."""
    from toolchain.command_data import BACKEND_HEADERS

    on_disk = {f"kernels/{p.name}" for p in KERNELS.iterdir() if p.suffix in (".h", ".cuh")}
    assert on_disk <= set(BACKEND_HEADERS)
