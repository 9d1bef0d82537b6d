"""MSVC on Windows: find Visual Studio with vswhere, select the pinned toolset,
capture the environment of `vcvarsall.bat x64 -vcvars_ver=<pin>` once (cached,
keyed by the vswhere result and the pin), and check what cl.exe says it is.

None of this can run on Linux; every function that reads the machine takes the
text it would read (vswhere's JSON, `set` output, cl's banner) so it is tested
against recorded fixtures, and `resolve_msvc` is the one place that runs tools.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PureWindowsPath

from .atomic import write_atomic
from .errors import ToolchainError

__all__ = [
    "CMATH_CONFLICT",
    "Msvc",
    "VsInstall",
    "check_cl_banner",
    "installed_toolsets",
    "parse_env_dump",
    "parse_vswhere",
    "resolve_msvc",
    "select_toolset",
    "vcvars_command",
    "vswhere_path",
]

CMATH_CONFLICT = (
    "MSVC 14.5x (Visual Studio 2026) ships a <cmath> whose declarations collide with HIP's __device__ math "
    "overloads, so hipcc/clang fails inside the standard headers; pin a 14.4x toolset such as 14.44.35207 "
    "(windows.msvc_toolset)"
)


@dataclass(frozen=True)
class VsInstall:
    path: PureWindowsPath
    version: str
    name: str


@dataclass(frozen=True)
class Msvc:
    install: VsInstall
    toolset: str
    env: Mapping[str, str]  # the vcvarsall environment
    cl_version: str  # e.g. 19.44.35207.1

    def fingerprint(self) -> dict[str, str]:
        return {"vs": str(self.install.path), "toolset": self.toolset, "cl": self.cl_version}


def vswhere_path(env: Mapping[str, str]) -> PureWindowsPath:
    base = env.get("ProgramFiles(x86)", r"C:\Program Files (x86)")
    return PureWindowsPath(base) / "Microsoft Visual Studio" / "Installer" / "vswhere.exe"


def parse_vswhere(text: str) -> list[VsInstall]:
    """`vswhere -products * -requires Microsoft.VisualStudio.Component.VC.Tools.x86.x64 -format json`."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ToolchainError(f"vswhere printed something that is not JSON: {exc}") from None
    out = [
        VsInstall(
            PureWindowsPath(d["installationPath"]),
            str(d.get("installationVersion", "?")),
            str(d.get("displayName", "")),
        )
        for d in data
        if isinstance(d, dict) and d.get("installationPath")
    ]
    return sorted(out, key=lambda i: [int(p) if p.isdigit() else 0 for p in i.version.split(".")], reverse=True)


def installed_toolsets(names: list[str]) -> list[str]:
    """Toolset folder names under VC\\Tools\\MSVC, newest first."""
    found = [n for n in names if re.fullmatch(r"\d+\.\d+\.\d+", n)]
    return sorted(found, key=lambda v: tuple(int(p) for p in v.split(".")), reverse=True)


def select_toolset(installed: list[str], pin: str | None, *, for_hip: bool) -> str:
    listing = ", ".join(installed) or "none"
    if not pin:
        raise ToolchainError(f"no MSVC toolset pinned (windows.msvc_toolset); installed: {listing}")
    if for_hip and pin.startswith("14.5"):
        raise ToolchainError(f"MSVC toolset {pin} cannot build HIP: {CMATH_CONFLICT}")
    if pin not in installed:
        hint = f"; {CMATH_CONFLICT}" if for_hip and any(t.startswith("14.5") for t in installed) else ""
        raise ToolchainError(f"MSVC toolset {pin} is not installed; installed: {listing}{hint}")
    return pin


def vcvars_command(install: VsInstall, toolset: str) -> list[str]:
    vcvarsall = install.path / "VC" / "Auxiliary" / "Build" / "vcvarsall.bat"
    return ["cmd.exe", "/s", "/c", f'"{vcvarsall}" x64 -vcvars_ver={toolset} >nul && set']


