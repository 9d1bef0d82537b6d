"""Device-code containers: clang's offload bundle (HIP) and NVIDIA's fatbin (CUDA).

Both are parsed here from their documented/observed layouts so verification
needs no SDK tool (clang-offload-bundler, cuobjdump) on the verifying machine.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = [
    "CodeObject",
    "OffloadBundle",
    "code_objects",
    "cuda_fatbin_arches",
    "inflate_bundle",
    "parse_offload_bundle",
]

BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
COMPRESSED_MAGIC = b"CCOB"
FATBIN_MAGIC = 0xBA55ED50
FATBIN_KIND_PTX = 1
FATBIN_KIND_ELF = 2
# an entry's flags (the 64-bit word at byte 40 of its header): code built for an
# arch-specific target (sm_90a: compute_90a, runs on that arch only) or a
# family-specific one (sm_100f), as nvcc 12.9-13.0 write them
FATBIN_FLAG_ARCH_SPECIFIC = 0x100000
FATBIN_FLAG_FAMILY_SPECIFIC = 0x200000
# the payload is compressed (nvcc -Xfatbin -compress-all, and PTX by default); its
# inflated size is the 64-bit word at byte 56 of the entry's header
FATBIN_FLAG_COMPRESSED = 0x8000


@dataclass(frozen=True)
class OffloadBundle:
    triples: tuple[str, ...]  # e.g. hipv4-amdgcn-amd-amdhsa--gfx1030
    compressed: bool = False

    @property
    def gfx_targets(self) -> tuple[str, ...]:
        out = []
        for t in self.triples:
            if "amdgcn" in t and "--" in t:
                # the whole target id, with its features: gfx90a:xnack+
                out.append(t.rsplit("--", 1)[1])
        return tuple(out)


COMPRESSION_ZLIB = 0
COMPRESSION_ZSTD = 1
MAX_INFLATED = 1 << 31


def inflate_bundle(data: bytes, pos: int) -> tuple[bytes, int]:
    """The plain bundle inside the compressed one at `pos` (clang --offload-compress), and the
    offset just past it. Layout: "CCOB", u16 version, u16 method (0 zlib, 1 zstd), then
    version 2: u32 total size, u32 plain size; version 3: u64 total, u64 plain; then a u64
    hash and the compressed stream. Version 1 has no total size (it runs to the end)."""
    if pos + 8 > len(data):
        raise ValueError("compressed offload bundle header is truncated")
    version, method = struct.unpack_from("<HH", data, pos + 4)
    if version == 1:
        head, (plain_size,), total = 20, struct.unpack_from("<I", data, pos + 8), len(data) - pos
    elif version == 2:
        head = 24
        total, plain_size = struct.unpack_from("<II", data, pos + 8) if pos + 16 <= len(data) else (0, 0)
    elif version == 3:
        head = 32
        total, plain_size = struct.unpack_from("<QQ", data, pos + 8) if pos + 24 <= len(data) else (0, 0)
    else:
        raise ValueError(f"compressed offload bundle version {version} is not known (1 to 3 are)")
    if total < head or pos + total > len(data) or plain_size > MAX_INFLATED:
        raise ValueError("compressed offload bundle is truncated or claims an impossible size")
    stream = data[pos + head : pos + total]
    if method == COMPRESSION_ZSTD:
        import zstandard

        try:
            plain = zstandard.ZstdDecompressor().decompress(stream, max_output_size=plain_size)
        except zstandard.ZstdError as exc:
            raise ValueError(f"compressed offload bundle does not inflate: {exc}") from None
    elif method == COMPRESSION_ZLIB:
        import zlib

        try:
            plain = zlib.decompress(stream)
        except zlib.error as exc:
            raise ValueError(f"compressed offload bundle does not inflate: {exc}") from None
    else:
        raise ValueError(f"compressed offload bundle uses compression method {method} (0 zlib and 1 zstd are known)")
    if len(plain) != plain_size:
        raise ValueError(f"compressed offload bundle inflates to {len(plain)} bytes, not the {plain_size} it claims")
    return plain, pos + total


def _bundles(data: bytes, compressed: bool = False) -> list[tuple[bool, list[tuple[str, bytes]]]]:
    """Each bundle in `data` as (compressed, [(triple, code object)]), compressed ones inflated."""
    bundles: list[tuple[bool, list[tuple[str, bytes]]]] = []
    pos = 0
    while True:
        plain = data.find(BUNDLE_MAGIC, pos)
        packed = data.find(COMPRESSED_MAGIC, pos)
        if plain < 0 and packed < 0:
            return bundles
        if packed >= 0 and (plain < 0 or packed < plain):
            inner, pos = inflate_bundle(data, packed)
            bundles += _bundles(inner, compressed=True)
            continue
        p = plain + len(BUNDLE_MAGIC)
        if p + 8 > len(data):
            raise ValueError("offload bundle header is truncated")
        (count,) = struct.unpack_from("<Q", data, p)
        if count > 4096:
            raise ValueError(f"offload bundle claims {count} entries")
        p += 8
        entries = []
        for _ in range(count):
            if p + 24 > len(data):
                raise ValueError("offload bundle entry is truncated")
            off, size, tlen = struct.unpack_from("<QQQ", data, p)
            p += 24
            if tlen > 1024 or p + tlen > len(data):
                raise ValueError("offload bundle triple is truncated")
            triple = data[p : p + tlen].decode("ascii", errors="replace")
            p += tlen
            # offsets count from the bundle's magic; a code object past the data is cut to what is there
            entries.append((triple, data[plain + off : plain + off + size]))
        bundles.append((compressed, entries))
        pos = p


def parse_offload_bundle(data: bytes) -> list[OffloadBundle]:
    """Every bundle in a .hip_fatbin section (one per translation unit, 4 KiB aligned);
    compressed ones are inflated and listed with compressed=True."""
    return [OffloadBundle(tuple(t for t, _ in entries), compressed=c) for c, entries in _bundles(data)]


def _fatbin_entries(data: bytes) -> Iterator[tuple[str, int, int, int, bytes]]:
    """Each PTX or ELF entry of every fatbin in a .nv_fatbin section: its arch (with
    its arch- or family-specific suffix), kind, flags, inflated size (0 unless
    compressed) and payload as stored."""
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
            (flags,) = struct.unpack_from("<Q", data, p + 40) if ehsize >= 48 else (0,)
            (inflated,) = struct.unpack_from("<Q", data, p + 56) if ehsize >= 64 else (0,)
            suffix = "a" if flags & FATBIN_FLAG_ARCH_SPECIFIC else "f" if flags & FATBIN_FLAG_FAMILY_SPECIFIC else ""
            if kind in (FATBIN_KIND_PTX, FATBIN_KIND_ELF):
                yield f"sm_{arch}{suffix}", kind, flags, inflated, data[p + ehsize : p + ehsize + payload]
            p += ehsize + payload
        pos = end


def cuda_fatbin_arches(data: bytes) -> dict[str, set[str]]:
    """sm_XX (sm_XXa, sm_XXf) -> {"sass", "ptx"} for every entry of every fatbin in a
    .nv_fatbin section: the entry's arch with its arch- or family-specific flag."""
    found: dict[str, set[str]] = {}
    for arch, kind, _flags, _inflated, _body in _fatbin_entries(data):
        found.setdefault(arch, set()).add("sass" if kind == FATBIN_KIND_ELF else "ptx")
    return found


