"""The host executable itself: the selftest under AddressSanitizer and
UndefinedBehaviorSanitizer, and every way a backend can fail to load."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, compile_ok, run_host

pytestmark = pytest.mark.slow

KERNELS = ROOT / "kernels"


def run(host: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_host(host, *args)


def test_selftest_is_clean_under_sanitizers(sanitized: tuple[Path, Path]) -> None:
    host, ref = sanitized
    proc = run(host, "--backend", str(ref), "--selftest", "--json")
    assert proc.returncode == 0, proc.stderr
    # the selftest's 512 TiB upload makes ASan warn that it returned NULL, as asked
    reports = [x for x in proc.stderr.splitlines() if "Sanitizer" in x or "runtime error" in x]
    assert [x for x in reports if "failed to allocate" not in x] == [], proc.stderr
    result = json.loads(proc.stdout)
    assert result["passed"] is True and result["backend"] == "ref"
    assert result["abi"] == "1.1"
    checks = [c for c in result["checks"] if c["op"] == "matmul"]
    assert len(checks) >= 15 and all(c["ok"] for c in result["checks"])
    shapes = {(c["rows"], c["cols"], c["s"]) for c in checks}
    assert len(checks) == 3 * len(shapes), "every shape is checked in every format"
    assert {c["format"] for c in checks} == {"f32", "int8", "int4"}
    many = [c for c in result["checks"] if c["op"] == "matmul_many"]
    assert [c["s"] for c in many] == [1, 3] and all(sorted(c["formats"]) == ["f32", "int4", "int8"] for c in many)
    bad = result["bad_input"]
    assert len(bad) >= 13 and all(b["ok"] and b["message"] for b in bad)
    assert sum(b["case"].startswith("matmul_many") for b in bad) == 4
    assert result["resident_after_free"] == 0


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        ([], 2, "nothing to do"),
        (["--model", "/x"], 2, "--ids is required"),
        (["--selftest"], 2, "needs --backend"),
        (["--bogus"], 2, "unknown option: --bogus"),
        (["--device", "x", "--selftest"], 2, "--device must be"),
        (["--backend", "relative/lib.so", "--selftest"], 4, "backend must be ref, cuda, hip or an absolute path"),
        (["--backend", "/nonexistent/libcoli_ref.so", "--selftest"], 4, "does not exist"),
        (["--backend", "/tmp", "--selftest"], 4, "is not a regular file"),
    ],
)
def test_cli_errors_are_one_line(sanitized: tuple[Path, Path], args: list[str], code: int, needle: str) -> None:
    proc = run(sanitized[0], *args)
    assert proc.returncode == code
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr


def test_not_a_library_and_missing_symbols(sanitized: tuple[Path, Path], tmp_path: Path) -> None:
    host = sanitized[0]
    junk = tmp_path / "libjunk.so"
    junk.write_text("not a library")
    proc = run(host, "--backend", str(junk), "--selftest")
    assert proc.returncode == 4 and "cannot load" in proc.stderr and "GPU tier disabled" in proc.stderr
    libm = next(
        p for p in (Path("/lib/x86_64-linux-gnu/libm.so.6"), Path("/usr/lib/x86_64-linux-gnu/libm.so.6")) if p.exists()
    )
    proc = run(host, "--backend", str(libm), "--selftest")
    assert proc.returncode == 4 and "lacks the mandatory symbol coli_abi_version" in proc.stderr


def ref_backend_of_version(gen_dir: Path, tmp_path: Path, version: int) -> Path:
    """The reference backend, reporting ABI `version` ((major << 16) | minor)."""
    src = tmp_path / f"v{version:x}.c"
    src.write_text(
        "#undef coli_abi_version\n#include <stdint.h>\n"
        f'__attribute__((visibility("default"))) uint32_t coli_abi_version(void) {{ return {version}u; }}\n'
    )
    lib = tmp_path / f"libcoli_v{version:x}.so"
    compile_ok(
        ["gcc", "-std=c11", "-shared", "-fPIC", f"-I{gen_dir}", f"-I{KERNELS}",
         "-Dcoli_abi_version=coli_abi_version_own", str(KERNELS / "backend_ref.c"), str(KERNELS / "cpu_ops.c"),
         str(src), "-o", str(lib), "-lm"]
    )  # fmt: skip
    return lib


def test_wrong_abi_major_is_refused(gen_dir: Path, sanitized: tuple[Path, Path], tmp_path: Path) -> None:
    lib = ref_backend_of_version(gen_dir, tmp_path, 2 << 16)
    proc = run(sanitized[0], "--backend", str(lib), "--selftest")
    assert proc.returncode == 4 and "has ABI 2.0, this host needs 1.0 or a later minor" in proc.stderr


def test_a_backend_of_an_older_minor_runs_without_its_newer_functions(
    gen_dir: Path, sanitized: tuple[Path, Path], tmp_path: Path
) -> None:
    """ABI 1.0 predates coli_matmul_many (1.1): the host runs such a backend and makes
    its calls one by one, even when the library happens to export the newer symbol."""
    lib = ref_backend_of_version(gen_dir, tmp_path, 1 << 16)
    host = sanitized[0]
    proc = run(host, "--backend", str(lib), "--selftest", "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["passed"] is True
    assert all(c["op"] == "matmul" for c in result["checks"])
    assert not any(b["case"].startswith("matmul_many") for b in result["bad_input"])
    model = ROOT / "tests/fixtures/models/glm_tiny"
    args = ["--model", str(model), "--ids", "5,17,42", "--teacher-force", "--json"]
    one_by_one = json.loads(run(host, *args, "--backend", str(lib)).stdout)
    together = json.loads(run(host, *args, "--backend", str(sanitized[1])).stdout)
    assert one_by_one["backend_calls"] == one_by_one["backend_matmuls"] == one_by_one["resident_tensors"]
    assert together["backend_calls"] < together["backend_matmuls"] == together["resident_tensors"]
    assert one_by_one["top2_margin"] == together["top2_margin"] and one_by_one["tf_pred"] == together["tf_pred"]
