from __future__ import annotations

import hashlib
import tarfile
import zipfile
from pathlib import Path

import pytest

from toolchain.package import sha256sums, write_package

FILES = {"coli": b"\x7fELF host", "libcoli_ref.so": b"lib", "build-info.json": b"{}\n"}


def test_tar_is_deterministic_sorted_and_owned_by_root(tmp_path: Path) -> None:
    a, b = tmp_path / "a.tar.gz", tmp_path / "b" / "a.tar.gz"
    write_package(a, "top", FILES, {"coli"}, 1_700_000_000)
    write_package(b, "top", dict(reversed(list(FILES.items()))), {"coli"}, 1_700_000_000)
    assert a.read_bytes() == b.read_bytes()
    with tarfile.open(a) as tf:
        members = tf.getmembers()
    assert [m.name for m in members] == sorted(f"top/{n}" for n in FILES)
    assert {(m.uid, m.gid, m.uname, m.gname, m.mtime) for m in members} == {(0, 0, "", "", 1_700_000_000)}
    assert {m.name: m.mode for m in members}["top/coli"] == 0o755
    write_package(a, "top", FILES, {"coli"}, 1_700_000_001)
    assert a.read_bytes() != b.read_bytes()


def test_zip_is_deterministic(tmp_path: Path) -> None:
    a, b = tmp_path / "a.zip", tmp_path / "b.zip"
    write_package(a, "top", FILES, {"coli"}, 0)  # before 1980: clamped
    write_package(b, "top", FILES, {"coli"}, 0)
    assert a.read_bytes() == b.read_bytes()
    with zipfile.ZipFile(a) as zf:
        assert zf.namelist() == sorted(f"top/{n}" for n in FILES)
        assert zf.read("top/libcoli_ref.so") == b"lib"


def test_no_partial_package_on_failure(tmp_path: Path) -> None:
    dest = tmp_path / "p.tar.gz"
    with pytest.raises(TypeError):
        write_package(dest, "top", {"x": "not bytes"}, set(), 0)  # type: ignore[dict-item]
    assert list(tmp_path.iterdir()) == []


def test_sha256sums_format() -> None:
    text = sha256sums(FILES).decode()
    lines = text.splitlines()
    assert [line.split("  ")[1] for line in lines] == sorted(FILES)
    assert lines[0] == f"{hashlib.sha256(FILES['build-info.json']).hexdigest()}  build-info.json"
