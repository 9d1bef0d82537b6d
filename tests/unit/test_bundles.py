"""Parsers of the device-code containers, on synthetic bytes (the real ones are in test_verify)."""

from __future__ import annotations

import struct
import zlib

import pytest
import zstandard

from toolchain.inspect.bundles import BUNDLE_MAGIC, FATBIN_MAGIC, cuda_fatbin_arches, parse_offload_bundle


def bundle(*triples: str) -> bytes:
    out = BUNDLE_MAGIC + struct.pack("<Q", len(triples))
    for t in triples:
        out += struct.pack("<QQQ", 4096, 0, len(t)) + t.encode()
    return out


def fatbin(*entries: tuple[int, int]) -> bytes:
    """entries: (kind, sm) with 1 = PTX, 2 = ELF."""
    body = b""
    for kind, sm in entries:
        header = struct.pack("<HHIQ", kind, 0x101, 64, 8) + b"\0" * 12 + struct.pack("<I", sm) + b"\0" * 32
        body += header + b"\xaa" * 8
    return struct.pack("<IHHQ", FATBIN_MAGIC, 1, 16, len(body)) + body


def test_offload_bundle_lists_whole_target_ids() -> None:
    """A target id keeps its features: gfx90a:xnack+ code is not code for any gfx90a."""
    data = b"\0" * 7 + bundle(
        "host-x86_64-unknown-linux--", "hipv4-amdgcn-amd-amdhsa--gfx1030", "hipv4-amdgcn-amd-amdhsa--gfx90a:xnack+"
    )
    (b,) = parse_offload_bundle(data)
    assert b.gfx_targets == ("gfx1030", "gfx90a:xnack+")


def compressed(plain: bytes, *, version: int, method: int) -> bytes:
    """A clang --offload-compress bundle (CCOB) around `plain`."""
    stream = zstandard.ZstdCompressor().compress(plain) if method == 1 else zlib.compress(plain)
    if version == 2:
        return b"CCOB" + struct.pack("<HHIIQ", 2, method, 24 + len(stream), len(plain), 0) + stream
    return b"CCOB" + struct.pack("<HHQQQ", 3, method, 32 + len(stream), len(plain), 0) + stream


@pytest.mark.parametrize(("version", "method"), [(2, 1), (2, 0), (3, 1), (3, 0)])
def test_compressed_bundles_are_inflated_and_listed(version: int, method: int) -> None:
    inner = bundle("host-x86_64-unknown-linux--", "hipv4-amdgcn-amd-amdhsa--gfx1151")
    data = bundle("hipv4-amdgcn-amd-amdhsa--gfx1030") + b"\0" * 100 + compressed(inner, version=version, method=method)
    bundles = parse_offload_bundle(data + b"\0" * 64)
    assert [b.compressed for b in bundles] == [False, True]
    assert bundles[1].gfx_targets == ("gfx1151",)


def test_damaged_compressed_bundles_are_errors() -> None:
    good = compressed(bundle("hipv4-amdgcn-amd-amdhsa--gfx1030"), version=2, method=1)
    with pytest.raises(ValueError, match="truncated"):
        parse_offload_bundle(good[:-5])
    with pytest.raises(ValueError, match="does not inflate"):
        parse_offload_bundle(good[:24] + b"\xff" * (len(good) - 24))
    with pytest.raises(ValueError, match="method 7"):
        parse_offload_bundle(good[:6] + struct.pack("<H", 7) + good[8:])
    with pytest.raises(ValueError, match="version 9"):
        parse_offload_bundle(good[:4] + struct.pack("<H", 9) + good[6:])


@pytest.mark.parametrize("cut", [30, 40, 60])
def test_truncated_bundle_is_an_error_not_a_crash(cut: int) -> None:
    with pytest.raises(ValueError, match="truncated"):
        parse_offload_bundle(bundle("hipv4-amdgcn-amd-amdhsa--gfx1030")[:cut])


def test_absurd_entry_count() -> None:
    with pytest.raises(ValueError, match="claims"):
        parse_offload_bundle(BUNDLE_MAGIC + struct.pack("<Q", 1 << 40))


def test_fatbin_kinds_per_arch() -> None:
    data = fatbin((2, 80), (2, 90), (1, 90)) + b"\0" * 8 + fatbin((2, 80))
    assert cuda_fatbin_arches(data) == {"sm_80": {"sass"}, "sm_90": {"sass", "ptx"}}


def test_truncated_fatbin() -> None:
    with pytest.raises(ValueError, match="truncated"):
        cuda_fatbin_arches(fatbin((2, 80))[:-4])
