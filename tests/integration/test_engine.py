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
    checks = result["checks"]
    assert len(checks) >= 15 and all(c["ok"] for c in checks)
    shapes = {(c["rows"], c["cols"], c["s"]) for c in checks}
    assert len(checks) == 3 * len(shapes), "every shape is checked in every format"
    assert {c["format"] for c in checks} == {"f32", "int8", "int4"}
    assert len(result["bad_input"]) >= 9 and all(b["ok"] and b["message"] for b in result["bad_input"])
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


def test_wrong_abi_major_is_refused(gen_dir: Path, sanitized: tuple[Path, Path], tmp_path: Path) -> None:
    wrong = tmp_path / "v2.c"
    wrong.write_text(
        "#undef coli_abi_version\n#include <stdint.h>\n"
        '__attribute__((visibility("default"))) uint32_t coli_abi_version(void) { return 2u << 16; }\n'
    )
    lib = tmp_path / "libcoli_v2.so"
    compile_ok(
        ["gcc", "-std=c11", "-shared", "-fPIC", f"-I{gen_dir}", f"-I{KERNELS}",
         "-Dcoli_abi_version=coli_abi_version_v1", str(KERNELS / "backend_ref.c"), str(KERNELS / "cpu_ops.c"),
         str(wrong), "-o", str(lib), "-lm"]
    )  # fmt: skip
    proc = run(sanitized[0], "--backend", str(lib), "--selftest")
    assert proc.returncode == 4 and "has ABI 2.0, this host needs 1.0" in proc.stderr