def parse_env_dump(text: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith("="):
            k, v = line.split("=", 1)
            env[k] = v
    return env


def check_cl_banner(banner: str, toolset: str) -> str:
    """cl.exe prints 'Microsoft (R) C/C++ Optimizing Compiler Version 19.44.35207.1 for x64'.
    Toolset 14.XX.BUILD is compiler 19.XX.BUILD; anything else is the wrong cl."""
    m = re.search(r"Version (\d+)\.(\d+)\.(\d+)(?:\.\d+)? for (\S+)", banner)
    if not m:
        raise ToolchainError(f"cannot read cl.exe's version from: {banner.strip()[:120]!r}")
    major, minor, build, target = m.groups()
    _, t_minor, t_build = toolset.split(".")
    if target.lower() != "x64":
        raise ToolchainError(f"cl.exe targets {target}, not x64 (vcvarsall was not run with x64)")
    if (int(minor), build) != (int(t_minor), t_build) or major != "19":
        raise ToolchainError(f"cl.exe is {major}.{minor}.{build}, which is not toolset {toolset}")
    return m.group(0).split()[1]


def _cache_key(vswhere_json: str, toolset: str) -> str:
    return hashlib.sha256(f"{vswhere_json}\n{toolset}".encode()).hexdigest()[:16]


def resolve_msvc(
    env: Mapping[str, str],
    pin: str | None,
    cache_dir: Path,
    *,
    for_hip: bool,
    run: Callable[[list[str], Mapping[str, str] | None], str] | None = None,
    list_dir: Callable[[PureWindowsPath], list[str]] | None = None,
) -> Msvc:
    """Runs vswhere, selects the pinned toolset, captures vcvarsall's environment
    (cached) and checks cl.exe. `run` and `list_dir` are replaceable for tests."""

    def default_run(argv: list[str], run_env: Mapping[str, str] | None) -> str:
        proc = subprocess.run(argv, capture_output=True, text=True, env=dict(run_env) if run_env else None)
        return proc.stdout + proc.stderr

    def default_list(p: PureWindowsPath) -> list[str]:
        local = Path(str(p))
        return [c.name for c in local.iterdir()] if local.is_dir() else []

    run = run or default_run
    list_dir = list_dir or default_list
    vswhere = vswhere_path(env)
    text = run(
        [str(vswhere), "-products", "*", "-requires", "Microsoft.VisualStudio.Component.VC.Tools.x86.x64",
         "-format", "json"], None,
    )  # fmt: skip
    installs = parse_vswhere(text)
    if not installs:
        raise ToolchainError(f"no Visual Studio with the C++ x64 tools found by {vswhere}")
    # the newest installation that has the pinned toolset (VS 2026 may hold only 14.5x)
    per_install = {i: installed_toolsets(list_dir(i.path / "VC" / "Tools" / "MSVC")) for i in installs}
    install = next((i for i in installs if pin in per_install[i]), installs[0])
    every = installed_toolsets(sorted({t for ts in per_install.values() for t in ts}))
    toolset = select_toolset(per_install[install] if pin in per_install[install] else every, pin, for_hip=for_hip)
    cache = cache_dir / f"vcvars-{_cache_key(text, toolset)}.json"
    if cache.is_file():
        captured = json.loads(cache.read_text(encoding="utf-8"))
    else:
        captured = parse_env_dump(run(vcvars_command(install, toolset), env))
        if "INCLUDE" not in captured or "LIB" not in captured:
            raise ToolchainError(f"vcvarsall.bat x64 -vcvars_ver={toolset} did not set INCLUDE and LIB")
        write_atomic(cache, json.dumps(captured, indent=1, sort_keys=True))
    banner = run(["cl.exe"], captured)
    return Msvc(install, toolset, captured, check_cl_banner(banner, toolset))
