"""The Windows HIP SDK discovery and the Windows backend commands, against
recorded SDK trees (the AMD installer's and TheRock's layouts), recorded
`hipcc --version` outputs and a recorded vcvarsall environment. None of this
runs here: a Windows machine with the HIP SDK and MSVC is needed for that."""

from __future__ import annotations

from pathlib import Path, PureWindowsPath

import pytest

from toolchain.commands_windows import hip_environment, windows_cuda_argv, windows_hip_argv
from toolchain.config import load_config
from toolchain.discover import Missing
from toolchain.msvc import Msvc, VsInstall, parse_env_dump
from toolchain.windows_sdk import Probe, WinHipSdk, find_windows_hip

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "windows"
ROOT = Path(__file__).resolve().parents[2]
AMD = PureWindowsPath(r"C:\Program Files\AMD\ROCm\6.4")
ROCK = PureWindowsPath(r"C:\TheRock\build")


def probe_for(trees: dict[PureWindowsPath, str], hipcc: dict[PureWindowsPath, str]) -> Probe:
    files: set[PureWindowsPath] = set()
    for root, listing in trees.items():
        for line in (FIX / "sdk" / listing).read_text().splitlines():
            if line and not line.startswith("#"):
                files.add(root / line)
    dirs = {p for f in files for p in f.parents}

    def exists(p: PureWindowsPath) -> bool:
        return p in files or p in dirs

    def listdir(p: PureWindowsPath) -> list[str]:
        return sorted({c.relative_to(p).parts[0] for c in files | dirs if p in c.parents})

    def run(tool: PureWindowsPath, args: tuple[str, ...]) -> str | None:
        return (FIX / "sdk" / hipcc[tool]).read_text() if tool in hipcc and args == ("--version",) else None

    return Probe(exists, listdir, run)


def find(env: dict[str, str], probe: Probe) -> WinHipSdk | Missing:
    rc = load_config(ROOT / "configs/default.toml", env, {})
    return find_windows_hip(rc.config.hip, rc.origin, env, probe)


AMD_PROBE = probe_for({AMD: "amd-hip-sdk-6.4.txt"}, {AMD / "bin/hipcc.exe": "hipcc-version-6.4.txt"})
ROCK_PROBE = probe_for({ROCK: "therock-7.txt"}, {ROCK / "bin/hipcc.exe": "hipcc-version-therock.txt"})
AMD62, AMD71 = AMD.parent / "6.2", AMD.parent / "7.1"
SDKS = {
    "amd-6.2": (AMD62, probe_for({AMD62: "amd-hip-sdk-6.2.txt"}, {AMD62 / "bin/hipcc.exe": "hipcc-version-6.2.txt"})),
    "amd-6.4": (AMD, AMD_PROBE),
    "amd-7.1": (AMD71, probe_for({AMD71: "amd-hip-sdk-7.1.txt"}, {AMD71 / "bin/hipcc.exe": "hipcc-version-7.1.txt"})),
    "therock-7": (ROCK, ROCK_PROBE),
}


def test_amd_installer_layout_found_without_any_setting() -> None:
    sdk = find({}, AMD_PROBE)
    assert isinstance(sdk, WinHipSdk)
    assert sdk.root == AMD and sdk.version == "6.4.43484-123eb3b7d"
    assert sdk.compiler == AMD / "bin/clang++.exe" and sdk.device_lib_dir == AMD / "amdgcn/bitcode"
    assert sdk.runtime_dll == "amdhip64_6.dll" and sdk.arch_tool == AMD / "bin/hipInfo.exe"
    assert sdk.supports("gfx1151") and not sdk.supports("gfx90a")
    assert sdk.sources["root"] == r"newest in C:\Program Files\AMD\ROCm"


@pytest.mark.parametrize(
    ("which", "version", "runtime", "compiler", "devlib"),
    [("amd-6.2", "6.2.41512-db3292736", "amdhip64_6.dll", "bin/clang++.exe", "amdgcn/bitcode"),
     ("amd-7.1", "7.1.25424-4179531dcd", "amdhip64_7.dll", "lib/llvm/bin/clang++.exe", "lib/llvm/amdgcn/bitcode")],
)  # fmt: skip
def test_each_installer_layout(which: str, version: str, runtime: str, compiler: str, devlib: str) -> None:
    """The 6.2 installer keeps clang++ and the device libraries at the root, as 6.4 does;
    the 7.x one, built from TheRock, under lib\\llvm. Each names its own runtime."""
    root, probe = SDKS[which]
    sdk = find({}, probe)
    assert isinstance(sdk, WinHipSdk) and sdk.root == root and sdk.version == version
    assert sdk.runtime_dll == runtime and sdk.compiler == root / compiler and sdk.device_lib_dir == root / devlib


