"""`doit build` for real: the real compilers, in project copies whose paths hold a space."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import executed, need_tool, run_doit, sbom_errors, verify_check

pytestmark = pytest.mark.slow

PLATFORM = "linux-x86_64"
KEYS = ("ref-cpu", "hip-gfx1030_gfx90a", "cuda-sm_80_sm_90")


def package(root: Path, key: str) -> Path:
    return root / "dist" / f"coli-0.1.0-{PLATFORM}-{key}.tar.gz"


def test_default_build_makes_host_and_one_verified_package_per_backend(built_project: Path) -> None:
    assert (built_project / "build/linux-x86_64/host/coli").is_file()
    names = sorted(p.name for p in (built_project / "dist").iterdir())
    assert names == sorted(f"coli-0.1.0-{PLATFORM}-{k}.tar.gz" for k in KEYS)
    for key in KEYS:
        api = key.split("-")[0]
        with tarfile.open(package(built_project, key)) as tf:
            top = f"coli-0.1.0-{PLATFORM}-{key}"
            files = {m.name.removeprefix(top + "/"): tf.extractfile(m).read() for m in tf.getmembers()}  # type: ignore[union-attr]
        extra = {"README-hip-runtime.txt"} if api == "hip" else set()
        assert set(files) == {"coli", f"libcoli_{api}.so", "build-info.json", "sbom.cdx.json", "SHA256SUMS", *extra}
        if api == "hip":  # the runtime is named, not bundled, unless the config says so
            readme = files["README-hip-runtime.txt"].decode()
            assert "COLI_HIP_RUNTIME_DIR" in readme and "libamdhip64.so.5" in readme and "resident_tensors" in readme
            assert "coli doctor" in readme and "gfx1030, gfx90a" in readme
        for line in files["SHA256SUMS"].decode().splitlines():
            digest, name = line.split("  ")
            assert hashlib.sha256(files[name]).hexdigest() == digest
        info = json.loads(files["build-info.json"])
        assert info["api"] == api and info["platform"] == PLATFORM
        # the SBOM: CycloneDX 1.6 by its schema, the host and the backend by their SHA-256, the toolchains
        assert sbom_errors(files["sbom.cdx.json"]) is None
        sbom = json.loads(files["sbom.cdx.json"])
        hashes = {c["name"]: c["hashes"][0]["content"] for c in sbom["components"]}
        assert hashes == {n: hashlib.sha256(files[n]).hexdigest() for n in ("coli", f"libcoli_{api}.so")}
        assert {t["bom-ref"] for t in sbom["metadata"]["tools"]["components"]} == {"tool:host", f"tool:{api}"}
        assert sbom["metadata"]["component"]["properties"][0]["value"] == info["source_revision"]
        assert info["source_revision"] and "host" in info["toolchain"] and api in info["toolchain"]
        assert all(v["ok"] for v in info["verify"].values())
        # the backend's device code per arch and kind, with its sizes
        kinds = {"ref": set(), "hip": {("gfx1030", "hsaco"), ("gfx90a", "hsaco")}}
        kinds["cuda"] = {("sm_80", "sass"), ("sm_90", "sass"), ("sm_90", "ptx")}
        assert {(c["arch"], c["kind"]) for c in info["device_code"]} == kinds[api]
        assert all(0 < c["compressed_bytes"] < c["bytes"] for c in info["device_code"])
        assert info["validate"]["host"]["status"] == "passed"
        backend = info["validate"][f"libcoli_{api}.so"]
        expected = "passed" if api == "ref" else "not-run"
        assert backend["status"] == expected, backend
        if api == "ref":
            # per model and format: teacher forcing, and a greedy decode with the whole step in the backend
            teacher = [c for c in backend["checks"] if "teacher forcing" in c["name"]]
            greedy = [c for c in backend["checks"] if "greedy decode" in c["name"]]
            assert len(teacher) == len(greedy) == 6 and all(c["ok"] for c in backend["checks"])
            assert all(c["resident_tensors"] > 0 for c in teacher)
            assert all(c["tier"] == "step" and c["decode_round_trips"] == 2 for c in greedy)
        else:
            assert "GPU tier disabled" in backend["reason"]


def test_coli_doctor_in_the_real_packages(built_project: Path, tmp_path: Path) -> None:
    """The packages as a user unpacks them, under the real coli doctor: the real HIP
    backend binds Debian's real ROCm runtime, its device code is read from the file, and
    with no GPU here the verdict is the runtime's own; the CUDA one has no driver here."""
    import os
    import subprocess

    reports = {}
    for key in ("hip-gfx1030_gfx90a", "cuda-sm_80_sm_90"):
        with tarfile.open(package(built_project, key)) as tf:
            tf.extractall(tmp_path, filter="data")
        folder = tmp_path / f"coli-0.1.0-{PLATFORM}-{key}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("COLI_")}
        env["COLI_HIP_RUNTIME_DIR"] = "/usr/lib/x86_64-linux-gnu"
        proc = subprocess.run([str(folder / "coli"), "doctor", "--json"], capture_output=True, text=True, env=env)
        reports[key.split("-")[0]] = proc.returncode, json.loads(proc.stdout)
    rc, hip = reports["hip"]
    (b,) = [b for b in hip["backends"] if b["present"]]
    assert (b["api"], b["abi"], b["name"], b["hip_runtime"]) == ("hip", hip["abi"], "hip", "libamdhip64.so.5")
    assert sorted(b["device_code"]) == ["gfx1030", "gfx90a"] and b["gpus"] == []
    assert b["runtime"]["version"] > 50000000 and "hipErrorNoDevice" in b["runtime"]["error"]
    assert hip["hip"]["decision"] == "load" and hip["hip"]["configured_version"].startswith("5.")
    assert rc == 1 and [v["code"] for v in hip["verdicts"] if v["level"] == "problem"] == ["no-gpu"]
    rc, cuda = reports["cuda"]
    (b,) = [b for b in cuda["backends"] if b["present"]]
    assert b["abi"] == cuda["abi"] and sorted(b["device_code"]) == ["compute_90", "sm_80", "sm_90"]
    assert b["runtime"]["driver_version"] == 0 and b["runtime"]["driver_too_old"] is False
    assert rc == 1 and [v["code"] for v in cuda["verdicts"]] == ["no-gpu"] and cuda["hip"] is None


