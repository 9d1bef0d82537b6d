"""The toolchain lockfile (toolchain.lock, written by `doit lock`): per platform and
toolchain, what pins it: the versions (gcc, clang, nvcc, the HIP SDK, MSVC's
toolset and cl), and each path by its place in its SDK (its layout) or, outside any
SDK, by its name, so the lock holds on another machine with the same toolchains
installed elsewhere. A release checks the toolchains it found against it."""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath, PureWindowsPath

from .plan import Plan

__all__ = ["LOCK_HEADER", "lock_differences", "lock_of", "read_lock", "render_lock"]

LOCK_HEADER = (
    "# The toolchains a release is built with, written by `doit lock` from what was found.\n"
    "# `doit release` refuses a toolchain that differs; `doit release lock=update` rewrites this file.\n"
)
_ROOT_KEYS = ("root", "home", "vs")  # where an SDK, CUDA or Visual Studio is installed
_ABSOLUTE = re.compile(r"^(/|[A-Za-z]:[\\/])")


def _path(text: str) -> PurePosixPath | PureWindowsPath:
    return PureWindowsPath(text) if re.match(r"^[A-Za-z]:", text) else PurePosixPath(text)


def _portable(fingerprint: Mapping[str, str]) -> dict[str, str]:
    """A fingerprint without this machine's folders: a path inside the SDK's root as
    `@/relative/path`, any other absolute path by its name."""
    roots = [_path(fingerprint[k]) for k in _ROOT_KEYS if fingerprint.get(k)]
    out: dict[str, str] = {}
    for key, value in sorted(fingerprint.items()):
        if key in _ROOT_KEYS:
            continue
        if not _ABSOLUTE.match(value):
            out[key] = value
            continue
        p = _path(value)
        inside = next((r for r in roots if type(r) is type(p) and (r == p or r in p.parents)), None)
        out[key] = "@/" + p.relative_to(inside).as_posix() if inside is not None else p.name
    return out


def lock_of(plans: Sequence[Plan]) -> dict[str, dict[str, dict[str, str]]]:
    """platform -> toolchain (host and each GPU API a plan builds) -> what pins it."""
    out: dict[str, dict[str, dict[str, str]]] = {}
    for plan in plans:
        apis = ["host", *sorted({s.api for s in plan.backends if s.api != "ref"})]
        out[plan.platform] = {api: _portable(plan.fingerprint(api)) for api in apis}
    return out


def render_lock(lock: Mapping[str, Mapping[str, Mapping[str, str]]]) -> str:
    """The lockfile's text: TOML, one table per platform and toolchain, keys sorted."""
    parts = [LOCK_HEADER]
    for platform in sorted(lock):
        for tool in sorted(lock[platform]):
            parts.append(f"\n[{platform}.{tool}]\n")
            parts += [f"{k} = {json.dumps(v)}\n" for k, v in sorted(lock[platform][tool].items())]
    return "".join(parts)


def read_lock(path: Path) -> dict[str, dict[str, dict[str, str]]]:
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    return {p: {t: {k: str(v) for k, v in kv.items()} for t, kv in tools.items()} for p, tools in data.items()}


def lock_differences(
    locked: Mapping[str, Mapping[str, Mapping[str, str]]], found: Mapping[str, Mapping[str, Mapping[str, str]]]
) -> list[str]:
    """Each way the toolchains found differ from the lock, for the platforms found."""
    out = []
    for platform in sorted(found):
        mine, theirs = found[platform], locked.get(platform)
        if theirs is None:
            out.append(f"{platform} is not in the lock")
            continue
        for tool in sorted(set(mine) | set(theirs)):
            if tool not in theirs:
                out.append(f"{platform} {tool} is not in the lock")
            elif tool not in mine:
                out.append(f"{platform} {tool} is in the lock but not used here")
            else:
                for key in sorted(set(mine[tool]) | set(theirs[tool])):
                    a, b = theirs[tool].get(key), mine[tool].get(key)
                    if a != b:
                        out.append(f"{platform} {tool}.{key}: {a if a is not None else 'none'} in the lock, "
                                   f"{b if b is not None else 'none'} here")  # fmt: skip
    return out
