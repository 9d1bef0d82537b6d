"""PE inspection with pefile."""

from __future__ import annotations

from pathlib import Path

import pefile

from .binary import Binary

__all__ = ["HIP_PE_SECTION", "read_pe"]

HIP_PE_SECTION = ".hip_fat"  # PE section names are at most 8 bytes
_MACHINE_AMD64 = 0x8664
_MAGIC_PE32_PLUS = 0x20B


def read_pe(path: Path) -> Binary:
    """Raises ValueError when the file is not a readable PE image."""
    try:
        pe = pefile.PE(str(path), fast_load=True)
        pe.parse_data_directories(
            directories=[
                pefile.DIRECTORY_ENTRY["IMAGE_DIRECTORY_ENTRY_EXPORT"],
                pefile.DIRECTORY_ENTRY["IMAGE_DIRECTORY_ENTRY_IMPORT"],
                pefile.DIRECTORY_ENTRY["IMAGE_DIRECTORY_ENTRY_DELAY_IMPORT"],
            ]
        )
    except (pefile.PEFormatError, OSError) as exc:
        raise ValueError(f"{path} is not a readable PE file: {exc}") from None
    try:
        exports: set[str] = set()
        if hasattr(pe, "DIRECTORY_ENTRY_EXPORT"):
            exports = {s.name.decode("ascii", "replace") for s in pe.DIRECTORY_ENTRY_EXPORT.symbols if s.name}
        imports = [e.dll.decode("ascii", "replace") for e in getattr(pe, "DIRECTORY_ENTRY_IMPORT", [])]
        delayed = [e.dll.decode("ascii", "replace") for e in getattr(pe, "DIRECTORY_ENTRY_DELAY_IMPORT", [])]
        imports += delayed
        sections = {}
        for sec in pe.sections:
            name = sec.Name.rstrip(b"\0").decode("ascii", "replace")
            if name == HIP_PE_SECTION:
                sections[name] = sec.get_data()
        machine = pe.FILE_HEADER.Machine
        magic = pe.OPTIONAL_HEADER.Magic
        kind = "DLL" if pe.is_dll() else "EXE"
        return Binary(
            path=path,
            format="PE",
            target_ok=machine == _MACHINE_AMD64 and magic == _MAGIC_PE32_PLUS,
            target=f"{'PE32+' if magic == _MAGIC_PE32_PLUS else 'PE32'} machine 0x{machine:04x} {kind}",
            exports=tuple(sorted(exports)),
            imports=tuple(imports),
            sections=sections,
            delay_imports=tuple(delayed),
        )
    finally:
        pe.close()
