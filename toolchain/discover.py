"""Finding every toolchain component, and recording where each setting came from.

Each finder returns a frozen record or a `Missing` that says what is absent and
how to get it; nothing here raises for a missing tool, because the default build
skips an absent API while an explicit request for it is an error (see plan.py).
"""

from __future__ import annotations

import re
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path, PureWindowsPath

from .arches import base_arch
from .config import ResolvedConfig
from .probe import Prober, which
from .sdk import Missing
from .windows_sdk import Probe, WinHipSdk, find_windows_hip

__all__ = [
    "Component",
    "CudaToolkit",
    "HipSdk",
    "Missing",
    "Tool",
    "Toolchains",
    "discover",
    "install_hint",
]


@cache
def _debian() -> dict[str, object]:
    return tomllib.loads(resources.files("toolchain.data").joinpath("debian.toml").read_text(encoding="utf-8"))


def install_hint(group: str) -> str:
    data = _debian()
    if group in data:
        return "apt-get install " + " ".join(data[group])  # type: ignore[arg-type]
    return "install " + str(data["elsewhere"][group])  # type: ignore[index]


@dataclass(frozen=True)
class Tool:
    """A single executable: a C compiler, Wine."""

    name: str
    path: Path
    version: str
    source: str

    def fingerprint(self) -> dict[str, str]:
        return {"path": str(self.path), "version": self.version}


@dataclass(frozen=True)
class CudaToolkit:
    home: Path
    nvcc: Path
    version: str
    gpu_arches: tuple[str, ...]  # sm_* that `nvcc --list-gpu-arch` accepts
    source: str

    @property
    def location(self) -> str:
        return str(self.home)

    def supports(self, arch: str) -> bool:
        return arch.rstrip("af") in self.gpu_arches

    def fingerprint(self) -> dict[str, str]:
        return {"nvcc": str(self.nvcc), "version": self.version}


@dataclass(frozen=True)
class HipSdk:
    root: Path
    bin_dir: Path
    include_dir: Path
    lib_dir: Path
    device_lib_dir: Path
    compiler: Path
    version: str
    compiler_version: str
    sources: Mapping[str, str] = field(default_factory=dict)
    runtime_name: str = "libamdhip64.so"  # the soname backends record in DT_NEEDED

    @property
    def offload_compress(self) -> bool:
        """Whether the compiler has --offload-compress: upstream clang 18 on, AMD's since clang 17 (ROCm 6.1)."""
        m = re.search(r"clang version (\d+)", self.compiler_version)
        major = int(m.group(1)) if m else 0
        return major >= (17 if "AMD" in self.compiler_version else 18)

    def isa_file(self, arch: str) -> Path:
        return self.device_lib_dir / f"oclc_isa_version_{base_arch(arch).removeprefix('gfx')}.bc"

    @property
    def location(self) -> str:
        return str(self.root)

    def supports(self, arch: str) -> bool:
        return self.isa_file(arch).is_file()

    def available_arches(self) -> list[str]:
        found = [p.stem.removeprefix("oclc_isa_version_") for p in self.device_lib_dir.glob("oclc_isa_version_*.bc")]
        return sorted(f"gfx{n}" for n in found)

    def unsupported(self, arch: str) -> str:
        return (
            f"HIP SDK {self.version} at {self.root} cannot build {arch}: no device library "
            f"{self.isa_file(arch).name} in {self.device_lib_dir} "
            f"(it has {', '.join(self.available_arches()) or 'none'})"
        )

    def fingerprint(self) -> dict[str, str]:
        return {
            "root": str(self.root),
            "version": self.version,
            "compiler": str(self.compiler),
            "compiler_version": self.compiler_version,
            "include_dir": str(self.include_dir),
            "lib_dir": str(self.lib_dir),
            "device_lib_dir": str(self.device_lib_dir),
            "runtime_name": self.runtime_name,
        }


@dataclass(frozen=True)
class Component:
    """One row of `doit toolchain`."""

    name: str
    path: str
    version: str
    source: str
    missing: str = ""


