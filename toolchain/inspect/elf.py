"""ELF inspection with pyelftools: what the verifier needs, as a frozen record."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile

__all__ = ["ElfInfo", "read_elf"]


@dataclass(frozen=True)
class ElfInfo:
    path: Path
    machine: str  # EM_X86_64
    elf_class: int  # 32 or 64
    elf_type: str  # ET_DYN, ET_EXEC
    exports: tuple[str, ...]  # defined global/weak dynamic symbols, sorted
    needed: tuple[str, ...]  # DT_NEEDED
    sections: dict[str, bytes]  # only the device-code sections, by name


DEVICE_SECTIONS = (".hip_fatbin", ".nv_fatbin")


def read_elf(path: Path) -> ElfInfo:
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
                    needed += [t.needed for t in section.iter_tags() if t.entry.d_tag == "DT_NEEDED"]
            sections = {}
            for name in DEVICE_SECTIONS:
                sec = elf.get_section_by_name(name)
                if sec is not None:
                    sections[name] = sec.data()
            return ElfInfo(
                path=path,
                machine=str(elf["e_machine"]),
                elf_class=elf.elfclass,
                elf_type=str(elf["e_type"]),
                exports=tuple(sorted(exports)),
                needed=tuple(needed),
                sections=sections,
            )
        except ELFError as exc:
            raise ValueError(f"{path} is not a readable ELF file: {exc}") from None
