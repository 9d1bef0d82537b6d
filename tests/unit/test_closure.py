"""A package's dependency closure (toolchain/closure.py) on real binaries: DLLs that
clang-19 and lld-link-19 build for Windows, one delay-loading another, and ELF
libraries from gcc; and what a bundled runtime brings along from its folder."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import compile_ok, need_tool
from toolchain.closure import closure_problems, runtime_companions
from toolchain.inspect import read_binary

HELPER = "void *__delayLoadHelper2(void *d, void **slot) { (void)d; return *slot; }\n"  # never run: inspected only


def _dll(tmp: Path, name: str, body: str, libs: list[str] = (), delay: list[str] = ()) -> Path:  # type: ignore[assignment]
    """name.dll from C `body` (no CRT, so only what the test names is imported), its
    import library name.lib beside it."""
    src, obj = tmp / f"{name}.c", tmp / f"{name}.o"
    src.write_text(body + (HELPER if delay else ""))
    compile_ok(["clang-19", "--target=x86_64-w64-windows-gnu", "-c", str(src), "-o", str(obj)])
    argv = ["lld-link-19", "/dll", "/noentry", "/nodefaultlib", f"/out:{tmp / name}.dll", str(obj)]
    argv += [str(tmp / f"{lib}.lib") for lib in libs] + [f"/delayload:{d}.dll" for d in delay]
    compile_ok([*argv, f"/implib:{tmp / name}.lib"])
    return tmp / f"{name}.dll"


def _pe_set(tmp: Path) -> dict[str, Path]:
    need_tool("clang-19", "lld-link-19")
    c = _dll(tmp, "c", "__declspec(dllexport) int cfun(void) { return 3; }\n")
    b = _dll(tmp, "b", "__declspec(dllexport) int bfun(void) { return 2; }\n")
    a = _dll(
        tmp,
        "a",
        "__declspec(dllimport) int bfun(void);\n__declspec(dllimport) int cfun(void);\n"
        "__declspec(dllexport) int afun(void) { return bfun() + cfun(); }\n",
        libs=["b", "c"],
        delay=["c"],
    )
    return {"a.dll": a, "b.dll": b, "c.dll": c}


def test_a_delay_loaded_dll_left_out_is_named_with_its_importer(tmp_path: Path) -> None:
    dlls = _pe_set(tmp_path)
    a = read_binary(dlls["a.dll"])
    assert a.delay_imports == ("c.dll",) and set(a.imports) == {"b.dll", "c.dll"}
    full = {name: p.read_bytes() for name, p in dlls.items()}
    assert closure_problems(full, windows=True) == []
    without_c = {k: v for k, v in full.items() if k != "c.dll"}
    assert closure_problems(without_c, windows=True) == [
        "a.dll delay-loads c.dll, which is neither in the package nor a system or driver library"
    ]
    without_b = {k: v for k, v in full.items() if k != "b.dll"}
    assert closure_problems(without_b, windows=True) == [
        "a.dll imports b.dll, which is neither in the package nor a system or driver library"
    ]
    # a member that starts like a binary but is not one is named too
    broken = {**full, "d.dll": b"MZ but nothing more"}
    assert closure_problems(broken, windows=True) == ["d.dll starts like a PE file but is not one"]
    # names match in any case on Windows, and text members are not binaries
    upper = {"A.DLL": full["a.dll"], "B.dll": full["b.dll"], "C.DLL": full["c.dll"], "README.txt": b"MZ is not"}
    assert closure_problems({k: v for k, v in upper.items() if k != "README.txt"}, windows=True) == []


def test_system_and_driver_libraries_may_be_left_to_the_machine(tmp_path: Path) -> None:
    need_tool("x86_64-w64-mingw32-gcc")
    src = tmp_path / "host.c"
    src.write_text("#include <windows.h>\nint main(void) { return (int)GetTickCount() & 1; }\n")
    exe = tmp_path / "coli.exe"
    compile_ok(["x86_64-w64-mingw32-gcc", str(src), "-o", str(exe)])
    assert {i.lower() for i in read_binary(exe).imports} >= {"kernel32.dll", "msvcrt.dll"}
    assert closure_problems({"coli.exe": exe.read_bytes()}, windows=True) == []


def _so(tmp: Path, name: str, body: str, needs: list[str] = ()) -> Path:  # type: ignore[assignment]
    src = tmp / f"{name}.c"
    src.write_text(body)
    out = tmp / f"lib{name}.so"
    compile_ok(["gcc", "-shared", "-fPIC", str(src), "-o", str(out), f"-L{tmp}", *[f"-l{n}" for n in needs]])
    return out


def test_an_elf_library_left_out_is_named(tmp_path: Path) -> None:
    dep = _so(tmp_path, "dep", "int dep(void) { return 1; }\n")
    user = _so(tmp_path, "user", "int dep(void);\nint user(void) { return dep(); }\n", needs=["dep"])
    assert "libdep.so" in read_binary(user).imports
    members = {"libuser.so": user.read_bytes(), "libdep.so": dep.read_bytes()}
    assert closure_problems(members, windows=False) == []
    assert closure_problems({"libuser.so": user.read_bytes()}, windows=False) == [
        "libuser.so imports libdep.so, which is neither in the package nor a system or driver library"
    ]
    # an ELF name is case-sensitive
    assert closure_problems({"libuser.so": user.read_bytes(), "LIBDEP.so": dep.read_bytes()}, windows=False)


def test_a_bundled_runtime_brings_what_it_imports_from_its_folder(tmp_path: Path) -> None:
    """A HIP runtime stand-in importing a comgr stand-in (which imports the HSA one): the
    bundle carries both; the system's libraries and names found nowhere stay out."""
    need_tool("clang-19", "lld-link-19")
    sdk = tmp_path / "sdk"
    sdk.mkdir()
    _dll(sdk, "hsa", "__declspec(dllexport) int hsa(void) { return 1; }\n")
    _dll(
        sdk,
        "amd_comgr_3",
        "__declspec(dllimport) int hsa(void);\n__declspec(dllexport) int comgr(void) { return hsa(); }\n",
        libs=["hsa"],
    )
    runtime = _dll(
        sdk,
        "amdhip64_7",
        "__declspec(dllimport) int comgr(void);\n__declspec(dllexport) int hip(void) { return comgr(); }\n",
        libs=["amd_comgr_3"],
    )
    assert [p.name for p in runtime_companions(runtime, windows=True)] == ["amd_comgr_3.dll", "hsa.dll"]
    # the ELF side: the soname a library needs, found beside it; the system's C library,
    # even with a file of its name in the folder, stays the machine's
    lib = tmp_path / "rocm"
    lib.mkdir()
    hsa = _so(lib, "hsa-runtime64", "int hsa(void) { return 1; }\n")
    body = '#include <stdio.h>\nint hsa(void);\nint hip(void) { puts("hip"); return hsa(); }\n'
    hip = _so(lib, "amdhip64", body, needs=["hsa-runtime64"])
    (lib / "libc.so.6").write_bytes(hsa.read_bytes())
    assert "libc.so.6" in read_binary(hip).imports
    assert [p.name for p in runtime_companions(hip, windows=False)] == ["libhsa-runtime64.so"]
