from __future__ import annotations

from pathlib import Path

from tests.unit.fakes import cuda_toolkit, hip_sdk, script
from toolchain.config import load_config
from toolchain.discover import CudaToolkit, HipSdk, Missing, discover
from toolchain.probe import Prober

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = ROOT / "configs" / "default.toml"


def _discover(tmp_path: Path, env: dict[str, str]) -> tuple[HipSdk | Missing, CudaToolkit | Missing]:
    env = {"PATH": str(tmp_path / "empty-path"), **env}
    rc = load_config(DEFAULT, env, {})
    tc = discover(rc, env, Prober(tmp_path / "probes.json"))
    return tc.hip, tc.cuda


def test_hip_sdk_root_and_version(tmp_path: Path) -> None:
    root = hip_sdk(tmp_path / "rocm")
    hip, _ = _discover(tmp_path, {"HIP_SDK_ROOT": str(root)})
    assert isinstance(hip, HipSdk)
    assert hip.root == root
    assert hip.version == "6.2.4"
    assert hip.compiler == root / "llvm/bin/clang++"
    assert hip.compiler_version == "AMD clang version 18.0.0git"
    assert hip.sources["root"] == "env HIP_SDK_ROOT"
    assert hip.supports("gfx1030") and not hip.supports("gfx1151")
    msg = hip.unsupported("gfx1151")
    assert "HIP SDK 6.2.4" in msg and "oclc_isa_version_1151.bc" in msg and "gfx1030, gfx90a" in msg


def test_hip_path_is_a_fallback_with_backslashes_normalised(tmp_path: Path) -> None:
    root = hip_sdk(tmp_path / "rocm")
    hip, _ = _discover(tmp_path, {"HIP_PATH": str(root).replace("/", "\\")})
    assert isinstance(hip, HipSdk)
    assert hip.root == root
    assert hip.sources["root"] == "env HIP_PATH"


def test_hip_sdk_root_wins_over_hip_path(tmp_path: Path) -> None:
    a, b = hip_sdk(tmp_path / "a"), hip_sdk(tmp_path / "b")
    hip, _ = _discover(tmp_path, {"HIP_SDK_ROOT": str(a), "HIP_PATH": str(b), "ROCM_PATH": str(b)})
    assert isinstance(hip, HipSdk) and hip.root == a


def test_each_component_is_overridable(tmp_path: Path) -> None:
    """A split layout (TheRock-like): runtime, headers, bitcode and compiler in different places."""
    root = hip_sdk(tmp_path / "root")
    other = hip_sdk(tmp_path / "other", arches=("gfx1151",))
    clang = script(tmp_path / "tools/bin/clang++", "clang version 20")
    script(tmp_path / "tools/bin/clang-offload-bundler", "")
    env = {
        "HIP_SDK_ROOT": str(root),
        "HIP_INCLUDE_DIR": str(other / "include"),
        "HIP_LIB_DIR": str(other / "lib"),
        "HIP_DEVICE_LIB_PATH": str(other / "amdgcn/bitcode"),
        "HIPCC": str(clang),
        "HIP_BIN_DIR": str(tmp_path / "tools/bin"),
    }
    hip, _ = _discover(tmp_path, env)
    assert isinstance(hip, HipSdk)
    assert hip.include_dir == other / "include"
    assert hip.lib_dir == other / "lib"
    assert hip.device_lib_dir == other / "amdgcn/bitcode"
    assert hip.compiler == clang
    assert hip.bin_dir == tmp_path / "tools/bin"
    assert hip.supports("gfx1151") and not hip.supports("gfx1030")
    assert hip.sources["device_lib_dir"] == "env HIP_DEVICE_LIB_PATH"
    assert hip.sources["compiler"] == "env HIPCC"


def test_a_wrong_override_says_what_is_missing(tmp_path: Path) -> None:
    root = hip_sdk(tmp_path / "rocm")
    hip, _ = _discover(tmp_path, {"HIP_SDK_ROOT": str(root), "HIP_DEVICE_LIB_PATH": str(tmp_path)})
    assert isinstance(hip, Missing)
    assert "has no ocml.bc" in hip.reason and "env HIP_DEVICE_LIB_PATH" in hip.reason
    assert hip.hint.startswith("apt-get install ")


def test_compiler_without_offload_bundler_is_refused(tmp_path: Path) -> None:
    root = hip_sdk(tmp_path / "rocm")
    (root / "llvm/bin/clang-offload-bundler").unlink()
    hip, _ = _discover(tmp_path, {"HIP_SDK_ROOT": str(root)})
    assert isinstance(hip, Missing) and "clang-offload-bundler" in hip.reason


def test_cuda_home_and_arch_list(tmp_path: Path) -> None:
    home = cuda_toolkit(tmp_path / "cuda", arches=(75, 80, 90))
    _, cuda = _discover(tmp_path, {"CUDA_HOME": str(home)})
    assert isinstance(cuda, CudaToolkit)
    assert cuda.version == "12.8"
    assert cuda.gpu_arches == ("sm_75", "sm_80", "sm_90")
    assert cuda.supports("sm_90") and cuda.supports("sm_90a") and not cuda.supports("sm_100")
    assert cuda.source == "env CUDA_HOME"


def test_missing_nvcc_is_missing_not_an_exception(tmp_path: Path) -> None:
    _, cuda = _discover(tmp_path, {"NVCC": str(tmp_path / "nope/nvcc")})
    assert isinstance(cuda, Missing)
    assert "no nvcc" in cuda.reason and "env NVCC" in cuda.reason


def test_version_probes_are_cached_by_tool_identity(tmp_path: Path) -> None:
    tool = script(tmp_path / "t", "v1")
    prober = Prober(tmp_path / "cache.json")
    assert prober.run(tool, "--version") == "v1\n"
    prober.save()
    again = Prober(tmp_path / "cache.json")
    assert again.run(tool, "--version") == "v1\n"
    script(tool, "v2.0.1")  # a new tool at the same path (size and mtime change): asked again
    assert again.run(tool, "--version") == "v2.0.1\n"


def test_the_runtime_name_is_the_sdks_soname(tmp_path: Path) -> None:
    """ROCm 5, 6 and 7 each install libamdhip64.so as a link to libamdhip64.so.<major>.<...>,
    whose DT_SONAME (libamdhip64.so.5, .6, .7) is what a backend records in DT_NEEDED and so
    what the host's binding must look for: read from a real ELF object built here."""
    import subprocess

    from tests.conftest import need_tool

    need_tool("gcc")
    (tmp_path / "rt.c").write_text("int hipInit(unsigned f) { return (int)f; }\n")
    for major in (5, 6, 7):
        root = hip_sdk(tmp_path / f"rocm-{major}", version=(major, 2, 0))
        real = root / f"lib/libamdhip64.so.{major}.2.0"
        subprocess.run(["gcc", "-shared", "-fPIC", f"-Wl,-soname,libamdhip64.so.{major}", str(tmp_path / "rt.c"),
                        "-o", str(real)], check=True)  # fmt: skip
        (root / "lib/libamdhip64.so").unlink()
        (root / "lib/libamdhip64.so").symlink_to(real.name)
        hip, _ = _discover(tmp_path, {"HIP_SDK_ROOT": str(root)})
        assert isinstance(hip, HipSdk) and hip.runtime_name == f"libamdhip64.so.{major}", hip
