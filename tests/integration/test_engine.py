"""The host executable itself: the selftest under AddressSanitizer and
UndefinedBehaviorSanitizer, and every way a backend can fail to load."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, SANITIZE, compile_ok, run_host
from toolchain.abi import load_abi, render_abi
from toolchain.command_data import REF_SOURCES

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
    abi = load_abi(ROOT / "kernels/abi.toml")
    assert result["abi"] == f"{abi.major}.{abi.minor}"
    # every step op of the ABI alone against its CPU definition, all passing
    checked = {name for c in result["op_checks"] for name in c["op"].split(", ")}
    assert checked == {o.name for o in abi.ops} and all(c["ok"] for c in result["op_checks"])
    # moe: 3 rows in f32, int8 and int4 twice (the GPU groups them by expert), 1 row in int8 and int4 (it does not),
    # and 1 row in int8 and int4 routed by a route op before it (the GPU routes inside the experts' first kernel),
    # and 1 row in f32 (routed) and int8 whose rows take the GPU's up kernel on eight warps a row, and 1 row at
    # each format routed over all but the last expert, which is a fixed pick (a decode's shared expert); the
    # three routed first have their bias written by an op before the route (the GPU then loads it after its wait)
    moe = [c["what"] for c in result["op_checks"] if c["op"] == "moe"]
    assert len(moe) == 13 and len([w for w in moe if w.endswith(", routed first, bias written")]) == 3
    assert len([w for w in moe if w.endswith(", a fixed sixth")]) == 3
    # weights a step writes before a norm, layernorm and rope read them (the GPU loads only unwritten ones early)
    assert len([c for c in result["op_checks"] if "the last values of a long add" in c["what"]]) == 1
    steps = [b for b in result["bad_input"] if "step" in b["case"] or "op " in b["case"] or "buffer" in b["case"]]
    assert len(steps) >= 13 and all(b["ok"] for b in steps)
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


def ref_backend_replacing(gen_dir: Path, tmp_path: Path, name: str, function: str, source: str) -> Path:
    """The reference backend with its `function` renamed `<function>_own` and `source`
    (which defines `function`, and may call the original by that name) linked in."""
    src = tmp_path / f"{name}.c"
    src.write_text(f"#undef {function}\n{source}")
    lib = tmp_path / f"libcoli_{name}.so"
    compile_ok(
        ["gcc", "-std=c11", "-shared", "-fPIC", f"-I{gen_dir}", f"-I{KERNELS}",
         f"-D{function}={function}_own", *(str(ROOT / s) for s in REF_SOURCES),
         str(src), "-o", str(lib), "-lm"]
    )  # fmt: skip
    return lib


def ref_backend_of_version(gen_dir: Path, tmp_path: Path, version: int) -> Path:
    """The reference backend, reporting ABI `version` ((major << 16) | minor)."""
    return ref_backend_replacing(
        gen_dir, tmp_path, f"v{version:x}", "coli_abi_version",
        "#include <stdint.h>\n"
        f'__attribute__((visibility("default"))) uint32_t coli_abi_version(void) {{ return {version}u; }}\n',
    )  # fmt: skip


def test_the_selftest_rejects_a_backend_whose_replays_write_nothing(
    gen_dir: Path, sanitized: tuple[Path, Path], tmp_path: Path
) -> None:
    """The reference backend with a step_run that queues only a step's first run: the
    attend and indexer checks set their outputs to all ones before the second run (the
    GPU's graph replay, whose last blocks must have set their counts back), so a replay
    that writes nothing fails them; without that it would leave the first run's right
    answer in place."""
    lib = ref_backend_replacing(
        gen_dir, tmp_path, "first_run_only", "coli_step_run",
        "#include <coli_backend.h>\n"
        "coli_status coli_step_run_own(coli_step step, int64_t position);\n"
        "COLI_API coli_status coli_step_run(coli_step step, int64_t position) {\n"
        "    static coli_step last;\n    static int ran;\n"
        "    if (ran && step == last) return COLI_OK;\n"
        "    ran = 1, last = step;\n    return coli_step_run_own(step, position);\n}\n",
    )  # fmt: skip
    proc = run(sanitized[0], "--backend", str(lib), "--selftest", "--json")
    result = json.loads(proc.stdout)
    failed = {c["op"] for c in result["op_checks"] if not c["ok"]}
    assert proc.returncode != 0 and not result["passed"] and {"attend", "indexer"} <= failed, failed


def test_a_backend_of_another_major_is_refused(gen_dir: Path, sanitized: tuple[Path, Path], tmp_path: Path) -> None:
    """This host (2.0) refuses a 1.x backend and a 3.x one, in one line naming both
    versions, and a model run stays on the CPU."""
    abi = load_abi(ROOT / "kernels/abi.toml")
    model = ROOT / "tests/fixtures/models/glm_tiny"
    for version in ((abi.major - 1) << 16 | 1, (abi.major + 1) << 16):
        lib = ref_backend_of_version(gen_dir, tmp_path, version)
        proc = run(sanitized[0], "--backend", str(lib), "--selftest")
        needle = f"has ABI {version >> 16}.{version & 0xFFFF}, this host needs {abi.major}.0 or a later minor"
        assert proc.returncode == 4 and needle in proc.stderr and len(proc.stderr.splitlines()) == 1, proc.stderr
        args = ["--model", str(model), "--ids", "5,17", "--teacher-force", "--json", "--backend", str(lib)]
        proc = run(sanitized[0], *args)
        assert proc.returncode == 0 and needle in proc.stderr and json.loads(proc.stdout)["tier"] == "cpu"


def test_a_backend_of_an_older_minor_runs_without_what_it_predates(
    gen_dir: Path, sanitized: tuple[Path, Path], tmp_path: Path
) -> None:
    """A backend of minor 0 in this host: it runs, and the optional functions of later
    minors that it exports anyway are not its ABI, so they are never called. `coli doctor`
    shows it: beside coli as its CUDA backend, a minor-0 build has no runtime description
    and cannot say whether its device is integrated; the same backend at this minor can.
    Nor are the ops of later minors recorded for it: its greedy decode gives the same
    tokens with a round trip each way a token."""
    import shutil

    abi = load_abi(ROOT / "kernels/abi.toml")
    assert abi.minor >= 1
    old = ref_backend_of_version(gen_dir, tmp_path, abi.major << 16)
    proc = run(sanitized[0], "--backend", str(old), "--selftest", "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["passed"] is True, proc.stderr
    seen = {}
    for name, lib in (("old", old), ("new", sanitized[1])):
        folder = tmp_path / name
        folder.mkdir()
        shutil.copy(sanitized[0], folder / "coli")
        shutil.copy(lib, folder / "libcoli_cuda.so")
        proc = run(folder / "coli", "doctor", "--json")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        (seen[name],) = [b for b in json.loads(proc.stdout)["backends"] if b["api"] == "cuda"]
    assert seen["old"]["abi"] == f"{abi.major}.0" and "runtime" not in seen["old"]
    assert seen["old"]["gpus"][0]["integrated"] is None and seen["old"]["gpus"][0]["has_code"] is None
    assert seen["new"]["abi"] == f"{abi.major}.{abi.minor}" and seen["new"]["runtime"]["version"] == 0
    assert seen["new"]["gpus"][0]["integrated"] is True and seen["new"]["gpus"][0]["arch"] == "cpu"
    # keep_ids (minor 2) is never recorded for it: its decode takes a round trip each way a token
    model = ROOT / "tests/fixtures/models/glm_tiny"
    gen = ["--model", str(model), "--ids", "5,17,42", "--generate", "40", "--json", "--backend"]
    runs = {name: run(sanitized[0], *gen, str(lib)) for name, lib in (("old", old), ("new", sanitized[1]))}
    assert all(p.returncode == 0 for p in runs.values()), [p.stderr for p in runs.values()]
    old_run, new_run = (json.loads(runs[name].stdout) for name in ("old", "new"))
    assert old_run["generated"] == new_run["generated"] and old_run["tier"] == new_run["tier"] == "step"
    assert old_run["decode_round_trips"] == 2 * 39 and new_run["decode_round_trips"] == 1 + 2


def test_a_host_of_abi_1_refuses_this_backend(sanitized: tuple[Path, Path], tmp_path: Path) -> None:
    """The reverse: the loader of a 1.x host (rendered from the last 1.x abi.toml, kept
    as a fixture) refuses this backend by its version before calling anything else."""
    old = tmp_path / "gen-1.1"
    old.mkdir()
    for name, text in render_abi(load_abi(ROOT / "tests/fixtures/abi/abi-1.1.toml")).items():
        (old / name).write_text(text)
    driver = tmp_path / "open.c"
    driver.write_text(
        '#include <stdio.h>\n#include "loader.h"\n'
        "int main(int argc, char **argv) {\n"
        "    coli_backend b;\n    char err[4096];\n    (void)argc;\n"
        '    if (coli_backend_open(argv[1], &b, err, sizeof err)) return fprintf(stderr, "%s\\n", err), 4;\n'
        "    coli_backend_close(&b);\n    return 0;\n}\n"
    )
    exe, engine = tmp_path / "host-1.1", ROOT / "engine"
    sources = [str(engine / f) for f in ("loader.c", "imports.c", "utf8.c", "hip_binding.c")]
    compile_ok(["gcc", "-std=c11", *SANITIZE, f"-I{old}", f"-I{engine}", str(driver), *sources, "-o", str(exe), "-ldl"])
    proc = subprocess.run([str(exe), str(sanitized[1])], capture_output=True, text=True, timeout=60)
    abi = load_abi(ROOT / "kernels/abi.toml")
    assert proc.returncode == 4, proc.stderr
    assert f"has ABI {abi.major}.{abi.minor}, this host needs 1.0 or a later minor" in proc.stderr
