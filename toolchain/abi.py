"""The backend ABI, loaded from kernels/abi.toml into frozen objects, and its renderings."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import jinja2
from pydantic import BaseModel, ConfigDict, Field, model_validator

from .toml_model import load_toml_model, read_text

__all__ = [
    "Abi",
    "Arg",
    "Constant",
    "Function",
    "Handle",
    "Op",
    "OpRef",
    "Struct",
    "StructField",
    "load_abi",
    "render_abi",
]

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TEMPLATES = Path(__file__).parent / "templates"

# file name of each rendering -> template
RENDERINGS: dict[str, str] = {
    "coli_backend.h": "abi/coli_backend.h.j2",
    "coli_backend_table.h": "abi/coli_backend_table.h.j2",
    "coli_ops.h": "abi/coli_ops.h.j2",
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


class Handle(_Model):
    name: Identifier
    doc: str


# element types an op's buffer operand may have, and their sizes
OP_ELEMENTS: dict[str, int] = {"float": 4, "int32_t": 4, "uint8_t": 1}
OP_SLOTS = {"ref": 8, "i": 10, "f": 2}  # the sizes of coli_op's arrays


class OpRef(_Model):
    name: Identifier
    type: str
    out: bool = False
    optional: bool = False

    @model_validator(mode="after")
    def _known_type(self) -> OpRef:
        if self.type not in OP_ELEMENTS:
            raise ValueError(f"op operand '{self.name}' has type '{self.type}'; allowed: {', '.join(OP_ELEMENTS)}")
        return self

    @property
    def pointer(self) -> str:
        """How a backend sees the operand once resolved: a typed pointer."""
        return f"{'' if self.out else 'const '}{self.type} *"


class Op(_Model):
    """One kind of step op: its operands in coli_op's slots, in order."""

    name: Identifier
    value: int = Field(gt=0)
    doc: str
    refs: tuple[OpRef, ...]
    ints: tuple[Identifier, ...] = ()
    floats: tuple[Identifier, ...] = ()
    tensors: str = Field("none", pattern="^(none|one|list)$")
    since_minor: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _fits(self) -> Op:
        for slot, names in (("ref", self.refs), ("i", self.ints), ("f", self.floats)):
            if len(names) > OP_SLOTS[slot]:
                raise ValueError(f"op {self.name} has {len(names)} {slot} operands; coli_op holds {OP_SLOTS[slot]}")
        _distinct([r.name for r in self.refs] + list(self.ints) + list(self.floats), f"op {self.name} operands")
        return self

    @property
    def const(self) -> str:
        return f"COLI_OP_{self.name.upper()}"

    @property
    def params(self) -> str:
        """The constructor's parameters, in slot order."""
        out = [f"coli_ref {r.name}" for r in self.refs]
        out += [f"int64_t {n}" for n in self.ints] + [f"float {n}" for n in self.floats]
        if self.tensors == "one":
            out.append("const coli_tensor *weight")
        elif self.tensors == "list":
            out += ["const coli_tensor *tensors", "int32_t n_tensors"]
        return ", ".join(out)


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
    handle: tuple[Handle, ...] = ()
    struct: tuple[Struct, ...] = ()
    op: tuple[Op, ...] = ()
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
        for o in self.op:
            if o.since_minor > self.abi.minor:
                raise ValueError(f"op {o.name} is since minor {o.since_minor}, past the ABI's minor {self.abi.minor}")
        _distinct([f.name for f in self.function], "functions")
        _distinct([o.name for o in self.op], "ops")
        _distinct([o.value for o in self.op], "op values")
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
    handles: tuple[Handle, ...]
    structs: tuple[Struct, ...]
    ops: tuple[Op, ...]
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
        handles=raw.handle,
        structs=raw.struct,
        ops=raw.op,
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
        name: env.get_template(tpl).render(abi=abi, width=width, dll_name=dll_name, elements=OP_ELEMENTS)
        for name, tpl in RENDERINGS.items()
    }
