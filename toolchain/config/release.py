"""The release matrix: each target's arch groups expanded into entries, and the
checks that need more than one field (group names, API of each arch, SDK support)."""

from __future__ import annotations

from dataclasses import dataclass

from ..arches import Api, api_of, arch_key, arch_table
from .schema import ReleaseSection

__all__ = ["ReleaseEntry", "release_entries", "release_problems"]


@dataclass(frozen=True)
class ReleaseEntry:
    os: str  # linux | windows
    api: Api
    arches: tuple[str, ...]
    group: str | None  # the group's name when the config named one
    bundle_hip_runtime: bool | None

    @property
    def platform(self) -> str:
        return f"{self.os}-x86_64"

    @property
    def id(self) -> str:
        """Matches BackendSpec.task and the package name's tail."""
        return f"{self.platform}-{self.api}-{arch_key(self.arches)}"


def _resolve(release: ReleaseSection, group: str | tuple[str, ...]) -> tuple[tuple[str, ...] | None, str | None]:
    if not isinstance(group, str):
        return group, None
    if group in release.groups:
        return release.groups[group], None
    members = arch_table().members(group)
    if members is not None:
        return members, None
    named = sorted(release.groups)
    allowed = ", ".join(named) if named else "none"
    return None, f"no group '{group}' (release.groups has {allowed}, or an arch family of toolchain/data/arches.toml)"


def _check_group(release: ReleaseSection, api: str, arches: tuple[str, ...]) -> list[str]:
    table = arch_table()
    problems = []
    unknown = table.unknown(arches)
    if unknown:
        return [unknown]
    if not arches:
        problems.append("an empty group (a release names every arch it ships)")
    if "native" in arches:
        problems.append("native is refused in a release: its arches are named, not the building machine's GPUs")
    wrong = [a for a in arches if a != "native" and api_of(a) != api]
    if wrong:
        want = {"ref": "cpu", "hip": "gfx* arches", "cuda": "sm_* arches"}[api]
        problems.append(f"{', '.join(wrong)} in a {api} target (allowed: {want})")
    if len(set(arches)) != len(arches):
        problems.append(f"an arch listed twice in {list(arches)}")
    version = {str(k): v for k, v in release.sdk.items()}.get(api)
    if version and not wrong and "native" not in arches:
        for arch in arches:
            why = table.sdk_problem(arch, api, version)
            if why:
                problems.append(f"{why} (release.sdk.{api})")
    return problems


def release_problems(release: ReleaseSection) -> list[tuple[str, str]]:
    """(dotted key, message) for every problem of the matrix; empty when it is sound."""
    out: list[tuple[str, str]] = []
    for name, arches in release.groups.items():
        bad = arch_table().unknown(arches)
        if bad:
            out.append((f"release.groups.{name}", bad))
    for target, spec in release.targets.items():
        _, api = target.split("-", 1)
        where = f"release.targets.{target}.groups"
        if not spec.groups and api != "ref":
            out.append((where, f"a {api} target needs at least one arch group"))
        seen: dict[str, int] = {}
        for i, group in enumerate(spec.groups):
            resolved, why = _resolve(release, group)
            if resolved is None:
                out.append((f"{where}.{i}", why or ""))
                continue
            out += [(f"{where}.{i}", p) for p in _check_group(release, api, resolved)]
            for arch in resolved:
                if arch in seen and seen[arch] != i:
                    out.append((f"{where}.{i}", f"{arch} is also in group {seen[arch]}: an arch ships in one package"))
                seen.setdefault(arch, i)
    if not release.targets:
        out.append(("release.targets", "no targets; name at least one of linux-ref, linux-hip, ... windows-cuda"))
    known = {e.id for e in release_entries(release, check=False)}
    for i, entry_id in enumerate(release.only):
        if entry_id not in known:
            out.append((f"release.only.{i}", f"no entry '{entry_id}' (entries: {', '.join(sorted(known))})"))
    return out


def release_entries(release: ReleaseSection, *, check: bool = True) -> list[ReleaseEntry]:
    """Every entry of the matrix in config order (only those in release.only when it is set)."""
    entries = []
    for target, spec in release.targets.items():
        os_name, api = target.split("-", 1)
        groups = spec.groups or ((("cpu",),) if api == "ref" else ())
        for group in groups:
            arches, _ = _resolve(release, group)
            if arches is None:
                continue
            name = group if isinstance(group, str) else None
            entries.append(ReleaseEntry(os_name, api, tuple(arches), name, spec.bundle_hip_runtime))  # type: ignore[arg-type]
    if check and release.only:
        entries = [e for e in entries if e.id in release.only]
    return entries
