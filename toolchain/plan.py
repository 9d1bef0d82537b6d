"""What one `doit build` makes: the host and one backend per API, from the config
and the toolchains found. An absent API is skipped in the default build and is an
error when asked for by name."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .arches import Api, api_of
from .config import ResolvedConfig
from .discover import CudaToolkit, HipSdk, Missing, Tool, Toolchains
from .errors import ToolchainError

__all__ = ["BackendSpec", "Plan", "make_plan"]


@dataclass(frozen=True)
class BackendSpec:
    platform: str
    api: Api
    arches: tuple[str, ...]

    @property
    def archkey(self) -> str:
        return "_".join(self.arches)

    @property
    def key(self) -> str:
        return f"{self.api}-{self.archkey}"

    @property
    def task(self) -> str:
        """Subtask name: platform and key, so Linux and Windows builds keep separate state."""
        return f"{self.platform}-{self.key}"

    @property
    def windows(self) -> bool:
        return self.platform.startswith("windows")

    @property
    def lib_name(self) -> str:
        return f"coli_{self.api}.dll" if self.windows else f"libcoli_{self.api}.so"


@dataclass(frozen=True)
class Plan:
    rc: ResolvedConfig
    toolchains: Toolchains
    root: Path
    platform: str
    host_cc: Tool
    backends: tuple[BackendSpec, ...]
    notes: tuple[str, ...]
    host_os: str = sys.platform
    msvc: Any = None  # msvc.Msvc when a Windows GPU backend is built on Windows

    @property
    def cross(self) -> bool:
        """Windows artifacts built on Linux: run under Wine, HIP and CUDA out of reach."""
        return self.windows and self.host_os != "win32"

    @property
    def windows(self) -> bool:
        return self.platform.startswith("windows")

    @property
    def build_dir(self) -> Path:
        return (self.root / self.rc.config.build.build_dir).absolute()

    @property
    def dist_dir(self) -> Path:
        return (self.root / self.rc.config.build.dist_dir).absolute()

    @property
    def gen_dir(self) -> Path:
        return self.build_dir / "gen"

    @property
    def host_exe(self) -> Path:
        return self.build_dir / self.platform / "host" / ("coli.exe" if self.windows else "coli")

    def backend_dir(self, spec: BackendSpec) -> Path:
        return self.build_dir / self.platform / spec.key

    def backend_lib(self, spec: BackendSpec) -> Path:
        return self.backend_dir(spec) / spec.lib_name

    @property
    def hip(self) -> HipSdk:
        assert isinstance(self.toolchains.hip, HipSdk)
        return self.toolchains.hip

    @property
    def cuda(self) -> CudaToolkit:
        assert isinstance(self.toolchains.cuda, CudaToolkit)
        return self.toolchains.cuda


def _group(arches: tuple[str, ...]) -> dict[Api, tuple[str, ...]]:
    out: dict[Api, list[str]] = {}
    for a in arches:
        out.setdefault(api_of(a), []).append(a)
    return {k: tuple(v) for k, v in out.items()}


MsvcResolver = Callable[[bool], Any]  # for_hip -> msvc.Msvc (raises ToolchainError)


def _native_arches(tool: Path | None, run: Callable[[list[str]], str]) -> list[str]:
    if tool is None:
        return []
    return sorted(set(re.findall(r"\bgfx[0-9a-f]+\b", run([str(tool)]))))


def make_plan(
    rc: ResolvedConfig,
    toolchains: Toolchains,
    root: Path,
    *,
    host_os: str = sys.platform,
    env: Mapping[str, str] | None = None,
    msvc_resolver: MsvcResolver | None = None,
    run_tool: Callable[[list[str]], str] | None = None,
) -> Plan:
    cfg = rc.config
    windows = cfg.build.os == "windows"
    platform = "windows-x86_64" if windows else "linux-x86_64"
    explicit = bool(cfg.build.arch)
    requested = cfg.build.arch or ("cpu", *cfg.hip.default_arches, *cfg.cuda.default_arches)
    notes: list[str] = []

    host = toolchains.mingw_cc if windows else toolchains.host_cc
    if isinstance(host, Missing):
        raise ToolchainError(f"{platform} host: {host}")

    def unavailable(api: str, reason: str) -> None:
        if explicit:
            raise ToolchainError(f"{platform}-{api}: {reason}")
        notes.append(f"{platform}-{api}: skipped: {reason}")

    native_windows = windows and host_os == "win32"
    run_tool = run_tool or (lambda argv: subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout)
    msvc = None
    backends: list[BackendSpec] = []
    for api, arches in _group(requested).items():
        if api == "ref":
            backends.append(BackendSpec(platform, "ref", ("cpu",)))
            continue
        if windows and not native_windows:
            sdk = "the HIP SDK and MSVC" if api == "hip" else "the CUDA toolkit and MSVC"
            unavailable(api, f"needs Windows with {sdk}; it cannot be cross-built from Linux")
            continue
        chain: Any = (
            toolchains.win_hip
            if (api == "hip" and native_windows)
            else (toolchains.hip if api == "hip" else toolchains.cuda)
        )
        if "native" in arches and not isinstance(chain, Missing):
            tool = getattr(chain, "arch_tool", None)
            if tool is None and not native_windows and isinstance(chain, HipSdk):
                found = chain.compiler.resolve().parent / "amdgpu-arch"
                tool = found if found.is_file() else None
            detected = _native_arches(Path(str(tool)) if tool else None, run_tool)
            if not detected:
                why = f"no GPU found by {tool}" if tool else "the SDK has no amdgpu-arch or hipInfo to detect the GPU"
                raise ToolchainError(f"arch=native: {why}; name the arch instead, e.g. arch=gfx1151")
            arches = tuple(dict.fromkeys(a for a in (*arches, *detected) if a != "native"))
        if isinstance(chain, Missing):
            unavailable(api, f"{chain.reason}; to get it: {chain.hint}")
            continue
        bad = [a for a in arches if not chain.supports(a)]
        if bad and explicit:
            if isinstance(chain, HipSdk):
                raise ToolchainError("; ".join(chain.unsupported(a) for a in bad))
            if not isinstance(chain, CudaToolkit):  # the Windows HIP SDK
                raise ToolchainError(
                    f"HIP SDK {chain.version} at {chain.root} cannot build {', '.join(bad)}: no device library "
                    f"for it in {chain.device_lib_dir} (it has {', '.join(chain.available) or 'none'})"
                )
            raise ToolchainError(
                f"CUDA {chain.version} ({chain.nvcc}) cannot build {', '.join(bad)} "
                f"(nvcc --list-gpu-arch gives {', '.join(chain.gpu_arches)})"
            )
        if bad:
            why = (
                f"CUDA {chain.version} does not list them in nvcc --list-gpu-arch"
                if isinstance(chain, CudaToolkit)
                else f"HIP SDK {chain.version} at {chain.root} has no device library for them"
            )
            notes.append(f"{platform}-{api}: skipping {', '.join(bad)}: {why}")
            arches = tuple(a for a in arches if a not in bad)
            if not arches:
                notes.append(f"{platform}-{api}: skipped: none of its default arches can be built here")
                continue
        if native_windows and msvc is None:
            try:
                msvc = (msvc_resolver or _default_msvc(rc, env or {}, root))(api == "hip")
            except ToolchainError as exc:
                if explicit:
                    raise
                notes.append(f"{platform}-{api}: skipped: {exc}")
                continue
        backends.append(BackendSpec(platform, api, arches))
    return Plan(rc, toolchains, root, platform, host, tuple(backends), tuple(notes), host_os, msvc)


def _default_msvc(rc: ResolvedConfig, env: Mapping[str, str], root: Path) -> MsvcResolver:
    from .msvc import resolve_msvc

    cache = (root / rc.config.build.build_dir / ".cache").absolute()
    return lambda for_hip: resolve_msvc(env, rc.config.windows.msvc_toolset, cache, for_hip=for_hip)
