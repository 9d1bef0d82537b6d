"""The exact command lines, checked against the plan they come from."""

from __future__ import annotations

from pathlib import Path

from tests.unit.test_plan import _plan
from toolchain.commands import ROCM_VARIABLES, backend_command, host_command


def test_hip_command_uses_every_resolved_component(tmp_path: Path) -> None:
    plan = _plan(tmp_path, {"arch": "gfx1030,gfx90a"})
    spec = plan.backends[0]
    cmd = backend_command(plan, spec, plan.backend_lib(spec))
    argv = list(cmd.argv)
    hip = plan.hip
    assert argv[0] == str(hip.compiler)
    assert argv[1:3] == ["-x", "hip"]
    assert "--offload-arch=gfx1030" in argv and "--offload-arch=gfx90a" in argv
    assert f"--rocm-path={hip.root}" in argv
    assert f"--rocm-device-lib-path={hip.device_lib_dir}" in argv
    assert f"-L{hip.lib_dir}" in argv and "-lamdhip64" in argv
    assert f"-ffile-prefix-map={tmp_path}=." in argv
    assert "-cuid=coli_backend_gpu" in argv
    assert argv[argv.index("-o") + 1] == str(plan.backend_lib(spec))
    # the sanitised environment: HIP_PATH is the SDK, other ROCm steering removed
    assert cmd.env["HIP_PATH"] == str(hip.root)
    assert set(cmd.unset) == set(ROCM_VARIABLES) - {"HIP_PATH"}
    assert cmd.env["TMPDIR"].startswith(str(plan.build_dir))


def test_cuda_command_has_sass_per_arch_and_ptx_for_the_newest(tmp_path: Path) -> None:
    plan = _plan(tmp_path, {"arch": "sm_80,sm_90"})
    spec = plan.backends[0]
    cmd = backend_command(plan, spec, plan.backend_lib(spec))
    argv = list(cmd.argv)
    assert argv[0] == "./nvcc" and cmd.cwd == (plan.cuda.home / "bin").resolve()
    codes = [argv[i + 1] for i, a in enumerate(argv) if a == "-gencode"]
    assert codes == ["arch=compute_80,code=sm_80", "arch=compute_90,code=[sm_90,compute_90]"]
    # compiled apart so no temporary file name reaches the library
    (compile_step,) = cmd.before
    assert "-c" in compile_step and "-objtemp" in compile_step and "-frandom-seed=coli_backend_gpu" in compile_step
    obj = compile_step[compile_step.index("-o") + 1]
    assert obj in argv and Path(obj).parent in cmd.mkdirs


def test_paths_with_spaces_are_quoted_for_nvcc(tmp_path: Path) -> None:
    spaced = tmp_path / "my project"
    spaced.mkdir()
    plan = _plan(spaced, {"arch": "sm_90"})
    cmd = backend_command(plan, plan.backends[0], plan.backend_lib(plan.backends[0]))
    assert f'"-ffile-prefix-map={spaced}=."' in cmd.before[0]  # the compile step
    assert any(a.startswith('"--version-script=') for a in cmd.argv)  # the link


def test_windows_host_and_reference_backend(tmp_path: Path) -> None:
    plan = _plan(tmp_path, {"os": "windows", "arch": "cpu"})
    host = host_command(plan, plan.host_exe)
    assert host.argv[0].endswith("x86_64-w64-mingw32-gcc")
    assert "-Wl,--no-insert-timestamp" in host.argv and "-D__USE_MINGW_ANSI_STDIO=1" in host.argv
    ref = backend_command(plan, plan.backends[0], plan.backend_lib(plan.backends[0]))
    assert str(plan.gen_dir / "coli_backend.def") in ref.argv
    assert ref.output.name == "coli_ref.dll"
