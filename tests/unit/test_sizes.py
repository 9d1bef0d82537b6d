"""What a package weighs: the device code per arch and kind (toolchain/inspect/bundles.py
code_objects) read from real nvcc and clang output, compressed and not, and the size
budget's one-line refusal (toolchain/sizes.py; the package task's own is in test_plan_windows)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import compile_ok, need_tool
from toolchain.inspect import read_binary
from toolchain.inspect.bundles import CodeObject, code_objects
from toolchain.sizes import budget_problem, size_table

KERNEL = "__global__ void scale(float *x, float a) { x[threadIdx.x] = sinf(x[threadIdx.x]) * a; }\n"


def _cuda(tmp_path: Path, name: str, *extra: str) -> list[CodeObject]:
    src = tmp_path / "one_kernel.cu"
    src.write_text(KERNEL)
    out = tmp_path / f"{name}.so"
    compile_ok(
        ["nvcc", "-shared", "-Xcompiler", "-fPIC", *extra, "-gencode", "arch=compute_80,code=sm_80",
         "-gencode", "arch=compute_90,code=[sm_90,compute_90]", str(src), "-o", str(out)]
    )  # fmt: skip
    return code_objects(read_binary(out).sections)


def test_cuda_code_objects_per_arch_and_kind_compressed_or_not(tmp_path: Path) -> None:
    """sm_80's SASS, sm_90's SASS and PTX; with -Xfatbin -compress-all nvcc stores them
    compressed, and the size the runtime loads (read from the entry's header) is the
    plain build's."""
    need_tool("nvcc")
    plain, packed = _cuda(tmp_path, "plain"), _cuda(tmp_path, "packed", "-Xfatbin", "-compress-all")
    assert [(c.arch, c.kind) for c in plain] == [("sm_80", "sass"), ("sm_90", "ptx"), ("sm_90", "sass")]
    assert [(c.arch, c.kind, c.bytes) for c in packed] == [(c.arch, c.kind, c.bytes) for c in plain]
    assert all(0 < c.compressed_bytes < c.bytes for c in plain + packed)


@pytest.mark.parametrize("compress", [False, True])
def test_hip_code_objects_per_target_compressed_bundle_or_not(tmp_path: Path, compress: bool) -> None:
    """One code object a target id, from a plain offload bundle and from a compressed one
    (inflated first): the same sizes either way, the host's empty entry left out."""
    need_tool("clang++-19")
    src = tmp_path / "one_kernel.hip"
    src.write_text("#include <hip/hip_runtime.h>\n" + KERNEL)
    sizes = {}
    for packed in (False, compress):
        out = tmp_path / f"kernel-{packed}.o"
        compile_ok(
            ["clang++-19", "-x", "hip", "-c", "--rocm-path=/usr",
             "--rocm-device-lib-path=/usr/lib/x86_64-linux-gnu/amdgcn/bitcode", "--offload-arch=gfx1030",
             "--offload-arch=gfx90a:xnack-", *(["--offload-compress"] if packed else []), str(src), "-o", str(out)]
        )  # fmt: skip
        from elftools.elf.elffile import ELFFile

        with out.open("rb") as fh:
            section = ELFFile(fh).get_section_by_name(".hip_fatbin")
            assert section is not None
            objects = code_objects({".hip_fatbin": bytes(section.data())})
        assert [(c.arch, c.kind) for c in objects] == [("gfx1030", "hsaco"), ("gfx90a:xnack-", "hsaco")]
        assert all(0 < c.compressed_bytes < c.bytes for c in objects)
        sizes[packed] = [c.bytes for c in objects]
    assert sizes[False] == sizes[compress]


def test_over_budget_is_one_line_with_the_figures() -> None:
    objects = [CodeObject("gfx1151", "hsaco", 300 << 20, 90 << 20), CodeObject("gfx1030", "hsaco", 200 << 20, 60 << 20)]
    assert budget_problem("p.zip", objects, 100 << 20, 100 << 20, "package.max_bytes") is None
    line = budget_problem("p.zip", objects, (100 << 20) + 1, 100 << 20, "package.max_bytes_by_api.hip")
    assert line is not None and "\n" not in line
    assert line.startswith("package p.zip is 104857601 bytes (100.0 MiB), over its budget of 104857600 (100.0 MiB;")
    assert "config package.max_bytes_by_api.hip" in line
    assert "gfx1151 hsaco 90.0 MiB, gfx1030 hsaco 60.0 MiB" in line and "split its arches into release groups" in line
    table = size_table("p.zip", objects, 50 << 20, 100 << 20).splitlines()
    assert table[0] == "package p.zip: 50.0 MiB of its 100.0 MiB budget"
    assert table[1].split() == ["arch", "kind", "size", "compressed"]
    assert table[3].split() == ["gfx1151", "hsaco", "300.0", "MiB", "90.0", "MiB"]
