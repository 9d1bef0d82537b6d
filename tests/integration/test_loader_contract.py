"""The HIP runtime binding contract, scenario by scenario, each in its own
process: on Linux natively, on Windows (MinGW builds) under Wine."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import need_tool
from tests.loader_fixtures import (
    LINUX,
    PLATFORMS,
    WINDOWS,
    Fixtures,
    build,
    build_host,
    doc_table,
    other_sdk_backend,
)
from toolchain.wine import warm

pytestmark = [pytest.mark.slow, pytest.mark.loader_contract]


@pytest.fixture(scope="module", params=PLATFORMS)
def fx(request: pytest.FixtureRequest, gen_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fixtures]:
    platform = LINUX if request.param == "linux" else WINDOWS
    need_tool(platform.cc, *(["wine"] if platform.under_wine else []))
    base = tmp_path_factory.mktemp(f"contract-{platform.name}")
    fixtures = build(platform, base, gen_dir)
    yield fixtures
    # cleanup leaves nothing behind
    import shutil

    shutil.rmtree(base)
    assert not base.exists()


def open_hip(fx: Fixtures, env_dir: str | None, *preload: str) -> dict[str, object]:
    args = [a for p in preload for a in ("--preload", fx.platform.host_path(fx.runtimes[p]))]
    return fx.run(*args, "open", "hip", env={"COLI_HIP_RUNTIME_DIR": env_dir})


# ---- the fixtures themselves ---------------------------------------------------


def test_fixture_structure(fx: Fixtures, gen_dir: Path) -> None:
    """The fake backend exports the whole ABI (plus its test accessor), undecorated, and
    imports only the runtime and system libraries."""
    import re

    from tests.conftest import ROOT
    from toolchain.abi import load_abi
    from toolchain.inspect import read_binary

    abi = load_abi(ROOT / "kernels/abi.toml")
    backend = read_binary(fx.app / fx.platform.backend)
    assert set(abi.exports) | {"coli_test_bound_runtime"} == set(backend.exports)
    assert len(abi.exports) == 28
    # no _name@N stdcall decoration, no C++ mangling: the names the loader asks for
    assert all(re.fullmatch(r"coli_[a-z0-9_]+", name) for name in backend.exports), backend.exports
    if fx.platform.windows:
        assert backend.target == "PE32+ machine 0x8664 DLL"
        assert {i.lower() for i in backend.imports} <= {"amdhip64_7.dll", "kernel32.dll", "msvcrt.dll"}
    else:
        assert backend.target.startswith("ELF64 EM_X86_64")
        assert set(backend.imports) <= {"libamdhip64.so.5", "libc.so.6", "libm.so.6", "ld-linux-x86-64.so.2"}
    assert fx.platform.runtime in {i.lower() for i in backend.imports} | set(backend.imports)
    assert (fx.root / "src").exists() is False  # rendered sources are removed once built


def test_the_stub_runtimes_are_distinct_files(fx: Fixtures) -> None:
    """Runtimes A, B and the lean one share a file name but not their bytes, and each
    says which it is: a binding to the wrong one cannot pass for the right one."""
    blobs = {k: p.read_bytes() for k, p in fx.runtimes.items()}
    assert len(set(blobs.values())) == len(blobs) == 3
    assert {p.name for p in fx.runtimes.values()} == {fx.platform.runtime}
    assert len({p.parent for p in fx.runtimes.values()}) == 3
    for key in ("A", "B"):
        r = fx.run("open", "hip", env={"COLI_HIP_RUNTIME_DIR": fx.dir_of(key)})
        assert r["backend"] == f"hip-stub-{key}", r


def _own_literals(fx: Fixtures, gen_dir: Path, src: Path) -> list[str]:
    """The format strings of `src` itself (not of its headers) as the platform's compiler
    sees it (its preprocessor, the harness's defines), each split at its fields. Only
    format strings: a constant one the compiler may write as immediate stores."""
    import re
    import subprocess

    from tests.conftest import ROOT

    argv = [fx.platform.cc, "-E", "-std=c11", "-DCOLI_BINDING_FAULTS=1", f"-I{gen_dir}", f"-I{ROOT / 'kernels'}",
            f"-I{ROOT / 'engine'}", str(src)]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    mine, lines = True, []
    for line in out.splitlines():
        marker = re.match(r'# \d+ "([^"]+)"', line)
        if marker:
            mine = Path(marker.group(1)).name == src.name
        elif mine:
            lines.append(line)
    literals = re.findall(r'"((?:[^"\\\n]|\\.)*)"', "\n".join(lines))
    return [piece for lit in literals if "\\" not in lit and "%" in lit
            for piece in re.split(r"%[-0-9.*]*[a-z]+", lit) if len(piece) >= 12]  # fmt: skip


def test_the_harness_is_the_production_loader(fx: Fixtures, gen_dir: Path) -> None:
    """The harness is compiled from the repository's loader and binding sources as they
    are (no copy, no edit: every message of loader.c and hip_binding.c, as the compiler
    sees them for this platform, is in the binary) and imports no GPU runtime of its own."""
    import re

    from tests.conftest import ROOT
    from toolchain.inspect import read_binary

    production = [ROOT / "engine/loader.c", ROOT / "engine/hip_binding.c", ROOT / "engine/imports.c"]
    assert all(src in fx.harness_sources for src in production), fx.harness_sources
    blob = fx.harness.read_bytes()
    for src in production[:2]:
        pieces = _own_literals(fx, gen_dir, src)
        assert len(pieces) >= 10, (src, pieces)
        missing = [piece for piece in pieces if piece.encode() not in blob]
        assert not missing, (src.name, missing)
    imports = {i.lower() for i in read_binary(fx.harness).imports}
    gpu = [i for i in imports if re.search(r"amdhip|hiprt|cuda|nvcuda|coli_", i)]
    assert not gpu, imports


def test_the_fixture_root_has_a_space_and_non_ascii_letters(fx: Fixtures) -> None:
    """Every fixture path, the runtimes' folders and the executable's, holds a space and
    non-ASCII letters, so no path is ever handled as narrow ANSI text or split at spaces."""
    for path in (fx.root, fx.app, *(p.parent for p in fx.runtimes.values())):
        text = str(path.relative_to(fx.root.parent))
        assert " " in text and not text.isascii(), text


# ---- the hazard the contract exists for -------------------------------------


def test_preloading_b_satisfies_a_backend_linked_against_a(fx: Fixtures) -> None:
    """Without the contract (the OS loader alone, rawopen), an already-loaded runtime B
    silently serves a backend linked against A."""
    r = fx.run(
        "--preload",
        fx.platform.host_path(fx.runtimes["B"]),
        "rawopen",
        fx.platform.host_path(fx.app / fx.platform.backend),
    )
    assert r["ok"] is True and r["bound"] == "B", r


def test_hip_mode_is_what_the_backend_imports(fx: Fixtures) -> None:
    """A HIP backend renamed, or given by absolute path, still goes through the binding:
    HIP mode comes from its import table, not its name or how it was named."""
    renamed = fx.app / ("coli_other" + Path(fx.platform.backend).suffix)
    renamed.write_bytes((fx.app / fx.platform.backend).read_bytes())
    for backend in (renamed, fx.app / fx.platform.backend):
        given = fx.platform.host_path(backend)
        r = fx.run("open", given, env={"COLI_HIP_RUNTIME_DIR": None})
        assert r["rc"] == 1 and "COLI_HIP_RUNTIME_DIR is not set" in str(r["error"]), r
        r = fx.run("--preload", fx.platform.host_path(fx.runtimes["B"]), "open", given,
                   env={"COLI_HIP_RUNTIME_DIR": fx.dir_of("A")})  # fmt: skip
        assert r["rc"] == 1 and "a different" in str(r["error"]), r
        r = fx.run("open", given, env={"COLI_HIP_RUNTIME_DIR": fx.dir_of("A")})
        assert r["ok"] is True and r["backend"] == "hip-stub-A", r


def test_the_import_table_decides_hip_mode(fx: Fixtures) -> None:
    """The loader reads what a file imports before it maps it: the HIP backend imports the
    runtime, the CUDA stand-in does not, and a file that is no image is refused unread."""
    p = fx.platform
    hip = fx.run("imports", p.host_path(fx.app / p.backend))
    assert hip["read"] is True and hip["hip"] == p.runtime and p.runtime in hip["imports"], hip
    other = fx.run("imports", p.host_path(fx.app / p.other_backend))
    assert other["read"] is True and other["hip"] is None and other["imports"], other
    junk = fx.root / ("junk" + Path(p.backend).suffix)
    junk.write_bytes(b"MZ" + bytes(200))
    r = fx.run("imports", p.host_path(junk))
    assert r["read"] is False and "not a PE image" in str(r["error"]), r
    r = fx.run("open", p.host_path(junk), env={"COLI_HIP_RUNTIME_DIR": None})
    assert r["rc"] == 1 and str(r["error"]).startswith("[backend] cannot load ") and "not a PE image" in str(r["error"])


def test_a_delay_loaded_runtime_is_hip_mode_too(fx: Fixtures) -> None:
    """A DLL that delay-loads the runtime (no entry in its normal import table) still goes
    through the binding: the delay-import descriptors are read too."""
    import subprocess

    from tests.loader_fixtures import DLLTOOL, NM, compile_c

    p = fx.platform
    if not p.windows:  # ELF has no delay-load: DT_NEEDED is the whole table (the test above)
        return
    need_tool(DLLTOOL, NM)
    work = fx.root / "delay"
    work.mkdir(exist_ok=True)
    (work / "rt.def").write_text(f"LIBRARY {p.runtime}\nEXPORTS\n    coli_stub_runtime_marker\n")
    lib = work / "libdelay.a"
    make_lib = [DLLTOOL, "--input-def", str(work / "rt.def"), "--dllname", p.runtime, "--output-delaylib", str(lib)]
    subprocess.run(make_lib, check=True)
    (work / "late.c").write_text(
        "__declspec(dllimport) char coli_stub_runtime_marker(void);\n"
        "__declspec(dllexport) char coli_late_marker(void) { return coli_stub_runtime_marker(); }\n"
    )
    dll = fx.app / "coli_late.dll"
    compile_c(p, "-shared", work / "late.c", "-o", dll, lib)
    # binutils' ld leaves the delay-import directory empty (the descriptor is there, the
    # helper finds it by symbol); point it at the descriptor, as MSVC's link writes it
    import pefile

    symbols = subprocess.run([NM, str(dll)], capture_output=True, text=True, check=True).stdout
    va = next(int(line.split()[0], 16) for line in symbols.splitlines() if "__DELAY_IMPORT_DESCRIPTOR_" in line)
    pe = pefile.PE(str(dll))
    entry = pe.OPTIONAL_HEADER.DATA_DIRECTORY[13]  # IMAGE_DIRECTORY_ENTRY_DELAY_IMPORT
    entry.VirtualAddress, entry.Size = va - pe.OPTIONAL_HEADER.ImageBase, 32  # one descriptor
    data = pe.write()
    pe.close()
    dll.write_bytes(bytes(data))
    r = fx.run("imports", p.host_path(dll))
    assert r["read"] is True and r["hip"] == p.runtime, r
    r = fx.run("open", p.host_path(dll), env={"COLI_HIP_RUNTIME_DIR": None})
    assert r["rc"] == 1 and "COLI_HIP_RUNTIME_DIR is not set" in str(r["error"]), r


def test_nothing_of_the_backend_runs_before_the_second_check(fx: Fixtures) -> None:
    """The backend maps, its own loading pulls in runtime B beside the configured A, and
    the check after the map refuses it: none of its functions ran (its trace stays
    empty) and it is unmapped. The same backend without the second runtime is called
    only once the checks have passed."""
    trace = fx.root / "trace.txt"
    env: dict[str, str | None] = {
        "COLI_HIP_RUNTIME_DIR": fx.dir_of("A"),
        "COLI_TEST_TRACE": fx.platform.host_path(trace),
    }
    r = fx.run("open", "hip", env={**env, "COLI_TEST_MAP_LOADS": fx.platform.host_path(fx.runtimes["B"])})
    assert r["rc"] == 1 and "after the backend mapped: 2 modules named" in str(r["error"]), r
    assert r["backend_mapped_after"] is False and r["mapped_after"] == 1, r  # only B, which the backend loaded
    assert not trace.exists(), trace.read_text()
    r = fx.run("open", "hip", env=env)
    assert r["ok"] is True and r["backend"] == "hip-stub-A", r
    assert trace.read_text().split() == ["abi_version", "backend_name"]
    trace.unlink()


def test_preloading_a_binds_a(fx: Fixtures) -> None:
    r = open_hip(fx, fx.dir_of("A"), "A")
    assert r["ok"] is True and r["backend"] == "hip-stub-A" and r["reused"] is True, r
    assert r["mapped_after"] == 1  # reused, not loaded a second time


def test_nothing_preloaded_loads_the_configured_one(fx: Fixtures) -> None:
    for key, marker in (("A", "A"), ("B", "B")):
        r = open_hip(fx, fx.dir_of(key))
        assert r["ok"] is True and r["backend"] == f"hip-stub-{marker}" and r["reused"] is False, r


# ---- COLI_HIP_RUNTIME_DIR -----------------------------------------------------


def test_unset_and_empty(fx: Fixtures) -> None:
    """Checked before anything is loaded: neither the runtime nor the backend maps."""
    r = open_hip(fx, None)
    assert r["rc"] == 1 and "COLI_HIP_RUNTIME_DIR is not set" in str(r["error"])
    assert (r["backend_mapped_after"], r["mapped_after"]) == (False, 0), r
    r = open_hip(fx, "")
    assert r["rc"] == 1 and "is set but empty" in str(r["error"])
    assert (r["backend_mapped_after"], r["mapped_after"]) == (False, 0), r


@pytest.mark.parametrize("value", ["runtime", "./runtime", "../runtime", "rt A/sub"])
def test_relative_forms(fx: Fixtures, value: str) -> None:
    r = open_hip(fx, value.replace("/", "\\") if fx.platform.windows else value)
    assert r["rc"] == 1 and "is a relative path" in str(r["error"]), r


def test_drive_and_root_relative_on_windows(fx: Fixtures) -> None:
    if not fx.platform.windows:
        assert fx.run("form", "C:runtime", "windows")["form"] == "drive-relative"
        assert fx.run("form", "\\runtime", "windows")["form"] == "root-relative"
        return
    assert "is drive-relative" in str(open_hip(fx, "C:runtime")["error"])
    assert "relative to the current drive's root" in str(open_hip(fx, "\\runtime")["error"])
    # absolute forms: a share, the long-path and device prefixes, a forward slash
    for value in ("\\\\server\\share\\rocm", "\\\\?\\C:\\rocm", "C:/rocm", "//server/share"):
        assert fx.run("form", value, "windows")["form"] == "ok", value


def test_missing_file_and_folder_cases(fx: Fixtures) -> None:
    root = fx.root
    r = open_hip(fx, fx.platform.host_path(root / "no such folder"))
    assert "does not exist" in str(r["error"])
    r = open_hip(fx, fx.platform.host_path(fx.runtimes["A"]))
    assert "is not a folder" in str(r["error"])
    empty = root / "empty folder"
    empty.mkdir(exist_ok=True)
    r = open_hip(fx, fx.platform.host_path(empty))
    assert f"has no {fx.platform.runtime}" in str(r["error"])
    trap = root / "trap"
    (trap / fx.platform.runtime).mkdir(parents=True, exist_ok=True)
    r = open_hip(fx, fx.platform.host_path(trap))
    assert "is a folder, not the runtime" in str(r["error"])


@pytest.mark.parametrize("sep", ["\\", "/"])
def test_trailing_separator_and_unicode_are_accepted(fx: Fixtures, sep: str) -> None:
    """Both separators on Windows; on Linux a backslash is an ordinary character, so
    there a trailing "/" is doubled instead."""
    tail = sep if fx.platform.windows else "//"
    r = open_hip(fx, fx.dir_of("A") + tail)
    assert r["ok"] is True and r["backend"] == "hip-stub-A", r
    assert "tést ü" in str(r["runtime"]) and r["mapped_after"] == 1


# ---- what is already mapped ---------------------------------------------------


def test_configured_a_with_b_preloaded_is_refused(fx: Fixtures) -> None:
    r = open_hip(fx, fx.dir_of("A"), "B")
    assert r["rc"] == 1 and f"a different {fx.platform.runtime} is already loaded" in str(r["error"]), r


def test_two_runtimes_preloaded_are_refused(fx: Fixtures) -> None:
    r = open_hip(fx, fx.dir_of("A"), "A", "B")
    if r.get("preload_failed"):
        pytest.fail(f"the platform loader refused the second same-named runtime: {r}")
    assert r["rc"] == 1 and f"2 modules named {fx.platform.runtime} are loaded" in str(r["error"]), r


def test_a_hard_link_to_the_configured_file_is_the_same_file(fx: Fixtures) -> None:
    """Wine keeps the host's inode numbers as file ids, so a hard link reads as the
    same file there as on Windows (NTFS file ids) and Linux (st_ino)."""
    r = open_hip(fx, fx.platform.host_path(_hard_link(fx).parent), "A")
    assert r["ok"] is True and r["reused"] is True and r["backend"] == "hip-stub-A", r


def test_a_runtime_missing_a_procedure_is_refused(fx: Fixtures) -> None:
    """A backend importing a procedure the configured runtime lacks. Linux and Windows
    refuse the load (Windows: error 127, classified by test_windows_error_words).
    Wine differs: it binds the missing import to a stub and stops the process when it
    is called, so under Wine this checks that the process stops there, naming it,
    before it reports any result. Wine's exit status after that stop depends on
    whether its debugger starts (0 on some machines), so it is not checked there."""
    r = open_hip(fx, fx.dir_of("lean"))
    if fx.platform.under_wine:
        assert r.get("no_json") is True, r
        assert "unimplemented function" in str(r["stderr"]), r
        assert "coli_stub_runtime_extra" in str(r["stderr"]), r
    else:
        assert r["rc"] != 0, r
        # native Windows names the error, not the procedure; dlerror names the symbol
        missing = "(Windows error 127)" if fx.platform.windows else "coli_stub_runtime_extra"
        assert missing in str(r["error"]), r


@pytest.mark.parametrize(
    ("code", "exists", "words"), [(int(c), e == "yes", w) for c, e, w in doc_table("Windows loader errors")]
)
def test_windows_error_words(fx: Fixtures, code: int, exists: bool, words: str) -> None:
    """Each Windows loader error has its own words, so missing file, missing dependency,
    missing procedure and invalid image can be told apart. On Linux, where dlerror
    gives the reason, the words say whether the file exists."""
    path = fx.runtimes["A"] if exists else fx.root / "absent.dll"
    message = fx.run("classify", str(code), fx.platform.host_path(path))["message"]
    if fx.platform.windows:
        assert message == f"{words} (Windows error {code})"
    else:
        assert message.startswith("the dynamic loader refused it" if exists else "the file does not exist")


def test_a_backend_missing_a_dependency_is_named_so(fx: Fixtures) -> None:
    """A real load, not a set error number: a backend (no HIP import) whose dependency is
    gone. Windows and Wine: error 126 with the file present, in docs/binding.md's words;
    Linux: the dynamic loader's own reason (dlerror), naming the missing library."""
    from tests.loader_fixtures import compile_c

    p = fx.platform
    work = fx.root / "gone"
    work.mkdir(exist_ok=True)
    dep_name = "coli_gone.dll" if p.windows else "libcoli_gone.so"
    (work / "gone.c").write_text("int coli_gone(void) { return 1; }\n")
    (work / "uses.c").write_text("int coli_gone(void);\nint coli_uses(void) { return coli_gone(); }\n")
    dep = work / dep_name
    pic = [] if p.windows else ["-fPIC", f"-Wl,-soname,{dep_name}"]
    compile_c(p, "-shared", *pic, work / "gone.c", "-o", dep)
    uses = fx.app / ("coli_uses" + Path(p.backend).suffix)
    compile_c(p, "-shared", *([] if p.windows else ["-fPIC"]), work / "uses.c", "-o", uses, dep)
    dep.unlink()
    r = fx.run("open", p.host_path(uses), env={"COLI_HIP_RUNTIME_DIR": None})
    words = {w: e for c, e, w in doc_table("Windows loader errors") if c == "126"}
    if p.windows:
        expected = next(w for w, e in words.items() if e == "yes")
        assert r["rc"] == 1 and f"{expected} (Windows error 126)" in str(r["error"]), r
    else:
        assert r["rc"] == 1 and f"{dep_name}: cannot open shared object file" in str(r["error"]), r


def test_the_load_failures_are_told_apart(fx: Fixtures) -> None:
    """Missing file, missing dependency, missing procedure and invalid image: four
    classes, four different messages (docs/binding.md)."""
    words = {c: w for c, e, w in doc_table("Windows loader errors") if e == "yes" or c == "2"}
    assert len({words[c] for c in ("2", "126", "127", "193")}) == 4


def test_an_invalid_runtime_image_is_refused(fx: Fixtures) -> None:
    bad = fx.root / "rt bad"
    bad.mkdir(exist_ok=True)
    (bad / fx.platform.runtime).write_text("not an image")
    r = open_hip(fx, fx.platform.host_path(bad))
    assert r["rc"] == 1 and "cannot load the runtime" in str(r["error"]), r
    if fx.platform.windows:
        assert "Windows error 193" in str(r["error"]), r


def test_a_backend_of_another_hip_sdk_is_refused(fx: Fixtures) -> None:
    """A backend that imports another version's runtime than the one this host binds is
    refused by name, before the binding or any load: the host and the backend come from
    one package, built against one SDK."""
    p = fx.platform
    backend, work, other = other_sdk_backend(fx)
    assert fx.run("imports", p.host_path(backend))["hip"] == other
    for env_dir in (fx.dir_of("A"), p.host_path(work)):
        r = fx.run("open", p.host_path(backend), env={"COLI_HIP_RUNTIME_DIR": env_dir})
        assert r["rc"] == 1 and str(r["error"]) == (
            f"[HIP] backend {p.host_path(backend)} imports {other}, but this host binds {p.runtime} "
            "(built against another HIP SDK); use the host and backend of one package"
        ), r
        assert (r["backend_mapped_after"], r["mapped_after"]) == (False, 0), r


def _refusal_for(fx: Fixtures, when: str) -> str | None:
    """The error the loader gives in the situation a row of docs/binding.md's refusal
    table names (None: a Windows-only row on Linux)."""
    p = fx.platform
    a, b = p.host_path(fx.runtimes["A"]), p.host_path(fx.runtimes["B"])
    empty = fx.root / "empty folder"
    empty.mkdir(exist_ok=True)
    junk = fx.root / ("junk" + Path(p.backend).suffix)
    junk.write_bytes(b"MZ" + bytes(200))
    dir_a = fx.dir_of("A")
    cases: dict[str, tuple[list[str], str | None, str]] = {
        "the variable is unset": ([], None, "hip"),
        "it is set to nothing": ([], "", "hip"),
        "it is relative": ([], "runtime", "hip"),
        "C:runtime (Windows)": ([], "C:runtime", "hip"),
        "\\runtime (Windows)": ([], "\\runtime", "hip"),
        "it names nothing": ([], p.host_path(fx.root / "no such folder"), "hip"),
        "it names a file": ([], a, "hip"),
        "the folder lacks the runtime": ([], p.host_path(empty), "hip"),
        "another runtime of that name is mapped": (["--preload", b], dir_a, "hip"),
        "more than one is mapped": (["--preload", a, "--preload", b], dir_a, "hip"),
        "the module list or an identity cannot be read": (["--fault", "snapshot", "--preload", a], dir_a, "hip"),
        "the backend imports another runtime than the host binds": ([], dir_a, p.host_path(other_sdk_backend(fx)[0])),
        "the backend's import table cannot be read": ([], dir_a, p.host_path(junk)),
    }
    args, env_dir, spec = cases[when]
    if "(Windows)" in when and not p.windows:
        return None
    return str(fx.run(*args, "open", spec, env={"COLI_HIP_RUNTIME_DIR": env_dir})["error"])


def test_every_refusal_says_what_the_docs_say(fx: Fixtures) -> None:
    """Each row of docs/binding.md's refusal table, made to happen: the line is the row's
    words, each <placeholder> filled in (a HIP refusal after its "[HIP] " prefix)."""
    import re

    rows = doc_table("Refusals")
    assert len(rows) == 13
    seen = 0
    for when, words in rows:
        message = _refusal_for(fx, when)
        if message is None:
            continue
        pattern = re.sub(r"<[a-z ]+>", ".+", re.escape(words).replace("\\<", "<").replace("\\>", ">"))
        assert re.fullmatch(pattern, message.removeprefix("[HIP] ")), (when, words, message)
        seen += 1
    assert seen == (13 if fx.platform.windows else 11)


# ---- the backend's own folder, and the other modes ----------------------------


def test_the_hip_backend_comes_from_the_executables_folder_only(fx: Fixtures) -> None:
    moved = fx.app / "elsewhere"
    moved.mkdir(exist_ok=True)
    (fx.app / fx.platform.backend).rename(moved / fx.platform.backend)
    try:
        r = open_hip(fx, fx.dir_of("A"))
        assert r["rc"] == 1 and "does not exist" in str(r.get("error")) and "app dir ü" in str(r.get("error")), r
    finally:
        (moved / fx.platform.backend).rename(fx.app / fx.platform.backend)


def test_backend_selection_messages(fx: Fixtures) -> None:
    """A CUDA backend and a HIP backend are opened under different labels."""
    cuda = fx.run("open", "cuda", env={"COLI_HIP_RUNTIME_DIR": None})
    assert cuda["ok"] is True and cuda["backend"] == "cuda-stub" and cuda["runtime"] is None, cuda
    missing = fx.run("open", fx.platform.host_path(fx.app / ("absent" + Path(fx.platform.backend).suffix)))
    assert str(missing["error"]).startswith("[backend] backend ") and "does not exist" in str(missing["error"])
    hip = fx.run("open", "hip", env={"COLI_HIP_RUNTIME_DIR": None})
    assert str(hip["error"]).startswith("[HIP] COLI_HIP_RUNTIME_DIR is not set"), hip
    bogus = fx.run("open", "rocm", env={"COLI_HIP_RUNTIME_DIR": None})
    assert "backend must be ref, cuda, hip or an absolute path, got 'rocm'" in str(bogus["error"])


@pytest.mark.parametrize("how", ["cuda", "path"])
def test_other_modes_ignore_coli_hip_runtime_dir(fx: Fixtures, how: str) -> None:
    """A backend that imports no HIP runtime behaves exactly as with the variable unset,
    however the variable is poisoned: the same output, the same exit."""
    spec = "cuda" if how == "cuda" else fx.platform.host_path(fx.app / fx.platform.other_backend)
    unset = fx.run("open", spec, env={"COLI_HIP_RUNTIME_DIR": None})
    assert unset["ok"] is True and unset["runtime"] is None, unset
    for poison in ("relative garbage", "", fx.dir_of("B"), fx.platform.host_path(fx.runtimes["A"])):
        r = fx.run(
            "--preload", fx.platform.host_path(fx.runtimes["B"]), "open", spec, env={"COLI_HIP_RUNTIME_DIR": poison}
        )
        assert {k: r[k] for k in ("ok", "rc", "backend", "runtime", "stderr")} == {
            k: unset[k] for k in ("ok", "rc", "backend", "runtime", "stderr")
        }, (poison, r)


# ---- the pure helpers ------------------------------------------------------------


def _decision_rows() -> list[tuple[str, str, str, str]]:
    """docs/binding.md's decision table, each "-" and "2 or more" spelt out."""
    rows = []
    for read, mapped, same, decision in doc_table("Decisions"):
        counts = {"-": ["0", "1"], "2 or more": ["2", "3"]}.get(mapped, [mapped])
        sames = {"-": ["same", "different"], "yes": ["same"], "no": ["different"]}.get(same, [same])
        rows += [("1" if read == "yes" else "0", n, c, decision) for n in counts for c in sames]
    return rows


@pytest.mark.parametrize(("ok", "mapped", "single", "decision"), _decision_rows())
def test_decision_table(fx: Fixtures, ok: str, mapped: str, single: str, decision: str) -> None:
    """The binding's decision for every row of the table in docs/binding.md."""
    assert fx.run("decide", ok, mapped, single)["decision"] == decision


def _matrix_setup(fx: Fixtures, mapped: str) -> tuple[list[str], dict[str, str | None]]:
    """The preloads and environment for the matrix's "mapped before the binding" cell."""
    p = fx.platform
    runtime = {"A": p.host_path(fx.runtimes["A"]), "B": p.host_path(fx.runtimes["B"])}
    setups: dict[str, tuple[list[str], dict[str, str | None]]] = {
        "nothing": ([], {}),
        "A": ([runtime["A"]], {}),
        "A, by a hard link": ([p.host_path(_hard_link(fx))], {}),
        "B": ([runtime["B"]], {}),
        "A and B": ([runtime["A"], runtime["B"]], {}),
        "nothing; the backend's own load maps B": ([], {"COLI_TEST_MAP_LOADS": runtime["B"]}),
    }
    return setups[mapped]


@pytest.mark.parametrize(
    ("case", "mapped", "fault", "decision", "stage"), [tuple(r) for r in doc_table("Decision matrix")]
)
def test_decision_matrix(fx: Fixtures, case: str, mapped: str, fault: str, decision: str, stage: str) -> None:
    """The seed's twelve binding cases (docs/binding.md), each a real binding in its own
    process: what is mapped, which system call fails, the decision and where it is made.
    A refusal names the stage, the configured file, every mapped module and the decision,
    leaves the runtime references as they were and the backend unmapped."""
    preloads, env = _matrix_setup(fx, mapped)
    args = [*(["--fault", fault] if fault != "-" else []), *(a for p in preloads for a in ("--preload", p))]
    r = fx.run(*args, "open", "hip", env={"COLI_HIP_RUNTIME_DIR": fx.dir_of("A"), **env})
    if decision in ("load", "reuse"):
        assert r["ok"] is True and r["backend"] == "hip-stub-A" and r["reused"] is (decision == "reuse"), r
        assert r["mapped_after_close"] == r["mapped_before"], r
        return
    error = str(r["error"])
    assert r["rc"] == 1 and error.startswith(f"[HIP] {stage}: ") and error.endswith(f"[{decision}]"), r
    assert f"the configured {fx.platform.host_path(fx.runtimes['A'])}" in error or (
        f"the configured one is {fx.platform.host_path(fx.runtimes['A'])}" in error
    ), r
    if decision in ("reject-different", "reject-multiple"):
        assert all(p in error for p in preloads), r
    assert r["backend_mapped_after"] is False, r
    assert r["mapped_after"] == r["mapped_before"] + ("COLI_TEST_MAP_LOADS" in env), r


def test_the_fault_points_are_test_builds_only(fx: Fixtures) -> None:
    """A host is built without the fault points: the production objects hold none of
    their names, and a fault given to a harness that has them changes only what it says."""
    from tests.conftest import ROOT

    source = (ROOT / "engine/hip_binding.c").read_text()
    assert "#if defined(COLI_BINDING_FAULTS)" in source and "#define fault(name) 0" in source
    r = fx.run("--fault", "no-such-fault", "open", "hip", env={"COLI_HIP_RUNTIME_DIR": fx.dir_of("A")})
    assert r["ok"] is True, r


def test_two_modules_of_one_file_are_two(fx: Fixtures) -> None:
    """The seed counts modules, not files: a file and its hard link listed as two mapped
    modules are reject-multiple, and the line says they are one file (on values: the
    loaders here never map one file twice, see test_inventory_counts_modules)."""
    a, b = fx.platform.host_path(fx.runtimes["A"]), fx.platform.host_path(fx.runtimes["B"])
    link = fx.platform.host_path(_hard_link(fx))
    r = fx.run("refusal", a, a, link)
    assert r["decision"] == "reject-multiple", r
    assert f"2 modules named {fx.platform.runtime} are loaded ({a}; {link} (both of them are one file))" in r["message"]
    r = fx.run("refusal", a, a, b)
    assert r["decision"] == "reject-multiple" and "one file" not in r["message"], r
    assert [fx.run("refusal", a, *m)["decision"] for m in ([], [a], [link], [b])] == [
        "load",
        "reuse",
        "reuse",
        "reject-different",
    ]


def test_the_identity_fallback_is_symmetric(fx: Fixtures) -> None:
    """Without FILE_ID_INFO (no-file-id-info), both sides fall back to the legacy volume
    serial and file index: the configured file and every mapped module are read the same
    way, so the binding still tells A from B and A from its hard link. With the extended
    id on one side only (the fault from the first inventory on), they are never compared:
    reject-unverifiable. Linux has one kind (st_dev, st_ino), which the fault leaves alone."""
    a, b = fx.platform.host_path(fx.runtimes["A"]), fx.platform.host_path(fx.runtimes["B"])
    link = fx.platform.host_path(_hard_link(fx))
    legacy = ["--fault", "no-file-id-info"]
    kind = "legacy" if fx.platform.windows else "posix"
    assert fx.run(*legacy, "identity", a, a) == {**fx.run(*legacy, "identity", a, a), "format": kind, "compare": "same"}
    assert fx.run(*legacy, "identity", a, b)["compare"] == "different"
    assert fx.run(*legacy, "identity", a, link)["compare"] == "same"
    env: dict[str, str | None] = {"COLI_HIP_RUNTIME_DIR": fx.dir_of("A")}
    reuse = fx.run(*legacy, "--preload", a, "open", "hip", env=env)
    assert reuse["ok"] is True and reuse["reused"] is True, reuse
    other = fx.run(*legacy, "--preload", b, "open", "hip", env=env)
    assert str(other.get("error")).endswith("[reject-different]"), other
    load = fx.run(*legacy, "open", "hip", env=env)
    assert load["ok"] is True and load["reused"] is False, load
    one_side = fx.run("--fault", "no-file-id-info@1", "--preload", a, "open", "hip", env=env)
    if fx.platform.windows:
        assert str(one_side.get("error")).endswith("cannot be read), the configured one is "
                                                   f"{a} [reject-unverifiable]"), one_side  # fmt: skip
    else:
        assert one_side["ok"] is True and one_side["reused"] is True, one_side


def test_paths_beyond_max_path(fx: Fixtures) -> None:
    """The production binding and loader, not only the join helper, past MAX_PATH: the
    executable, its backend and the configured runtime in folders deeper than 260
    characters bind, reuse and refuse as anywhere else."""
    import shutil

    p = fx.platform
    deep = fx.root / "deep" / "/".join(f"long segment ü {i:02d}" for i in range(14))
    app, rt = deep / "app", deep / "rt"
    app.mkdir(parents=True, exist_ok=True)
    rt.mkdir(exist_ok=True)
    for f in (fx.harness, fx.app / p.backend):
        shutil.copy2(f, app / f.name)
    shutil.copy2(fx.runtimes["A"], rt / p.runtime)
    runtime = p.host_path(rt / p.runtime)
    assert len(runtime) > 260 and len(p.host_path(app / p.backend)) > 260
    deep_fx = Fixtures(p, fx.root, app, {"A": rt / p.runtime})
    env: dict[str, str | None] = {"COLI_HIP_RUNTIME_DIR": p.host_path(rt)}
    loaded = deep_fx.run("open", "hip", env=env)
    assert loaded["ok"] is True and loaded["backend"] == "hip-stub-A" and loaded["runtime"] == runtime, loaded
    reused = deep_fx.run("--preload", runtime, "open", "hip", env=env)
    assert reused["ok"] is True and reused["reused"] is True, reused
    refused = deep_fx.run("--preload", p.host_path(fx.runtimes["B"]), "open", "hip", env=env)
    assert str(refused.get("error")).endswith(f"not the configured {runtime} [reject-different]"), refused
    if p.windows:  # what Windows needs past MAX_PATH (Wine takes either form)
        assert deep_fx.run("widen", runtime)["wide"] == "\\\\?\\" + runtime
        assert deep_fx.run("widen", "C:\\short\\x.dll")["wide"] == "C:\\short\\x.dll"
        share = "\\\\server\\share\\" + "d" * 300
        assert deep_fx.run("widen", share)["wide"] == "\\\\?\\UNC\\server\\share\\" + "d" * 300


def test_identity(fx: Fixtures) -> None:
    a, b = fx.platform.host_path(fx.runtimes["A"]), fx.platform.host_path(fx.runtimes["B"])
    assert fx.run("identity", a, a)["compare"] == "same"
    assert fx.run("identity", a, b)["compare"] == "different"
    sep = "\\" if fx.platform.windows else "/"
    dotted = fx.dir_of("A") + f"{sep}..{sep}rt A{sep}" + fx.platform.runtime
    assert fx.run("identity", a, dotted)["compare"] == "same"
    assert fx.run("identity", a, fx.platform.host_path(fx.root / "missing.dll"))["compare"] == "unknown"
    link = fx.root / "identity link"
    if not link.exists():
        os.link(fx.runtimes["A"], link)
    assert fx.run("identity", a, fx.platform.host_path(link))["compare"] == "same"
    if fx.platform.windows:  # Windows paths are case-insensitive: another spelling, the same file
        assert fx.run("identity", a, a.upper())["compare"] == "same"
    else:
        assert fx.run("identity", a, a.upper())["compare"] == "unknown"  # no such file on a case-sensitive disk
    assert fx.run("formats")["compare"] == "unknown"
    expected = "extended" if fx.platform.windows else "posix"
    assert fx.run("identity", a)["format"] in (expected, "legacy")


def test_inventory_counts_modules(fx: Fixtures) -> None:
    """The seed's count: every mapped module of the runtime's name, not folded by file. A
    repeated load of one path is one module, and so is a hard link loaded under its
    second name: the loaders (Linux's, and Wine's like Windows') map one file once
    whatever name they are asked by. Two modules of one file would count as two (the
    decision table's 2-mapped-same row: reject-multiple)."""
    a, b = fx.platform.host_path(fx.runtimes["A"]), fx.platform.host_path(fx.runtimes["B"])
    assert fx.run("inventory")["mapped"] == 0
    assert fx.run("--preload", a, "inventory")["mapped"] == 1
    assert fx.run("--preload", a, "--preload", a, "inventory")["mapped"] == 1
    assert fx.run("--preload", a, "--preload", b, "inventory")["mapped"] == 2
    alias = fx.platform.host_path(_hard_link(fx))
    assert fx.run("--preload", a, "--preload", alias, "inventory")["mapped"] == 1
    assert fx.run("--preload", a, "--preload", b, "inventory")["paths"] == [a, b]


def _hard_link(fx: Fixtures) -> Path:
    """Runtime A under a second name (a hard link in another folder)."""
    link = fx.root / "rt link"
    link.mkdir(exist_ok=True)
    if not (link / fx.platform.runtime).exists():
        os.link(fx.runtimes["A"], link / fx.platform.runtime)
    return link / fx.platform.runtime


def test_the_binding_holds_its_own_reference(fx: Fixtures) -> None:
    """One counted reference to the exact runtime whether it was loaded or reused: with
    the preload's own reference dropped the runtime stays mapped while the backend is
    open, and every reference is gone once it is closed (the backend first)."""
    reused = fx.run("--release-preloads", "--preload", fx.platform.host_path(fx.runtimes["A"]), "open", "hip",
                    env={"COLI_HIP_RUNTIME_DIR": fx.dir_of("A")})  # fmt: skip
    assert reused["ok"] is True and reused["reused"] is True, reused
    assert (reused["mapped_before"], reused["mapped_held"], reused["mapped_after_close"]) == (1, 1, 0), reused
    loaded = open_hip(fx, fx.dir_of("A"))
    assert loaded["ok"] is True and loaded["reused"] is False, loaded
    assert (loaded["mapped_before"], loaded["mapped_after"], loaded["mapped_after_close"]) == (0, 1, 0), loaded


@pytest.mark.parametrize(
    ("dir_", "name", "style", "joined"),
    [
        ("/opt/rocm/lib", "libamdhip64.so.5", "posix", "/opt/rocm/lib/libamdhip64.so.5"),
        ("/opt/rocm/lib///", "x", "posix", "/opt/rocm/lib/x"),
        ("C:\\ROCm\\bin", "amdhip64_7.dll", "windows", "C:\\ROCm\\bin\\amdhip64_7.dll"),
        ("C:\\ROCm\\bin\\/", "amdhip64_7.dll", "windows", "C:\\ROCm\\bin\\amdhip64_7.dll"),
        ("\\\\?\\C:\\long", "amdhip64_7.dll", "windows", "\\\\?\\C:\\long\\amdhip64_7.dll"),
    ],
)
def test_join_has_exactly_one_separator(fx: Fixtures, dir_: str, name: str, style: str, joined: str) -> None:
    assert fx.run("join", dir_, name, style)["path"] == joined


def test_join_beyond_max_path(fx: Fixtures) -> None:
    long_dir = "C:\\" + "\\".join(["segment" * 4] * 20)
    r = fx.run("join", long_dir, "amdhip64_7.dll", "windows")
    assert len(str(r["path"])) > 260 and str(r["path"]).endswith("\\amdhip64_7.dll")


# ---- the engine end to end in HIP mode -------------------------------------------


def test_engine_in_hip_mode_end_to_end(fx: Fixtures, gen_dir: Path) -> None:
    """The real host (coli / coli.exe) beside the fake HIP backend: binding, backend load,
    dense tensors resident, teacher forcing equal to the oracle and the CPU path with the
    expanded cache; and the CPU path's default, the latent cache, giving the expanded
    cache's predictions on this platform."""
    import json
    import subprocess

    from tests.conftest import ROOT

    p = fx.platform
    host = build_host(fx, gen_dir)
    # the fault points are the harness's alone: the host holds none of their names
    for fault in (b"module-path", b"module-identity", b"file-identity"):
        assert fault in fx.harness.read_bytes() and fault not in host.read_bytes(), fault
    model = ROOT / "tests/fixtures/models/glm_tiny2"
    exp = json.loads((model / "expected.json").read_text())
    ids = ",".join(map(str, exp["ids"]))
    env = {**os.environ, "WINEDEBUG": "-all", "COLI_HIP_RUNTIME_DIR": fx.dir_of("A")}
    launcher = ["wine"] if p.under_wine else []
    warm(launcher)
    for quant in ("f32", "int4"):
        base = [
            *launcher,
            str(host),
            "--model",
            p.host_path(model),
            "--ids",
            ids,
            "--teacher-force",
            "--json",
            "--quant",
            quant,
        ]
        # the CPU path with the cache form the backend's step keeps
        expanded = ["--backend", "none", "--kv", "expanded"]
        cpu = subprocess.run([*base, *expanded], capture_output=True, env=env, timeout=300)
        hip = subprocess.run([*base, "--backend", "hip"], capture_output=True, env=env, timeout=300)
        assert cpu.returncode == 0 and hip.returncode == 0, hip.stderr
        c, h = json.loads(cpu.stdout), json.loads(hip.stdout)
        # the whole step in the backend: the dense linears (37), the router and the
        # indexer heads (2) and the routed experts (2 layers x 4 experts x 3)... of glm_tiny2
        assert h["backend"] == "hip-stub-A" and h["tier"] == "step" and h["resident_tensors"] == 77, h
        assert h["tf_pred"] == c["tf_pred"] and h["top2_margin"] == c["top2_margin"]
        if quant == "f32":
            assert h["tf_pred"] == exp["tf_pred"]
        # the CPU path's default, the latent cache, built for this platform too: the expanded cache's predictions
        lat = subprocess.run([*base, "--backend", "none"], capture_output=True, env=env, timeout=300)
        assert lat.returncode == 0, lat.stderr
        la = json.loads(lat.stdout)
        assert la["kv_cache"] == "latent" and la["tf_pred"] == c["tf_pred"]
        assert all(abs(a - b) < 1e-4 for a, b in zip(la["top2_margin"], c["top2_margin"], strict=True))
    # a refusal is one line, and the run goes on on the CPU with the same tokens
    unset = {k: v for k, v in env.items() if k != "COLI_HIP_RUNTIME_DIR"}
    r = subprocess.run([*base, "--backend", "hip"], capture_output=True, env=unset, timeout=300)
    lines = r.stderr.decode("utf-8", "replace").strip().splitlines()
    assert r.returncode == 0 and lines == [
        f"[HIP] COLI_HIP_RUNTIME_DIR is not set; set it to the folder holding {p.runtime}; "
        "GPU tier disabled (CPU path remains active)"
    ], lines
    data = json.loads(r.stdout)
    assert data["backend"] is None and data["tf_pred"] == c["tf_pred"], data
    # the configured runtime is the one bound: configure B and the backend reports B
    env["COLI_HIP_RUNTIME_DIR"] = fx.dir_of("B")
    r = subprocess.run([*launcher, str(host), "--model", p.host_path(model), "--ids", ids, "--teacher-force", "--json",
                        "--backend", "hip"], capture_output=True, env=env, timeout=300)  # fmt: skip
    data = json.loads(r.stdout)
    assert r.returncode == 0 and data["backend"] == "hip-stub-B" and data["tf_pred"] == exp["tf_pred"]
