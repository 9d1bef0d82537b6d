"""`coli doctor`, the real host beside the fake HIP backend and the stub runtimes
(which report the GPUs a test chooses): on Linux natively, on Windows (MinGW
builds) under Wine. Every verdict is made to happen; the backend carries device
code from a real clang offload bundle (plain, and compressed), and on Linux the
system's own libamdhip64 (Debian's ROCm) is the one found in the system folders."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import need_tool
from tests.loader_fixtures import (
    LINUX,
    OBJCOPY,
    PLATFORMS,
    WINDOWS,
    Fixtures,
    build,
    build_host,
    compile_c,
    other_sdk_backend,
)
from toolchain.wine import warm

pytestmark = [pytest.mark.slow, pytest.mark.loader_contract]

CLANG = "clang++-19"
ARCHES = ("gfx1100", "gfx1151")
IGPU = "AMD Radeon(TM) 8060S Graphics|gfx1151|1|68719476736"
DGPU = "AMD Radeon RX 7900 XTX|gfx1100|0|25769803776"
RDNA4 = "AMD Radeon RX 9070 XT|gfx1201|0|17179869184"


@dataclass
class Doctor:
    fx: Fixtures
    package: Path  # coli and its HIP backend, whose device code is gfx1100 and gfx1151

    def folder(self, name: str, *, backend: Path | None = None) -> Path:
        """Another package folder: this coli, and `backend` (if any) as its HIP backend."""
        where = self.fx.root / name
        where.mkdir()
        shutil.copy(self.package / f"coli{self.fx.platform.exe}", where)
        if backend is not None:
            shutil.copy(backend, where / self.fx.platform.backend)
        return where

    def run(
        self, *, runtime: str | None = "A", gpus: str | None = IGPU, folder: Path | None = None,
        text: bool = False, env: dict[str, str] | None = None,
    ) -> tuple[int, Any, str]:  # fmt: skip
        """coli doctor [--json] with COLI_HIP_RUNTIME_DIR naming runtime A, B or lean (a key),
        or the text given, or unset (None); the stub runtimes report `gpus`."""
        p = self.fx.platform
        full = {k: v for k, v in os.environ.items() if not k.startswith(("COLI_", "LD_PRELOAD"))}
        full["WINEDEBUG"] = "-all"
        if runtime is not None:
            full["COLI_HIP_RUNTIME_DIR"] = self.fx.dir_of(runtime) if runtime in self.fx.runtimes else runtime
        if gpus is not None:
            full["COLI_STUB_GPUS"] = gpus
        full.update(env or {})
        host = (folder or self.package) / f"coli{p.exe}"
        argv = [str(host), "doctor", *([] if text else ["--json"])]
        if p.under_wine:
            argv.insert(0, "wine")
            warm(["wine"])
        proc = subprocess.run(argv, capture_output=True, env=full, timeout=120)
        out = proc.stdout.decode("utf-8", "replace").replace("\r\n", "\n")
        err = proc.stderr.decode("utf-8", "replace")
        if text:
            return proc.returncode, out, err
        try:
            return proc.returncode, json.loads(out), err
        except json.JSONDecodeError:  # the run's own words, not only the parser's
            raise AssertionError(f"{argv}: exit {proc.returncode}, no JSON in {out!r}; stderr: {err!r}") from None


def bundle(where: Path, *, compress: bool) -> Path:
    """A real clang offload bundle of one kernel for ARCHES (zstd-compressed with compress)."""
    src = where / "k.hip"
    src.write_text("__attribute__((global)) void k(float *x) { x[0] = 1.0f; }\n")
    out = where / ("kc.hipfb" if compress else "k.hipfb")
    argv = [CLANG, "-x", "hip", "--cuda-device-only", *(f"--offload-arch={a}" for a in ARCHES), "-nogpulib",
            "-nogpuinc", *(["--offload-compress"] if compress else []), "-c", str(src), "-o", str(out)]  # fmt: skip
    subprocess.run(argv, check=True, capture_output=True)
    return out


def with_device_code(fx: Fixtures, backend: Path, code: Path, out: Path) -> Path:
    """`backend` with `code` as its device-code section, where clang's HIP builds put it."""
    if not fx.platform.windows:
        subprocess.run(["objcopy", "--add-section", f".hip_fatbin={code}", str(backend), str(out)], check=True)
        return out
    import pefile

    # a PE section is mapped: it goes just past the image, where the loader expects the next one
    pe = pefile.PE(str(backend), fast_load=True)
    end = pe.OPTIONAL_HEADER.ImageBase + pe.OPTIONAL_HEADER.SizeOfImage
    pe.close()
    flags = ["--set-section-flags", ".hip_fat=contents,alloc,load,readonly,data"]
    place = ["--change-section-address", f".hip_fat={end:#x}"]
    subprocess.run([OBJCOPY, "--add-section", f".hip_fat={code}", *flags, *place, str(backend), str(out)], check=True)
    return out


