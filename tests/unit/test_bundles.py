"""Parsers of the device-code containers, on synthetic bytes (the real ones are in test_verify)."""

from __future__ import annotations

import struct

import pytest

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


def test_offload_bundle_lists_targets_and_strips_features() -> None:
    data = b"\0" * 7 + bundle(
        "host-x86_64-unknown-linux--", "hipv4-amdgcn-amd-amdhsa--gfx1030", "hipv4-amdgcn-amd-amdhsa--gfx90a:xnack+"
    )
    (b,) = parse_offload_bundle(data)
    assert b.gfx_targets == ("gfx1030", "gfx90a")


def test_several_bundles_and_compressed_ones() -> None:
    bundles = parse_offload_bundle(bundle("hipv4-amdgcn-amd-amdhsa--gfx1030") + b"\0" * 100 + b"CCOB" + b"\0" * 20)
    assert [b.compressed for b in bundles] == [False, True]


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