def test_the_newest_installed_sdk_is_found() -> None:
    trees = {AMD62: "amd-hip-sdk-6.2.txt", AMD: "amd-hip-sdk-6.4.txt", AMD71: "amd-hip-sdk-7.1.txt"}
    sdk = find({}, probe_for(trees, {}))
    assert isinstance(sdk, WinHipSdk) and sdk.root == AMD71 and sdk.runtime_dll == "amdhip64_7.dll"


def test_therock_layout_from_hip_path_with_forward_slashes() -> None:
    sdk = find({"HIP_PATH": "C:/TheRock/build"}, ROCK_PROBE)
    assert isinstance(sdk, WinHipSdk)
    assert sdk.root == ROCK and sdk.sources["root"] == "env HIP_PATH"
    assert sdk.compiler == ROCK / "lib/llvm/bin/clang++.exe"
    assert sdk.device_lib_dir == ROCK / "lib/llvm/amdgcn/bitcode"
    assert sdk.runtime_dll == "amdhip64_7.dll" and sdk.version == "7.14.60850-9b8f2a51"
    assert sdk.available == ("gfx1100", "gfx1151") and sdk.arch_tool == ROCK / "bin/amdgpu-arch.exe"


def test_components_overridden_one_by_one() -> None:
    probe = probe_for({AMD: "amd-hip-sdk-6.4.txt", ROCK: "therock-7.txt"}, {})
    env = {"HIP_SDK_ROOT": str(AMD), "HIP_DEVICE_LIB_PATH": str(ROCK / "lib/llvm/amdgcn/bitcode"),
           "HIPCC": str(ROCK / "lib/llvm/bin/clang++.exe")}  # fmt: skip
    sdk = find(env, probe)
    assert isinstance(sdk, WinHipSdk)
    assert sdk.include_dir == AMD / "include" and sdk.device_lib_dir == ROCK / "lib/llvm/amdgcn/bitcode"
    assert sdk.compiler == ROCK / "lib/llvm/bin/clang++.exe" and sdk.available == ("gfx1100", "gfx1151")
    assert sdk.sources["device_lib_dir"] == "env HIP_DEVICE_LIB_PATH" and sdk.version == "unknown"


def test_a_wrong_component_names_what_is_missing() -> None:
    sdk = find({"HIP_SDK_ROOT": str(AMD), "HIP_DEVICE_LIB_PATH": r"C:\nowhere"}, AMD_PROBE)
    assert isinstance(sdk, Missing) and r"C:\nowhere (env HIP_DEVICE_LIB_PATH) has no ocml.bc" in sdk.reason


def msvc() -> Msvc:
    env = parse_env_dump((FIX / "vcvars-set.txt").read_text())
    vs = VsInstall(PureWindowsPath(r"C:\Program Files\Microsoft Visual Studio\2022\Community"), "17.14", "VS 2022")
    return Msvc(vs, "14.44.35207", env, "19.44.35207.1")


def test_hip_dll_command_golden() -> None:
    sdk = find({"HIP_PATH": "C:/TheRock/build"}, ROCK_PROBE)
    assert isinstance(sdk, WinHipSdk)
    src = PureWindowsPath(r"D:\src\coli")
    gen = src / "build" / "gen"
    out = src / r"build\windows-x86_64\hip-gfx1151\coli_hip.dll"
    assert windows_hip_argv(sdk, ("gfx1151",), src, gen, out, ("-O2",)) == [
        r"C:\TheRock\build\lib\llvm\bin\clang++.exe", "-x", "hip", "-std=c++17", "-O2", "--offload-arch=gfx1151",
        r"--rocm-path=C:\TheRock\build", r"--rocm-device-lib-path=C:\TheRock\build\lib\llvm\amdgcn\bitcode",
        "-fms-runtime-lib=static", r"-ffile-prefix-map=D:\src\coli=.", "-cuid=coli_backend_gpu",
        r"-ID:\src\coli\build\gen", r"-ID:\src\coli\kernels", r"D:\src\coli\kernels\backend_gpu.cu",
        "-shared", "-o", r"D:\src\coli\build\windows-x86_64\hip-gfx1151\coli_hip.dll",
        r"-LC:\TheRock\build\lib", "-lamdhip64", r"-Wl,/DEF:D:\src\coli\build\gen\coli_backend.def",
        "-Wl,/Brepro", "-Wl,/INCREMENTAL:NO",
    ]  # fmt: skip


def test_hip_environment_is_sanitised() -> None:
    sdk = find({"HIP_PATH": "C:/TheRock/build"}, ROCK_PROBE)
    assert isinstance(sdk, WinHipSdk)
    env = hip_environment(sdk, msvc(), PureWindowsPath(r"D:\src\coli\build\tmp\hip"), r"C:\Windows")
    assert env["HIP_PATH"] == r"C:\TheRock\build"
    for name in ("ROCM_PATH", "ROCM_HOME", "HIP_DEVICE_LIB_PATH", "HIP_PLATFORM", "HIP_CLANG_PATH"):
        assert env[name] is None
    assert env["TMP"] == env["TEMP"] == env["TMPDIR"] == r"D:\src\coli\build\tmp\hip"
    path = str(env["Path"]).split(";")
    assert path[0] == r"C:\TheRock\build\bin" and r"C:\Windows\system32".lower() in (p.lower() for p in path)
    assert env["VCToolsVersion"] == "14.44.35207" and "PATH" not in env