def test_device_code_of_the_default_arches(built_project: Path) -> None:
    device = verify_check(built_project, "hip-gfx1030_gfx90a", "device code")
    assert device["ok"] and device["detail"] == ".hip_fatbin lists gfx1030, gfx90a"
    runtime = verify_check(built_project, "hip-gfx1030_gfx90a", "hip runtime")
    assert runtime["ok"] and runtime["detail"] == "host binds libamdhip64.so.5; backend imports libamdhip64.so.5"
    device = verify_check(built_project, "cuda-sm_80_sm_90", "device code")
    detail = str(device["detail"])
    assert device["ok"] and "sm_80 (sass)" in detail and "sm_90 (ptx+sass)" in detail


@contextlib.contextmanager
def _state_kept(root: Path, keep: Path) -> Iterator[None]:
    """Afterwards the build state (build/, doit's database in it, and dist/, timestamps kept) as
    it was before, so the next build has nothing to do."""
    for d in ("build", "dist"):
        shutil.copytree(root / d, keep / d, symlinks=True)
    try:
        yield
    finally:
        for d in ("build", "dist"):
            shutil.rmtree(root / d)
            shutil.move(keep / d, root / d)


@contextlib.contextmanager
def _edited(root: Path, rel: str, old: str, new: str, keep: Path) -> Iterator[None]:
    """`rel` with `old` replaced by `new`; afterwards the file and the build state as they were."""
    path = root / rel
    text = path.read_text()
    assert old in text
    with _state_kept(root, keep):
        path.write_text(text.replace(old, new))
        try:
            yield
        finally:
            path.write_text(text)


