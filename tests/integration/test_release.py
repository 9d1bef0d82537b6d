"""`doit release` for real: the local matrix (Linux host, reference, HIP and CUDA
backends, the Windows host and reference DLL; windows-hip cannot be built here), its CUDA
group cut to one arch: each arch is one more nvcc compile of the whole backend in each of
the suite's two releases, and two arches in one group are the default build's (test_build.py)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT, copy_project, need_tool, provenance_errors, run_doit, sbom_errors

pytestmark = pytest.mark.slow

CONFIG = "config=configs/release-local.toml"
RELEASE = Path("dist/release-0.2.0")


def _member(package: Path, name: str) -> bytes:
    """A package's member by its name under the package's top folder."""
    top = package.name.removesuffix(".zip").removesuffix(".tar.gz")
    if package.suffix == ".zip":
        with zipfile.ZipFile(package) as zf:
            return zf.read(f"{top}/{name}")
    with tarfile.open(package) as tf:
        f = tf.extractfile(f"{top}/{name}")
        assert f is not None
        return f.read()


def release_copy(dest: Path) -> Path:
    """A project copy whose local release config builds sm_90 alone."""
    root = copy_project(dest)
    config = root / "configs/release-local.toml"
    text = config.read_text()
    assert 'groups = [["sm_80", "sm_90"]]' in text
    config.write_text(text.replace('groups = [["sm_80", "sm_90"]]', 'groups = [["sm_90"]]'))
    return root


def files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def released(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    need_tool("gcc", "clang++-19", "nvcc", "x86_64-w64-mingw32-gcc", "wine")
    root = release_copy(tmp_path_factory.mktemp("release") / "release copy")
    proc = run_doit(root, "-n", "2", "release", CONFIG)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return root, proc.stdout


def test_release_publishes_every_entry_with_manifest_and_sums(released: tuple[Path, str]) -> None:
    root, stdout = released
    folder = root / RELEASE
    manifest = json.loads((folder / "release-manifest.json").read_text())
    status = {e["id"]: e["status"] for e in manifest["entries"]}
    assert status == {
        "linux-x86_64-ref-cpu": "built",
        "windows-x86_64-ref-cpu": "built",
        "linux-x86_64-hip-gfx90a": "built",
        "linux-x86_64-hip-gfx1030": "built",
        "linux-x86_64-cuda-sm_90": "built",
        "windows-x86_64-hip-gfx1151": "not-built",
    }
    (skipped,) = [e for e in manifest["entries"] if e["status"] != "built"]
    assert skipped["needs"].startswith("needs Windows with the HIP SDK and MSVC")
    for e in manifest["entries"]:
        if e["status"] == "built":
            data = (folder / e["package"]).read_bytes()
            assert hashlib.sha256(data).hexdigest() == e["sha256"] and len(data) == e["size"]
            assert e["toolchain"]["host"]["version"] and e["validation"].split(":")[0] in ("passed", "not-run")
            # each GPU package's device code: the arches of its group, a row an arch and kind
            arches = {c["arch"] for c in e["device_code"]}
            assert arches == (set() if e["api"] == "ref" else set(e["arches"])), e
    sums: dict[str, str] = {}
    for line in (folder / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split("  ")
        sums[name] = digest
    packages = {e["package"] for e in manifest["entries"] if "package" in e}
    assert set(sums) == packages | {"release-manifest.json", "provenance.intoto.json"}
    for name, digest in sums.items():
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest
    # the provenance: an in-toto Statement, SLSA v1, naming every package by its sha256
    statement = (folder / "provenance.intoto.json").read_text()
    assert provenance_errors(statement) == []
    subjects = {x["name"]: x["digest"]["sha256"] for x in json.loads(statement)["subject"]}
    assert subjects == {name: sums[name] for name in packages}
    # every package carries its SBOM, valid CycloneDX 1.6
    for name in packages:
        assert sbom_errors(_member(folder / name, "sbom.cdx.json")) is None, name
    # the summary table names every entry, and what the missing one needs
    assert "release: 5 of 6 entries built" in stdout
    assert "windows-x86_64-hip-gfx1151" in stdout and "needs Windows" in stdout
    # the HIP bundles are compressed, and verify still proved each arch is inside
    verify = json.loads((root / "build/linux-x86_64/reports/verify-hip-gfx90a.json").read_text())
    assert any("(compressed) lists gfx90a" in c["detail"] for c in verify["checks"])


def test_an_unchanged_release_runs_nothing(released: tuple[Path, str]) -> None:
    root, _ = released
    before = {p.name: p.stat().st_mtime_ns for p in (root / RELEASE).iterdir()}
    proc = run_doit(root, "release", CONFIG)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "tasks ran" not in proc.stdout and "release:" not in proc.stdout
    assert {p.name: p.stat().st_mtime_ns for p in (root / RELEASE).iterdir()} == before


def test_a_clean_release_in_another_folder_gives_the_same_bytes(released: tuple[Path, str], tmp_path: Path) -> None:
    """The builds' bytes depend neither on the folder nor on parallel tasks (prefix maps, a
    fixed clang -cuid, nvcc compiling apart with -objtemp and a fixed -frandom-seed): the
    fixture's release ran `-n 2` in a folder whose path holds a space; this one runs serially
    elsewhere, and every package (host, reference, HIP and CUDA backends) is compared."""
    root, _ = released
    other = release_copy(tmp_path / "plain")  # no space this time, serial, later
    proc = run_doit(other, "release", CONFIG)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert files(root / RELEASE) == files(other / RELEASE)


def test_entries_fanned_out_and_merged_match_the_full_release(released: tuple[Path, str], tmp_path: Path) -> None:
    root, _ = released
    parts = []
    for entry in ("linux-x86_64-ref-cpu", "windows-x86_64-ref-cpu"):
        dist = tmp_path / entry
        proc = run_doit(root, "release", CONFIG, f"entry={entry}", f"dist_dir={dist}")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        parts.append(str(dist / "release-0.2.0"))
    merged = tmp_path / "merged"
    proc = subprocess.run(
        [sys.executable, "-m", "toolchain.publish", "merge", str(merged), *parts],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((merged / "release-manifest.json").read_text())
    assert [e["id"] for e in manifest["entries"]] == ["linux-x86_64-ref-cpu", "windows-x86_64-ref-cpu"]
    for e in manifest["entries"]:
        assert (merged / e["package"]).read_bytes() == (root / RELEASE / e["package"]).read_bytes()


def test_release_requests_that_cannot_be_met_end_in_one_line(released: tuple[Path, str]) -> None:
    root, _ = released
    proc = run_doit(root, "release")
    assert proc.returncode != 0 and "has no [release] table" in proc.stdout + proc.stderr
    proc = run_doit(root, "release", CONFIG, "arch=gfx90a")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "config error: arch= do not apply to a release config (configs/release-local.toml): its [release] table "
        "says what to build; pick entries with entry=<id>[,<id>...]"
    ]
    strict = root / "configs" / "release-strict.toml"
    strict.write_text(
        (root / "configs/release-local.toml")
        .read_text()
        .replace('name = "local"', 'name = "local"\nrequire_all = true')
    )
    proc = run_doit(root, "release", "config=configs/release-strict.toml")
    assert proc.returncode != 0
    assert "release.require_all is set and 1 entries cannot be built here: windows-x86_64-hip-gfx1151" in proc.stdout


def test_a_release_refuses_a_toolchain_that_differs_from_its_lock(released: tuple[Path, str]) -> None:
    """`doit lock` pins what was found; a lock that says another nvcc stops the release
    before anything runs, in one line naming the difference, and leaves the release as
    it was; lock=update accepts the toolchain found and rewrites the lock."""
    root, _ = released
    lock = root / "toolchain.lock"
    assert run_doit(root, "release", CONFIG).returncode == 0  # whatever tests before this one left
    before = files(root / RELEASE)
    try:
        proc = run_doit(root, "lock", CONFIG)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        pinned = lock.read_text()
        assert "[linux-x86_64.cuda]" in pinned and "[windows-x86_64.host]" in pinned and "/usr/" not in pinned
        proc = run_doit(root, "release", CONFIG)
        assert proc.returncode == 0 and "tasks ran" not in proc.stdout, proc.stdout + proc.stderr
        version = next(line for line in pinned.splitlines() if line.startswith("version = ") and "." in line)
        lock.write_text(pinned.replace(version, 'version = "0.9"', 1))
        proc = run_doit(root, "release", CONFIG)
        assert proc.returncode != 0
        (line,) = [x for x in (proc.stdout + proc.stderr).splitlines() if "differ from the lock" in x]
        assert "toolchain.lock: the toolchains found differ from the lock: linux-x86_64 " in line
        assert ": 0.9 in the lock, " in line and "doit release lock=update accepts them" in line
        assert files(root / RELEASE) == before
        proc = run_doit(root, "release", CONFIG, "lock=update")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert lock.read_text() == pinned and files(root / RELEASE) == before
    finally:
        lock.unlink(missing_ok=True)
