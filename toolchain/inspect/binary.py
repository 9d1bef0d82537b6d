"""The format-neutral view of a built binary that verification works on."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["Binary"]


@dataclass(frozen=True)
class Binary:
    path: Path
    format: str  # "ELF" or "PE"
    target_ok: bool  # x86-64, 64-bit image (ELF64 / PE32+)
    target: str  # human description: "ELF64 EM_X86_64 ET_DYN", "PE32+ AMD64 DLL"
    exports: tuple[str, ...]  # sorted
    imports: tuple[str, ...]  # DT_NEEDED, or imported + delay-loaded DLLs
    sections: dict[str, bytes]  # device-code sections only, by name
    delay_imports: tuple[str, ...] = ()  # PE: the delay-loaded DLLs (also in imports)
