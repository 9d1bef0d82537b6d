"""Planning a Windows build on a Windows host (injected: this machine is Linux),
with the recorded TheRock SDK tree and a stand-in for MSVC; and arch=native."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import compile_ok, need_tool
from tests.unit.fakes import script
from tests.unit.test_closure import _dll
from tests.unit.test_plan import _plan
from tests.unit.test_windows_build import AMD, ROCK_PROBE, find, msvc
from toolchain.commands import backend_command
from toolchain.errors import ToolchainError, VerifyError
from toolchain.plan import make_plan


def windows_plan(
    tmp_path: Path,
    variables: dict[str, str],
    *,
    msvc_ok: bool = True,
    tool_output: str = "",
    sdk: Any = None,
    config: dict[str, Any] | None = None,
) -> Any:
    base = _plan(tmp_path, {"os": "windows", "arch": "cpu"})
    sdk = sdk or find({"HIP_PATH": "C:/TheRock/build"}, ROCK_PROBE)
    toolchains = replace(base.toolchains, win_hip=sdk)
    build = base.rc.config.build.model_copy(update={"arch": tuple(variables["arch"].split(","))})
    rc = base.rc.__class__(
        config=base.rc.config.model_copy(update={"build": build, **(config or {})}),
        origins=base.rc.origins,
        file=base.rc.file,
    )

    def resolver(for_hip: bool):  # type: ignore[no-untyped-def]
        if not msvc_ok:
            raise ToolchainError("MSVC toolset 14.44.35207 is not installed; installed: 14.50.35717")
        return msvc()

    return make_plan(
        rc, toolchains, tmp_path, host_os="win32", msvc_resolver=resolver, run_tool=lambda argv: tool_output
    )


def test_windows_host_builds_the_hip_dll_with_the_sdk_and_msvc(tmp_path: Path) -> None:
    plan = windows_plan(tmp_path, {"arch": "gfx1151"})
    (spec,) = plan.backends
    assert spec.lib_name == "coli_hip.dll" and not plan.cross and plan.msvc.toolset == "14.44.35207"
    cmd = backend_command(plan, spec, plan.backend_lib(spec))
    assert cmd.argv[0] == r"C:\TheRock\build\lib\llvm\bin\clang++.exe"
    assert "--offload-arch=gfx1151" in cmd.argv and "-fms-runtime-lib=static" in cmd.argv
    assert cmd.env["HIP_PATH"] == r"C:\TheRock\build" and "ROCM_PATH" in cmd.unset
    assert cmd.env["VCToolsVersion"] == "14.44.35207"


@pytest.mark.parametrize(
    ("which", "want"),
    [("amd-6.2", "amdhip64_6.dll"), ("amd-6.4", "amdhip64_6.dll"), ("amd-7.1", "amdhip64_7.dll"),
     ("therock-7", "amdhip64_7.dll")],
)  # fmt: skip
def test_the_host_binds_the_runtime_its_sdk_links(tmp_path: Path, which: str, want: str) -> None:
    """The runtime's name comes from the SDK that builds the HIP backend (HIP SDK 6.x:
    amdhip64_6.dll; 7.x and TheRock: amdhip64_7.dll), rendered into the host."""
    from tests.unit.test_windows_build import SDKS
    from toolchain.commands import host_command

    root, probe = SDKS[which]
    sdk = find({"HIP_PATH": str(root)}, probe)
    plan = windows_plan(tmp_path, {"arch": "gfx1030" if which == "amd-6.2" else "gfx1151"}, sdk=sdk)
    assert plan.win_hip.runtime_dll == want
    (compile_main, *_) = host_command(plan, plan.host_exe).before
    assert f'-DCOLI_HIP_RUNTIME_NAME="{want}"' in compile_main


def test_an_arch_the_windows_sdk_lacks_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ToolchainError, match="cannot build gfx1201"):
        windows_plan(tmp_path, {"arch": "gfx1201"})


def test_missing_msvc_is_an_error_when_asked_for(tmp_path: Path) -> None:
    with pytest.raises(ToolchainError, match=r"14\.44\.35207 is not installed"):
        windows_plan(tmp_path, {"arch": "gfx1151"}, msvc_ok=False)


def test_native_uses_the_sdks_arch_tool(tmp_path: Path) -> None:
    """A local arch=native build resolves the GPU's arch, and build-info.json records that
    arch, never "native"."""
    from toolchain.package import build_info
    from toolchain.revision import Revision

    plan = windows_plan(tmp_path, {"arch": "native"}, tool_output="gfx1151\\n")
    assert plan.backends[0].arches == ("gfx1151",)
    info = build_info(name="p", version="1", spec=plan.backends[0], abi="1.0", revision=Revision("x", False, 0),
                      toolchain={}, verify={}, validate={})  # fmt: skip
    assert info["arches"] == ["gfx1151"]
    with pytest.raises(ToolchainError, match="arch=native: no GPU found by"):
        windows_plan(tmp_path, {"arch": "native"}, tool_output="")


def test_native_without_an_arch_tool_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ToolchainError, match="has no amdgpu-arch or hipInfo"):
        _plan(tmp_path, {"arch": "native"})


def test_native_on_linux_with_amdgpu_arch(tmp_path: Path) -> None:
    script(tmp_path / "rocm/llvm/bin/amdgpu-arch", "gfx1030\\ngfx1030")
    plan = _plan(tmp_path, {"arch": "native"})
    assert [b.arches for b in plan.backends] == [("gfx1030",)]


def test_cross_builds_from_linux_still_refuse_gpu_backends(tmp_path: Path) -> None:
    with pytest.raises(ToolchainError, match="cannot be cross-built from Linux"):
        _plan(tmp_path, {"os": "windows", "arch": "gfx1151"})
    assert _plan(tmp_path, {"os": "windows", "arch": "cpu"}).cross


def _windows_hip_package(
    tmp_path: Path, backend_body: str = "", libs: tuple[str, ...] = (), config: dict[str, Any] | None = None
) -> tuple[Any, Any, Path]:
    """The windows-hip package task's inputs, artifacts stood in for by real PE files
    (the package checks its members' imports): the graph, the spec and the package's path."""
    import json

    from toolchain.tasks import _Graph

    plan = windows_plan(tmp_path, {"arch": "gfx1151"}, config=config)
    (spec,) = plan.backends
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels/abi.toml").write_text((Path(__file__).resolve().parents[2] / "kernels/abi.toml").read_text())
    graph = _Graph(plan)
    plan.host_exe.parent.mkdir(parents=True)
    plan.backend_lib(spec).parent.mkdir(parents=True)
    src = tmp_path / "stand_in.c"
    src.write_text("__declspec(dllexport) int coli_abi_version(void) { return 0; }\nint main(void) { return 0; }\n")
    compile_ok(["x86_64-w64-mingw32-gcc", str(src), "-o", str(plan.host_exe)])
    if backend_body:
        built = _dll(tmp_path, "backend", backend_body, libs=list(libs))
        plan.backend_lib(spec).write_bytes(built.read_bytes())
    else:
        compile_ok(["x86_64-w64-mingw32-gcc", "-shared", str(src), "-o", str(plan.backend_lib(spec))])
    report = {"ok": True, "checks": []}
    for path in (
        graph.verify_json("host"),
        graph.verify_json(spec.key),
        graph.validate_host_json(),
        graph.validate_json(spec),
    ):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report))
    return graph, spec, graph.package_path(spec)


def test_windows_hip_package_contents(tmp_path: Path) -> None:
    """The windows-hip zip as the package task writes it (artifacts stood in for: they
    are built only on Windows): coli.exe, coli_hip.dll, the runtime README rendered for
    amdhip64_7.dll, build-info.json and SHA256SUMS; no runtime DLL unless configured."""
    import json
    import zipfile

    graph, spec, dest = _windows_hip_package(tmp_path)
    graph._package(spec, dest)
    assert dest.name == "coli-0.1.0-windows-x86_64-hip-gfx1151.zip"
    with zipfile.ZipFile(dest) as zf:
        top = "coli-0.1.0-windows-x86_64-hip-gfx1151"
        names = sorted(n.removeprefix(top + "/") for n in zf.namelist())
        readme = zf.read(f"{top}/README-hip-runtime.txt").decode()
        info = json.loads(zf.read(f"{top}/build-info.json"))
    assert info["hip_runtime"] == "amdhip64_7.dll"
    assert names == [
        "README-hip-runtime.txt",
        "SHA256SUMS",
        "build-info.json",
        "coli.exe",
        "coli_hip.dll",
        "sbom.cdx.json",
    ]
    assert "amdhip64_7.dll" in readme and r"set COLI_HIP_RUNTIME_DIR=C:\Program Files\AMD\ROCm" in readme
    assert "HIP SDK 7.14.60850-9b8f2a51 built it" in readme and "resident_tensors" in readme


def test_a_package_whose_backend_imports_a_dll_it_lacks_is_not_written(tmp_path: Path) -> None:
    """The dependency closure in the package task: a backend importing amd_comgr_3.dll,
    which the package does not carry and no system provides, stops the task in one line
    naming both, and no package is left behind."""
    need_tool("clang-19", "lld-link-19")
    _dll(tmp_path, "amd_comgr_3", "__declspec(dllexport) int comgr(void) { return 1; }\n")
    body = (
        "__declspec(dllimport) int comgr(void);\n__declspec(dllexport) int coli_abi_version(void) { return comgr(); }\n"
    )
    graph, spec, dest = _windows_hip_package(tmp_path, body, ("amd_comgr_3",))
    with pytest.raises(VerifyError) as err:
        graph._package(spec, dest)
    line = err.value.one_line()
    assert "coli_hip.dll imports amd_comgr_3.dll, which is neither in the package nor a system" in line, line
    assert "\n" not in line and not dest.exists() and not list(dest.parent.glob("*.zip*"))


def test_a_package_over_its_size_budget_is_not_kept(tmp_path: Path) -> None:
    """The size budget in the package task: a hip package over package.max_bytes_by_api.hip
    stops the task in one line with both figures and the setting, and is not left behind;
    under it, the package is written and build-info.json lists its device code (none in
    these stand-ins)."""
    import json
    import zipfile

    from toolchain.config.schema import PackageSection

    graph, spec, dest = _windows_hip_package(
        tmp_path, config={"package": PackageSection(max_bytes_by_api={"hip": 1000})}
    )
    with pytest.raises(VerifyError) as err:
        graph._package(spec, dest)
    line = err.value.one_line()
    assert f"package {dest.name} is " in line and "over its budget of 1000 (1000 bytes; config" in line, line
    assert "package.max_bytes_by_api.hip" in line and "\n" not in line
    assert not dest.exists() and not list(dest.parent.glob("*.zip*"))
    graph, spec, dest = _windows_hip_package(tmp_path / "roomy")
    graph._package(spec, dest)
    with zipfile.ZipFile(dest) as zf:
        info = json.loads(zf.read(f"{dest.name.removesuffix('.zip')}/build-info.json"))
    assert info["device_code"] == []


def test_the_leak_check_covers_the_windows_sdk_and_msvc(tmp_path: Path) -> None:
    """verify refuses an artifact naming the checkout, the build folder, the Windows HIP SDK
    (with a component found outside its root) or the MSVC install and its toolset folder."""
    from dataclasses import replace as with_

    plan = windows_plan(tmp_path, {"arch": "gfx1151"})
    paths = plan.build_machine_paths()
    assert str(tmp_path) in paths and r"C:\TheRock\build" in paths
    assert str(plan.msvc.install.path) in paths
    tools = "D:\\BuildTools\\VC\\Tools\\MSVC\\14.44.35207\\"  # a toolset installed apart from the IDE
    moved = with_(plan, msvc=with_(plan.msvc, env={**plan.msvc.env, "VCToolsInstallDir": tools}))
    assert tools.rstrip("\\") in moved.build_machine_paths()
    outside = with_(plan.win_hip, device_lib_dir=AMD / "amdgcn" / "bitcode")
    split = windows_plan(tmp_path, {"arch": "gfx1151"}, sdk=outside)
    assert str(AMD / "amdgcn" / "bitcode") in split.build_machine_paths()
