"""A minimal safetensors reader/writer for building broken model files in tests
(the project itself does not depend on the safetensors package)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

Tensors = dict[str, tuple[str, list[int], bytes]]  # name -> (dtype, shape, raw bytes)


def read(path: Path) -> Tensors:
    data = path.read_bytes()
    (n,) = struct.unpack_from("<Q", data, 0)
    header: dict[str, Any] = json.loads(data[8 : 8 + n])
    base = 8 + n
    out: Tensors = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        out[name] = (e["dtype"], e["shape"], data[base + b : base + end])
    return out


def header_bytes(header: dict[str, Any]) -> bytes:
    raw = json.dumps(header).encode()
    return raw + b" " * (-len(raw) % 8)


def write(path: Path, tensors: Tensors, *, header_patch: dict[str, dict[str, Any]] | None = None) -> None:
    """Writes tensors in order; header_patch overrides fields of an entry (to make it lie)."""
    header: dict[str, Any] = {}
    blob = b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(blob), len(blob) + len(raw)]}
        blob += raw
    for name, fields in (header_patch or {}).items():
        header[name].update(fields)
    hb = header_bytes(header)
    path.write_bytes(struct.pack("<Q", len(hb)) + hb + blob)
