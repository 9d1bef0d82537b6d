from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.fakes import cuda_toolkit, hip_sdk, script
from toolchain.config import load_config
from toolchain.discover import discover
from toolchain.errors import ToolchainError
from toolchain.plan import Plan, make_plan
from toolchain.probe import Prober

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = ROOT / "configs" / "default.toml"


def _plan(
    tmp_path: Path, variables: dict[str, str], *, hip: bool = True, cuda: bool = True, config: Path = DEFAULT
) -> Plan:
    bin_dir = tmp_path / "bin"
    script(bin_dir / "gcc", "gcc (fake) 12.2.0")
    script(bin_dir / "x86_64-w64-mingw32-gcc", "x86_64-w64-mingw32-gcc (fake) 12")
    env = {"PATH": str(bin_dir)}
    if hip:
        env["HIP_SDK_ROOT"] = str(hip_sdk(tmp_path / "rocm", arches=("gfx1030", "gfx90a"), version=(5, 2, 21153)))
    else:
        env["HIP_SDK_ROOT"] = str(tmp_path / "no-rocm")
    env["CUDA_HOME"] = str(cuda_toolkit(tmp_path / "cuda", (80, 90))) if cuda else str(tmp_path / "no-cuda")
    rc = load_config(config, env, variables)
    return make_plan(rc, discover(rc, env, Prober(None)), tmp_path)


def test_default_plan_skips_what_the_sdk_cannot_build(tmp_path: Path) -> None:
    plan = _plan(tmp_path, {})
    assert [b.key for b in plan.backends] == ["ref-cpu", "hip-gfx1030_gfx90a", "cuda-sm_80_sm_90"]
    assert len(plan.notes) == 1
    assert "skipping gfx1100, gfx1151" in plan.notes[0] and "HIP SDK 5.2.21153" in plan.notes[0]


def test_default_plan_skips_an_absent_api_with_one_line(tmp_path: Path) -> None:
    plan = _plan(tmp_path, {}, hip=False, cuda=False)
    assert [b.key for b in plan.backends] == ["ref-cpu"]
    assert len(plan.notes) == 2
    assert all("skipped" in n and "to get it" in n for n in plan.notes)


def test_named_arch_the_sdk_cannot_build_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ToolchainError) as exc:
        _plan(tmp_path, {"arch": "gfx1151"})
    msg = str(exc.value)
    assert "HIP SDK 5.2.21153" in msg and "oclc_isa_version_1151.bc" in msg


def test_named_api_without_its_toolchain_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ToolchainError, match="linux-x86_64-cuda: no nvcc"):
        _plan(tmp_path, {"arch": "sm_90"}, cuda=False)
    with pytest.raises(ToolchainError, match=r"CUDA 12.8 .* cannot build sm_100"):
        _plan(tmp_path, {"arch": "sm_100"})


def test_arch_groups_and_names(tmp_path: Path) -> None:
    plan = _plan(tmp_path, {"arch": "gfx90a,gfx1030,sm_90,cpu"})
    keys = {b.api: b for b in plan.backends}
    assert keys["hip"].arches == ("gfx90a", "gfx1030")
    assert keys["hip"].lib_name == "libcoli_hip.so"
    assert plan.backend_lib(keys["cuda"]) == tmp_path / "build/linux-x86_64/cuda-sm_90/libcoli_cuda.so"
    assert plan.host_exe == tmp_path / "build/linux-x86_64/host/coli"


def test_windows_plan(tmp_path: Path) -> None:
    plan = _plan(tmp_path, {"os": "windows", "arch": "cpu"})
    assert plan.host_exe.name == "coli.exe"
    assert plan.backends[0].lib_name == "coli_ref.dll"
    assert plan.host_cc.name == "mingw cc"
    with pytest.raises(ToolchainError, match="windows-x86_64-hip: needs Windows with the HIP SDK"):
        _plan(tmp_path, {"os": "windows", "arch": "gfx1030"})


def test_target_ids_and_specific_targets_pass_through_unchanged(tmp_path: Path) -> None:
    """gfx90a:xnack- goes to clang and sm_90a to nvcc as written; in file and task names a
    target id's ':' becomes '-' (Windows file names cannot hold it)."""
    from toolchain.commands import backend_command

    (tmp_path / "cuda-sm90a").mkdir()  # the second plan's own folder
    hip = _plan(tmp_path, {"arch": "gfx90a:xnack-,gfx1030"})
    (spec,) = [b for b in hip.backends if b.api == "hip"]
    assert spec.key == "hip-gfx90a-xnack-_gfx1030"
    cmd = backend_command(hip, spec, hip.backend_lib(spec))
    argv = [a for step in (*cmd.before, cmd.argv) for a in step]
    assert "--offload-arch=gfx90a:xnack-" in argv and "--offload-arch=gfx1030" in argv
    cuda = _plan(tmp_path / "cuda-sm90a", {"arch": "sm_90a"})
    (spec,) = [b for b in cuda.backends if b.api == "cuda"]
    cmd = backend_command(cuda, spec, cuda.backend_lib(spec))
    argv = [a for step in (*cmd.before, cmd.argv) for a in step]
    assert "arch=compute_90a,code=[sm_90a,compute_90a]" in argv
