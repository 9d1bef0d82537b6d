"""ELF inspection with pyelftools."""

from __future__ import annotations

from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile

from .binary import Binary

__all__ = ["DEVICE_SECTIONS", "read_elf"]

DEVICE_SECTIONS = (".hip_fatbin", ".nv_fatbin")


def read_elf(path: Path) -> Binary:
    """Raises ValueError when the file is not a readable ELF."""
    with path.open("rb") as fh:
        try:
            elf = ELFFile(fh)
            exports: set[str] = set()
            needed: list[str] = []
            dynsym = elf.get_section_by_name(".dynsym")
            if dynsym is not None:
                for sym in dynsym.iter_symbols():  # type: ignore[attr-defined]
                    if (
                        sym.name
                        and sym["st_shndx"] != "SHN_UNDEF"
                        and sym["st_info"]["bind"] in ("STB_GLOBAL", "STB_WEAK")
                        and sym["st_other"]["visibility"] in ("STV_DEFAULT", "STV_PROTECTED")
                    ):
                        exports.add(sym.name)
            for section in elf.iter_sections():
                if isinstance(section, DynamicSection):
                    needed += [str(t.needed) for t in section.iter_tags() if t.entry.d_tag == "DT_NEEDED"]  # type: ignore[attr-defined]
            sections = {}
            for name in DEVICE_SECTIONS:
                sec = elf.get_section_by_name(name)
                if sec is not None:
                    sections[name] = sec.data()
            machine, cls = str(elf["e_machine"]), elf.elfclass
            return Binary(
                path=path,
                format="ELF",
                target_ok=machine == "EM_X86_64" and cls == 64,
                target=f"ELF{cls} {machine} {elf['e_type']}",
                exports=tuple(sorted(exports)),
                imports=tuple(needed),
                sections=sections,
            )
        except ELFError as exc:
            raise ValueError(f"{path} is not a readable ELF file: {exc}") from None
