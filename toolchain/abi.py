"""The backend ABI, loaded from kernels/abi.toml into frozen objects, and its renderings."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import jinja2
from pydantic import BaseModel, ConfigDict, Field, model_validator

from .toml_model import load_toml_model, read_text

__all__ = ["Abi", "Arg", "Constant", "Function", "Struct", "StructField", "load_abi", "render_abi"]

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TEMPLATES = Path(__file__).parent / "templates"

# file name of each rendering -> template
RENDERINGS: dict[str, str] = {
    "coli_backend.h": "abi/coli_backend.h.j2",
    "coli_backend_table.h": "abi/coli_backend_table.h.j2",
    "coli_backend.def": "abi/coli_backend.def.j2",
    "coli_backend.map": "abi/coli_backend.map.j2",
    "exports.txt": "abi/exports.txt.j2",
}


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


Identifier = Annotated[str, Field(pattern=_IDENT.pattern)]


class Arg(_Model):
    name: Identifier
    type: str

    @property
    def decl(self) -> str:
        sep = "" if self.type.endswith("*") else " "
        return f"{self.type}{sep}{self.name}"


class Function(_Model):
    name: Identifier
    returns: str
    args: tuple[Arg, ...]
    doc: str
    optional: bool = False
    since_minor: int = Field(0, ge=0)

    @property
    def member(self) -> str:
        """Name of the function-table member: the name without the ABI prefix."""
        return self.name.removeprefix("coli_")

    @property
    def params(self) -> str:
        return ", ".join(a.decl for a in self.args) or "void"


class Constant(_Model):
    name: Identifier
    value: int
    doc: str


class StructField(_Model):
    name: Identifier
    type: str
    doc: str = ""
    array: int | None = Field(None, gt=0)

    @property
    def decl(self) -> str:
        suffix = f"[{self.array}]" if self.array else ""
        return f"{self.type} {self.name}{suffix}"


class Struct(_Model):
    name: Identifier
    doc: str = ""
    fields: tuple[StructField, ...]


class _Head(_Model):
    name: Identifier
    prefix: str
    major: int = Field(ge=0, le=0xFFFF)
    minor: int = Field(ge=0, le=0xFFFF)


def _distinct(values: list[Any], what: str) -> None:
    dupes = sorted({str(v) for v in values if values.count(v) > 1})
    if dupes:
        raise ValueError(f"{what} defined twice: {', '.join(dupes)}")


class _AbiFile(_Model):
    """kernels/abi.toml, table by table."""

    abi: _Head
    status: tuple[Constant, ...] = ()
    format: tuple[Constant, ...] = ()
    struct: tuple[Struct, ...] = ()
    function: tuple[Function, ...] = ()

    @model_validator(mode="after")
    def _consistent(self) -> _AbiFile:
        if not self.function:
            raise ValueError("no functions defined")
        for f in self.function:
            if not f.name.startswith(self.abi.prefix):
                raise ValueError(f"function name '{f.name}' must be an identifier starting with '{self.abi.prefix}'")
            if f.since_minor > self.abi.minor:
                raise ValueError(f"{f.name} is since minor {f.since_minor}, past the ABI's minor {self.abi.minor}")
        _distinct([f.name for f in self.function], "functions")
        for table in ("status", "format"):
            _distinct([c.value for c in getattr(self, table)], f"{table} values")
            _distinct([c.name for c in getattr(self, table)], f"{table} names")
        return self


@dataclass(frozen=True)
class Abi:
    name: str
    prefix: str
    major: int
    minor: int
    statuses: tuple[Constant, ...]
    formats: tuple[Constant, ...]
    structs: tuple[Struct, ...]
    functions: tuple[Function, ...]

    @property
    def version(self) -> int:
        return (self.major << 16) | self.minor

    @property
    def exports(self) -> tuple[str, ...]:
        """Every symbol a backend must export (optional ones too: ours implement all)."""
        return tuple(f.name for f in self.functions)

    @property
    def mandatory(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.functions if not f.optional)


def load_abi(path: Path) -> Abi:
    """Load and check the ABI file: identifiers, the prefix on every function, nothing twice."""
    raw = load_toml_model(read_text(path, "the ABI"), _AbiFile, str(path))
    return Abi(
        name=raw.abi.name,
        prefix=raw.abi.prefix,
        major=raw.abi.major,
        minor=raw.abi.minor,
        statuses=raw.status,
        formats=raw.format,
        structs=raw.struct,
        functions=raw.function,
    )


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(_TEMPLATES),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def render_abi(abi: Abi, dll_name: str = "coli_backend") -> dict[str, str]:
    """Render every ABI file; returns file name -> text."""
    env = _environment()
    width = max(len(f.returns) for f in abi.functions)
    return {
        name: env.get_template(tpl).render(abi=abi, width=width, dll_name=dll_name) for name, tpl in RENDERINGS.items()
    }