def test_no_op_and_incremental_rebuilds(built_project: Path, tmp_path: Path) -> None:
    proc = run_doit(built_project, "build")
    assert proc.returncode == 0 and executed(proc) == [], proc.stdout

    with _edited(built_project, "kernels/backend_gpu.cu", '"no %s device: %s"', '"no usable %s device: %s"', tmp_path):
        ran = set(executed(run_doit(built_project, "-n", "2", "build")))  # the two GPU compiles side by side
        gpu = {f"{PLATFORM}-{k}" for k in KEYS[1:]}
        assert ran == {f"{stage}:{t}" for stage in ("backend", "verify", "validate", "package") for t in gpu}
    assert executed(run_doit(built_project, "build")) == []

    with _edited(built_project, "engine/main.c", "--model DIR is required", "--model DIR is needed", tmp_path):
        ran = set(executed(run_doit(built_project, "build")))
        assert f"host:{PLATFORM}" in ran and f"verify:{PLATFORM}-host" in ran and f"validate:{PLATFORM}-host" in ran
        assert not any(t.startswith("backend:") for t in ran)
        assert {f"package:{PLATFORM}-{k}" for k in KEYS} <= ran
    assert executed(run_doit(built_project, "build")) == []


def test_named_arches(built_project: Path) -> None:
    """The default group named is up to date; cpu alone skips nothing. A CUDA arch alone and an
    AMD target id with a feature are built by the shared-cache test (test_shared_cache.py),
    whose runners name their arches so, and their device code is checked there."""
    proc = run_doit(built_project, "build", "arch=gfx1030,gfx90a")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not any(t.startswith("backend:") for t in executed(proc))  # same group as the default: up to date

    proc = run_doit(built_project, "build", "arch=cpu")
    assert proc.returncode == 0
    assert proc.stderr.count("note:") == 0  # nothing skipped when nothing else was asked for


@pytest.mark.parametrize(
    ("args", "env", "code", "needles"),
    [
        (["arch=gfx9999"], {}, 2, ["unknown arch 'gfx9999'", "allowed: cpu"]),
        (["arch="], {}, 2, ["build.arch: empty; leave arch= out for the default"]),
        (["arch=gfx1030:xnack+"], {}, 2, ["gfx1030 takes no target features"]),
        (["arch=sm_1"], {}, 2, ["unknown arch 'sm_1'"]),
        (["arch=gfx1151"], {}, 3, ["HIP SDK 5.2", "oclc_isa_version_1151.bc"]),
        (["arhc=cpu"], {}, 2, ["did you mean 'arch='"]),
        (["arch=sm_90"], {"NVCC": "/nonexistent/nvcc"}, 3, ["linux-x86_64-cuda: no nvcc", "env NVCC"]),
        (["profile=fast"], {}, 2, ["no profile 'fast'"]),
        (["build_dir="], {}, 2, ["build.build_dir: empty; leave build_dir= out for the default ('build')"]),
        (
            ["dist_dir=.."],
            {},
            2,
            ["build.dist_dir: '..' is the project's folder or holds it", "(the default is 'dist')"],
        ),
        (["build_dir=README.md/x"], {}, 1, ["error: ", "README.md/x/.cache: Not a directory"]),
    ],
)
def test_bad_requests_end_in_one_line(
    built_project: Path, args: list[str], env: dict[str, str], code: int, needles: list[str]
) -> None:
    proc = run_doit(built_project, "build", *args, env=env)
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    for n in needles:
        assert n in lines[0]


