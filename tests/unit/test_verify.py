"""Verification on real binaries built here: a good one passes, and each kind of
defect (extra export, forbidden import, embedded path, missing arch) fails with
a message that names it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, compile_ok, need_tool
from toolchain.abi import load_abi
from toolchain.command_data import REF_SOURCES
from toolchain.verify import REPORT_VERSION, Report, format_table, verify_artifact

ABI = load_abi(ROOT / "kernels" / "abi.toml").exports
KERNELS = ROOT / "kernels"
REF = [str(ROOT / s) for s in REF_SOURCES]


def check(report: Report, name: str) -> tuple[bool, str]:
    (c,) = [c for c in report.checks if c.name == name]
    return c.ok, c.detail


# The reference backends below are built unoptimised: verify reads their exports, imports
# and strings, which do not depend on it, and -O0 compiles them in half the time.


def elf_ref(gen: Path, out: Path, *extra: str, version_script: bool = True) -> Path:
    need_tool("gcc")
    argv = ["gcc", "-std=c11", "-O0", "-shared", "-fPIC", "-fvisibility=hidden", f"-I{gen}", f"-I{KERNELS}", *REF]
    if version_script:
        argv.append(f"-Wl,--version-script={gen / 'coli_backend.map'}")
    compile_ok([*argv, *extra, "-o", str(out), "-lm"])
    return out


def test_good_elf_backend_passes_and_reports_json(gen_dir: Path, tmp_path: Path) -> None:
    lib = elf_ref(gen_dir, tmp_path / "libcoli_ref.so")
    report = verify_artifact(lib, "ref", ABI, (), [str(tmp_path)])
    assert report.ok, report.failures()
    data = json.loads(report.to_json())
    assert data["version"] == REPORT_VERSION and data["ok"] is True and data["format"] == "ELF"
    assert "libcoli_ref.so" in format_table([report])


def test_extra_export_fails(gen_dir: Path, tmp_path: Path) -> None:
    extra = tmp_path / "extra.c"
    extra.write_text('__attribute__((visibility("default"))) int coli_debug_hook(void) { return 1; }\n')
    lib = elf_ref(gen_dir, tmp_path / "libx.so", str(extra), version_script=False)
    ok, detail = check(verify_artifact(lib, "ref", ABI, (), []), "exports")
    assert not ok and "unexpected coli_debug_hook" in detail


def test_missing_export_fails(gen_dir: Path, tmp_path: Path) -> None:
    lib = elf_ref(gen_dir, tmp_path / "libx.so")
    ok, detail = check(verify_artifact(lib, "ref", (*ABI, "coli_future_op"), (), []), "exports")
    assert not ok and "missing coli_future_op" in detail


def test_forbidden_import_fails(gen_dir: Path, tmp_path: Path) -> None:
    lib = elf_ref(gen_dir, tmp_path / "libx.so", "-Wl,--no-as-needed", "-lstdc++")
    ok, detail = check(verify_artifact(lib, "ref", ABI, (), []), "imports")
    assert not ok and "libstdc++.so.6" in detail


def test_embedded_build_path_fails(gen_dir: Path, tmp_path: Path) -> None:
    leak = tmp_path / "leak.c"
    leak.write_text(f'const char *coli_where = "{tmp_path}/src";\n')
    lib = elf_ref(gen_dir, tmp_path / "libx.so", str(leak))
    ok, detail = check(verify_artifact(lib, "ref", ABI, (), [str(tmp_path)]), "paths")
    assert not ok and f"embeds {tmp_path}" in detail


def test_not_a_binary(tmp_path: Path) -> None:
    junk = tmp_path / "libjunk.so"
    junk.write_text("not an ELF")
    report = verify_artifact(junk, "ref", ABI, (), [])
    assert not report.ok and "neither ELF nor PE" in report.failures()[0]


@pytest.fixture(scope="module")
def hip_lib(gen_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real HIP backend with code for gfx1030 only, built by clang from the single source;
    unoptimised, since these tests read its sections and imports, not its code's speed, and
    -O0 compiles it in about a third of the time."""
    need_tool("clang++-19")
    out = tmp_path_factory.mktemp("hip") / "libcoli_hip.so"
    compile_ok(
        [
            "clang++-19", "-x", "hip", "-std=c++17", "-O0", "--offload-arch=gfx1030", "--rocm-path=/usr",
            "--rocm-device-lib-path=/usr/lib/x86_64-linux-gnu/amdgcn/bitcode", "-fPIC", "-fvisibility=hidden",
            "-shared", "-fuse-ld=lld", f"-I{gen_dir}", f"-I{KERNELS}", str(KERNELS / "backend_gpu.cu"),
            "-o", str(out), "-lamdhip64", f"-Wl,--version-script={gen_dir / 'coli_backend.map'}",
        ]
    )  # fmt: skip
    return out


