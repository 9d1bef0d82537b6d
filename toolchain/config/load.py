"""Layered configuration: defaults < config file < environment < doit variables.

Every value remembers where it came from, so `doit config` can show it and an
error can name the file or variable to fix.
"""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..errors import ConfigError
from ..toml_model import describe_error
from .schema import Config, ReleaseSection

__all__ = ["ENV_KEYS", "VAR_KEYS", "ResolvedConfig", "load_config"]

# environment variable -> dotted key
ENV_KEYS: dict[str, str] = {
    "COLI_ARCH": "build.arch",
    "COLI_OS": "build.os",
    "COLI_PROFILE": "build.profile",
    "COLI_BUILD_DIR": "build.build_dir",
    "COLI_DIST_DIR": "build.dist_dir",
    "HIP_SDK_ROOT": "hip.sdk_root",
    "HIP_BIN_DIR": "hip.bin_dir",
    "HIP_INCLUDE_DIR": "hip.include_dir",
    "HIP_LIB_DIR": "hip.lib_dir",
    "HIP_DEVICE_LIB_PATH": "hip.device_lib_dir",
    "HIPCC": "hip.compiler",
    "CUDA_PATH": "cuda.home",
    "CUDA_HOME": "cuda.home",  # after CUDA_PATH: CUDA_HOME wins when both are set
    "NVCC": "cuda.compiler",
    "COLI_CACHE": "cache.launcher",
    "COLI_CACHE_DIR": "cache.dir",
    "COLI_CACHE_REMOTE": "cache.remote",
}

# doit command-line variable -> dotted key (`config=` picks the file itself)
VAR_KEYS: dict[str, str] = {
    "arch": "build.arch",
    "os": "build.os",
    "profile": "build.profile",
    "build_dir": "build.build_dir",
    "dist_dir": "build.dist_dir",
    "cache": "cache.launcher",
    "entry": "release.only",
    "lock": "release.lock_mode",
}

_LIST_KEYS = {"build.arch", "release.only"}


@dataclass(frozen=True)
class ResolvedConfig:
    config: Config
    origins: Mapping[str, str]  # dotted key -> "default", "file <path>", "env NAME", "var name="
    file: Path

    def origin(self, key: str) -> str:
        """Where `key` was set; a key inside a table set as a whole (profiles) inherits its origin."""
        parts = key.split(".")
        for n in range(len(parts), 0, -1):
            found = self.origins.get(".".join(parts[:n]))
            if found:
                return found
        return "default"

    def folders(self, root: Path) -> tuple[Path, Path]:
        """The build and dist folders, absolute, for a project at `root`."""
        build = self.config.build
        return (root / build.build_dir).absolute(), (root / build.dist_dir).absolute()


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v and key != "profiles":
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _unflatten(flat: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, v in flat.items():
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = v
    return out


def _split_list(value: str, where: str, key: str) -> tuple[list[str], str | None]:
    """A comma-separated list, and the problem with it: an empty value or an empty item
    is never read as "the default" or skipped, it is named with what to write instead."""
    items = [p.strip() for p in value.split(",")]
    name = key.rsplit(".", 1)[-1]
    example = " (e.g. arch=gfx1030,sm_90)" if key == "build.arch" else ""
    if not value.strip():
        return [], f"{where}: {key}: empty; leave {name}= out for the default, or list the values{example}"
    if "" in items:
        fixed = ",".join(i for i in items if i)
        return [], f"{where}: {key}: an empty item in '{value}'; write {name}={fixed}"
    return items, None


def _list_value(raw: str, where: str, key: str, problems: list[str]) -> list[str]:
    items, problem = _split_list(raw, where, key)
    if problem:
        problems.append(problem)
    return items


def _where(origins: Mapping[str, str], dotted: str) -> str:
    """The origin of `dotted`, else of a key below it, else of its parent."""
    found = origins.get(dotted) or next((o for k, o in origins.items() if k.startswith(dotted + ".")), None)
    parts = dotted.split(".")
    while not found and len(parts) > 1:
        parts.pop()
        found = origins.get(".".join(parts))
    return found or "default"


def _describe(err: Mapping[str, Any], origins: Mapping[str, str]) -> str:
    loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and "[" in p))
    return describe_error(err, Config, _where(origins, ".".join(str(p) for p in loc)))


def _release_alone(data: Any) -> ReleaseSection | None:
    """The [release] table validated on its own, so its matrix is checked even when another table is wrong."""
    try:
        return ReleaseSection.model_validate(data) if isinstance(data, dict) else None
    except ValidationError:
        return None


def load_config(
    path: Path,
    env: Mapping[str, str],
    variables: Mapping[str, str],
) -> ResolvedConfig:
    """Read `path`, overlay the environment and doit variables, validate once.

    All problems are reported together, each with its dotted key and origin.
    """
    problems: list[str] = []
    origins: dict[str, str] = {}
    flat: dict[str, Any] = {}

    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path}: cannot read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: not valid TOML: {exc}") from None
    for key, value in _flatten(data).items():
        flat[key] = value
        origins[key] = f"file {path}"

    for name, key in ENV_KEYS.items():
        if name in env:
            raw = env[name]
            origins[key] = f"env {name}"
            flat[key] = _list_value(raw, origins[key], key, problems) if key in _LIST_KEYS else raw

    for name, raw in variables.items():
        if name == "config":
            continue
        if name not in VAR_KEYS:
            allowed = ["config", *VAR_KEYS]
            close = difflib.get_close_matches(name, allowed, n=1)
            hint = f"; did you mean '{close[0]}='?" if close else ""
            problems.append(f"unknown variable '{name}='{hint} (allowed: {', '.join(a + '=' for a in allowed)})")
            continue
        key = VAR_KEYS[name]
        origins[key] = f"var {name}="
        flat[key] = _list_value(raw, origins[key], key, problems) if key in _LIST_KEYS else raw

    config: Config | None = None
    try:
        config = Config.model_validate(_unflatten(flat))
    except ValidationError as exc:
        problems += [_describe(e, origins) for e in exc.errors()]
    if config is not None and config.build.profile not in config.profiles:
        where = origins.get("build.profile", "default")
        problems.append(
            f"{where}: build.profile: no profile '{config.build.profile}' "
            f"(allowed: {', '.join(sorted(config.profiles))})"
        )
    release = config.release if config is not None else _release_alone(_unflatten(flat).get("release"))
    if release is not None:
        from .release import release_problems

        problems += [f"{_where(origins, key)}: {key}: {msg}" for key, msg in release_problems(release)]
    if problems or config is None:
        raise ConfigError(problems)
    return ResolvedConfig(config=config, origins=origins, file=path)
