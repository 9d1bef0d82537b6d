"""The exact command lines, checked against the plan they come from."""

from __future__ import annotations

from pathlib import Path

from tests.unit.test_plan import _plan
from toolchain.command_data import GPU_SOURCES, HOST_SOURCES, ROCM_VARIABLES
from toolchain.commands import backend_command, host_command


def test_hip_command_uses_every_resolved_component(tmp_path: Path) -> None:
    plan = _plan(tmp_path, {"arch": "gfx1030,gfx90a"})
    spec = plan.backends[0]
    cmd = backend_command(plan, spec, plan.backend_lib(spec))
    (compile_step,) = cmd.before
    argv = list(cmd.argv)
    hip = plan.hip
    assert compile_step[0] == str(hip.compiler) and argv[0] == str(hip.compiler)
    assert compile_step[1:3] == ("-x", "hip")
    assert "--offload-arch=gfx1030" in compile_step and "--offload-arch=gfx90a" in compile_step
    assert f"--rocm-path={hip.root}" in compile_step
    assert f"--rocm-device-lib-path={hip.device_lib_dir}" in compile_step
    assert f"-ffile-prefix-map={tmp_path}=." in compile_step
    assert "-cuid=coli_backend_gpu" in compile_step
    assert "--offload-compress" not in compile_step  # off unless hip.offload_compress
    obj = compile_step[compile_step.index("-o") + 1]
    assert obj in argv and Path(obj).parent in cmd.mkdirs
    assert f"-L{hip.lib_dir}" in argv and "-lamdhip64" in argv
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
    # the arches compiled side by side (the same bytes as one at a time)
    assert compile_step[compile_step.index("--threads") + 1] == "0"
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
    assert "-Wl,--no-insert-timestamp" in host.argv
    assert all("-D__USE_MINGW_ANSI_STDIO=1" in step for step in host.before)
    ref = backend_command(plan, plan.backends[0], plan.backend_lib(plan.backends[0]))
    assert str(plan.gen_dir / "coli_backend.def") in ref.argv
    assert ref.output.name == "coli_ref.dll"


def test_each_source_compiles_apart_and_the_cache_launcher_fronts_every_compile(tmp_path: Path) -> None:
    plan = _plan(tmp_path, {"arch": "cpu,gfx1030,sm_90"})
    host = host_command(plan, plan.host_exe)
    assert len(host.before) == len(HOST_SOURCES) and all("-c" in step for step in host.before)
    assert not host.env  # no launcher unless configured
    cached = _plan(tmp_path, {"arch": "cpu,gfx1030,sm_90", "cache": "ccache"})
    cache_dir = str(tmp_path / ".cache" / "compiler")
    host = host_command(cached, cached.host_exe)
    assert all(step[0] == "ccache" for step in host.before) and host.argv[0] != "ccache"  # not the link
    assert host.env["CCACHE_DIR"] == cache_dir and host.env["CCACHE_BASEDIR"] == str(tmp_path)
    # under a cache the compiles name the checkout's files relative to it and run from it, with no
    # -ffile-prefix-map (whose value names the checkout), so another checkout hashes the same
    assert host.cwd == tmp_path and all(str(tmp_path) not in arg for step in host.before for arg in step[2:])
    assert host.before[0][-4:-2] == ("-c", "engine/main.c") and not any("prefix-map" in a for a in host.before[0])
    debug = host_command(_plan(tmp_path, {"arch": "cpu", "cache": "ccache", "profile": "debug"}), cached.host_exe)
    assert debug.cwd is None and any("-ffile-prefix-map=" in a for a in debug.before[0])  # -g records the folder
    for spec in cached.backends:
        cmd = backend_command(cached, spec, cached.backend_lib(spec))
        assert cmd.before and all(step[0] == "ccache" for step in cmd.before), spec.key
        assert cmd.env["CCACHE_DIR"] == cache_dir
    # the CUDA compile runs in a copy of its sources (nvcc hands its steps the source's absolute
    # path), named relative to it; the link still runs from nvcc's own folder
    cuda = next(s for s in cached.backends if s.api == "cuda")
    cmd = backend_command(cached, cuda, cached.backend_lib(cuda))
    assert all(str(tmp_path) not in arg for arg in cmd.before[0][2:-1]) and cmd.before[0][-3] == GPU_SOURCES[0]
    assert dict(cmd.stage)[GPU_SOURCES[0]] == tmp_path / GPU_SOURCES[0] and "gen/coli_ops.h" in dict(cmd.stage)
    assert not backend_command(plan, cuda, plan.backend_lib(cuda)).stage  # uncached: compiled in place
    sc = _plan(tmp_path, {"arch": "cpu", "cache": "sccache"})
    ref = backend_command(sc, sc.backends[0], sc.backend_lib(sc.backends[0]))
    assert ref.before[0][0] == "sccache" and ref.env == {"SCCACHE_DIR": cache_dir, "SCCACHE_BASEDIRS": str(tmp_path)}
    # a shared store: sccache's objects go there, ccache's there too
    remote = tmp_path / "remote.toml"
    remote.write_text('[cache]\nremote = "redis://127.0.0.1:6379"\n')
    sc = _plan(tmp_path, {"arch": "cpu", "cache": "sccache"}, config=remote)
    assert backend_command(sc, sc.backends[0], sc.backend_lib(sc.backends[0])).env["SCCACHE_REDIS_ENDPOINT"] == (
        "redis://127.0.0.1:6379"
    )
    cc = _plan(tmp_path, {"arch": "cpu", "cache": "ccache"}, config=remote)
    assert host_command(cc, cc.host_exe).env["CCACHE_REMOTE_STORAGE"] == "redis://127.0.0.1:6379"


def test_offload_compress_where_the_compiler_has_it(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[hip]\noffload_compress = true\n")
    plan = _plan(tmp_path, {"arch": "gfx1030"}, config=config)
    (compile_step,) = backend_command(plan, plan.backends[0], plan.backend_lib(plan.backends[0])).before
    assert "--offload-compress" in compile_step


def test_a_cuda_program_is_built_as_the_backend_is(tmp_path: Path) -> None:
    """The GPU bench's compile (python -m toolchain.program): the plan's nvcc, the backend's
    includes and -gencode, then the caller's flags."""
    from toolchain.commands import cuda_program_command

    plan = _plan(tmp_path, {"arch": "sm_90"})
    cmd = cuda_program_command(plan, ("sm_90",), tmp_path / "bench.cu", tmp_path / "bench", ("-O3", "-Itools"))
    assert cmd.argv[0] == str(plan.cuda.nvcc)
    assert cmd.argv[-3:] == (str(tmp_path / "bench.cu"), "-o", str(tmp_path / "bench"))
    assert "arch=compute_90,code=[sm_90,compute_90]" in cmd.argv
    assert f"-I{plan.gen_dir}" in cmd.argv and cmd.argv.index("-O3") > cmd.argv.index(f"-I{plan.gen_dir}")
