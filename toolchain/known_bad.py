"""Toolchain combinations known to break (toolchain/data/known_bad.toml): each row's
condition against what a build plan would use, so that a build meeting one stops
before it compiles anything, with the row's message, its upstream issue and its fix."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from .arches import base_arch, version_tuple
from .plan import BackendSpec, Plan

__all__ = ["KnownBad", "Facts", "facts_of", "known_bad", "matching_rows"]

VERSION_KEYS = ("hip", "msvc", "nvcc", "host")


@dataclass(frozen=True)
class KnownBad:
    id: str
    when: Mapping[str, Any]
    issue: str
    message: str
    fix: str

    def line(self, subject: str) -> str:
        return f"{subject}: known to break ({self.id}): {self.message}; fix: {self.fix}; see {self.issue}"


@dataclass(frozen=True)
class Facts:
    """What a backend build would use: its OS, API, arches and toolchain versions."""

    os: str
    api: str
    arches: tuple[str, ...]
    versions: Mapping[str, str]


@cache
def _rows() -> tuple[KnownBad, ...]:
    import tomllib

    data = tomllib.loads(resources.files("toolchain.data").joinpath("known_bad.toml").read_text(encoding="utf-8"))
    return tuple(KnownBad(**row) for row in data["row"])


def _in_range(version: str, spec: str) -> bool:
    have = version_tuple(version)
    if not have:
        return False
    for part in spec.split(","):
        part = part.strip()
        op = next(o for o in (">=", "<=", "==", ">", "<", "") if part.startswith(o))
        want = version_tuple(part[len(op) :])
        mine = have[: len(want)]  # "7.1.52802" against "<=7.1" compares 7.1
        ok = {
            ">=": mine >= want,
            "<=": mine <= want,
            ">": mine > want,
            "<": mine < want,
            "==": mine == want,
            "": mine == want,
        }[op]
        if not ok:
            return False
    return True


def matching_rows(facts: Facts, rows: Sequence[KnownBad] | None = None) -> list[KnownBad]:
    """The rows whose every condition holds for `facts`."""
    out = []
    for row in _rows() if rows is None else rows:
        w = row.when
        if ("os" in w and w["os"] != facts.os) or ("api" in w and w["api"] != facts.api):
            continue
        if "arches" in w and not {base_arch(a) for a in facts.arches} & set(w["arches"]):
            continue
        if any(k in w and not _in_range(facts.versions.get(k, ""), w[k]) for k in VERSION_KEYS):
            continue
        out.append(row)
    return out


def facts_of(plan: Plan, spec: BackendSpec) -> Facts:
    versions = {"host": plan.fingerprint("host").get("version", "")}
    if spec.api in ("hip", "cuda"):
        fp = plan.fingerprint(spec.api)
        versions["hip" if spec.api == "hip" else "nvcc"] = fp.get("version", "")
        if "toolset" in fp:  # a Windows GPU build: the pinned MSVC
            versions["msvc"] = fp["toolset"]
    return Facts("windows" if plan.windows else "linux", spec.api, tuple(spec.arches), versions)


def known_bad(plans: Sequence[Plan]) -> list[str]:
    """One line for each backend of `plans` that meets a known-bad row."""
    return [row.line(f"{plan.platform}-{spec.key}") for plan in plans for spec in plan.backends
            for row in matching_rows(facts_of(plan, spec))]  # fmt: skip
