"""The configuration, one frozen pydantic model per TOML table.

Each field's description is its documentation: `doit config` and the option
reference are generated from these models.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from ..arches import arch_table

__all__ = [
    "BuildSection",
    "Config",
    "CudaSection",
    "HipSection",
    "HostSection",
    "PackageSection",
    "ProfileSection",
    "ReleaseSection",
    "ReleaseTarget",
    "ValidateSection",
    "WindowsSection",
]


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


def _check_arches(values: tuple[str, ...]) -> tuple[str, ...]:
    """The arches, each family's name (toolchain/data/arches.toml) given as its members."""
    table = arch_table()
    values = tuple(a for v in values for a in (table.members(v) or (v,)))
    problem = table.unknown(values)
    if problem:
        raise ValueError(problem)
    if len(set(values)) != len(values):
        raise ValueError(f"arch listed twice in {list(values)}")
    return values


class BuildSection(_Section):
    os: Literal["linux", "windows"] = Field("linux", description="Target OS; windows cross-builds with MinGW-w64.")
    arch: tuple[str, ...] = Field(
        (),
        description="Architectures to build: cpu, gfx* (HIP; AMD target ids such as gfx90a:xnack- too), sm_* "
        "(CUDA; sm_90a and sm_100f arch- and family-specific targets too), or a family of them by name "
        "(rdna2, hopper: toolchain/data/arches.toml). Unset: cpu plus each API's default_arches that the "
        "installed SDK supports; arch= given empty is an error.",
    )
    profile: str = Field("release", description="Name of a [profiles.*] table.")
    build_dir: str = Field(
        "build",
        description="Where intermediate and final artifacts go, relative to the project: a folder of its own "
        "(`doit clean-build` empties it), not the project's, one holding it or one holding files git tracks.",
    )
    dist_dir: str = Field(
        "dist", description="Where packages go, relative to the project: a folder of its own, as build_dir."
    )

    _arches = field_validator("arch")(classmethod(lambda cls, v: _check_arches(v)))

    @field_validator("build_dir", "dist_dir")
    @classmethod
    def _named(cls, v: str, info: ValidationInfo) -> str:
        """An empty folder would be the project's own (toolchain/config/folders.py checks the rest)."""
        if not v.strip():
            name = info.field_name or ""
            default = cls.model_fields[name].default
            raise ValueError(f"empty; leave {name}= out for the default ('{default}'), or name a folder")
        return v


class HostSection(_Section):
    cc: str | None = Field(None, description="Host C compiler; unset: gcc (linux) or x86_64-w64-mingw32-gcc.")


class HipSection(_Section):
    sdk_root: str | None = Field(
        None, description="HIP SDK root (env HIP_SDK_ROOT); unset: HIP_PATH, ROCM_PATH, /opt/rocm, /usr."
    )
    bin_dir: str | None = Field(None, description="SDK bin directory (env HIP_BIN_DIR); unset: <root>/bin.")
    include_dir: str | None = Field(None, description="Directory holding hip/hip_runtime.h (env HIP_INCLUDE_DIR).")
    lib_dir: str | None = Field(None, description="Directory holding the HIP runtime library (env HIP_LIB_DIR).")
    device_lib_dir: str | None = Field(
        None, description="Directory of the amdgcn device bitcode (env HIP_DEVICE_LIB_PATH)."
    )
    compiler: str | None = Field(
        None, description="HIP-capable clang++ (env HIPCC); unset: the SDK's, then clang++-19."
    )
    bundle_runtime: bool = Field(
        False, description="Put the HIP runtime library into HIP packages (off: users name their own runtime)."
    )
    offload_compress: bool = Field(
        False,
        description="Compress the offload bundles (clang --offload-compress) where the compiler supports it; "
        "verify inflates them to prove each arch's code is inside.",
    )
    default_arches: tuple[str, ...] = Field(
        ("gfx1030", "gfx90a", "gfx1100", "gfx1151"),
        description="gfx targets of the default build; those the SDK cannot build are skipped with a note.",
    )

    _arches = field_validator("default_arches")(classmethod(lambda cls, v: _check_arches(v)))


class CudaSection(_Section):
    home: str | None = Field(
        None, description="CUDA toolkit root (env CUDA_HOME or CUDA_PATH); unset: nvcc on PATH, /usr/local/cuda."
    )
    compiler: str | None = Field(None, description="nvcc to use (env NVCC); unset: <home>/bin/nvcc.")
    default_arches: tuple[str, ...] = Field(("sm_80", "sm_90"), description="sm targets of the default build.")

    _arches = field_validator("default_arches")(classmethod(lambda cls, v: _check_arches(v)))


class WindowsSection(_Section):
    mingw_prefix: str = Field("x86_64-w64-mingw32-", description="Prefix of the MinGW-w64 cross tools.")
    msvc_toolset: str = Field(
        "14.44.35207",
        pattern=r"^\d+\.\d+\.\d+$",
        description="The MSVC toolset the Windows GPU backends are built with (vcvarsall -vcvars_ver).",
    )
    wine: str = Field("wine", description="Wine launcher used to run Windows artifacts on Linux.")


class ValidateSection(_Section):
    models: tuple[str, ...] = Field(
        ("tests/fixtures/models/glm_tiny", "tests/fixtures/models/glm_tiny2"),
        description="Reference models (config.json, safetensors and expected.json from tools/oracle), "
        "relative to the project.",
    )
    quants: tuple[Literal["f32", "int8", "int4"], ...] = Field(
        ("f32", "int8", "int4"), description="Weight formats at which each backend must match the CPU path."
    )


