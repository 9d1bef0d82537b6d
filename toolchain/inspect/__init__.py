"""Read-only inspection of built binaries, one module per format."""

from .bundles import OffloadBundle, cuda_fatbin_arches, parse_offload_bundle
from .elf import ElfInfo, read_elf

__all__ = ["ElfInfo", "OffloadBundle", "cuda_fatbin_arches", "parse_offload_bundle", "read_elf"]
