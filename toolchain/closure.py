"""A package's dependency closure: every ELF and PE file in it resolves each of its
imports, normal and delay-loaded, to another file of the package or to a library
the system or the GPU driver provides (data/system_libraries.toml). A missing
companion DLL is then a build failure naming the file, the import and who imports
it, not a user's "cannot load" at run time."""

from __future__ import annotations

import fnmatch
import tempfile
import tomllib
from collections.abc import Mapping
from importlib import resources
from pathlib import Path

from .inspect import read_binary

__all__ = ["closure_problems", "runtime_companions", "system_libraries"]


def system_libraries(windows: bool) -> tuple[str, ...]:
    text = resources.files("toolchain.data").joinpath("system_libraries.toml").read_text(encoding="utf-8")
    return tuple(tomllib.loads(text)["windows" if windows else "linux"]["libraries"])


def _is_system(name: str, patterns: tuple[str, ...], windows: bool) -> bool:
    fold = str.lower if windows else str
    return any(fnmatch.fnmatchcase(fold(name), fold(p)) for p in patterns)


def _is_binary(data: bytes) -> bool:
    return data[:4] == b"\x7fELF" or data[:2] == b"MZ"


def closure_problems(members: Mapping[str, bytes], windows: bool) -> list[str]:
    """One line for each import of a package member that nothing in the package or the
    system provides; [] when the package is closed."""
    patterns = system_libraries(windows)
    fold = str.lower if windows else str
    present = {fold(name) for name in members}
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, data in sorted(members.items()):
            if not _is_binary(data):
                continue
            path = Path(tmp) / Path(name).name
            path.write_bytes(data)
            try:
                binary = read_binary(path)
            except ValueError:
                kind = "a PE" if data[:2] == b"MZ" else "an ELF"
                problems.append(f"{name} starts like {kind} file but is not one")
                continue
            delayed = {fold(d) for d in binary.delay_imports}
            for lib in binary.imports:
                if fold(lib) in present or _is_system(lib, patterns, windows):
                    continue
                how = "delay-loads" if fold(lib) in delayed else "imports"
                problems.append(f"{name} {how} {lib}, which is neither in the package nor a system or driver library")
    return problems


def runtime_companions(runtime: Path, windows: bool) -> list[Path]:
    """What a bundled runtime brings along: the libraries it imports, and theirs, that
    sit in its own folder and are not the system's, in the order found."""
    patterns = system_libraries(windows)
    fold = str.lower if windows else str
    found: dict[str, Path] = {}
    queue = [runtime]
    seen = {fold(runtime.name)}
    here = {fold(p.name): p for p in runtime.parent.iterdir()} if runtime.parent.is_dir() else {}
    while queue:
        for lib in read_binary(queue.pop(0)).imports:
            key = fold(lib)
            if key in seen or _is_system(lib, patterns, windows) or key not in here:
                continue
            seen.add(key)
            found[key] = here[key]
            queue.append(here[key])
    return list(found.values())