class CacheSection(_Section):
    launcher: Literal["none", "ccache", "sccache"] = Field(
        "none",
        description="Compiler launcher that caches objects (env COLI_CACHE): each compile runs as "
        "`<launcher> <compiler> ...`, so another build folder, machine or CI run with the same cache reuses them.",
    )
    dir: str = Field(
        ".cache/compiler",
        description="The launcher's cache folder (CCACHE_DIR / SCCACHE_DIR; env COLI_CACHE_DIR), "
        "relative to the project.",
    )
    remote: str = Field(
        "",
        description="A cache store shared between machines, a Redis URL (redis://host:port[/db]; env "
        "COLI_CACHE_REMOTE): sccache keeps its objects there instead of in dir, ccache there besides dir; "
        "fanned-out release jobs pointed at one store compile each object once.",
    )

    @field_validator("remote")
    @classmethod
    def _redis_url(cls, v: str) -> str:
        if v and not re.fullmatch(r"rediss?://[^\s/]+(/\d+)?", v):
            raise ValueError(
                f"'{v}' is not a Redis URL; write redis://host:port[/db] (rediss:// for TLS), or leave it empty"
            )
        return v


TargetName = Literal["linux-ref", "linux-hip", "linux-cuda", "windows-ref", "windows-hip", "windows-cuda"]


class ReleaseTarget(_Section):
    groups: tuple[str | tuple[str, ...], ...] = Field(
        (),
        description="Arch groups, one package each: a list of arches, or the name of a [release.groups] group "
        "or of an arch family (toolchain/data/arches.toml). A ref target may leave it empty (cpu).",
    )
    bundle_hip_runtime: bool | None = Field(None, description="Overrides hip.bundle_runtime for this target.")


class ReleaseSection(_Section):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$", description="Release name, used in the CI workflow's name.")
    targets: dict[TargetName, ReleaseTarget] = Field(
        description="The matrix: platform-API (" + ", ".join(get_args(TargetName)) + ") -> its arch groups."
    )
    groups: dict[str, tuple[str, ...]] = Field(
        default_factory=dict, description="Named arch groups that targets refer to by name."
    )
    sdk: dict[Literal["hip", "cuda"], str] = Field(
        default_factory=dict,
        description='SDK versions the release is built with (e.g. hip = "6.4"); every arch of every target '
        "must be supported by them, checked at load against toolchain/data/arches.toml.",
    )
    require_all: bool = Field(
        False,
        description="Fail when an entry cannot be built on this machine; off: the manifest records it as "
        "not-built with what it needs.",
    )
    only: tuple[str, ...] = Field(
        (),
        description="Build and publish only these entry ids (doit variable entry=; CI fans out with it). "
        "Empty: every entry.",
    )
    lock: str = Field(
        "toolchain.lock",
        description="The toolchain lockfile, relative to the project: `doit lock` writes it; a release whose "
        "toolchains differ from it stops before it builds, naming each difference.",
    )
    lock_mode: Literal["check", "update"] = Field(
        "check", description="update (doit variable lock=update): rewrite the lock from the toolchains found."
    )
    sign: tuple[str, ...] = Field(
        (),
        description="A command that signs the release's provenance statement before it is published, "
        "{file} standing for the statement and {signature} for where the signature goes "
        '(e.g. ["cosign", "sign-blob", "--yes", "--output-signature", "{signature}", "{file}"]). '
        "Empty: the statement is published unsigned.",
    )
    runners: dict[TargetName, str] = Field(
        default_factory=dict,
        description="GitHub Actions runner label per target for `doit ci-workflow` (defaults in "
        "toolchain/data/ci.toml).",
    )


class PackageSection(_Section):
    max_bytes: int = Field(
        2**31,
        gt=0,
        description="The largest a package's archive may be, in bytes. A larger one fails the package task "
        "with the sizes of its device code per arch and is not kept. The default is GitHub's 2 GiB limit on "
        "a release asset; a release splits a target's arches into packages with its groups.",
    )
    max_bytes_by_api: dict[Literal["ref", "hip", "cuda"], Annotated[int, Field(gt=0)]] = Field(
        default_factory=dict, description="The budget of one API's packages, in place of max_bytes."
    )

    def budget(self, api: str) -> int:
        """The most bytes a package of `api` may take."""
        return next((n for a, n in self.max_bytes_by_api.items() if a == api), self.max_bytes)


class ProfileSection(_Section):
    cflags: tuple[str, ...] = Field(("-O2",), description="Flags for C compiles (host and reference backend).")
    gpu_flags: tuple[str, ...] = Field(("-O2",), description="Flags for the CUDA/HIP compile.")


def _default_profiles() -> dict[str, ProfileSection]:
    return {
        "release": ProfileSection(),
        "debug": ProfileSection(cflags=("-O0", "-g"), gpu_flags=("-O0", "-g")),
    }


class Config(_Section):
    version: str = Field("0.1.0", pattern=r"^\d+\.\d+\.\d+([.+-][0-9A-Za-z.]+)?$", description="Package version.")
    build: BuildSection = Field(default_factory=BuildSection)
    host: HostSection = Field(default_factory=HostSection)
    hip: HipSection = Field(default_factory=HipSection)
    cuda: CudaSection = Field(default_factory=CudaSection)
    windows: WindowsSection = Field(default_factory=WindowsSection)
    validate_: ValidateSection = Field(default_factory=ValidateSection, alias="validate")
    profiles: dict[str, ProfileSection] = Field(default_factory=_default_profiles, description="Named flag sets.")
    cache: CacheSection = Field(default_factory=CacheSection)
    package: PackageSection = Field(default_factory=PackageSection)
    release: ReleaseSection | None = Field(
        None, description="The release matrix that `doit release` builds (configs/release-*.toml)."
    )

    @property
    def profile(self) -> ProfileSection:
        return self.profiles[self.build.profile]
