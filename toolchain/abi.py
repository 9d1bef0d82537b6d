"""The backend ABI, loaded from kernels/abi.toml into frozen objects, and its renderings."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

import jinja2

from .errors import ConfigError

__all__ = ["Abi", "Arg", "Constant", "Field", "Function", "Struct", "load_abi", "render_abi"]

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


@dataclass(frozen=True)
class Arg:
    name: str
    type: str

    @property
    def decl(self) -> str:
        sep = "" if self.type.endswith("*") else " "
        return f"{self.type}{sep}{self.name}"


@dataclass(frozen=True)
class Function:
    name: str
    returns: str
    args: tuple[Arg, ...]
    doc: str
    optional: bool = False
    since_minor: int = 0

    @property
    def member(self) -> str:
        """Name of the function-table member: the name without the ABI prefix."""
        return self.name.removeprefix("coli_")

    @property
    def params(self) -> str:
        return ", ".join(a.decl for a in self.args) or "void"


@dataclass(frozen=True)
class Constant:
    name: str
    value: int
    doc: str


@dataclass(frozen=True)
class Field:
    name: str
    type: str
    doc: str
    array: int | None = None

    @property
    def decl(self) -> str:
        suffix = f"[{self.array}]" if self.array else ""
        return f"{self.type} {self.name}{suffix}"


@dataclass(frozen=True)
class Struct:
    name: str
    doc: str
    fields: tuple[Field, ...]


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


def _require(table: dict[str, object], key: str, where: str, kind: type) -> object:
    if key not in table:
        raise ConfigError(f"{where}: missing key '{key}'")
    value = table[key]
    if not isinstance(value, kind):
        raise ConfigError(f"{where}.{key}: expected {kind.__name__}, got {type(value).__name__}")
    return value


def _constants(raw: list[dict[str, object]], where: str) -> tuple[Constant, ...]:
    out = []
    for i, c in enumerate(raw):
        w = f"{where}[{i}]"
        out.append(
            Constant(
                name=str(_require(c, "name", w, str)),
                value=int(_require(c, "value", w, int)),  # type: ignore[call-overload]
                doc=str(_require(c, "doc", w, str)),
            )
        )
    values = [c.value for c in out]
    if len(set(values)) != len(values):
        raise ConfigError(f"{where}: duplicate values {values}")
    return tuple(out)


def load_abi(path: Path) -> Abi:
    """Load and check the ABI file: unique identifiers, prefix on every function."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the ABI: {exc}") from exc
    head = raw.get("abi", {})
    prefix = str(_require(head, "prefix", f"{path}:abi", str))
    functions = []
    for i, f in enumerate(raw.get("function", [])):
        w = f"{path}:function[{i}]"
        args = tuple(
            Arg(str(_require(a, "name", w, str)), str(_require(a, "type", w, str)))
            for a in _require(f, "args", w, list)  # type: ignore[attr-defined]
        )
        fn = Function(
            name=str(_require(f, "name", w, str)),
            returns=str(_require(f, "returns", w, str)),
            args=args,
            doc=str(_require(f, "doc", w, str)),
            optional=bool(f.get("optional", False)),
            since_minor=int(f.get("since_minor", 0)),
        )
        if not fn.name.startswith(prefix) or not _IDENT.match(fn.name):
            raise ConfigError(f"{w}: function name '{fn.name}' must be an identifier starting with '{prefix}'")
        functions.append(fn)
    names = [f.name for f in functions]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"{path}: functions defined twice: {', '.join(dupes)}")
    if not functions:
        raise ConfigError(f"{path}: no functions defined")
    structs = tuple(
        Struct(
            name=str(s["name"]),
            doc=str(s.get("doc", "")),
            fields=tuple(
                Field(str(fl["name"]), str(fl["type"]), str(fl.get("doc", "")), fl.get("array")) for fl in s["fields"]
            ),
        )
        for s in raw.get("struct", [])
    )
    return Abi(
        name=str(_require(head, "name", f"{path}:abi", str)),
        prefix=prefix,
        major=int(_require(head, "major", f"{path}:abi", int)),  # type: ignore[call-overload]
        minor=int(_require(head, "minor", f"{path}:abi", int)),  # type: ignore[call-overload]
        statuses=_constants(raw.get("status", []), f"{path}:status"),
        formats=_constants(raw.get("format", []), f"{path}:format"),
        structs=structs,
        functions=tuple(functions),
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
