"""What the Linux and the Windows command builders share: the sources and headers
each artifact is built from, the variables that steer a ROCm toolchain from the
outside, and nvcc's -gencode for a list of arches."""

from __future__ import annotations

__all__ = [
    "BACKEND_HEADERS",
    "C_WARNINGS",
    "GEN_HEADERS",
    "GPU_SOURCES",
    "HOST_HEADERS",
    "HOST_SOURCES",
    "MINGW_DEFINES",
    "REF_SOURCES",
    "ROCM_VARIABLES",
    "cuda_gencode",
]

HOST_SOURCES = (
    "engine/main.c",
    "engine/clock.c",
    "engine/utf8.c",
    "engine/loader.c",
    "engine/hip_binding.c",
    "engine/imports.c",
    "engine/device_code.c",
    "engine/doctor.c",
    "engine/doctor_system.c",
    "engine/selftest.c",
    "engine/selftest_ops.c",
    "engine/json_out.c",
    "engine/json.c",
    "engine/safetensors.c",
    "engine/model_load.c",
    "engine/model_forward.c",
    "engine/model_step.c",
    "engine/model_bytes.c",
    "engine/model_latent.c",
    "engine/pool.c",
    "engine/progress.c",
    "kernels/cpu_ops.c",
    "kernels/cpu_model_ops.c",
)
HOST_HEADERS = (
    "engine/clock.h",
    "engine/loader.h",
    "engine/utf8.h",
    "engine/hip_binding.h",
    "engine/imports.h",
    "engine/device_code.h",
    "engine/doctor.h",
    "engine/doctor_system.h",
    "engine/selftest.h",
    "engine/selftest_ops.h",
    "engine/json_out.h",
    "engine/json.h",
    "engine/safetensors.h",
    "engine/model.h",
    "engine/model_latent.h",
    "engine/pool.h",
    "engine/progress.h",
    "kernels/cpu_ops.h",
    "kernels/cpu_model_ops.h",
)
REF_SOURCES = ("kernels/backend_ref.c", "kernels/cpu_ops.c", "kernels/cpu_model_ops.c")
GPU_SOURCES = ("kernels/backend_gpu.cu",)
BACKEND_HEADERS = (
    "kernels/backend_common.h",
    "kernels/backend_tensors.h",
    "kernels/backend_steps.h",
    "kernels/backend_step_types.h",
    "kernels/cpu_ops.h",
    "kernels/cpu_model_ops.h",
    "kernels/gpu_compat.h",
    "kernels/gpu_launch.cuh",
    "kernels/gpu_formats.cuh",
    "kernels/gpu_simple.cuh",
    "kernels/gpu_gemv.cuh",
    "kernels/gpu_tile.cuh",
    "kernels/gpu_decode.cuh",
    "kernels/gpu_mma.cuh",
    "kernels/gpu_gemm.cuh",
    "kernels/gpu_decode_bulk.cuh",
    "kernels/gpu_decode_mma.cuh",
    "kernels/gpu_decode_tiled.cuh",
    "kernels/gpu_dispatch.cuh",
    "kernels/gpu_steps.cuh",
    "kernels/gpu_experts.cuh",
    "kernels/gpu_attention.cuh",
    "kernels/gpu_step_run.cuh",
    "kernels/step_plan.h",
)
GEN_HEADERS = ("coli_backend.h", "coli_backend_table.h", "coli_ops.h")

# Variables that steer a ROCm toolchain from the outside; the HIP compile clears
# them so only the SDK this build resolved can be used.
ROCM_VARIABLES = (
    "ROCM_PATH",
    "ROCM_HOME",
    "HIP_PATH",
    "HIP_DEVICE_LIB_PATH",
    "HIP_PLATFORM",
    "HIP_COMPILER",
    "HIP_RUNTIME",
    "HIP_CLANG_PATH",
    "HIP_ROCCLR_HOME",
    "HSA_PATH",
    "DEVICE_LIB_PATH",
    "HIPCC_COMPILE_FLAGS_APPEND",
    "HIPCC_LINK_FLAGS_APPEND",
)

C_WARNINGS = ("-std=c11", "-Wall", "-Wextra")
# MinGW's default printf is msvcrt's, which lacks %zu and %lld; use its C99 one.
MINGW_DEFINES = ("-D__USE_MINGW_ANSI_STDIO=1",)


# nvcc compiles each -gencode target on a thread of its own (0: as many as the CPUs):
# the same bytes as one thread, and a two-arch backend's compile about half the wall time
NVCC_THREADS = ("--threads", "0")


def cuda_gencode(arches: tuple[str, ...]) -> list[str]:
    """SASS for every arch, and PTX of the newest so newer GPUs can JIT it."""
    out: list[str] = []
    for i, arch in enumerate(arches):
        num = arch.removeprefix("sm_")
        code = f"[sm_{num},compute_{num}]" if i == len(arches) - 1 else f"sm_{num}"
        out += ["-gencode", f"arch=compute_{num},code={code}"]
    return out