def test_misspelt_config_key(built_project: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[build]\narhc = ["cpu"]\n')
    proc = run_doit(built_project, "build", f"config={bad}")
    assert proc.returncode == 2
    assert f"file {bad}: unknown key 'build.arhc'; did you mean 'build.arch'?" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_absent_api_is_skipped_in_the_default_build_with_one_line(built_project: Path) -> None:
    proc = run_doit(built_project, "toolchain", env={"NVCC": "/nonexistent/nvcc"})
    assert proc.returncode == 0, proc.stderr
    notes = [line for line in proc.stderr.splitlines() if "cuda" in line]
    assert len(notes) == 1 and notes[0].startswith("note: linux-x86_64-cuda: skipped: no nvcc")
    assert "missing:" in proc.stdout


def test_list_and_toolchain(built_project: Path) -> None:
    proc = run_doit(built_project, "list")
    assert proc.returncode == 0
    docs = dict(line.split(None, 1) for line in proc.stdout.splitlines() if line.strip())
    for stage in ("toolchain", "codegen", "host", "backend", "verify", "validate", "package", "build", "config"):
        assert docs.get(stage), f"{stage} has no one-line doc in doit list"
    proc = run_doit(built_project, "toolchain")
    assert proc.returncode == 0
    for needle in ("host cc", "nvcc", "hip compiler", "hip device lib dir", "mingw cc", "wine", "PATH"):
        assert needle in proc.stdout
    proc = run_doit(built_project, "config", "arch=cpu")
    assert 'build.arch = ["cpu"]    # var arch=' in proc.stdout


def test_windows_cross_build_runs_under_wine(built_project: Path, tmp_path: Path) -> None:
    need_tool("x86_64-w64-mingw32-gcc", "wine")
    proc = run_doit(built_project, "build", "os=windows", "arch=cpu", env={"WINEDEBUG": "-all"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (built_project / "build/windows-x86_64/host/coli.exe").is_file()
    zpath = built_project / "dist/coli-0.1.0-windows-x86_64-ref-cpu.zip"
    with zipfile.ZipFile(zpath) as zf:
        top = "coli-0.1.0-windows-x86_64-ref-cpu"
        assert sorted(zf.namelist()) == sorted(
            f"{top}/{n}" for n in ("coli.exe", "coli_ref.dll", "build-info.json", "sbom.cdx.json", "SHA256SUMS")
        )
        info = json.loads(zf.read(f"{top}/build-info.json"))
        zf.extractall(tmp_path)
    assert info["validate"]["host"]["status"] == "passed"
    assert info["validate"]["coli_ref.dll"]["status"] == "passed"
    assert all(v["ok"] for v in info["verify"].values())
    # the real coli.exe's doctor, as a user of this CPU package runs it: Wine seen, the
    # reference backend read and opened, and the one problem that only the CPU can run
    import subprocess

    from toolchain.wine import warm

    warm(["wine"])
    exe = tmp_path / top / "coli.exe"
    proc = subprocess.run(["wine", str(exe), "doctor", "--json"], capture_output=True, text=True,
                          env={**os.environ, "WINEDEBUG": "-all"}, timeout=120)  # fmt: skip
    report = json.loads(proc.stdout)
    assert proc.returncode == 1 and report["platform"]["wine"] and report["platform"]["os"].startswith("Windows")
    (ref,) = [b for b in report["backends"] if b["present"]]
    assert (ref["api"], ref["file"], ref["abi"], ref["name"]) == ("ref", "coli_ref.dll", report["abi"], "ref")
    assert [v["code"] for v in report["verdicts"]] == ["no-gpu-backend"] and report["hip"] is None
    # the Linux build's state is kept apart from the Windows one
    assert executed(run_doit(built_project, "build")) == []


def test_a_changed_compiler_rebuilds_its_backend_only(built_project: Path, tmp_path: Path) -> None:
    """The toolchain fingerprint is part of each compile's state: a different HIP
    compiler (here the same clang behind a wrapper that reports another version)
    rebuilds the HIP backend and nothing else; the same one again is a no-op. The build state
    is put back afterwards, not rebuilt with the first compiler: that would be the same
    fingerprint check once more, at the price of a second HIP compile."""
    clang = Path("/usr/bin/clang++-19").resolve()
    wrapper = tmp_path / "bin" / "clang++"
    wrapper.parent.mkdir()
    wrapper.write_text(
        f'#!/bin/sh\n[ "$1" = --version ] && {{ echo "wrapped clang 19.1.7-x"; exit 0; }}\nexec {clang} "$@"\n'
    )
    wrapper.chmod(0o755)
    (wrapper.parent / "clang-offload-bundler").symlink_to(clang.parent / "clang-offload-bundler")
    env = {"HIPCC": str(wrapper)}
    with _state_kept(built_project, tmp_path / "keep"):
        ran = executed(run_doit(built_project, "build", env=env))
        assert f"backend:{PLATFORM}-hip-gfx1030_gfx90a" in ran
        assert not any(t.startswith(("backend:", "host:")) and "hip" not in t for t in ran), ran
        assert executed(run_doit(built_project, "build", env=env)) == []
    assert executed(run_doit(built_project, "build")) == []
