"""The toolchain lockfile (toolchain/lock.py) and the known-bad combinations
(toolchain/data/known_bad.toml, toolchain/known_bad.py): what a lock keeps of a
toolchain, how a drift is told, and which builds meet a known-bad row. The task
graph's use of both (`doit lock`, a release refused) is in tests/integration/test_release.py."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from tests.unit.test_plan_windows import windows_plan
from toolchain.known_bad import Facts, known_bad, matching_rows
from toolchain.lock import _portable, lock_differences, lock_of, read_lock, render_lock


def _ids(facts: Facts) -> list[str]:
    return [r.id for r in matching_rows(facts)]


def test_the_msvc_cmath_row_needs_all_of_its_conditions() -> None:
    bad = Facts("windows", "hip", ("gfx1151",), {"hip": "7.1.52802", "msvc": "14.44.35207", "host": "19.44"})
    assert _ids(bad) == ["msvc-cmath-hip"]
    assert _ids(Facts(**{**bad.__dict__, "versions": {**bad.versions, "msvc": "14.39.33519"}})) == []
    assert _ids(Facts(**{**bad.__dict__, "versions": {**bad.versions, "hip": "7.2.1"}})) == []
    assert _ids(Facts(**{**bad.__dict__, "os": "linux"})) == []
    assert _ids(Facts(**{**bad.__dict__, "versions": {"hip": "7.1.0"}})) == []  # no MSVC: not that row


def test_gfx9_past_gfx906_on_windows_by_arch_not_by_target_id() -> None:
    facts = Facts("windows", "hip", ("gfx1100", "gfx90a:xnack-"), {"hip": "6.4.1", "msvc": "14.38.33130"})
    assert _ids(facts) == ["windows-gfx9-past-gfx906"]
    assert _ids(Facts("windows", "hip", ("gfx906",), {"hip": "6.4.1"})) == []
    assert _ids(Facts("linux", "hip", ("gfx90a",), {"hip": "6.4.1"})) == []


def test_a_plan_that_meets_a_row_gets_one_line_with_the_issue_and_the_fix(tmp_path: Path) -> None:
    plan = windows_plan(tmp_path, {"arch": "gfx1151"})  # its stand-in SDK builds gfx1100 and gfx1151 only
    (spec,) = plan.backends
    plan = replace(plan, backends=(replace(spec, arches=("gfx942",)),))
    (line,) = known_bad([plan])
    assert line.startswith("windows-x86_64-hip-gfx942: known to break (windows-gfx9-past-gfx906): the Windows GPU")
    assert "fix: build these arches for Linux only" in line and "llama.cpp/issues/28423" in line and "\n" not in line
    assert known_bad([windows_plan(tmp_path / "other", {"arch": "gfx1151"})]) == []


def test_a_lock_keeps_versions_and_layouts_not_this_machines_folders() -> None:
    fp = {
        "root": "C:/TheRock/build",
        "version": "7.1.0",
        "compiler": "C:/TheRock/build/lib/llvm/bin/clang.exe",
        "vs": "C:/VS/2022",
        "cl": "19.44.35207",
        "toolset": "14.44.35207",
        "elsewhere": "D:/tools/ccache.exe",
    }
    kept = {"version": "7.1.0", "compiler": "@/lib/llvm/bin/clang.exe", "cl": "19.44.35207", "toolset": "14.44.35207"}
    assert _portable(fp) == kept | {"elsewhere": "ccache.exe"}
    assert _portable({"path": "/usr/bin/gcc", "version": "12.2"}) == {"path": "gcc", "version": "12.2"}


def test_a_lock_round_trips_and_names_each_difference(tmp_path: Path) -> None:
    plan = windows_plan(tmp_path, {"arch": "gfx1151"})
    lock = lock_of([plan])
    assert set(lock) == {"windows-x86_64"} and set(lock["windows-x86_64"]) == {"host", "hip"}
    assert lock["windows-x86_64"]["hip"]["toolset"] == "14.44.35207"
    path = tmp_path / "toolchain.lock"
    path.write_text(render_lock(lock))
    assert read_lock(path) == lock and lock_differences(read_lock(path), lock) == []
    drifted = {
        "windows-x86_64": {
            "host": lock["windows-x86_64"]["host"],
            "hip": {**lock["windows-x86_64"]["hip"], "toolset": "14.50.35717"},
        }
    }
    assert lock_differences(lock, drifted) == ["windows-x86_64 hip.toolset: 14.44.35207 in the lock, 14.50.35717 here"]
    assert lock_differences({}, lock) == ["windows-x86_64 is not in the lock"]
    only_host = {"windows-x86_64": {"host": lock["windows-x86_64"]["host"]}}
    assert lock_differences(only_host, lock) == ["windows-x86_64 hip is not in the lock"]