def test_hip_device_code_present_and_missing_arch(hip_lib: Path) -> None:
    ok, detail = check(verify_artifact(hip_lib, "hip", ABI, ("gfx1030",), []), "device code")
    assert ok and ".hip_fatbin lists gfx1030" in detail
    ok, detail = check(verify_artifact(hip_lib, "hip", ABI, ("gfx1030", "gfx90a"), []), "device code")
    assert not ok and "missing gfx90a" in detail


@pytest.mark.parametrize("compress", [False, True])
def test_hip_target_ids_are_proved_whole(tmp_path: Path, compress: bool) -> None:
    """AMD target ids as users write them (features in any order), passed to clang as
    they are: each offload-bundle entry's full target id must be the one asked for, in
    a plain bundle and a compressed one; gfx90a:xnack- does not stand for gfx90a."""
    need_tool("clang++-19")
    src = tmp_path / "one_kernel.hip"
    src.write_text("#include <hip/hip_runtime.h>\n__global__ void scale(float *x) { x[threadIdx.x] *= 2.f; }\n")
    out = tmp_path / "kernel.o"
    arches = ("gfx90a:xnack-", "gfx940:xnack+:sramecc-", "gfx1030")
    compile_ok(
        [
            "clang++-19", "-x", "hip", "-c", "--rocm-path=/usr",
            "--rocm-device-lib-path=/usr/lib/x86_64-linux-gnu/amdgcn/bitcode",
            *(f"--offload-arch={a}" for a in arches), *(["--offload-compress"] if compress else []),
            str(src), "-o", str(out),
        ]
    )  # fmt: skip
    sections = {".hip_fatbin": _section(out, ".hip_fatbin")}
    from toolchain.verify import _device_check

    c = _device_check("hip", sections, arches)
    assert c.ok and "gfx90a:xnack-" in c.detail and "gfx940:sramecc-:xnack+" in c.detail, c.detail
    assert ("(compressed)" in c.detail) is compress
    c = _device_check("hip", sections, ("gfx90a", "gfx940:xnack-:sramecc-"))
    assert not c.ok and c.detail.endswith("missing gfx90a, gfx940:sramecc-:xnack-"), c.detail


def _section(path: Path, name: str) -> bytes:
    from elftools.elf.elffile import ELFFile

    with path.open("rb") as fh:
        section = ELFFile(fh).get_section_by_name(name)
        assert section is not None, name
        return bytes(section.data())


def test_cuda_device_code_needs_sass_per_arch(tmp_path: Path) -> None:
    need_tool("nvcc")
    # one small kernel: the fat binary's entries are what is read, whatever the kernels
    src = tmp_path / "one_kernel.cu"
    src.write_text("__global__ void scale(float *x, float a) { x[threadIdx.x] *= a; }\n")
    out = tmp_path / "libcoli_cuda.so"
    compile_ok(
        [
            "nvcc", "-shared", "-Xcompiler", "-fPIC", "-gencode", "arch=compute_80,code=sm_80",
            "-gencode", "arch=compute_90,code=compute_90", str(src), "-o", str(out),
        ]
    )  # fmt: skip
    ok, detail = check(verify_artifact(out, "cuda", ABI, ("sm_80",), []), "device code")
    assert ok and "sm_80 (sass)" in detail
    ok, detail = check(verify_artifact(out, "cuda", ABI, ("sm_80", "sm_90"), []), "device code")
    assert not ok and "no SASS for sm_90" in detail and "sm_90 (ptx)" in detail


