"""Proving what was built: every artifact against the ABI, its allowlist, the
build machine's paths, and the requested arches. One report per artifact."""

from __future__ import annotations

import fnmatch
import json
import re
import tomllib
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path

from .arches import canonical_target
from .inspect import HIP_PE_SECTION, cuda_fatbin_arches, parse_offload_bundle, read_binary
from .table import aligned

__all__ = [
    "REPORT_VERSION",
    "Check",
    "Report",
    "allowlist",
    "format_table",
    "hip_runtime_names",
    "is_hip_runtime",
    "runtime_agreement",
    "verify_artifact",
]

REPORT_VERSION = 1


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class Report:
    artifact: str
    kind: str  # host, ref, cuda, hip
    format: str  # ELF, PE
    checks: tuple[Check, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def to_json(self) -> str:
        data = {"version": REPORT_VERSION, **asdict(self), "ok": self.ok}
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    def failures(self) -> list[str]:
        return [f"{c.name}: {c.detail}" for c in self.checks if not c.ok]


@cache
def _allowlists() -> dict[str, dict[str, dict[str, list[str]]]]:
    text = resources.files("toolchain.data").joinpath("allowlists.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)


def allowlist(fmt: str, kind: str) -> tuple[str, ...]:
    section = _allowlists()[fmt.lower()][kind]
    return tuple(section["needed" if fmt == "ELF" else "imports"])


def _outside(names: Iterable[str], patterns: tuple[str, ...], fold: bool) -> list[str]:
    def norm(s: str) -> str:
        return s.lower() if fold else s

    return sorted(n for n in names if not any(fnmatch.fnmatchcase(norm(n), norm(p)) for p in patterns))


_WINDOWS_PATH = re.compile(r"^(?:[A-Za-z]:|\\\\)[\\/]?")


def _spellings(text: str) -> tuple[set[str], bool]:
    """How a binary may hold `text`, and whether to look with case folded: a Windows path
    with either separator and in any case; any other path as it is."""
    if not _WINDOWS_PATH.match(text):
        return {text}, False
    low = text.lower()
    return {low.replace("/", "\\"), low.replace("\\", "/")}, True


def _leaks(path: Path, forbidden: Iterable[str]) -> list[str]:
    data = path.read_bytes()
    folded = data.lower()  # ASCII letters only, in UTF-8 and UTF-16 alike
    found = []
    for text in sorted(t for t in set(forbidden) if t):
        spellings, fold = _spellings(text)
        haystack = folded if fold else data
        if any(s.encode(enc) in haystack for s in spellings for enc in ("utf-8", "utf-16-le")):
            found.append(text)
    return found


def _exports_check(exports: Iterable[str], expected: tuple[str, ...]) -> Check:
    have, want = set(exports), set(expected)
    extra, missing = sorted(have - want), sorted(want - have)
    if not extra and not missing:
        return Check("exports", True, f"exactly the {len(want)} ABI functions")
    parts = []
    if missing:
        parts.append(f"missing {', '.join(missing)}")
    if extra:
        parts.append(f"unexpected {', '.join(extra[:10])}{' ...' if len(extra) > 10 else ''}")
    return Check("exports", False, "; ".join(parts))


def _device_check(kind: str, sections: dict[str, bytes], arches: tuple[str, ...]) -> Check:
    if kind == "hip":
        name = ".hip_fatbin" if ".hip_fatbin" in sections else HIP_PE_SECTION
        data = sections.get(name)
        if data is None:
            return Check("device code", False, f"no .hip_fatbin (ELF) or {HIP_PE_SECTION} (PE) section")
        try:
            bundles = parse_offload_bundle(data)
        except ValueError as exc:
            return Check("device code", False, f"{name}: {exc}")
        # full target ids, features in clang's order: gfx90a:xnack- is not gfx90a
        targets = {canonical_target(t) for b in bundles for t in b.gfx_targets}
        missing = sorted({canonical_target(a) for a in arches} - targets)
        packed = " (compressed)" if bundles and all(b.compressed for b in bundles) else ""
        detail = f"{name}{packed} lists {', '.join(sorted(targets)) or 'nothing'}"
        return Check("device code", not missing, detail + (f"; missing {', '.join(missing)}" if missing else ""))
    data = sections.get(".nv_fatbin")
    if data is None:
        return Check("device code", False, "no .nv_fatbin section")
    try:
        found = cuda_fatbin_arches(data)
    except ValueError as exc:
        return Check("device code", False, f".nv_fatbin: {exc}")
    missing = sorted(a for a in arches if "sass" not in found.get(a, set()))
    detail = ", ".join(f"{a} ({'+'.join(sorted(k))})" for a, k in sorted(found.items())) or "nothing"
    return Check(
        "device code",
        not missing,
        f".nv_fatbin holds {detail}" + (f"; no SASS for {', '.join(missing)}" if missing else ""),
    )


_HIP_RUNTIME = re.compile(r"^(libamdhip64\.so(\.[0-9]+)*|amdhip64(_[0-9]+)?\.dll)$", re.IGNORECASE)
# the name as the host's binding holds it: a C string literal
_HIP_RUNTIME_IN_BINARY = re.compile(
    rb"(?<![A-Za-z0-9_.])(libamdhip64\.so(?:\.[0-9]+)*|amdhip64(?:_[0-9]+)?\.dll)\x00", re.I
)


def is_hip_runtime(name: str) -> bool:
    """The HIP runtime under any version's name (engine/imports.c's rule)."""
    return bool(_HIP_RUNTIME.match(name)) and (not name.lower().startswith("lib") or name.startswith("libamdhip64.so"))


def hip_runtime_names(host: Path) -> list[str]:
    """The HIP runtime names a host executable holds (the one its binding looks for)."""
    return sorted({m.group(1).decode() for m in _HIP_RUNTIME_IN_BINARY.finditer(host.read_bytes())})


def runtime_agreement(host: Path, backend: Path) -> Check:
    """The HIP runtime the backend imports is the one the host binds: a package whose host
    and backend come from different HIP SDKs could never start its GPU tier."""
    imports = sorted(n for n in read_binary(backend).imports if is_hip_runtime(n))
    binds = hip_runtime_names(host)
    ok = len(imports) == 1 and [n.lower() for n in binds] == [imports[0].lower()]
    detail = f"host binds {', '.join(binds) or 'no HIP runtime'}; backend imports {', '.join(imports) or 'none'}"
    return Check("hip runtime", ok, detail)


def verify_artifact(
    path: Path, kind: str, abi_exports: tuple[str, ...], arches: tuple[str, ...], forbidden_paths: Iterable[str]
) -> Report:
    """kind: host, ref, cuda or hip; the format (ELF or PE) is read from the file.

    Backends must export exactly the ABI; every artifact's imports must match its
    allowlist for that format.
    """
    try:
        info = read_binary(path)
    except (OSError, ValueError) as exc:
        return Report(str(path), kind, "unknown", (Check("format", False, str(exc)),))
    checks = [Check("format", info.target_ok, info.target)]
    if kind != "host":
        checks.append(_exports_check(info.exports, abi_exports))
    pe = info.format == "PE"
    bad = _outside(info.imports, allowlist(info.format, kind), fold=pe)
    label = "imports" if pe else "DT_NEEDED"
    checks.append(
        Check(
            "imports",
            not bad,
            f"outside the allowlist: {', '.join(bad)}" if bad else f"{label} {', '.join(info.imports) or 'none'}",
        )
    )
    leaks = _leaks(path, forbidden_paths)
    checks.append(Check("paths", not leaks, f"embeds {', '.join(leaks)}" if leaks else "no build-machine path"))
    if kind in ("hip", "cuda"):
        checks.append(_device_check(kind, info.sections, arches))
    return Report(str(path), kind, info.format, tuple(checks))


def format_table(reports: Iterable[Report]) -> str:
    rows = [("artifact", "check", "result", "detail")]
    for r in reports:
        for c in r.checks:
            rows.append((Path(r.artifact).name, c.name, "ok" if c.ok else "FAIL", c.detail))
    return "\n".join(aligned(rows, rule=True))
