"""TOML data files validated by pydantic models, with errors in the configs' style:
one line each, `<where>: <dotted.key>: <what is wrong>`, and an unknown key named
with the keys allowed there (and a "did you mean" when one is close)."""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar, get_args, get_origin

from pydantic import BaseModel, ValidationError

from .errors import ConfigError

__all__ = ["describe_error", "fields_at", "load_toml_model"]

M = TypeVar("M", bound=BaseModel)


def _model_in(ann: Any) -> type[BaseModel] | None:
    """The model an annotation holds: itself, or an item of a tuple/list or union of it."""
    for a in (ann, *get_args(ann)):
        if isinstance(a, type) and issubclass(a, BaseModel):
            return a
    return None


def fields_at(model: type[BaseModel], path: tuple[str | int, ...]) -> list[str]:
    """Field names that would be valid at `path` below `model`, for 'did you mean'."""
    cls: type[BaseModel] | None = model
    in_dict = False  # the next part is a key of a dict of models
    for part in path:
        if cls is None:
            return []
        if in_dict or isinstance(part, int):  # a dict's key, a list's index: the same model
            in_dict = False
            continue
        fields = {f.alias or n: f for n, f in cls.model_fields.items()}
        field = fields.get(part)
        ann = field.annotation if field else None
        if get_origin(ann) is dict:
            cls, in_dict = _model_in(get_args(ann)[1]), True
        else:
            cls = _model_in(ann)
    return [f.alias or n for n, f in cls.model_fields.items()] if cls is not None else []


def describe_error(err: Mapping[str, Any], model: type[BaseModel], where: str) -> str:
    """One pydantic error as one line, against `model` (the file's root)."""
    loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and "[" in p))  # pydantic's validator steps
    dotted = ".".join(str(p) for p in loc)
    if err["type"] == "extra_forbidden":
        allowed = fields_at(model, loc[:-1])
        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        hint = f"; did you mean '{'.'.join(str(p) for p in (*loc[:-1], close[0]))}'?" if close else ""
        return f"{where}: unknown key '{dotted}'{hint} (allowed here: {', '.join(allowed)})"
    msg = str(err["msg"]).removeprefix("Value error, ")
    got = err.get("input")
    shown = f" (got {got!r})" if not isinstance(got, (dict, list, tuple)) and got is not None else ""
    return f"{where}: {dotted}: {msg}{shown}" if dotted else f"{where}: {msg}"


def load_toml_model(text: str, model: type[M], where: str) -> M:
    """`text` (a TOML file's, `where` naming it in messages) as `model`; every problem in
    one ConfigError."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: not valid TOML: {exc}") from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError([describe_error(e, model, where) for e in exc.errors()]) from None


def read_text(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read {what}: {exc}") from None
