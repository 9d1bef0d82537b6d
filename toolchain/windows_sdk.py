"""The HIP SDK on Windows, whose packagings do not share one layout: the AMD
installer (C:\\Program Files\\AMD\\ROCm\\<ver>), TheRock builds and tarballs.
Every component is found on its own (or set on its own in config/environment).

The filesystem and the tools are reached through the `Probe` given, so the
same code is tested here against recorded SDK trees and `hipcc --version`
outputs, and runs against the real disk on Windows.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import PureWindowsPath

from .arches import base_arch, version_tuple
from .config.schema import HipSection
from .sdk import Missing

__all__ = ["Probe", "WinHipSdk", "find_windows_hip"]

HINT = "install the AMD HIP SDK for Windows, or set HIP_SDK_ROOT (and any component: HIP_BIN_DIR, ...)"


@dataclass(frozen=True)
class Probe:
    exists: Callable[[PureWindowsPath], bool]
    listdir: Callable[[PureWindowsPath], list[str]]
    run: Callable[[PureWindowsPath, tuple[str, ...]], str | None]


@dataclass(frozen=True)
class WinHipSdk:
    root: PureWindowsPath
    bin_dir: PureWindowsPath
    include_dir: PureWindowsPath
    lib_dir: PureWindowsPath
    device_lib_dir: PureWindowsPath
    compiler: PureWindowsPath
    version: str
    runtime_dll: str  # amdhip64_7.dll: the name backends import and the host binds
    arch_tool: PureWindowsPath | None  # amdgpu-arch.exe or hipInfo.exe: arch=native needs one
    available: tuple[str, ...] = ()  # gfx targets with a device library
    sources: Mapping[str, str] = field(default_factory=dict)
    compiler_kind: str = "clang++"  # or "hipcc": the SDK's driver, which runs its clang++
    clang_dir: PureWindowsPath | None = None  # the SDK's clang++ folder (HIP_CLANG_PATH for hipcc)
    compiler_note: str = ""  # which compiler is used, and why (doit toolchain says it)

    @property
    def location(self) -> str:
        return str(self.root)

    def supports(self, arch: str) -> bool:
        return base_arch(arch) in self.available

    @property
    def offload_compress(self) -> bool:
        """--offload-compress came with the HIP SDK 6.1 compiler."""
        return version_tuple(self.version)[:2] >= (6, 1)

    def fingerprint(self) -> dict[str, str]:
        return {"root": str(self.root), "version": self.version, "compiler": str(self.compiler),
                "device_lib_dir": str(self.device_lib_dir), "runtime": self.runtime_dll}  # fmt: skip


def _norm(p: str) -> PureWindowsPath:
    return PureWindowsPath(p.replace("/", "\\"))


def find_windows_hip(
    cfg: HipSection, origin: Callable[[str], str], env: Mapping[str, str], probe: Probe
) -> WinHipSdk | Missing:
    sources: dict[str, str] = {}
    if cfg.sdk_root:
        root, sources["root"] = _norm(cfg.sdk_root), origin("hip.sdk_root")
    elif env.get("HIP_PATH"):
        root, sources["root"] = _norm(env["HIP_PATH"]), "env HIP_PATH"
    else:
        base = PureWindowsPath(env.get("ProgramFiles", r"C:\Program Files")) / "AMD" / "ROCm"
        versions = sorted((v for v in probe.listdir(base) if re.fullmatch(r"\d+\.\d+", v)),
                          key=lambda v: tuple(map(int, v.split("."))), reverse=True)  # fmt: skip
        if not versions:
            return Missing("hip sdk", f"no HIP_SDK_ROOT, no HIP_PATH and nothing in {base}", HINT)
        root, sources["root"] = base / versions[0], f"newest in {base}"

    def pick(
        key: str, configured: str | None, candidates: list[PureWindowsPath], marker: str
    ) -> PureWindowsPath | Missing:
        if configured:
            sources[key] = origin(f"hip.{key}")
            p = _norm(configured)
            return (
                p if probe.exists(p / marker) else Missing(f"hip {key}", f"{p} ({sources[key]}) has no {marker}", HINT)
            )
        sources[key] = f"found under {root}"
        for c in candidates:
            if probe.exists(c / marker):
                return c
        return Missing(f"hip {key}", f"no {marker} under {root} ({sources['root']})", HINT)

    llvm = root / "lib" / "llvm"
    clang_libs = [llvm / "lib" / "clang" / v / "lib" / "amdgcn" / "bitcode"
                  for v in sorted(probe.listdir(llvm / "lib" / "clang"), reverse=True)]  # fmt: skip
    parts = {
        "bin_dir": pick("bin_dir", cfg.bin_dir, [root / "bin"], "hipcc.exe" if not cfg.bin_dir else ""),
        "include_dir": pick("include_dir", cfg.include_dir, [root / "include"], "hip\\hip_runtime.h"),
        "lib_dir": pick("lib_dir", cfg.lib_dir, [root / "lib"], "amdhip64.lib"),
        "device_lib_dir": pick("device_lib_dir", cfg.device_lib_dir,
                               [root / "amdgcn" / "bitcode", llvm / "amdgcn" / "bitcode", *clang_libs], "ocml.bc"),
        # the SDK's own clang++: the compiler, or the one a hipcc driver runs
        "compiler": pick("compiler", None, [root / "bin", llvm / "bin"], "clang++.exe"),
    }  # fmt: skip
    configured = _norm(cfg.compiler) if cfg.compiler else None
    if isinstance(parts["compiler"], Missing) and configured and configured.stem.lower() != "hipcc":
        parts["compiler"] = configured.parent  # a clang++ of its own: the SDK needs none
    for v in parts.values():
        if isinstance(v, Missing):
            return v
    bin_dir, include, lib, devlib, compiler_dir = (
        parts[k] for k in ("bin_dir", "include_dir", "lib_dir", "device_lib_dir", "compiler")
    )
    assert isinstance(bin_dir, PureWindowsPath) and isinstance(devlib, PureWindowsPath)
    assert isinstance(include, PureWindowsPath) and isinstance(lib, PureWindowsPath)
    assert isinstance(compiler_dir, PureWindowsPath)
    chosen = _compiler(cfg.compiler, origin, compiler_dir, probe, sources)
    if isinstance(chosen, Missing):
        return chosen
    compiler, kind, note = chosen
    runtimes = sorted(n for n in probe.listdir(bin_dir) if re.fullmatch(r"amdhip64_\d+\.dll", n.lower()))
    if not runtimes:
        return Missing("hip runtime", f"no amdhip64_<N>.dll in {bin_dir}", HINT)
    hipcc = bin_dir / "hipcc.exe"
    out = probe.run(hipcc, ("--version",)) if probe.exists(hipcc) else None
    m = re.search(r"HIP version:\s*(\S+)", out or "")
    available = tuple(
        sorted(
            "gfx" + n.removeprefix("oclc_isa_version_").removesuffix(".bc")
            for n in probe.listdir(devlib)
            if n.startswith("oclc_isa_version_")
        )
    )
    tool = next((bin_dir / t for t in ("amdgpu-arch.exe", "hipInfo.exe") if probe.exists(bin_dir / t)), None)
    return WinHipSdk(root, bin_dir, include, lib, devlib, compiler, m.group(1) if m else "unknown", runtimes[-1],
                     tool, available, sources, kind, compiler_dir, note)  # fmt: skip


def _compiler(
    configured: str | None,
    origin: Callable[[str], str],
    clang_dir: PureWindowsPath,
    probe: Probe,
    sources: dict[str, str],
) -> tuple[PureWindowsPath, str, str] | Missing:
    """HIPCC (hip.compiler) as the seed means it, the SDK's hipcc driver, or a clang++;
    unset, the SDK's clang++. Returns the compiler, its kind and why it is used."""
    if not configured:
        return (clang_dir / "clang++.exe", "clang++",
                "the SDK's clang++, run directly: every path the compile uses is on its command line")  # fmt: skip
    path, sources["compiler"] = _norm(configured), origin("hip.compiler")
    if not probe.exists(path):
        return Missing("hip compiler", f"{path} ({sources['compiler']}) does not exist", HINT)
    stem = path.stem.lower()
    if stem == "hipcc":
        return (path, "hipcc", f"{sources['compiler']} names the hipcc driver, as the seed's build does; it runs "
                f"the SDK's clang++ ({clang_dir}, given as HIP_CLANG_PATH) with the same flags")  # fmt: skip
    if stem.startswith("clang++") or stem.endswith("clang++"):
        return path, "clang++", f"{sources['compiler']} names a clang++, run directly with the SDK's paths"
    return Missing("hip compiler", f"{path} ({sources['compiler']}) is neither hipcc nor a clang++", HINT)