@dataclass(frozen=True)
class Toolchains:
    host_cc: Tool | Missing
    cuda: CudaToolkit | Missing
    hip: HipSdk | Missing
    mingw_cc: Tool | Missing
    wine: Tool | Missing
    win_hip: WinHipSdk | Missing | None = None  # on a Windows build host only

    def components(self) -> list[Component]:
        rows: list[Component] = []

        def add(name: str, item: object, path: str, version: str, source: str) -> None:
            if isinstance(item, Missing):
                rows.append(Component(name, "-", "-", "-", f"{item.reason}; {item.hint}"))
            else:
                rows.append(Component(name, path, version, source))

        for name, tool in (("host cc", self.host_cc), ("mingw cc", self.mingw_cc), ("wine", self.wine)):
            t = tool if isinstance(tool, Tool) else None
            add(name, tool, str(t.path) if t else "", t.version if t else "", t.source if t else "")
        c = self.cuda if isinstance(self.cuda, CudaToolkit) else None
        add("nvcc", self.cuda, str(c.nvcc) if c else "", c.version if c else "", c.source if c else "")
        if c:
            rows.append(Component("cuda arches", str(c.home), " ".join(c.gpu_arches), "nvcc --list-gpu-arch"))
        h = self.hip if isinstance(self.hip, HipSdk) else None
        if h is None:
            add("hip sdk", self.hip, "", "", "")
        else:
            rows.append(Component("hip sdk", str(h.root), h.version, h.sources["root"]))
            rows.append(Component("hip compiler", str(h.compiler), h.compiler_version, h.sources["compiler"]))
            for key in ("bin_dir", "include_dir", "lib_dir", "device_lib_dir"):
                rows.append(Component(f"hip {key.replace('_', ' ')}", str(getattr(h, key)), "", h.sources[key]))
            rows.append(Component("hip arches", str(h.device_lib_dir), " ".join(h.available_arches()), "device libs"))
        w = self.win_hip
        if isinstance(w, Missing):
            add("windows hip sdk", w, "", "", "")
        elif w is not None:
            rows.append(Component("windows hip sdk", str(w.root), w.version, w.sources["root"]))
            rows.append(Component(f"hip compiler ({w.compiler_kind})", str(w.compiler), w.compiler_note,
                                  w.sources["compiler"]))  # fmt: skip
            rows.append(Component("hip runtime", str(w.bin_dir / w.runtime_dll), w.runtime_dll, "the SDK's bin"))
            rows.append(Component("windows hip arches", str(w.device_lib_dir), " ".join(w.available), "device libs"))
        return rows


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0] if text and text.strip() else "unknown"


def _find_tool(
    name: str,
    configured: str | None,
    configured_from: str,
    default: str,
    prober: Prober,
    version_args: tuple[str, ...],
    hint: str,
) -> Tool | Missing:
    wanted = configured or default
    path = Path(wanted) if "/" in wanted else which(wanted)
    source = configured_from if configured else "PATH"
    if path is None or not path.is_file():
        return Missing(
            name, f"'{wanted}' not found" + (f" (set by {configured_from})" if configured else " on PATH"), hint
        )
    out = prober.run(path, *version_args)
    if out is None:
        return Missing(name, f"{path} does not run", hint)
    return Tool(name, path, _first_line(out), source)


def _find_cuda(rc: ResolvedConfig, prober: Prober) -> CudaToolkit | Missing:
    cfg = rc.config.cuda
    hint = install_hint("cuda")
    if cfg.compiler:
        nvcc = Path(cfg.compiler) if "/" in cfg.compiler else which(cfg.compiler)
        source = rc.origin("cuda.compiler")
    elif cfg.home:
        nvcc = Path(cfg.home) / "bin" / "nvcc"
        source = rc.origin("cuda.home")
    elif (on_path := which("nvcc")) is not None:
        nvcc, source = on_path, "PATH"
    else:
        nvcc, source = Path("/usr/local/cuda/bin/nvcc"), "default /usr/local/cuda"
    if nvcc is None or not nvcc.is_file():
        return Missing("nvcc", f"no nvcc at {nvcc or cfg.compiler} ({source})", hint)
    out = prober.run(nvcc, "--version")
    arches = prober.run(nvcc, "--list-gpu-arch")
    if out is None or arches is None:
        return Missing("nvcc", f"{nvcc} does not run", hint)
    m = re.search(r"release (\d+\.\d+)", out)
    sm = tuple(f"sm_{a}" for a in re.findall(r"compute_(\d+)", arches))
    # nvcc on PATH may be a wrapper script; the toolkit is where its headers are
    homes = [Path(cfg.home)] if cfg.home else [nvcc.resolve().parent.parent, Path("/usr/local/cuda")]
    home = next((h for h in homes if (h / "include/cuda_runtime.h").is_file()), homes[0])
    return CudaToolkit(home, nvcc, m.group(1) if m else "unknown", sm, source)