@pytest.fixture(scope="module", params=PLATFORMS)
def doc(request: pytest.FixtureRequest, gen_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Doctor]:
    platform = LINUX if request.param == "linux" else WINDOWS
    need_tool(platform.cc, CLANG, *(["wine"] if platform.under_wine else []))
    base = tmp_path_factory.mktemp(f"doctor-{platform.name}")
    fx = build(platform, base, gen_dir)
    package = fx.root / "package ü"
    package.mkdir()
    build_host(fx, gen_dir, package)
    with_device_code(fx, fx.app / platform.backend, bundle(base, compress=False), package / platform.backend)
    yield Doctor(fx, package)
    shutil.rmtree(base)


def problems(report: dict[str, Any]) -> list[str]:
    return [v["code"] for v in report["verdicts"] if v["level"] == "problem"]


def warnings(report: dict[str, Any]) -> list[str]:
    return [v["code"] for v in report["verdicts"] if v["level"] == "warning"]


def verdict(report: dict[str, Any], code: str) -> dict[str, str]:
    (v,) = [v for v in report["verdicts"] if v["code"] == code]
    return dict(v)


def hip_backend(report: dict[str, Any]) -> dict[str, Any]:
    (b,) = [b for b in report["backends"] if b["api"] == "hip"]
    return dict(b)


def test_a_working_package(doc: Doctor) -> None:
    """The runtime configured, the GPU's arch inside the backend: no problem, exit 0, and
    everything the report names is what the files and the runtime say."""
    p = doc.fx.platform
    rc, r, _ = doc.run()
    assert rc == 0 and r["ok"] is True and problems(r) == [], r["verdicts"]
    assert r["platform"]["arch"] == "x86_64" and r["platform"]["os"].startswith("Windows" if p.windows else "Linux")
    assert (r["platform"]["wine"] is not None) == p.under_wine
    assert r["folder"] == p.host_path(doc.package)
    b = hip_backend(r)
    assert (b["present"], b["abi"], b["name"], b["hip_runtime"]) == (True, r["abi"], "hip-stub-A", p.runtime), b
    assert sorted(b["device_code"]) == list(ARCHES) and b["compressed_bundles"] == 0
    assert b["runtime"] == {"version": 70125424, "driver_version": 70125424, "driver_too_old": False, "error": None}
    assert b["gpus"] == [{"index": 0, "name": "AMD Radeon(TM) 8060S Graphics", "arch": "gfx1151",
                          "total_memory": 68719476736, "integrated": True, "has_code": True}]  # fmt: skip
    hip = r["hip"]
    assert hip["runtime_name"] == p.runtime and hip["runtime_dir"] == doc.fx.dir_of("A")
    assert hip["configured"] == p.host_path(doc.fx.runtimes["A"]) and hip["decision"] == "load"
    assert hip["mapped"] == [] and hip["error"] is None
    assert [x["api"] for x in r["backends"] if x["present"]] == ["hip"]


def test_the_text_report_says_the_same(doc: Doctor) -> None:
    rc, text, _ = doc.run(gpus=RDNA4, text=True)
    _, r, _ = doc.run(gpus=RDNA4)
    assert rc == 1
    for v in r["verdicts"]:
        assert f"  {v['level']} [{v['code']}] {v['problem']}; fix: {v['fix']}\n" in text, text
    for needle in ("backend ABI", "decision               load", "gfx1201", "code no", doc.fx.dir_of("A")):
        assert needle in text, (needle, text)


@pytest.mark.parametrize("value", [None, "", "runtime"])
def test_the_runtime_folder(doc: Doctor, value: str | None) -> None:
    """Unset, empty or relative: the binding's own words, the backend not opened, and a
    fix that names the runtime."""
    p = doc.fx.platform
    rc, r, _ = doc.run(runtime=value)
    assert rc == 1 and problems(r) == ["runtime-folder"], r["verdicts"]
    v = verdict(r, "runtime-folder")
    assert v["problem"] == {None: "COLI_HIP_RUNTIME_DIR is not set", "": "COLI_HIP_RUNTIME_DIR is set but empty",
                            "runtime": "COLI_HIP_RUNTIME_DIR 'runtime' is a relative path"}[value]  # fmt: skip
    assert v["fix"].startswith(f"set COLI_HIP_RUNTIME_DIR to the absolute path of the folder holding {p.runtime}")
    assert r["hip"]["decision"] is None and r["hip"]["error"].startswith("[HIP] COLI_HIP_RUNTIME_DIR")
    assert hip_backend(r)["abi"] is None and hip_backend(r)["gpus"] is None


