"""Shared fixtures: project copies for real builds, doit runs, and the CI rule
that an unexpected skip fails the run (COLI_FAIL_ON_SKIP=1, set by nox)."""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
COPY_IGNORE = shutil.ignore_patterns(
    "build", "dist", ".git", ".nox", ".venv", "__pycache__", "*.egg-info", ".*_cache", ".cache", "node_modules"
)


def copy_project(dest: Path) -> Path:
    """A copy of the sources a build needs, as a fresh clone would have them."""
    shutil.copytree(ROOT, dest, ignore=COPY_IGNORE)
    return dest


def run_doit(
    cwd: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {})}
    full_env.pop("COLI_ARCH", None)
    return subprocess.run(
        [sys.executable, "-m", "doit", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
    )


def executed(proc: subprocess.CompletedProcess[str]) -> list[str]:
    """Names of the tasks whose actions ran ('.  name' lines)."""
    return [line[3:].strip() for line in proc.stdout.splitlines() if line.startswith(".  ")]


def bench_module(name: str) -> ModuleType:
    """bench/<name>.py imported as a module (bench/ is scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def verify_check(root: Path, key: str, name: str) -> dict[str, object]:
    """Check `name` of a build's verify report for `key` (e.g. "cuda-sm_90"), as verify wrote it."""
    report = json.loads((root / "build/linux-x86_64/reports" / f"verify-{key}.json").read_text())
    (check,) = [c for c in report["checks"] if c["name"] == name]
    return dict(check)


# C11, warning-free, as the project's own builds are
WARN = ["-std=c11", "-Wall", "-Wextra", "-Werror"]


def need_tool(*names: str) -> None:
    missing = [n for n in names if shutil.which(n) is None]
    if missing:
        pytest.skip(f"missing tool(s): {', '.join(missing)} (scripts/setup installs them)")


@pytest.fixture(scope="session")
def built_project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One full default `doit build` in a project copy whose path has a space, shared by the build tests."""
    need_tool("gcc", "clang++-19", "nvcc")
    root = copy_project(tmp_path_factory.mktemp("built") / "coli project")
    proc = run_doit(root, "build")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    yield root


# The modules that take longest, longest first; the rest follow in collection order. pytest-xdist
# hands modules out in this order, so the long builds start at once and the short modules fill in
# beside them (longest processing time first); by xdist's own order, most tests first, these
# single-test builds came last and ran alone on one core at the end.
LONGEST_FIRST = tuple(
    f"integration/test_{name}.py" for name in ("release", "build", "release_interrupt", "model", "shared_cache")
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    tests = ROOT / "tests"
    # list.sort is stable: each module keeps its tests' order
    items.sort(key=lambda item: rank.get(item.path.relative_to(tests).as_posix(), len(rank)))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.environ.get("COLI_FAIL_ON_SKIP") != "1":
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter else []
    if skipped and reporter is not None:
        reporter.write_line(f"COLI_FAIL_ON_SKIP=1: {len(skipped)} test(s) skipped; CI must run every test", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def gen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ABI renderings (headers, .def, version script), as codegen writes them."""
    from toolchain.abi import load_abi, render_abi

    out = tmp_path_factory.mktemp("gen")
    for name, text in render_abi(load_abi(ROOT / "kernels" / "abi.toml")).items():
        (out / name).write_text(text)
    return out


def sbom_errors(data: bytes) -> object:
    """What CycloneDX 1.6's JSON schema finds wrong with an SBOM (None: nothing), by the
    library's own strict validator."""
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    return JsonStrictValidator(SchemaVersion.V1_6).validate_str(data.decode())


def provenance_errors(text: str) -> list[str]:
    """What the in-toto Statement / SLSA v1 schema (tests/fixtures/schemas) finds wrong."""
    import jsonschema  # type: ignore[import-untyped]  # no stubs in the dev set

    schema = json.loads((ROOT / "tests/fixtures/schemas/in-toto-statement-slsa-provenance-v1.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    return [f"{'/'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(json.loads(text))]


def compile_ok(argv: list[str], cwd: Path | None = None) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=cwd)
    assert proc.returncode == 0, f"{' '.join(argv)}\n{proc.stderr}"


def terminal_lines(stderr: str) -> list[str]:
    """What a terminal shows after each carriage return's segment of a progress line: the
    segment overwrites from the line's start and leaves the characters past its end."""
    shown, screen = [], ""
    for segment in stderr.split("\r")[1:]:
        screen = segment + screen[len(segment) :]
        shown.append(screen.rstrip())
    return shown


def refusal_line(exe: Path, args: list[str]) -> str:
    """The one line a bench probe refuses bad settings with (exit 2, nothing on stdout)."""
    proc = subprocess.run([str(exe), *args], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    return line


def build_bench_probe(name: str, out_dir: Path, *extra: str) -> Path:
    """bench/<name>.c (with `extra` sources and flags) built warning-free, as its header says."""
    exe = out_dir / name
    compile_ok(["gcc", *WARN, "-O2", "-pthread",
                str(ROOT / f"bench/{name}.c"), *extra, "-o", str(exe)])  # fmt: skip
    return exe


# -O1, as sanitizer users build: -O0 runs the engine several times slower and finds nothing more
SANITIZE = ["-O1", "-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-g"]


def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This run's temporary folder, shared by pytest-xdist's workers (each has its own
    below it); without xdist, the run's own."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """run_folder's `name`, filled by `build` once a run: the first worker to ask builds it under
    a lock, and the others wait for it and find it."""
    shared = run_folder(tmp_path_factory)
    out = shared / name
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "built").exists():
            out.mkdir(exist_ok=True)
            build(out)
            (out / "built").touch()  # last: a worker that failed half-way leaves no "built"
    return out


# the CPU kernels every sanitized build links
CPU_KERNELS = ("kernels/cpu_ops.c", "kernels/cpu_model_ops.c")


def _object(source: str) -> str:
    return Path(source).with_suffix(".o").name


@pytest.fixture(scope="session")
def asan_kernels(gen_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """CPU_KERNELS as ASan/UBSan objects, position-independent so that the host, the reference
    backend and the C checks all link them, compiled once a run: cpu_ops.c takes a core several
    seconds to compile so, and six builds link it."""
    need_tool("gcc")

    def build(out: Path) -> None:
        inc = [f"-I{gen_dir}", f"-I{ROOT / 'kernels'}"]
        for src in CPU_KERNELS:
            compile_ok(["gcc", *WARN, *SANITIZE, "-fPIC", *inc, "-c", str(ROOT / src), "-o", str(out / _object(src))])

    out = built_once(tmp_path_factory, "asan-kernels", build)
    return [str(out / _object(src)) for src in CPU_KERNELS]


def without_cpu_kernels(sources: tuple[str, ...]) -> list[str]:
    """`sources` (paths from the repository's root) less CPU_KERNELS, as absolute paths."""
    return [str(ROOT / s) for s in sources if s not in CPU_KERNELS]


@pytest.fixture(scope="session")
def sanitized(gen_dir: Path, asan_kernels: list[str], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The host and the reference backend built with AddressSanitizer and UndefinedBehaviorSanitizer,
    once a run (two modules ask)."""
    from toolchain import commands

    need_tool("gcc")

    def build(out: Path) -> None:
        inc = [f"-I{gen_dir}", f"-I{ROOT / 'kernels'}", f"-I{ROOT / 'engine'}"]
        host = without_cpu_kernels(commands.HOST_SOURCES)
        compile_ok(["gcc", *WARN, *SANITIZE, *inc, *host, *asan_kernels, "-o", str(out / "coli"), "-lm", "-lpthread"])
        ref = without_cpu_kernels(commands.REF_SOURCES)
        compile_ok(["gcc", *WARN, *SANITIZE, "-shared", "-fPIC", *inc, *ref, *asan_kernels,
                    "-o", str(out / "libcoli_ref.so"), "-lm"])  # fmt: skip

    out = built_once(tmp_path_factory, "asan", build)
    return out / "coli", out / "libcoli_ref.so"


def run_host(
    host: Path, *args: str, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    # allocator_may_return_null: the selftest asks for 512 TiB on purpose and expects a NULL
    asan = "detect_leaks=1:allocator_may_return_null=1"
    base = {"ASAN_OPTIONS": asan, "UBSAN_OPTIONS": "print_stacktrace=1", "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [str(host), *args], capture_output=True, text=True, env={**base, **(env or {})}, timeout=timeout
    )
