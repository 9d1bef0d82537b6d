"""Device-code containers: clang's offload bundle (HIP) and NVIDIA's fatbin (CUDA).

Both are parsed here from their documented/observed layouts so verification
needs no SDK tool (clang-offload-bundler, cuobjdump) on the verifying machine.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

__all__ = ["OffloadBundle", "cuda_fatbin_arches", "parse_offload_bundle"]

BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
COMPRESSED_MAGIC = b"CCOB"
FATBIN_MAGIC = 0xBA55ED50
FATBIN_KIND_PTX = 1
FATBIN_KIND_ELF = 2


@dataclass(frozen=True)
class OffloadBundle:
    triples: tuple[str, ...]  # e.g. hipv4-amdgcn-amd-amdhsa--gfx1030
    compressed: bool = False

    @property
    def gfx_targets(self) -> tuple[str, ...]:
        out = []
        for t in self.triples:
            if "amdgcn" in t and "--" in t:
                # target id may carry features: gfx90a:xnack+ -> gfx90a
                out.append(t.rsplit("--", 1)[1].split(":")[0])
        return tuple(out)


def parse_offload_bundle(data: bytes) -> list[OffloadBundle]:
    """Every bundle in a .hip_fatbin section (one per translation unit, 4 KiB aligned)."""
    bundles: list[OffloadBundle] = []
    pos = 0
    while True:
        plain = data.find(BUNDLE_MAGIC, pos)
        packed = data.find(COMPRESSED_MAGIC, pos)
        if plain < 0 and packed < 0:
            return bundles
        if packed >= 0 and (plain < 0 or packed < plain):
            # compressed bundles carry no readable triple list until inflated
            bundles.append(OffloadBundle((), compressed=True))
            pos = packed + len(COMPRESSED_MAGIC)
            continue
        p = plain + len(BUNDLE_MAGIC)
        if p + 8 > len(data):
            raise ValueError("offload bundle header is truncated")
        (count,) = struct.unpack_from("<Q", data, p)
        if count > 4096:
            raise ValueError(f"offload bundle claims {count} entries")
        p += 8
        triples = []
        for _ in range(count):
            if p + 24 > len(data):
                raise ValueError("offload bundle entry is truncated")
            _off, _size, tlen = struct.unpack_from("<QQQ", data, p)
            p += 24
            if tlen > 1024 or p + tlen > len(data):
                raise ValueError("offload bundle triple is truncated")
            triples.append(data[p : p + tlen].decode("ascii", errors="replace"))
            p += tlen
        bundles.append(OffloadBundle(tuple(triples)))
        pos = p


def cuda_fatbin_arches(data: bytes) -> dict[str, set[str]]:
    """sm_XX -> {"sass", "ptx"} for every entry of every fatbin in a .nv_fatbin section."""
    found: dict[str, set[str]] = {}
    pos = 0
    while pos + 16 <= len(data):
        magic, _ver, hsize, fsize = struct.unpack_from("<IHHQ", data, pos)
        if magic != FATBIN_MAGIC:
            # fatbins are aligned; skip padding between them
            pos += 8
            continue
        p, end = pos + hsize, pos + hsize + fsize
        if end > len(data):
            raise ValueError("fatbin is truncated")
        while p + 32 <= end:
            kind, _v, ehsize, payload = struct.unpack_from("<HHIQ", data, p)
            (arch,) = struct.unpack_from("<I", data, p + 28)
            if ehsize < 32:
                raise ValueError("fatbin entry header too small")
            if kind in (FATBIN_KIND_PTX, FATBIN_KIND_ELF):
                found.setdefault(f"sm_{arch}", set()).add("sass" if kind == FATBIN_KIND_ELF else "ptx")
            p += ehsize + payload
        pos = end
    return found
