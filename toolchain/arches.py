"""Known GPU architectures (data/arches.toml) and how a requested arch maps to an API."""

from __future__ import annotations

import difflib
import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Literal

__all__ = ["Api", "ArchTable", "api_of", "arch_table"]

Api = Literal["ref", "hip", "cuda"]


@dataclass(frozen=True)
class ArchTable:
    hip: dict[str, tuple[str, ...]]
    cuda: dict[str, tuple[str, ...]]

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
    table = ArchTable(
        hip={k: tuple(v) for k, v in raw["hip"]["families"].items()},
        cuda={k: tuple(v) for k, v in raw["cuda"]["families"].items()},
    )
    seen: set[str] = set()
    for arch in table.known:
        if arch in seen:
            raise ValueError(f"arches.toml lists {arch} twice")
        seen.add(arch)
    return table


def api_of(arch: str) -> Api:
    if arch == "cpu":
        return "ref"
    if arch.startswith("gfx") or arch == "native":
        return "hip"
    return "cuda"
