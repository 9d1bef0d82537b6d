"""The Windows GPU backends' compile and link commands (the HIP SDK's clang and
nvcc, both against the pinned MSVC). They cannot run here: they are data, and
golden-tested against recorded SDK trees and a recorded vcvarsall environment."""

from __future__ import annotations

from pathlib import PureWindowsPath

from .command_data import GPU_SOURCES, NVCC_THREADS, ROCM_VARIABLES, cuda_gencode
from .msvc import Msvc
from .windows_sdk import WinHipSdk

__all__ = ["hip_environment", "windows_cuda_argv", "windows_hip_argv"]


def hip_environment(sdk: WinHipSdk, msvc: Msvc, tmp: PureWindowsPath, system_root: str) -> dict[str, str | None]:
    """The HIP compile's environment: vcvarsall's, HIP_PATH = the selected SDK, the
    other ROCm steering variables removed (None) but HIP_CLANG_PATH = the SDK's clang++
    folder for the hipcc driver, System32 on PATH, and a writable
    build-local TMP/TEMP/TMPDIR (MSYS2 shells often leave them unset)."""
    env: dict[str, str | None] = dict(msvc.env)
    for name in ROCM_VARIABLES:
        env[name] = None
    env["HIP_PATH"] = str(sdk.root)
    if sdk.compiler_kind == "hipcc" and sdk.clang_dir is not None:
        env["HIP_CLANG_PATH"] = str(sdk.clang_dir)  # the driver runs this SDK's clang++, not one on Path
    path = env.get("Path") or env.get("PATH") or ""
    system32 = f"{system_root}\\System32"
    parts = [str(sdk.bin_dir), *(p for p in path.split(";") if p)]
    if system32.lower() not in (p.lower() for p in parts):
        parts.append(system32)
    env.pop("PATH", None)
    env["Path"] = ";".join(parts)
    for name in ("TMP", "TEMP", "TMPDIR"):
        env[name] = str(tmp)
    return env


def windows_hip_argv(
    sdk: WinHipSdk,
    arches: tuple[str, ...],
    root: PureWindowsPath,
    gen_dir: PureWindowsPath,
    output: PureWindowsPath,
    gpu_flags: tuple[str, ...],
) -> list[str]:
    return [
        str(sdk.compiler),
        "-x", "hip", "-std=c++17", *gpu_flags,
        *(f"--offload-arch={a}" for a in arches),
        f"--rocm-path={sdk.root}",
        f"--rocm-device-lib-path={sdk.device_lib_dir}",
        *(["-isystem", str(sdk.include_dir)] if sdk.include_dir != sdk.root / "include" else []),
        "-fms-runtime-lib=static",  # static CRT: the DLL needs no MSVC redistributable
        f"-ffile-prefix-map={root}=.",
        "-cuid=coli_backend_gpu",
        f"-I{gen_dir}", f"-I{root / 'kernels'}",
        str(root / PureWindowsPath(GPU_SOURCES[0])),
        "-shared", "-o", str(output),
        f"-L{sdk.lib_dir}", "-lamdhip64",
        f"-Wl,/DEF:{gen_dir / 'coli_backend.def'}",
        "-Wl,/Brepro", "-Wl,/INCREMENTAL:NO",
    ]  # fmt: skip


def windows_cuda_argv(
    nvcc: PureWindowsPath,
    arches: tuple[str, ...],
    root: PureWindowsPath,
    gen_dir: PureWindowsPath,
    output: PureWindowsPath,
    gpu_flags: tuple[str, ...],
) -> list[str]:
    gencode = cuda_gencode(arches)
    return [
        str(nvcc), "-std=c++17", *gpu_flags, *NVCC_THREADS, "-shared",
        "-Xcompiler", "/MT", "-Xcompiler", "/Brepro",
        "-Xlinker", f"/DEF:{gen_dir / 'coli_backend.def'}", "-Xlinker", "/Brepro",
        *gencode,
        f"-I{gen_dir}", f"-I{root / 'kernels'}",
        str(root / PureWindowsPath(GPU_SOURCES[0])),
        "-o", str(output),
    ]  # fmt: skip