def test_cuda_arch_and_family_specific_targets_are_told_apart(tmp_path: Path) -> None:
    """sm_90a, sm_100a, sm_100f and sm_120a built with the build's own -gencode lines (one nvcc
    call, the arch-specific and family-specific flags of each fatbin entry read): each
    is proved by its own entry, and an sm_90a build has no SASS for plain sm_90."""
    from toolchain.command_data import cuda_gencode

    need_tool("nvcc")
    src = tmp_path / "one_kernel.cu"
    src.write_text("__global__ void scale(float *x, float a) { x[threadIdx.x] *= a; }\n")
    out = tmp_path / "libcoli_cuda.so"
    arches = ("sm_90a", "sm_100a", "sm_100f", "sm_120a")
    compile_ok(["nvcc", "-shared", "-Xcompiler", "-fPIC", *cuda_gencode(arches), str(src), "-o", str(out)])
    ok, detail = check(verify_artifact(out, "cuda", ABI, arches, []), "device code")
    assert ok and "sm_90a (sass)" in detail and "sm_100a (sass)" in detail and "sm_100f (sass)" in detail
    assert "sm_120a (ptx+sass)" in detail
    ok, detail = check(verify_artifact(out, "cuda", ABI, ("sm_90",), []), "device code")
    assert not ok and "no SASS for sm_90" in detail


# ---- PE, built with MinGW ------------------------------------------------


def pe_ref(gen: Path, out: Path, *extra: str) -> Path:
    need_tool("x86_64-w64-mingw32-gcc")
    compile_ok(
        [
            "x86_64-w64-mingw32-gcc", "-std=c11", "-O0", "-shared", "-D__USE_MINGW_ANSI_STDIO=1", f"-I{gen}",
            f"-I{KERNELS}", *REF, *extra, "-o", str(out), "-static-libgcc", "-Wl,--no-insert-timestamp",
        ]
    )  # fmt: skip
    return out


def test_good_pe_backend(gen_dir: Path, tmp_path: Path) -> None:
    dll = pe_ref(gen_dir, tmp_path / "coli_ref.dll", str(gen_dir / "coli_backend.def"))
    report = verify_artifact(dll, "ref", ABI, (), [str(tmp_path)])
    assert report.ok, report.failures()
    assert check(report, "format")[1] == "PE32+ machine 0x8664 DLL"


def test_pe_extra_export_and_forbidden_import(gen_dir: Path, tmp_path: Path) -> None:
    extra = tmp_path / "extra.c"
    extra.write_text(
        "#include <winsock2.h>\n__declspec(dllexport) int coli_debug_hook(void) { return WSAGetLastError(); }\n"
    )
    dll = pe_ref(gen_dir, tmp_path / "coli_ref.dll", str(extra), "-lws2_32")
    report = verify_artifact(dll, "ref", ABI, (), [])
    ok, detail = check(report, "exports")
    assert not ok and "unexpected coli_debug_hook" in detail
    ok, detail = check(report, "imports")
    assert not ok and "WS2_32.dll" in detail


def test_pe_embedded_path_in_utf16(gen_dir: Path, tmp_path: Path) -> None:
    leak = tmp_path / "leak.c"
    leak.write_text(f'#include <wchar.h>\nconst wchar_t *coli_where = L"{tmp_path}";\n')
    dll = pe_ref(gen_dir, tmp_path / "coli_ref.dll", str(gen_dir / "coli_backend.def"), str(leak))
    ok, detail = check(verify_artifact(dll, "ref", ABI, (), [str(tmp_path)]), "paths")
    assert not ok and str(tmp_path) in detail


