"""MSVC selection against recorded fixtures (vswhere JSON, vcvarsall's `set`, cl's banner)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path, PureWindowsPath

import pytest

from toolchain.errors import ToolchainError
from toolchain.msvc import check_cl_banner, parse_env_dump, parse_vswhere, resolve_msvc, select_toolset, vcvars_command

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "windows"
VS2022 = PureWindowsPath(r"C:\Program Files\Microsoft Visual Studio\2022\Community")
VS2026 = PureWindowsPath(r"C:\Program Files\Microsoft Visual Studio\18\Insiders")
TOOLSETS = {VS2022 / "VC/Tools/MSVC": ["14.38.33130", "14.44.35207"], VS2026 / "VC/Tools/MSVC": ["14.50.35717"]}


class Recorded:
    """Answers the commands resolve_msvc runs with the recorded outputs."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str], env: Mapping[str, str] | None) -> str:
        self.calls.append(argv)
        if argv[0].endswith("vswhere.exe"):
            return (FIX / "vswhere.json").read_text()
        if argv[0] == "cmd.exe":
            return (FIX / "vcvars-set.txt").read_text()
        if argv[0] == "cl.exe":
            assert env is not None and env["VCToolsVersion"] == "14.44.35207"
            return (FIX / "cl-banner-14.44.txt").read_text()
        raise AssertionError(argv)


def listing(p: PureWindowsPath) -> list[str]:
    return TOOLSETS.get(p, [])


def test_vswhere_newest_first() -> None:
    installs = parse_vswhere((FIX / "vswhere.json").read_text())
    assert [i.version for i in installs] == ["18.0.11111.16", "17.14.36310.24"]


def test_pinned_toolset_is_found_in_the_installation_that_has_it(tmp_path: Path) -> None:
    run = Recorded()
    msvc = resolve_msvc({}, "14.44.35207", tmp_path, for_hip=True, run=run, list_dir=listing)
    assert msvc.install.path == VS2022 and msvc.toolset == "14.44.35207" and msvc.cl_version == "19.44.35207.1"
    assert msvc.env["VCToolsVersion"] == "14.44.35207"
    assert run.calls[1] == vcvars_command(msvc.install, "14.44.35207")
    assert run.calls[1][-1].endswith('vcvarsall.bat" x64 -vcvars_ver=14.44.35207 >nul && set')
    # the environment is captured once: a second resolve reads the cache
    again = Recorded()
    resolve_msvc({}, "14.44.35207", tmp_path, for_hip=True, run=again, list_dir=listing)
    assert [c[0] for c in again.calls] == [run.calls[0][0], "cl.exe"]


def test_unpinned_or_missing_toolsets_list_what_is_installed() -> None:
    with pytest.raises(ToolchainError, match=r"no MSVC toolset pinned .*installed: 14.44.35207, 14.38.33130"):
        select_toolset(["14.44.35207", "14.38.33130"], None, for_hip=False)
    with pytest.raises(ToolchainError, match=r"14.40.1 is not installed; installed: 14.50.35717, 14.44.35207.*<cmath>"):
        select_toolset(["14.50.35717", "14.44.35207"], "14.40.1", for_hip=True)


def test_14_5x_gets_the_cmath_explanation_for_hip_only() -> None:
    with pytest.raises(ToolchainError, match=r"cannot build HIP: .*<cmath>.*__device__"):
        select_toolset(["14.50.35717"], "14.50.35717", for_hip=True)
    assert select_toolset(["14.50.35717"], "14.50.35717", for_hip=False) == "14.50.35717"


@pytest.mark.parametrize(
    ("banner", "message"),
    [
        ("Microsoft (R) C/C++ Optimizing Compiler Version 19.50.35717 for x64", "not toolset 14.44.35207"),
        ("Microsoft (R) C/C++ Optimizing Compiler Version 19.44.35207.1 for x86", "targets x86, not x64"),
        ("bash: cl.exe: command not found", "cannot read cl.exe's version"),
    ],
)
def test_wrong_cl_is_refused(banner: str, message: str) -> None:
    with pytest.raises(ToolchainError, match=message):
        check_cl_banner(banner, "14.44.35207")


def test_env_dump() -> None:
    env = parse_env_dump((FIX / "vcvars-set.txt").read_text())
    assert env["VSCMD_ARG_TGT_ARCH"] == "x64" and env["LIB"].endswith(r"ucrt\x64")
