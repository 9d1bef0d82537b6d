"""Fake SDK trees and tools for discovery tests: real files, made on the fly."""

from __future__ import annotations

from pathlib import Path


def script(path: Path, stdout: str) -> Path:
    """An executable that prints `stdout` for any arguments."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\ncat <<'EOF'\n" + stdout + "\nEOF\n")
    path.chmod(0o755)
    return path


def hip_sdk(
    root: Path, arches: tuple[str, ...] = ("gfx1030", "gfx90a"), version: tuple[int, int, int] = (6, 2, 4)
) -> Path:
    """A ROCm-like tree: include/hip, lib/libamdhip64.so, amdgcn/bitcode, llvm/bin/clang++."""
    (root / "include/hip").mkdir(parents=True, exist_ok=True)
    (root / "include/hip/hip_runtime.h").write_text("")
    major, minor, patch = version
    (root / "include/hip/hip_version.h").write_text(
        f"#define HIP_VERSION_MAJOR {major}\n#define HIP_VERSION_MINOR {minor}\n#define HIP_VERSION_PATCH {patch}\n"
    )
    (root / "lib").mkdir(exist_ok=True)
    (root / "lib/libamdhip64.so").write_text("")
    bitcode = root / "amdgcn/bitcode"
    bitcode.mkdir(parents=True, exist_ok=True)
    (bitcode / "ocml.bc").write_text("")
    for a in arches:
        (bitcode / f"oclc_isa_version_{a.removeprefix('gfx')}.bc").write_text("")
    script(root / "llvm/bin/clang++", "AMD clang version 18.0.0git")
    script(root / "llvm/bin/clang-offload-bundler", "")
    return root


def cuda_toolkit(home: Path, arches: tuple[int, ...] = (80, 90)) -> Path:
    (home / "include").mkdir(parents=True, exist_ok=True)
    (home / "include/cuda_runtime.h").write_text("")
    listing = "\n".join(f"compute_{a}" for a in arches)
    nvcc = home / "bin/nvcc"
    nvcc.parent.mkdir(parents=True, exist_ok=True)
    nvcc.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "--list-gpu-arch" ]; then\n'
        f"cat <<'EOF'\n{listing}\nEOF\n"
        "else\necho 'Cuda compilation tools, release 12.8, V12.8.61'\nfi\n"
    )
    nvcc.chmod(0o755)
    return home