def test_an_arch_the_package_does_not_carry(doc: Doctor) -> None:
    rc, r, _ = doc.run(gpus=RDNA4)
    assert rc == 1 and problems(r) == ["arch-not-carried"]
    v = verdict(r, "arch-not-carried")
    assert v["problem"] == (
        f"GPU 0 (AMD Radeon RX 9070 XT, gfx1201) has no code in {doc.fx.platform.backend}, which carries "
        f"{', '.join(hip_backend(r)['device_code'])}"
    )
    assert v["fix"] == "install the package built for gfx1201 (doit build arch=gfx1201)"
    assert hip_backend(r)["gpus"][0]["has_code"] is False


def test_another_gpu_carries_code(doc: Doctor) -> None:
    """GPU 0 has no code but GPU 1 does: the fix is --device 1."""
    rc, r, _ = doc.run(gpus=f"{RDNA4};{DGPU}")
    assert rc == 1 and problems(r) == ["arch-not-carried"]
    assert verdict(r, "arch-not-carried")["fix"].startswith("run with --device 1 (AMD Radeon RX 7900 XTX, gfx1100")


def test_an_integrated_gpu_before_a_discrete_one(doc: Doctor) -> None:
    """A warning, not a problem: the iGPU runs, but the discrete GPU is there too."""
    rc, r, _ = doc.run(gpus=f"{IGPU};{DGPU}")
    assert rc == 0 and problems(r) == [] and "integrated-first" in warnings(r)
    v = verdict(r, "integrated-first")
    assert v["fix"] == "run with --device 1 to use the discrete GPU"
    assert "integrated AMD Radeon(TM) 8060S Graphics" in v["problem"]


def test_no_gpu_and_an_old_driver(doc: Doctor) -> None:
    rc, r, _ = doc.run(gpus="")
    assert rc == 1 and problems(r) == ["no-gpu"]
    assert "hipErrorNoDevice" in verdict(r, "no-gpu")["problem"] and hip_backend(r)["gpus"] == []
    rc, r, _ = doc.run(env={"COLI_STUB_DRIVER": "old"})
    assert rc == 1 and problems(r) == ["old-driver"]
    assert "(version 60000000) is older than it needs" in verdict(r, "old-driver")["problem"]
    assert hip_backend(r)["runtime"]["driver_too_old"] is True


def test_a_runtime_the_backend_cannot_use(doc: Doctor) -> None:
    """The lean runtime lacks a procedure the backend imports: the binding loads it, the
    backend does not map, and the loader's line is the problem. Wine binds the missing
    import to a stub that stops the process when called (test_loader_contract's
    test_a_runtime_missing_a_procedure_is_refused): there, the line the doctor leaves on
    stderr before it binds says what it was doing."""
    if doc.fx.platform.under_wine:
        rc, out, err = doc.run(runtime="lean", text=True)
        assert "verdict" not in out and "unimplemented function" in err and "coli_stub_runtime_extra" in err, err
        assert (
            f"coli doctor: binding {doc.fx.platform.host_path(doc.fx.runtimes['lean'])} to ask it for its GPUs" in err
        )
        return
    rc, r, _ = doc.run(runtime="lean")
    assert rc == 1 and problems(r) == ["backend-refused"], r["verdicts"]
    assert r["hip"]["decision"] == "load" and hip_backend(r)["abi"] is None
    assert verdict(r, "backend-refused")["problem"].startswith("[HIP] ")


def test_compressed_device_code(doc: Doctor) -> None:
    """clang --offload-compress: the arches cannot be listed without inflating, so it is a
    warning and no GPU is judged by its arch."""
    fx = doc.fx
    packed = with_device_code(fx, fx.app / fx.platform.backend, bundle(fx.root, compress=True), fx.root / "packed")
    rc, r, _ = doc.run(gpus=RDNA4, folder=doc.folder("compressed", backend=packed))
    assert rc == 0 and problems(r) == [] and "code-compressed" in warnings(r), r["verdicts"]
    b = hip_backend(r)
    assert (b["device_code"], b["compressed_bundles"], b["gpus"][0]["has_code"]) == ([], 1, None)


def test_no_gpu_backend_and_a_damaged_one(doc: Doctor) -> None:
    fx = doc.fx
    rc, r, _ = doc.run(folder=doc.folder("cpu only"))
    assert rc == 1 and problems(r) == ["no-gpu-backend"] and r["hip"] is None
    junk = fx.root / "junk"
    junk.write_bytes(b"MZ" + bytes(200))
    rc, r, _ = doc.run(folder=doc.folder("damaged", backend=junk))
    assert rc == 1 and problems(r) == ["backend-unreadable"]
    assert "its import table cannot be read" in verdict(r, "backend-unreadable")["problem"]


