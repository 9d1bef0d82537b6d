from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from toolchain.abi import RENDERINGS, load_abi, render_abi
from toolchain.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
ABI = ROOT / "kernels" / "abi.toml"


def test_abi_covers_what_the_issue_names() -> None:
    abi = load_abi(ABI)
    names = set(abi.exports)
    for required in (
        "coli_backend_init",
        "coli_backend_shutdown",
        "coli_device_count",
        "coli_device_describe",
        "coli_memory_info",
        "coli_tensor_upload_f32",
        "coli_tensor_upload_q8",
        "coli_tensor_upload_q4",
        "coli_tensor_free",
        "coli_tensor_size",
        "coli_matmul",
        "coli_resident_count",
        "coli_last_error",
    ):
        assert required in names
    assert abi.version == (abi.major << 16) | abi.minor
    assert set(abi.mandatory) < names  # the optional one is not mandatory


def test_every_rendering_lists_every_function() -> None:
    abi = load_abi(ABI)
    out = render_abi(abi)
    assert set(out) == set(RENDERINGS)
    for fn in abi.functions:
        assert f" {fn.name}(" in out["coli_backend.h"]
        assert f'"{fn.name}"' in out["coli_backend_table.h"]
        assert f"    {fn.name}\n" in out["coli_backend.def"]
        assert f"    {fn.name};" in out["coli_backend.map"]
    assert out["exports.txt"].split() == list(abi.exports)


def test_rendered_header_compiles_as_c11_and_cpp(tmp_path: Path) -> None:
    for name, text in render_abi(load_abi(ABI)).items():
        (tmp_path / name).write_text(text)
    src = tmp_path / "use.c"
    src.write_text('#include "coli_backend_table.h"\nint main(void) { return COLI_SYMBOL_COUNT > 0 ? 0 : 1; }\n')
    for cmd in (
        ["gcc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic", "-fsyntax-only", f"-I{tmp_path}", str(src)],
        ["g++", "-x", "c++", "-std=c++17", "-Wall", "-Wextra", "-Werror", "-fsyntax-only", f"-I{tmp_path}", str(src)],
    ):
        proc = subprocess.run(cmd, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr


def _write(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "abi.toml"
    p.write_text('[abi]\nname = "x"\nprefix = "coli_"\nmajor = 1\nminor = 0\n' + body)
    return p


def test_duplicate_function_is_an_error(tmp_path: Path) -> None:
    fn = '[[function]]\nname = "coli_a"\nreturns = "int"\nargs = []\ndoc = "a"\n'
    with pytest.raises(ConfigError, match="defined twice: coli_a"):
        load_abi(_write(tmp_path, fn + fn))


def test_function_without_prefix_is_an_error(tmp_path: Path) -> None:
    fn = '[[function]]\nname = "other_a"\nreturns = "int"\nargs = []\ndoc = "a"\n'
    with pytest.raises(ConfigError, match="must be an identifier starting with 'coli_'"):
        load_abi(_write(tmp_path, fn))


def test_missing_key_names_the_place(tmp_path: Path) -> None:
    fn = '[[function]]\nname = "coli_a"\nargs = []\ndoc = "a"\n'
    with pytest.raises(ConfigError, match=r"abi.toml: function.0.returns: Field required"):
        load_abi(_write(tmp_path, fn))


def test_an_unknown_key_is_named_with_the_allowed_ones(tmp_path: Path) -> None:
    fn = '[[function]]\nname = "coli_a"\nreturns = "int"\nargs = []\ndoc = "a"\noptinal = true\n'
    with pytest.raises(ConfigError) as info:
        load_abi(_write(tmp_path, fn))
    (line,) = info.value.problems
    assert line.endswith(
        "abi.toml: unknown key 'function.0.optinal'; did you mean 'function.0.optional'? "
        "(allowed here: name, returns, args, doc, optional, since_minor)"
    )


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    body = '[[function]]\nname = "coli_a"\nargs = []\ndoc = "a"\n[[status]]\nname = "X"\nvalue = "one"\ndoc = ""\n'
    with pytest.raises(ConfigError) as info:
        load_abi(_write(tmp_path, body))
    assert [p.split(": ", 1)[1] for p in info.value.problems] == [
        "status.0.value: Input should be a valid integer, unable to parse string as an integer (got 'one')",
        "function.0.returns: Field required",
    ]


def test_an_op_since_a_minor_past_the_abis_is_an_error(tmp_path: Path) -> None:
    fn = '[[function]]\nname = "coli_a"\nreturns = "int"\nargs = []\ndoc = "a"\n'
    op = '[[op]]\nname = "later"\nvalue = 1\nsince_minor = 1\ndoc = "b"\nrefs = []\n'
    with pytest.raises(ConfigError, match="op later is since minor 1, past the ABI's minor 0"):
        load_abi(_write(tmp_path, fn + op))
