"""Read-only inspection of built binaries, one module per format."""

from pathlib import Path

from .binary import Binary
from .bundles import OffloadBundle, cuda_fatbin_arches, parse_offload_bundle
from .elf import read_elf
from .pe import HIP_PE_SECTION, read_pe

__all__ = [
    "HIP_PE_SECTION",
    "Binary",
    "OffloadBundle",
    "cuda_fatbin_arches",
    "parse_offload_bundle",
    "read_binary",
    "read_elf",
    "read_pe",
]


def read_binary(path: Path) -> Binary:
    """ELF or PE by magic; ValueError for anything else."""
    with path.open("rb") as fh:
        magic = fh.read(4)
    if magic == b"\x7fELF":
        return read_elf(path)
    if magic[:2] == b"MZ":
        return read_pe(path)
    raise ValueError(f"{path} is neither ELF nor PE (starts with {magic!r})")