def test_a_backend_of_another_hip_sdk(doc: Doctor) -> None:
    p = doc.fx.platform
    backend, _, other = other_sdk_backend(doc.fx)
    rc, r, _ = doc.run(folder=doc.folder("six", backend=backend))
    assert rc == 1 and problems(r) == ["runtime-mismatch"]
    assert verdict(r, "runtime-mismatch")["problem"] == f"{p.backend} imports {other}, but this coli binds {p.runtime}"


@pytest.mark.parametrize("doc", ["linux"], indirect=True)
def test_runtimes_already_mapped_are_refused(doc: Doctor, tmp_path: Path) -> None:
    """Linux only: a preloaded runtime is in the process before coli starts (a Windows
    program cannot be given a preload; the harness's --preload covers Windows). LD_PRELOAD
    splits at spaces, so each runtime is preloaded through a hard link (the same file)."""
    fx = doc.fx
    for key in ("A", "B"):
        (tmp_path / key).mkdir()
        os.link(fx.runtimes[key], tmp_path / key / fx.platform.runtime)
    a, b = (str(tmp_path / key / fx.platform.runtime) for key in ("A", "B"))
    rc, r, _ = doc.run(env={"LD_PRELOAD": b})
    assert rc == 1 and problems(r) == ["runtime-refused"]
    assert r["hip"]["decision"] == "reject-different" and [m["path"] for m in r["hip"]["mapped"]] == [b]
    assert "a different libamdhip64.so.5 is already loaded" in verdict(r, "runtime-refused")["problem"]
    rc, r, _ = doc.run(env={"LD_PRELOAD": f"{a}:{b}"})
    assert rc == 1 and r["hip"]["decision"] == "reject-multiple" and problems(r) == ["runtime-refused"]
    rc, r, _ = doc.run(env={"LD_PRELOAD": a})  # the configured one already mapped: reused
    assert rc == 0 and r["hip"]["decision"] == "reuse" and hip_backend(r)["name"] == "hip-stub-A", r["verdicts"]


def test_the_runtimes_the_system_holds(doc: Doctor, tmp_path: Path) -> None:
    """Linux: Debian's own libamdhip64.so.5 (ROCm 5.2) in the system folders, another file
    than the configured one: listed with its version, and a warning. Windows: a runtime
    of another major put into Wine's System32 for the test, with its version resource."""
    p = doc.fx.platform
    if not p.windows:
        rc, r, _ = doc.run()
        system = {s["path"]: s for s in r["hip"]["system"]}
        debian = system["/usr/lib/x86_64-linux-gnu/libamdhip64.so.5"]
        assert debian["version"].startswith("5.") and debian["configured"] is False
        assert rc == 0 and "system-runtime" in warnings(r)
        assert verdict(r, "system-runtime")["problem"].startswith("/usr/lib/x86_64-linux-gnu/libamdhip64.so.5 (5.")
        rc, r, _ = doc.run(runtime=None)  # the fix names that folder, the driver's runtime
        assert "or /usr/lib/x86_64-linux-gnu for the driver's own (5." in verdict(r, "runtime-folder")["fix"]
        return
    prefix = Path(os.environ.get("WINEPREFIX", Path.home() / ".wine"))
    system32 = prefix / "drive_c" / "windows" / "system32"
    rc_file = tmp_path / "v.rc"
    rc_file.write_text(
        "1 VERSIONINFO FILEVERSION 6,2,41133,0 PRODUCTVERSION 6,2,41133,0\nBEGIN\n"
        ' BLOCK "StringFileInfo"\n BEGIN\n  BLOCK "040904b0"\n  BEGIN\n'
        '   VALUE "FileVersion", "6.2.41133.0\\0"\n  END\n END\n'
        ' BLOCK "VarFileInfo"\n BEGIN\n  VALUE "Translation", 0x409, 1200\n END\nEND\n'
    )
    windres = p.cc.removesuffix("gcc") + "windres"  # MinGW's, beside its gcc
    subprocess.run([windres, str(rc_file), "-O", "coff", "-o", str(tmp_path / "v.o")], check=True)
    (tmp_path / "rt.c").write_text("int six(void) { return 6; }\n")
    dll = system32 / "amdhip64_6.dll"
    assert not dll.exists(), "Wine's System32 already holds an amdhip64_6.dll"
    try:
        compile_c(p, "-shared", tmp_path / "rt.c", tmp_path / "v.o", "-o", dll)
        rc, r, _ = doc.run()
        (s,) = r["hip"]["system"]
        assert s == {"path": "C:\\windows\\system32\\amdhip64_6.dll", "version": "6.2.41133.0", "configured": False}
        assert rc == 0 and problems(r) == [] and "system-runtime" not in warnings(r)  # another name than the one bound
    finally:
        dll.unlink(missing_ok=True)
