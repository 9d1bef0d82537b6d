"""Known GPU architectures (data/arches.toml) and how a requested arch maps to an API."""

from __future__ import annotations

import difflib
import itertools
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .toml_model import load_toml_model

__all__ = [
    "Api", "ArchTable", "SdkRange", "api_of", "arch_key", "arch_table", "base_arch", "canonical_target",
    "version_tuple",
]  # fmt: skip

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


Version = Annotated[str, Field(pattern=r"^[0-9]+(\.[0-9]+)*$")]


class SdkRange(BaseModel):
    """The SDK releases that build one arch: since <= version, and version <= until when set."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    since: Version
    until: Version | None = None

    def admits(self, version: str) -> bool:
        v = version_tuple(version)[:2]
        return version_tuple(self.since) <= v and (self.until is None or v <= version_tuple(self.until))

    def __str__(self) -> str:
        return f"{self.since} to {self.until}" if self.until else f"{self.since} or newer"


class _SdkSpans(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    family: dict[str, SdkRange] = {}
    arch: dict[str, SdkRange] = {}


class _ApiArches(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    families: dict[str, tuple[str, ...]]
    sdk: _SdkSpans = _SdkSpans()
    features: dict[str, tuple[str, ...]] = {}  # AMD target-id features an arch takes


def base_arch(arch: str) -> str:
    """gfx90a:xnack- -> gfx90a: the processor of an AMD target id (any other arch as it is)."""
    return arch.split(":", 1)[0]


def arch_key(arches: tuple[str, ...]) -> str:
    """Arches as they go into file, task and release-entry names: a target id's ':'
    (which Windows file names cannot hold) as '-', gfx90a:xnack- -> gfx90a-xnack-."""
    return "_".join(a.replace(":", "-") for a in arches)


def canonical_target(arch: str) -> str:
    """An AMD target id with its features in clang's order (sorted): gfx942:xnack-:sramecc+
    and gfx942:sramecc+:xnack- are one target, written the second way in offload bundles."""
    base, *features = arch.split(":")
    return ":".join([base, *sorted(features)])


class _ArchesFile(BaseModel):
    """toolchain/data/arches.toml: each API's families and the SDK releases that build them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    hip: _ApiArches
    cuda: _ApiArches

    @model_validator(mode="after")
    def _consistent(self) -> _ArchesFile:
        seen: set[str] = set()
        for api in ("hip", "cuda"):
            table: _ApiArches = getattr(self, api)
            for name in sorted(set(table.sdk.family) - set(table.families)):
                raise ValueError(f"{api}.sdk.family.{name} is not a family")
            for name, members in table.families.items():
                if name not in table.sdk.family:
                    raise ValueError(f"{api}.sdk.family has no range for {name}")
                for arch in members:
                    if arch in seen:
                        raise ValueError(f"{arch} is listed twice")
                    seen.add(arch)
            for arch in table.sdk.arch:
                if not any(arch in m for m in table.families.values()):
                    raise ValueError(f"{api}.sdk.arch.{arch} is in no {api} family")
            for arch in table.features:
                if not any(arch in m for m in table.families.values()):
                    raise ValueError(f"{api}.features.{arch} is in no {api} family")
        return self


@dataclass(frozen=True)
class ArchTable:
    hip: dict[str, tuple[str, ...]]
    cuda: dict[str, tuple[str, ...]]
    sdk: dict[str, SdkRange]  # every known GPU arch -> the SDK releases that build it
    features: dict[str, tuple[str, ...]] = field(default_factory=dict)  # gfx arch -> its target-id features

    @property
    def known(self) -> tuple[str, ...]:
        """Every accepted word: cpu, native (the GPUs of this machine, via the SDK's arch tool), the arches."""
        return (
            "cpu",
            "native",
            *(a for f in self.hip.values() for a in f),
            *(a for f in self.cuda.values() for a in f),
        )

    def members(self, family: str) -> tuple[str, ...] | None:
        return self.hip.get(family) or self.cuda.get(family)

    def sdk_problem(self, arch: str, api: str, version: str) -> str | None:
        """None when SDK `version` builds `arch`; else why not, from the data."""
        span = self.sdk.get(base_arch(arch))
        if span is None or span.admits(version):
            return None
        sdk = "HIP SDK" if api == "hip" else "CUDA"
        return f"{arch} needs {sdk} {span}, not {version}"

    def unknown(self, arches: tuple[str, ...]) -> str | None:
        """None when every arch is known; else one line naming each unknown one and what is allowed."""
        bad, features = [], []
        for arch in arches:
            base, _, rest = arch.partition(":")
            if base not in self.known:
                close = difflib.get_close_matches(base, (*self.known, *self.hip, *self.cuda), n=2, cutoff=0.6)
                bad.append(f"'{arch}'" + (f" (did you mean {' or '.join(close)}?)" if close else ""))
            elif rest:
                problem = self._feature_problem(arch, base, rest.split(":"))
                if problem:
                    features.append(problem)
        if bad:
            return (
                f"unknown arch {', '.join(bad)}; allowed: cpu, gfx* of {', '.join(self.hip)}, "
                f"sm_* of {', '.join(self.cuda)}, or a family's name (toolchain/data/arches.toml lists them)"
            )
        return "; ".join(features) or None

    def _feature_problem(self, arch: str, base: str, written: list[str]) -> str | None:
        """What is wrong with the features of target id `arch`, in words, or None."""
        allowed = self.features.get(base, ())
        if not allowed:
            return f"'{arch}': {base} takes no target features (write {base})"
        names = [w[:-1] for w in written if w[-1:] in ("+", "-")]
        forms = ", ".join(f"{f}+ or {f}-" for f in allowed)
        if len(names) != len(written) or any(n not in allowed for n in names):
            return f"'{arch}': {base} takes {forms}"
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            return f"'{arch}': {', '.join(twice)} given twice"
        return None


@cache
def arch_table() -> ArchTable:
    text = resources.files("toolchain.data").joinpath("arches.toml").read_text(encoding="utf-8")
    return _table(load_toml_model(text, _ArchesFile, "toolchain/data/arches.toml"))


def _table(raw: _ArchesFile) -> ArchTable:
    """The families of each API, and every arch's SDK range (its own, else its family's)."""
    sdk: dict[str, SdkRange] = {}
    for table in (raw.hip, raw.cuda):
        for name, members in table.families.items():
            for arch in members:
                sdk[arch] = table.sdk.arch.get(arch, table.sdk.family[name])
    return ArchTable(hip=dict(raw.hip.families), cuda=dict(raw.cuda.families), sdk=sdk, features=dict(raw.hip.features))


def api_of(arch: str) -> Api:
    if arch == "cpu":
        return "ref"
    if arch.startswith("gfx") or arch == "native":
        return "hip"
    return "cuda"
