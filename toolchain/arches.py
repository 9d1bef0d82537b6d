"""Known GPU architectures (data/arches.toml) and how a requested arch maps to an API."""

from __future__ import annotations

import difflib
import itertools
import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, Literal

__all__ = ["Api", "ArchTable", "SdkRange", "api_of", "arch_table", "version_tuple"]

Api = Literal["ref", "hip", "cuda"]


def version_tuple(text: str) -> tuple[int, ...]:
    """'6.4' -> (6, 4); '5.2.21153' -> (5, 2, 21153); stops at the first non-number."""
    out: list[int] = []
    for part in text.split("."):
        digits = "".join(itertools.takewhile(str.isdigit, part))
        if not digits:
            break
        out.append(int(digits))
        if digits != part:
            break
    return tuple(out)


@dataclass(frozen=True)
class SdkRange:
    """The SDK releases that build one arch: since <= version, and version <= until when set."""

    since: str
    until: str | None = None

    def admits(self, version: str) -> bool:
        v = version_tuple(version)[:2]
        return version_tuple(self.since) <= v and (self.until is None or v <= version_tuple(self.until))

    def __str__(self) -> str:
        return f"{self.since} to {self.until}" if self.until else f"{self.since} or newer"


@dataclass(frozen=True)
class ArchTable:
    hip: dict[str, tuple[str, ...]]
    cuda: dict[str, tuple[str, ...]]
    sdk: dict[str, SdkRange]  # every known GPU arch -> the SDK releases that build it

    @property
    def known(self) -> tuple[str, ...]:
        """Every accepted word: cpu, native (the GPUs of this machine, via the SDK's arch tool), the arches."""
        return (
            "cpu",
            "native",
            *(a for f in self.hip.values() for a in f),
            *(a for f in self.cuda.values() for a in f),
        )

    def family_of(self, arch: str) -> str | None:
        for fams in (self.hip, self.cuda):
            for name, members in fams.items():
                if arch in members:
                    return name
        return None

    def members(self, family: str) -> tuple[str, ...] | None:
        return self.hip.get(family) or self.cuda.get(family)

    def sdk_problem(self, arch: str, api: str, version: str) -> str | None:
        """None when SDK `version` builds `arch`; else why not, from the data."""
        span = self.sdk.get(arch)
        if span is None or span.admits(version):
            return None
        sdk = "HIP SDK" if api == "hip" else "CUDA"
        return f"{arch} needs {sdk} {span}, not {version}"

    def unknown(self, arches: tuple[str, ...]) -> str | None:
        """None when every arch is known; else one line naming each unknown one and what is allowed."""
        bad = []
        for arch in arches:
            if arch not in self.known:
                close = difflib.get_close_matches(arch, self.known, n=2, cutoff=0.6)
                bad.append(f"'{arch}'" + (f" (did you mean {' or '.join(close)}?)" if close else ""))
        if not bad:
            return None
        return (
            f"unknown arch {', '.join(bad)}; allowed: cpu, gfx* of {', '.join(self.hip)}, "
            f"sm_* of {', '.join(self.cuda)} (toolchain/data/arches.toml lists them)"
        )


@cache
def arch_table() -> ArchTable:
    raw = tomllib.loads(resources.files("toolchain.data").joinpath("arches.toml").read_text(encoding="utf-8"))
    return _table(raw)


def _table(raw: dict[str, Any]) -> ArchTable:
    """Build and check the table: no arch twice, every family and arch given an SDK range."""
    families = {api: {k: tuple(v) for k, v in raw[api]["families"].items()} for api in ("hip", "cuda")}
    sdk: dict[str, SdkRange] = {}
    for api, fams in families.items():
        spans = raw[api].get("sdk", {})
        for name in set(spans.get("family", {})) - set(fams):
            raise ValueError(f"arches.toml: {api}.sdk.family.{name} is not a family")
        for name, members in fams.items():
            if name not in spans.get("family", {}):
                raise ValueError(f"arches.toml: {api}.sdk.family has no range for {name}")
            for arch in members:
                if arch in sdk:
                    raise ValueError(f"arches.toml lists {arch} twice")
                sdk[arch] = SdkRange(**spans["family"][name])
        for arch, span in spans.get("arch", {}).items():
            if not any(arch in m for m in fams.values()):
                raise ValueError(f"arches.toml: {api}.sdk.arch.{arch} is in no {api} family")
            sdk[arch] = SdkRange(**span)
    return ArchTable(hip=families["hip"], cuda=families["cuda"], sdk=sdk)


def api_of(arch: str) -> Api:
    if arch == "cpu":
        return "ref"
    if arch.startswith("gfx") or arch == "native":
        return "hip"
    return "cuda"