def test_pe_with_a_real_offload_bundle_in_hip_fat(gen_dir: Path, hip_lib: Path, tmp_path: Path) -> None:
    """The bundle clang made for the Linux HIP build, placed in a .hip_fat section of a MinGW DLL,
    is read the same way a Windows HIP SDK build's would be."""
    need_tool("objcopy", "x86_64-w64-mingw32-objcopy")
    raw = tmp_path / "bundle.bin"
    compile_ok(["objcopy", "-O", "binary", "--only-section=.hip_fatbin", str(hip_lib), str(raw)])
    dll = pe_ref(gen_dir, tmp_path / "coli_hip.dll", str(gen_dir / "coli_backend.def"))
    compile_ok(["x86_64-w64-mingw32-objcopy", "--add-section", f".hip_fat={raw}", str(dll)])
    ok, detail = check(verify_artifact(dll, "hip", ABI, ("gfx1030",), []), "device code")
    assert ok and ".hip_fat lists gfx1030" in detail
    ok, detail = check(verify_artifact(dll, "hip", ABI, ("gfx1030", "gfx1151"), []), "device code")
    assert not ok and "missing gfx1151" in detail
    # the imports allowlist of coli_hip.dll is the runtime and KERNEL32 only: MinGW's msvcrt is outside it
    ok, detail = check(verify_artifact(dll, "hip", ABI, ("gfx1030",), []), "imports")
    assert not ok and "msvcrt.dll" in detail


def test_objcopy_of_elf_section_matches_pyelftools(hip_lib: Path, tmp_path: Path) -> None:
    from toolchain.inspect import read_binary

    raw = tmp_path / "b.bin"
    subprocess.run(["objcopy", "-O", "binary", "--only-section=.hip_fatbin", str(hip_lib), str(raw)], check=True)
    assert read_binary(hip_lib).sections[".hip_fatbin"] == raw.read_bytes()


def test_the_host_must_bind_what_the_hip_backend_imports(hip_lib: Path, tmp_path: Path) -> None:
    """A package's host and HIP backend from different HIP SDKs could never start the GPU
    tier: verify names both runtimes."""
    from toolchain.verify import runtime_agreement

    host = tmp_path / "coli"
    host.write_bytes(b"\x7fELF...\x00libamdhip64.so.5\x00[HIP] %s\x00")
    check = runtime_agreement(host, hip_lib)
    assert check.ok and check.detail == "host binds libamdhip64.so.5; backend imports libamdhip64.so.5"
    host.write_bytes(b"\x7fELF...\x00libamdhip64.so.6\x00")
    check = runtime_agreement(host, hip_lib)
    assert not check.ok and check.detail == "host binds libamdhip64.so.6; backend imports libamdhip64.so.5"
    host.write_bytes(b"\x7fELF... no runtime named here")
    assert runtime_agreement(host, hip_lib).detail == "host binds no HIP runtime; backend imports libamdhip64.so.5"


@pytest.mark.parametrize(
    ("embedded", "wide"),
    [("c:/program files/amd/rocm/6.4/include/hip", False), ("C:\\\\PROGRAM FILES\\\\AMD\\\\ROCM\\\\6.4\\\\bin", True)],
)
def test_a_windows_sdk_path_leaks_in_any_spelling(gen_dir: Path, tmp_path: Path, embedded: str, wide: bool) -> None:
    """Windows paths are matched without case and with either separator, in UTF-8 and
    UTF-16: a DLL holding the HIP SDK's root in another spelling still fails."""
    leak = tmp_path / "leak.c"
    leak.write_text(
        f'#include <wchar.h>\nconst {"wchar_t" if wide else "char"} *coli_where = {"L" if wide else ""}"{embedded}";\n'
    )
    dll = pe_ref(gen_dir, tmp_path / "coli_ref.dll", str(gen_dir / "coli_backend.def"), str(leak))
    sdk = r"C:\Program Files\AMD\ROCm\6.4"
    ok, detail = check(
        verify_artifact(dll, "ref", ABI, (), [sdk, r"C:\Program Files\Microsoft Visual Studio"]), "paths"
    )
    assert not ok and detail == f"embeds {sdk}", detail
    ok, _ = check(verify_artifact(dll, "ref", ABI, (), [r"C:\Program Files\AMD\ROCm\7.1"]), "paths")
    assert ok
