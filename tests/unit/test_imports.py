"""The toolchain package's modules import one another without a cycle (imports
inside functions included: they are where cycles hide), and the CI cache key
(`python -m toolchain.fingerprint`) loads without doit or the task graph."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

PACKAGE = ROOT / "toolchain"


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    here = _module(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join([*base, *(node.module.split(".") if node.module else [])])
            if target.startswith("toolchain"):
                out.add(target)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("toolchain"))
    return out


def test_no_import_cycles() -> None:
    modules = {_module(p): p for p in PACKAGE.rglob("*.py")}
    graph = {m: {i for i in _imports(p) if i in modules and i != m} for m, p in modules.items()}
    done: set[str] = set()

    def visit(m: str, stack: list[str]) -> None:
        if m in stack:
            cycle = [*stack[stack.index(m) :], m]
            raise AssertionError("import cycle: " + " -> ".join(cycle))
        if m in done:
            return
        for n in sorted(graph[m]):
            if not (m.startswith(n + ".") or n == "toolchain"):  # a module importing its own package
                visit(n, [*stack, m])
        done.add(m)

    for m in sorted(graph):
        visit(m, [])


def test_the_fingerprint_loads_without_doit() -> None:
    code = (
        "import sys, toolchain.fingerprint\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'doit' or m == 'toolchain.tasks'))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
