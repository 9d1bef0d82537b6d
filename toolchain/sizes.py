"""What a package weighs: its backend's device code per arch and kind (the figures
build-info.json, the release manifest and the terminal table give), and its
archive against the size budget in config ([package])."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .inspect import read_binary
from .inspect.bundles import CodeObject, code_objects
from .table import aligned

__all__ = ["budget_problem", "device_code", "human_size", "size_table"]


def device_code(lib: Path) -> list[CodeObject]:
    """The device code in a backend library (none for the reference backend)."""
    return code_objects(read_binary(lib).sections)


def human_size(n: int) -> str:
    """GiB, MiB or KiB with one decimal, or bytes."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def size_table(name: str, objects: Sequence[CodeObject], package_bytes: int, budget: int) -> str:
    """The package's size against its budget, then its device code, a row an arch and kind."""
    lines = [f"package {name}: {human_size(package_bytes)} of its {human_size(budget)} budget"]
    if objects:
        rows = [["arch", "kind", "size", "compressed"]]
        rows += [[c.arch, c.kind, human_size(c.bytes), human_size(c.compressed_bytes)] for c in objects]
        lines += ["  " + line for line in aligned(rows, rule=True)]
    return "\n".join(lines)


def budget_problem(
    name: str, objects: Sequence[CodeObject], package_bytes: int, budget: int, setting: str
) -> str | None:
    """One line when the package is over its budget: the figures, its largest device code, the fix."""
    if package_bytes <= budget:
        return None
    big = sorted(objects, key=lambda c: -c.compressed_bytes)[:4]
    parts = ", ".join(f"{c.arch} {c.kind} {human_size(c.compressed_bytes)}" for c in big)
    code = f"; its device code compressed: {parts}{' ...' if len(objects) > len(big) else ''}" if big else ""
    return (
        f"package {name} is {package_bytes} bytes ({human_size(package_bytes)}), over its budget of {budget} "
        f"({human_size(budget)}; config {setting}){code}: split its arches into release groups, or raise the budget"
    )
