"""Compile and link command lines, as data: pure functions of the plan, so the
exact commands are golden-testable and run the same way in every task."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .command_data import (
    BACKEND_HEADERS,
    C_WARNINGS,
    GEN_HEADERS,
    GPU_SOURCES,
    HOST_HEADERS,
    HOST_SOURCES,
    MINGW_DEFINES,
    NVCC_THREADS,
    REF_SOURCES,
    ROCM_VARIABLES,
    cuda_gencode,
)
from .commands_windows import hip_environment, windows_cuda_argv, windows_hip_argv
from .discover import HipSdk
from .plan import BackendSpec, Plan
from .windows_sdk import WinHipSdk

__all__ = [
    "HOST_SOURCES",
    "REF_SOURCES",
    "GPU_SOURCES",
    "Command",
    "backend_command",
    "backend_inputs",
    "cuda_program_command",
    "host_command",
    "sanitized_env",
]


@dataclass(frozen=True)
class Command:
    argv: tuple[str, ...]
    output: Path
    env: Mapping[str, str] = field(default_factory=dict)  # overrides
    unset: tuple[str, ...] = ()
    cwd: Path | None = None
    before: tuple[tuple[str, ...], ...] = ()  # steps run first: same env, and cwd unless staged
    mkdirs: tuple[Path, ...] = ()  # build-local folders the steps write to (objects, TMPDIR)
    # (name, source) pairs copied to a folder named by their content (staging.py), where
    # the `before` steps then run: a compile that names its sources' folder, cached.
    stage: tuple[tuple[str, Path], ...] = ()


def _prefix_maps(plan: Plan) -> list[str]:
    """Map every build-machine path the compiler sees onto a fixed one."""
    maps = [f"-ffile-prefix-map={plan.root}=."]
    if not plan.build_dir.is_relative_to(plan.root):
        maps.append(f"-ffile-prefix-map={plan.build_dir}=build")
    return maps


def _nvcc_pass(flag: str, options: list[str]) -> list[str]:
    """nvcc re-splits -Xcompiler/-Xlinker values on spaces and commas; one option
    per flag, double-quoted when it holds a space (a project path like '/tmp/my builds')."""
    out: list[str] = []
    for opt in options:
        out += [flag, f'"{opt}"' if " " in opt else opt]
    return out


def _relative(plan: Plan, flags: tuple[str, ...]) -> bool:
    """Under a compiler cache the compiles run from the checkout with paths relative to it
    and no -ffile-prefix-map: a checkout at another path then hashes the same (the cache
    rewrites path arguments to its base folder, not the map's value, which names the
    checkout). Not where -g would record the folder a compile ran in, nor where the build
    folder is outside the checkout."""
    cache = plan.rc.config.cache.launcher != "none"
    return cache and "-g" not in flags and plan.build_dir.is_relative_to(plan.root)


def _at(plan: Plan, path: Path | str, relative: bool) -> str:
    """`path` (a Path, or relative to the checkout) as a compile line names it."""
    full = plan.root / path if isinstance(path, str) else path
    return str(full.relative_to(plan.root)) if relative else str(full)


def launcher(plan: Plan) -> tuple[list[str], dict[str, str]]:
    """The compiler cache in front of each compile (cache.launcher), and its settings: the cache
    folder, the project as the base folder its paths hash relative to (so a checkout elsewhere
    hits the same objects), and the shared store (cache.remote) when there is one."""
    cache = plan.rc.config.cache
    if cache.launcher == "none":
        return [], {}
    folder = str((plan.root / cache.dir).absolute())
    if cache.launcher == "ccache":
        env = {"CCACHE_DIR": folder, "CCACHE_BASEDIR": str(plan.root), "CCACHE_NOHASHDIR": "1"}
        return ["ccache"], env | ({"CCACHE_REMOTE_STORAGE": cache.remote} if cache.remote else {})
    env = {"SCCACHE_DIR": folder, "SCCACHE_BASEDIRS": str(plan.root)}
    return ["sccache"], env | ({"SCCACHE_REDIS_ENDPOINT": cache.remote} if cache.remote else {})


def _compile_apart(
    plan: Plan, cc: list[str], flags: list[str], sources: tuple[str, ...], objdir: Path, relative: bool
) -> tuple[tuple[tuple[str, ...], ...], list[str]]:
    """One compile per source (so a compiler cache can serve each), and the objects to link."""
    front, _ = launcher(plan)
    steps, objs = [], []
    for src in sources:
        obj = objdir / (Path(src).stem + ".o")
        steps.append((*front, *cc, *flags, "-c", _at(plan, src, relative), "-o", _at(plan, obj, relative)))
        objs.append(str(obj))
    return tuple(steps), objs


def host_command(plan: Plan, output: Path) -> Command:
    cfg = plan.rc.config
    rel = _relative(plan, cfg.profile.cflags)
    flags = [
        *C_WARNINGS,
        *cfg.profile.cflags,
        *([] if rel else _prefix_maps(plan)),
        *(MINGW_DEFINES if plan.windows else ()),
        f'-DCOLI_VERSION="{cfg.version}"',
        *_runtime_name(plan),
        f"-I{_at(plan, plan.gen_dir, rel)}",
        f"-I{_at(plan, 'kernels', rel)}",
        f"-I{_at(plan, 'engine', rel)}",
    ]
    objdir = plan.build_dir / "tmp" / plan.platform / "host"
    steps, objs = _compile_apart(plan, [str(plan.host_cc.path)], flags, HOST_SOURCES, objdir, rel)
    argv = [str(plan.host_cc.path), *cfg.profile.cflags, *objs, "-o", str(output)]
    if plan.windows:
        argv += ["-static", "-Wl,--no-insert-timestamp", "-lshell32", "-lversion"]
    else:
        argv += ["-Wl,--build-id=none"]
    argv += ["-lm", "-lpthread"]
    return Command(
        tuple(argv), output, launcher(plan)[1], cwd=plan.root if rel else None, before=steps, mkdirs=(objdir,)
    )


def _runtime_name(plan: Plan) -> list[str]:
    """The HIP runtime the host's binding contract looks for: the one the SDK that
    builds its HIP backends links them against (its soname on Linux, its
    amdhip64_<N>.dll on Windows), else the engine's default. It depends on the SDK
    found, not on the arches asked for, so one host serves every backend."""
    hip, win = plan.toolchains.hip, plan.toolchains.win_hip
    if plan.windows:
        return [f'-DCOLI_HIP_RUNTIME_NAME="{win.runtime_dll}"'] if isinstance(win, WinHipSdk) else []
    return [f'-DCOLI_HIP_RUNTIME_NAME="{hip.runtime_name}"'] if isinstance(hip, HipSdk) else []


def backend_inputs(plan: Plan, spec: BackendSpec) -> list[Path]:
    sources = REF_SOURCES if spec.api == "ref" else GPU_SOURCES
    gen = [plan.gen_dir / h for h in GEN_HEADERS] + [
        plan.gen_dir / "coli_backend.map",
        plan.gen_dir / "coli_backend.def",
    ]
    return [plan.root / s for s in (*sources, *BACKEND_HEADERS)] + gen


def sanitized_env(plan: Plan, tmp: Path) -> tuple[dict[str, str], tuple[str, ...]]:
    """HIP compile environment: HIP_PATH is the resolved SDK, other ROCm steering cleared."""
    return (
        {"HIP_PATH": str(plan.hip.root), "TMPDIR": str(tmp), "TMP": str(tmp), "TEMP": str(tmp)},
        tuple(v for v in ROCM_VARIABLES if v != "HIP_PATH"),
    )


def backend_command(plan: Plan, spec: BackendSpec, output: Path) -> Command:
    cfg = plan.rc.config
    includes = [f"-I{plan.gen_dir}", f"-I{plan.root / 'kernels'}"]
    if spec.api == "ref":
        rel = _relative(plan, cfg.profile.cflags)
        maps = [] if rel else _prefix_maps(plan)
        flags = [*C_WARNINGS, *cfg.profile.cflags, *maps, *(MINGW_DEFINES if plan.windows else ())]
        if not plan.windows:
            flags += ["-fPIC", "-fvisibility=hidden"]
        objdir = plan.build_dir / "tmp" / plan.platform / spec.key
        rel_includes = [f"-I{_at(plan, plan.gen_dir, rel)}", f"-I{_at(plan, 'kernels', rel)}"]
        steps, objs = _compile_apart(plan, [str(plan.host_cc.path)], [*flags, *rel_includes], REF_SOURCES, objdir, rel)
        argv = [str(plan.host_cc.path), *cfg.profile.cflags, "-shared", *objs, "-o", str(output)]
        if plan.windows:
            # ld derives a DLL's automatic image base from its output path, which differs from folder to folder
            argv += [str(plan.gen_dir / "coli_backend.def"), "-static-libgcc", "-Wl,--no-insert-timestamp"]
            argv += ["-Wl,--disable-auto-image-base"]
        else:
            argv += [f"-Wl,--version-script={plan.gen_dir / 'coli_backend.map'}", "-Wl,--build-id=none"]
        argv += ["-lm"]
        return Command(
            tuple(argv), output, launcher(plan)[1], cwd=plan.root if rel else None, before=steps, mkdirs=(objdir,)
        )
    if plan.windows and spec.api in ("hip", "cuda"):
        return _windows_gpu_command(plan, spec, output)
    if spec.api == "cuda":
        gencode = cuda_gencode(spec.arches)
        # nvcc records its device-link command (with -L <toolkit>) inside each
        # cubin; run from its own bin directory as ./nvcc, the toolkit path it
        # derives, and so records, is relative.
        bin_dir = (plan.cuda.home / "bin").resolve()
        local = bin_dir / "nvcc"
        nvcc, cwd = ("./nvcc", bin_dir) if local.is_file() else (str(plan.cuda.nvcc), None)
        # A one-step nvcc build embeds its temporary files' names (tmpxft_<pid>_...):
        # compile apart with the intermediates named after a build-local object
        # (-objtemp) and a fixed seed for generated names, then link.
        obj = plan.build_dir / "tmp" / spec.key / "backend_gpu.o"
        front, cache_env = launcher(plan)
        # Cached, the compile runs in a copy of its sources at a path their content names
        # (staging.py), so a checkout elsewhere gives the same nvcc steps, each a hit.
        stage: tuple[tuple[str, Path], ...] = ()
        if _relative(plan, cfg.profile.gpu_flags):
            stage = tuple((name, plan.root / name) for name in (*GPU_SOURCES, *BACKEND_HEADERS))
            stage += tuple((f"gen/{h}", plan.gen_dir / h) for h in GEN_HEADERS)
            compiler, includes, source, maps = str(plan.cuda.nvcc), ["-Igen", "-Ikernels"], GPU_SOURCES[0], []
        else:
            compiler, source, maps = nvcc, _at(plan, GPU_SOURCES[0], False), _prefix_maps(plan)
        compile_step = (
            *front,
            compiler,
            "-std=c++17",
            *cfg.profile.gpu_flags,
            "-c",
            "-objtemp",
            "-frandom-seed=coli_backend_gpu",
            *NVCC_THREADS,
            *_nvcc_pass("-Xcompiler", ["-fPIC", "-fvisibility=hidden", "-Wall", "-Wextra", *maps]),
            *gencode,
            *includes,
            source,
            "-o",
            str(obj),
        )
        argv = [
            nvcc,
            "-shared",
            *_nvcc_pass("-Xlinker", [f"--version-script={plan.gen_dir / 'coli_backend.map'}", "--build-id=none"]),
            *gencode,
            str(obj),
            "-o",
            str(output),
        ]
        return Command(
            tuple(argv), output, cache_env, cwd=cwd, before=(compile_step,), mkdirs=(obj.parent,), stage=stage
        )
    hip = plan.hip
    tmp = plan.build_dir / "tmp" / spec.key
    rel = _relative(plan, cfg.profile.gpu_flags)
    compress = ["--offload-compress"] if cfg.hip.offload_compress and hip.offload_compress else []
    env, unset = sanitized_env(plan, tmp)
    obj = tmp / "backend_gpu.o"
    front, cache_env = launcher(plan)
    compile_step = (
        *front,
        str(hip.compiler),
        "-x",
        "hip",
        "-std=c++17",
        *cfg.profile.gpu_flags,
        *(f"--offload-arch={a}" for a in spec.arches),
        *compress,
        f"--rocm-path={hip.root}",
        f"--rocm-device-lib-path={hip.device_lib_dir}",
        # --rocm-path already puts <root>/include in place; only a split layout needs more
        *(["-isystem", str(hip.include_dir)] if hip.include_dir != hip.root / "include" else []),
        "-Wall",
        "-Wextra",
        *([] if rel else _prefix_maps(plan)),
        # clang derives the compilation-unit id from the source path by default,
        # which makes the library differ from folder to folder
        "-cuid=coli_backend_gpu",
        "-fPIC",
        "-fvisibility=hidden",
        f"-I{_at(plan, plan.gen_dir, rel)}",
        f"-I{_at(plan, 'kernels', rel)}",
        "-c",
        _at(plan, GPU_SOURCES[0], rel),
        "-o",
        _at(plan, obj, rel),
    )
    argv = [
        str(hip.compiler),
        "-shared",
        "-fuse-ld=lld",
        str(obj),
        "-o",
        str(output),
        f"-L{hip.lib_dir}",
        "-lamdhip64",
        f"-Wl,--version-script={plan.gen_dir / 'coli_backend.map'}",
        "-Wl,--build-id=none",
    ]
    return Command(
        tuple(argv),
        output,
        {**env, **cache_env},
        unset,
        cwd=plan.root if rel else None,
        before=(compile_step,),
        mkdirs=(tmp,),
    )


def cuda_program_command(
    plan: Plan, arches: tuple[str, ...], source: Path, output: Path, extra: tuple[str, ...] = ()
) -> Command:
    """A CUDA program built on the backend's sources (the GPU bench, which includes
    backend_gpu.cu): the nvcc this plan found, the backend's standard, warnings,
    includes and -gencode for `arches`, then `extra` (its optimisation, more -I)."""
    argv = [
        str(plan.cuda.nvcc),
        "-std=c++17",
        *_nvcc_pass("-Xcompiler", ["-Wall", "-Wextra"]),
        *cuda_gencode(arches),
        f"-I{plan.gen_dir}",
        f"-I{plan.root / 'kernels'}",
        *extra,
        str(source),
        "-o",
        str(output),
    ]
    return Command(tuple(argv), output)


def host_inputs(plan: Plan) -> list[Path]:
    return [plan.root / s for s in (*HOST_SOURCES, *HOST_HEADERS)] + [plan.gen_dir / h for h in GEN_HEADERS]


def _windows_gpu_command(plan: Plan, spec: BackendSpec, output: Path) -> Command:
    """coli_hip.dll / coli_cuda.dll on a Windows build host, against the pinned MSVC."""
    import os
    from pathlib import PureWindowsPath

    win = PureWindowsPath
    root, gen, out = win(str(plan.root)), win(str(plan.gen_dir)), win(str(output))
    flags = plan.rc.config.profile.gpu_flags
    if spec.api == "hip":
        tmp = win(str(plan.build_dir / "tmp" / spec.key))
        sdk = plan.win_hip
        assert plan.msvc is not None
        full = hip_environment(sdk, plan.msvc, tmp, os.environ.get("SYSTEMROOT", r"C:\Windows"))
        packed = ("--offload-compress",) if plan.rc.config.hip.offload_compress and sdk.offload_compress else ()
        argv = windows_hip_argv(sdk, spec.arches, root, gen, out, (*flags, *packed))
    else:
        full = dict(plan.msvc_env)
        argv = windows_cuda_argv(win(str(plan.cuda.nvcc)), spec.arches, root, gen, out, flags)
    env = {k: v for k, v in full.items() if v is not None}
    unset = tuple(k for k, v in full.items() if v is None)
    return Command(tuple(argv), output, env, unset, mkdirs=(plan.build_dir / "tmp" / spec.key,))