@pytest.mark.parametrize("arches", [("sm_80", "sm_90"), ("sm_90",)])
def test_cuda_dll_command_golden(arches: tuple[str, ...]) -> None:
    src = PureWindowsPath(r"D:\src\coli")
    argv = windows_cuda_argv(PureWindowsPath(r"C:\CUDA\v13.0\bin\nvcc.exe"), arches, src, src / "build/gen",
                             src / "out/coli_cuda.dll", ("-O2",))  # fmt: skip
    assert argv[:6] == [r"C:\CUDA\v13.0\bin\nvcc.exe", "-std=c++17", "-O2", "--threads", "0", "-shared"]
    assert argv[6:8] == ["-Xcompiler", "/MT"] and r"/DEF:D:\src\coli\build\gen\coli_backend.def" in argv
    codes = [argv[i + 1] for i, a in enumerate(argv) if a == "-gencode"]
    assert codes[-1] == f"arch=compute_{arches[-1][3:]},code=[{arches[-1]},compute_{arches[-1][3:]}]"
    assert argv[-2:] == ["-o", r"D:\src\coli\out\coli_cuda.dll"]


def test_hipcc_may_name_the_hipcc_driver() -> None:
    """HIPCC as the seed means it: the SDK's hipcc driver. It is used as the compiler, runs
    this SDK's clang++ (HIP_CLANG_PATH, not one on Path), and `doit toolchain` says so."""
    from toolchain.discover import Toolchains

    sdk = find({"HIP_PATH": "C:/TheRock/build", "HIPCC": r"C:\TheRock\build\bin\hipcc.exe"}, ROCK_PROBE)
    assert isinstance(sdk, WinHipSdk)
    assert (sdk.compiler, sdk.compiler_kind, sdk.clang_dir) == (ROCK / "bin/hipcc.exe", "hipcc", ROCK / "lib/llvm/bin")
    assert "hipcc driver" in sdk.compiler_note and "env HIPCC" in sdk.compiler_note
    src = PureWindowsPath(r"D:\src\coli")
    argv = windows_hip_argv(sdk, ("gfx1151",), src, src / "build/gen", src / "out/coli_hip.dll", ("-O2",))
    assert argv[0] == r"C:\TheRock\build\bin\hipcc.exe" and "--offload-arch=gfx1151" in argv
    env = hip_environment(sdk, msvc(), PureWindowsPath(r"D:\src\coli\build\tmp\hip"), r"C:\Windows")
    assert env["HIP_CLANG_PATH"] == r"C:\TheRock\build\lib\llvm\bin" and env["HIP_PATH"] == str(ROCK)
    gone = Missing("x", "not here", "")
    rows = {c.name: c for c in Toolchains(gone, gone, gone, gone, gone, win_hip=sdk).components()}
    row = rows["hip compiler (hipcc)"]
    assert row.path == r"C:\TheRock\build\bin\hipcc.exe" and "hipcc driver" in row.version
    assert rows["hip runtime"].version == "amdhip64_7.dll"


def test_hipcc_may_name_a_clang() -> None:
    clang = find({"HIP_PATH": "C:/TheRock/build", "HIPCC": r"C:\TheRock\build\lib\llvm\bin\clang++.exe"}, ROCK_PROBE)
    assert (
        isinstance(clang, WinHipSdk) and clang.compiler_kind == "clang++" and "names a clang++" in clang.compiler_note
    )
    unset = find({"HIP_PATH": "C:/TheRock/build"}, ROCK_PROBE)
    assert isinstance(unset, WinHipSdk) and unset.compiler_kind == "clang++" and "run directly" in unset.compiler_note
    env = hip_environment(unset, msvc(), PureWindowsPath(r"D:\tmp"), r"C:\Windows")
    assert env["HIP_CLANG_PATH"] is None


@pytest.mark.parametrize(
    ("hipcc", "words"),
    [
        (r"C:\TheRock\build\bin\nothere.exe", "does not exist"),
        (r"C:\TheRock\build\bin\amdgpu-arch.exe", "neither hipcc"),
    ],
)
def test_a_wrong_hipcc_is_named(hipcc: str, words: str) -> None:
    sdk = find({"HIP_PATH": "C:/TheRock/build", "HIPCC": hipcc}, ROCK_PROBE)
    assert isinstance(sdk, Missing) and hipcc in sdk.reason and "(env HIPCC)" in sdk.reason and words in sdk.reason