@dataclass(frozen=True)
class CodeObject:
    """The device code a backend carries for one arch, in one kind, over all its
    bundles or fatbins: `bytes` as the runtime loads it; `compressed_bytes` what it
    costs compressed: as stored where nvcc stored it compressed, else deflated alone
    at level 9, as a package's archive keeps it (for a compressed HIP bundle, whose
    code objects are compressed together, an estimate of its share)."""

    arch: str  # gfx1030, gfx90a:xnack-, sm_90, sm_90a
    kind: str  # hsaco, sass, ptx
    bytes: int
    compressed_bytes: int

    def to_json(self) -> dict[str, str | int]:
        return {"arch": self.arch, "kind": self.kind, "bytes": self.bytes, "compressed_bytes": self.compressed_bytes}


def _deflated(data: bytes) -> int:
    import zlib

    return len(zlib.compress(data, 9))


def _fatbin_objects(data: bytes) -> list[tuple[str, str, int, int]]:
    out = []
    for arch, kind, flags, inflated, body in _fatbin_entries(data):
        compressed = bool(flags & FATBIN_FLAG_COMPRESSED and inflated)
        sizes = (int(inflated), len(body)) if compressed else (len(body), _deflated(body))
        out.append((arch, "sass" if kind == FATBIN_KIND_ELF else "ptx", *sizes))
    return out


def code_objects(sections: dict[str, bytes]) -> list[CodeObject]:
    """The device code in a binary's device-code sections (.hip_fatbin or the PE's
    HIP section; .nv_fatbin), summed by arch and kind, sorted."""
    found: list[tuple[str, str, int, int]] = []
    for name, data in sections.items():
        if name == ".nv_fatbin":
            found += _fatbin_objects(data)
            continue
        for _compressed, entries in _bundles(data):
            for triple, obj in entries:
                if "amdgcn" in triple and "--" in triple and obj:
                    found.append((triple.rsplit("--", 1)[1], "hsaco", len(obj), _deflated(obj)))
    total: dict[tuple[str, str], tuple[int, int]] = {}
    for arch, kind, plain, packed in found:
        a, b = total.get((arch, kind), (0, 0))
        total[arch, kind] = (a + plain, b + packed)
    return [CodeObject(arch, kind, a, b) for (arch, kind), (a, b) in sorted(total.items())]