def _hip_version(include_dir: Path) -> str:
    try:
        text = (include_dir / "hip" / "hip_version.h").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "unknown"
    parts = [re.search(rf"#define HIP_VERSION_{k}\s+(\d+)", text) for k in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(m.group(1) for m in parts if m) or "unknown"


def _soname(lib: Path) -> str:
    """DT_SONAME of the HIP runtime (libamdhip64.so.5 on ROCm 5): the name a backend
    links against, and so the name the host's runtime binding looks for."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile

    try:
        with lib.open("rb") as fh:
            for section in ELFFile(fh).iter_sections():
                if isinstance(section, DynamicSection):
                    for tag in section.iter_tags():
                        if tag.entry.d_tag == "DT_SONAME":
                            return str(tag.soname)  # type: ignore[attr-defined]
    except (OSError, ELFError):
        pass
    return lib.resolve().name if lib.exists() else lib.name


def _first_dir(candidates: list[Path], marker: str) -> Path | None:
    for c in candidates:
        if (c / marker).exists():
            return c
    return None


def _find_hip(rc: ResolvedConfig, env: Mapping[str, str], prober: Prober) -> HipSdk | Missing:
    cfg = rc.config.hip
    hint = install_hint("hip")
    sources: dict[str, str] = {}
    if cfg.sdk_root:
        root, sources["root"] = Path(cfg.sdk_root), rc.origin("hip.sdk_root")
    elif env.get("HIP_PATH"):
        root, sources["root"] = Path(env["HIP_PATH"].replace("\\", "/")), "env HIP_PATH"
    elif env.get("ROCM_PATH"):
        root, sources["root"] = Path(env["ROCM_PATH"]), "env ROCM_PATH"
    elif Path("/opt/rocm/include/hip/hip_runtime.h").is_file():
        root, sources["root"] = Path("/opt/rocm"), "default /opt/rocm"
    else:
        root, sources["root"] = Path("/usr"), "default /usr"

    def pick(key: str, configured: str | None, candidates: list[Path], marker: str) -> Path | Missing:
        if configured:
            sources[key] = rc.origin(f"hip.{key}")
            p = Path(configured)
            if not (p / marker).exists():
                return Missing(f"hip {key}", f"{p} ({sources[key]}) has no {marker}", hint)
            return p
        sources[key] = f"found under {root}"
        found = _first_dir(candidates, marker)
        if found is None:
            return Missing(f"hip {key}", f"no {marker} under {root} ({sources['root']})", hint)
        return found

    include = pick("include_dir", cfg.include_dir, [root / "include"], "hip/hip_runtime.h")
    lib = pick("lib_dir", cfg.lib_dir, [root / "lib", root / "lib64", root / "lib/x86_64-linux-gnu"], "libamdhip64.so")
    bitcode_candidates = [
        root / "amdgcn/bitcode",
        root / "lib/amdgcn/bitcode",
        root / "lib/x86_64-linux-gnu/amdgcn/bitcode",
        *sorted((root / "lib/llvm/lib/clang").glob("*/lib/amdgcn/bitcode"), reverse=True),
    ]
    devlib = pick("device_lib_dir", cfg.device_lib_dir, bitcode_candidates, "ocml.bc")
    bin_dir = Path(cfg.bin_dir) if cfg.bin_dir else root / "bin"
    sources["bin_dir"] = rc.origin("hip.bin_dir") if cfg.bin_dir else f"default {root}/bin"
    for item in (include, lib, devlib):
        if isinstance(item, Missing):
            return item
    assert isinstance(include, Path) and isinstance(lib, Path) and isinstance(devlib, Path)

    compiler: Path | None
    if cfg.compiler:
        compiler = Path(cfg.compiler) if "/" in cfg.compiler else which(cfg.compiler)
        sources["compiler"] = rc.origin("hip.compiler")
    else:
        candidates = [root / "llvm/bin/clang++", root / "lib/llvm/bin/clang++", bin_dir / "amdclang++"]
        compiler = next((c for c in candidates if c.is_file()), None)
        sources["compiler"] = f"found under {root}"
        if compiler is None:
            compiler = which("clang++-19") or which("clang++")
            sources["compiler"] = "PATH"
    if compiler is None or not compiler.is_file():
        return Missing("hip compiler", f"no HIP-capable clang++ ({sources['compiler']})", hint)
    out = prober.run(compiler, "--version")
    if out is None:
        return Missing("hip compiler", f"{compiler} does not run", hint)
    bundler = compiler.resolve().parent / "clang-offload-bundler"
    if not bundler.is_file():
        return Missing("hip compiler", f"{compiler} has no clang-offload-bundler beside it", hint)
    return HipSdk(
        runtime_name=_soname(lib / "libamdhip64.so"),
        root=root,
        bin_dir=bin_dir,
        include_dir=include,
        lib_dir=lib,
        device_lib_dir=devlib,
        compiler=compiler,
        version=_hip_version(include),
        compiler_version=_first_line(out),
        sources=sources,
    )


def discover(rc: ResolvedConfig, env: Mapping[str, str], prober: Prober) -> Toolchains:
    cfg = rc.config
    host = _find_tool("host cc", cfg.host.cc, rc.origin("host.cc"), "gcc", prober, ("--version",), install_hint("host"))
    mingw = _find_tool(
        "mingw cc", None, "", f"{cfg.windows.mingw_prefix}gcc", prober, ("--version",), install_hint("mingw")
    )
    wine = _find_tool("wine", None, "", cfg.windows.wine, prober, ("--version",), install_hint("wine"))
    win_hip = None
    if sys.platform == "win32":

        def run(tool: PureWindowsPath, args: tuple[str, ...]) -> str | None:
            return prober.run(Path(str(tool)), *args)

        def listdir(p: PureWindowsPath) -> list[str]:
            d = Path(str(p))
            return [c.name for c in d.iterdir()] if d.is_dir() else []

        probe = Probe(lambda p: Path(str(p)).exists(), listdir, run)
        win_hip = find_windows_hip(cfg.hip, rc.origin, env, probe)
    result = Toolchains(
        host_cc=host,
        cuda=_find_cuda(rc, prober),
        hip=_find_hip(rc, env, prober) if sys.platform != "win32" else Missing("hip sdk", "see win_hip", ""),
        mingw_cc=mingw,
        wine=wine,
        win_hip=win_hip,
    )
    prober.save()
    return result
