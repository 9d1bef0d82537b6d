"""What one `doit build` makes: the host and one backend per API, from the config
and the toolchains found. An absent API is skipped in the default build and is an
error when asked for by name."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from .arches import Api, api_of, arch_key, version_tuple
from .config import ResolvedConfig
from .config.release import ReleaseEntry
from .discover import CudaToolkit, HipSdk, Tool, Toolchains
from .errors import ToolchainError
from .msvc import Msvc
from .sdk import Missing, Sdk
from .windows_sdk import WinHipSdk

__all__ = ["BackendSpec", "Plan", "make_plan", "make_release_plans"]


@dataclass(frozen=True)
class BackendSpec:
    platform: str
    api: Api
    arches: tuple[str, ...]
    bundle_hip_runtime: bool | None = field(default=None, compare=False)  # a release target's override

    @property
    def archkey(self) -> str:
        return arch_key(self.arches)

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
    msvc: Msvc | None = None  # when a Windows GPU backend is built on Windows

    @property
    def cross(self) -> bool:
        """Windows artifacts built on Linux: run under Wine, HIP and CUDA out of reach."""
        return self.windows and self.host_os != "win32"

    @property
    def windows(self) -> bool:
        return self.platform.startswith("windows")

    @property
    def build_dir(self) -> Path:
        return self.rc.folders(self.root)[0]

    @property
    def dist_dir(self) -> Path:
        return self.rc.folders(self.root)[1]

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

    def fingerprint(self, api: str) -> dict[str, str]:
        """The toolchain an artifact of `api` (or "host") is built with; a change rebuilds it."""
        if api in ("host", "ref"):
            return self.host_cc.fingerprint()
        if self.windows and self.msvc is not None:
            sdk: Sdk = self.win_hip if api == "hip" else self.cuda
            return {**sdk.fingerprint(), **self.msvc.fingerprint()}
        return (self.hip if api == "hip" else self.cuda).fingerprint()

    @property
    def win_hip(self) -> WinHipSdk:
        """The Windows HIP SDK, on a Windows build host that has one."""
        assert isinstance(self.toolchains.win_hip, WinHipSdk)
        return self.toolchains.win_hip

    def build_machine_paths(self) -> list[str]:
        """The folders no artifact may name (verify's leak check): the checkout, the build
        folder, the SDK roots (the Linux HIP SDK, CUDA, and on a Windows build host the
        Windows HIP SDK with each component found apart from its root), and the MSVC
        install with its toolset folder. System prefixes (/usr, ...) are left out: they
        hold nothing of this build machine's own."""
        paths = [str(self.root), str(self.build_dir)]
        tc = self.toolchains
        for sdk_root in (getattr(tc.hip, "root", None), getattr(tc.cuda, "home", None)):
            if sdk_root is not None and str(sdk_root) not in ("/", "/usr", "/usr/local"):
                paths.append(str(sdk_root))
        win = tc.win_hip
        if isinstance(win, WinHipSdk):
            parts = (win.root, win.bin_dir, win.include_dir, win.lib_dir, win.device_lib_dir, win.clang_dir)
            paths += [str(p) for p in parts if p is not None and win.root not in (p, *p.parents)]
            paths.append(str(win.root))
        if self.msvc is not None:
            paths.append(str(self.msvc.install.path))
            tools = self.msvc.env.get("VCToolsInstallDir", "").rstrip("\\")
            if tools and not tools.lower().startswith(str(self.msvc.install.path).lower()):
                paths.append(tools)
        return paths

    @property
    def msvc_env(self) -> dict[str, str]:
        """The pinned MSVC's environment, on a Windows build host building a GPU backend."""
        assert self.msvc is not None
        return dict(self.msvc.env)


def _group(arches: tuple[str, ...]) -> dict[Api, tuple[str, ...]]:
    out: dict[Api, list[str]] = {}
    for a in arches:
        out.setdefault(api_of(a), []).append(a)
    return {k: tuple(v) for k, v in out.items()}


MsvcResolver = Callable[[bool], Msvc]  # for_hip -> the pinned MSVC (raises ToolchainError)


def _native_arches(tool: Path | None, run: Callable[[list[str]], str]) -> list[str]:
    if tool is None:
        return []
    return sorted(set(re.findall(r"\bgfx[0-9a-f]+\b", run([str(tool)]))))


Mode = Literal["strict", "default", "release"]  # arch= named / default build / release matrix


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
    """The plan of `doit build`: build.arch grouped by API (named: all must build; default: what can)."""
    cfg = rc.config
    explicit = bool(cfg.build.arch)
    requested = cfg.build.arch or ("cpu", *cfg.hip.default_arches, *cfg.cuda.default_arches)
    groups: list[tuple[Api, tuple[str, ...], ReleaseEntry | None]] = [
        (api, arches, None) for api, arches in _group(requested).items()
    ]
    ctx = _Context(rc, toolchains, root, host_os, env or {}, msvc_resolver, run_tool)
    return ctx.plan(cfg.build.os, groups, "strict" if explicit else "default", [])


def make_release_plans(
    rc: ResolvedConfig,
    toolchains: Toolchains,
    root: Path,
    entries: list[ReleaseEntry],
    *,
    host_os: str = sys.platform,
    env: Mapping[str, str] | None = None,
    msvc_resolver: MsvcResolver | None = None,
    run_tool: Callable[[list[str]], str] | None = None,
) -> tuple[list[Plan], list[tuple[ReleaseEntry, str]]]:
    """One plan per platform of the matrix, and each entry this machine cannot build with what it needs."""
    ctx = _Context(rc, toolchains, root, host_os, env or {}, msvc_resolver, run_tool)
    plans: list[Plan] = []
    skipped: list[tuple[BackendSpec, str]] = []
    by_id = {e.id: e for e in entries}
    for os_name in dict.fromkeys(e.os for e in entries):
        mine = [e for e in entries if e.os == os_name]
        try:
            plans.append(ctx.plan(os_name, [(e.api, e.arches, e) for e in mine], "release", skipped))
        except ToolchainError as exc:  # no host compiler: nothing of this platform builds
            skipped += [(BackendSpec(e.platform, e.api, e.arches), str(exc)) for e in mine]
    return plans, [(by_id[spec.task], why) for spec, why in skipped]


@dataclass(frozen=True)
class _Context:
    rc: ResolvedConfig
    toolchains: Toolchains
    root: Path
    host_os: str
    env: Mapping[str, str]
    msvc_resolver: MsvcResolver | None
    run_tool: Callable[[list[str]], str] | None

    def run(self, argv: list[str]) -> str:
        if self.run_tool is not None:
            return self.run_tool(argv)
        return subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout

    def plan(
        self,
        os_name: str,
        groups: list[tuple[Api, tuple[str, ...], ReleaseEntry | None]],
        mode: Mode,
        skipped: list[tuple[BackendSpec, str]],
    ) -> Plan:
        """Resolve each (API, arches) group against the toolchains; what cannot be built raises
        (strict), becomes a note (default) or lands in `skipped` with the reason (release)."""
        rc, toolchains = self.rc, self.toolchains
        windows = os_name == "windows"
        platform = "windows-x86_64" if windows else "linux-x86_64"
        notes: list[str] = []
        host = toolchains.mingw_cc if windows else toolchains.host_cc
        if isinstance(host, Missing):
            raise ToolchainError(f"{platform} host: {host}")
        native_windows = windows and self.host_os == "win32"
        msvc = None
        backends: list[BackendSpec] = []
        for api, arches, entry in groups:
            spec = BackendSpec(platform, api, arches, entry.bundle_hip_runtime if entry else None)
            try:
                built = self._backend(spec, mode, native_windows, notes)
                if built is not None and native_windows and api != "ref" and msvc is None:
                    msvc = self._msvc(api)
            except ToolchainError as exc:
                if mode == "strict":
                    raise ToolchainError(f"{platform}-{api}: {exc}") from None
                if mode == "release":
                    skipped.append((spec, str(exc)))
                else:
                    notes.append(f"{platform}-{api}: skipped: {exc}")
                continue
            if built is not None:
                backends.append(built)
        if native_windows and backends and msvc is None and any(b.api != "ref" for b in backends):
            raise ToolchainError("internal: a Windows GPU backend without MSVC")
        return Plan(rc, toolchains, self.root, platform, host, tuple(backends), tuple(notes), self.host_os, msvc)

    def _msvc(self, api: str) -> Msvc:
        resolver = self.msvc_resolver or _default_msvc(self.rc, self.env, self.root)
        return resolver(api == "hip")

    def _backend(self, spec: BackendSpec, mode: Mode, native_windows: bool, notes: list[str]) -> BackendSpec | None:
        """The spec to build (arches may be narrowed in the default build), None when skipped with a note;
        raises ToolchainError naming what is missing."""
        api, arches, platform, toolchains = spec.api, spec.arches, spec.platform, self.toolchains
        if api == "ref":
            return spec
        if spec.windows and not native_windows:
            sdk = "the HIP SDK and MSVC" if api == "hip" else "the CUDA toolkit and MSVC"
            raise ToolchainError(f"needs Windows with {sdk}; it cannot be cross-built from Linux")
        chain: Sdk | Missing | None = (
            toolchains.win_hip
            if (api == "hip" and native_windows)
            else (toolchains.hip if api == "hip" else toolchains.cuda)
        )
        if chain is None:
            raise ToolchainError("internal: no Windows HIP SDK discovery on this host")
        if "native" in arches and not isinstance(chain, Missing):
            arches = self._native(chain, arches, native_windows)
        if isinstance(chain, Missing):
            raise ToolchainError(f"{chain.reason}; to get it: {chain.hint}")
        pinned = self.rc.config.release.sdk.get(api) if self.rc.config.release and mode == "release" else None
        if pinned and version_tuple(chain.version)[:2] != version_tuple(pinned)[:2]:
            sdk = "CUDA" if api == "cuda" else "HIP SDK"
            where = chain.location
            raise ToolchainError(f"needs {sdk} {pinned} (release.sdk.{api}); found {chain.version} at {where}")
        bad = [a for a in arches if not chain.supports(a)]
        if bad and mode != "default":
            raise ToolchainError(_cannot_build(chain, bad))
        if bad:
            why = (
                f"CUDA {chain.version} does not list them in nvcc --list-gpu-arch"
                if isinstance(chain, CudaToolkit)
                else f"HIP SDK {chain.version} at {chain.location} has no device library for them"
            )
            notes.append(f"{platform}-{api}: skipping {', '.join(bad)}: {why}")
            arches = tuple(a for a in arches if a not in bad)
            if not arches:
                notes.append(f"{platform}-{api}: skipped: none of its default arches can be built here")
                return None
        hip_sdk = isinstance(chain, (HipSdk, WinHipSdk))
        if hip_sdk and self.rc.config.hip.offload_compress and not getattr(chain, "offload_compress", False):
            what = getattr(chain, "compiler_version", "") or f"HIP SDK {chain.version}"
            notes.append(f"{platform}-hip: offload bundles stay uncompressed: {what} has no --offload-compress")
        return BackendSpec(platform, api, arches, spec.bundle_hip_runtime)

    def _native(self, chain: Sdk, arches: tuple[str, ...], native_windows: bool) -> tuple[str, ...]:
        tool = getattr(chain, "arch_tool", None)
        if tool is None and not native_windows and isinstance(chain, HipSdk):
            found = chain.compiler.resolve().parent / "amdgpu-arch"
            tool = found if found.is_file() else None
        detected = _native_arches(Path(str(tool)) if tool else None, self.run)
        if not detected:
            why = f"no GPU found by {tool}" if tool else "the SDK has no amdgpu-arch or hipInfo to detect the GPU"
            raise ToolchainError(f"arch=native: {why}; name the arch instead, e.g. arch=gfx1151")
        return tuple(dict.fromkeys(a for a in (*arches, *detected) if a != "native"))


def _cannot_build(chain: Sdk, bad: list[str]) -> str:
    if isinstance(chain, HipSdk):
        return "; ".join(chain.unsupported(a) for a in bad)
    if isinstance(chain, WinHipSdk):
        return (
            f"HIP SDK {chain.version} at {chain.root} cannot build {', '.join(bad)}: no device library "
            f"for it in {chain.device_lib_dir} (it has {', '.join(chain.available) or 'none'})"
        )
    assert isinstance(chain, CudaToolkit)
    return (
        f"CUDA {chain.version} ({chain.nvcc}) cannot build {', '.join(bad)} "
        f"(nvcc --list-gpu-arch gives {', '.join(chain.gpu_arches)})"
    )


def _default_msvc(rc: ResolvedConfig, env: Mapping[str, str], root: Path) -> MsvcResolver:
    from .msvc import resolve_msvc

    cache = (root / rc.config.build.build_dir / ".cache").absolute()
    return lambda for_hip: resolve_msvc(env, rc.config.windows.msvc_toolset, cache, for_hip=for_hip)
