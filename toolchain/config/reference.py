"""The configuration's JSON schema and option reference, generated from the
models (their field descriptions are the documentation), never kept by hand.

    python -m toolchain.config.reference           # writes docs/config-reference.md and build/config-schema.json
    python -m toolchain.config.reference --check   # fails when the committed reference is out of date

The reference is committed (our own rendering); the schema is generated on
demand, since its exact text is pydantic's and changes between its releases.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, get_args, get_origin

from pydantic import BaseModel

from ..atomic import write_atomic
from .load import ENV_KEYS, VAR_KEYS
from .schema import Config

__all__ = ["reference_markdown", "schema_json"]

ROOT = Path(__file__).resolve().parents[2]
OUTPUTS = {"docs/config-reference.md": "reference", "build/config-schema.json": "schema"}
CHECKED = {"docs/config-reference.md"}


def schema_json() -> str:
    return json.dumps(Config.model_json_schema(by_alias=True), indent=2, sort_keys=True) + "\n"


def _model_in(ann: Any) -> tuple[type[BaseModel] | None, str]:
    """The table model a field holds: itself, optional, or as the values of a named table (`<name>`)."""
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann, ""
    args = get_args(ann)
    if get_origin(ann) is dict and len(args) == 2:
        inner, _ = _model_in(args[1])
        return inner, "<name>."
    for arg in args:  # X | None
        inner, _ = _model_in(arg)
        if inner is not None and type(None) in args:
            return inner, ""
    return None, ""


def _rows(model: type[BaseModel], prefix: str) -> list[tuple[str, str, str]]:
    rows = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{field.alias or name}"
        inner, named = _model_in(field.annotation)
        required = field.is_required()
        if inner is not None and (required or not (named and field.get_default(call_default_factory=True))):
            if field.description:
                rows.append((key, "required" if required else "", " ".join(field.description.split())))
            rows += _rows(inner, f"{key}.{named}")
            continue
        if required:
            rows.append((key, "required", " ".join((field.description or "").split())))
            continue
        default = field.get_default(call_default_factory=True)
        if isinstance(default, dict):  # named tables (profiles)
            default = {k: v.model_dump(mode="json") if isinstance(v, BaseModel) else v for k, v in default.items()}
        rows.append((key, json.dumps(default, default=str), " ".join((field.description or "").split())))
    return rows


def reference_markdown() -> str:
    env_for = {v: k for k, v in ENV_KEYS.items()}
    var_for = {v: k for k, v in VAR_KEYS.items()}
    lines = [
        "# Configuration reference",
        "",
        "Generated from `toolchain/config/schema.py` by `python -m toolchain.config.reference`; do not edit.",
        "Precedence: defaults < config file (`config=`, default `configs/default.toml`) < environment < `doit`",
        "variables. `doit config` shows the resolved values and where each came from.",
        "",
        "| key | default | environment | doit variable | meaning |",
        "|---|---|---|---|---|",
    ]
    for key, default, doc in _rows(Config, ""):
        env = ", ".join(f"`{n}`" for n, k in ENV_KEYS.items() if k == key) if key in env_for else ""
        var = f"`{var_for[key]}=`" if key in var_for else ""
        shown = f"`{default}`" if default and default != "required" else default
        lines.append(f"| `{key}` | {shown} | {env} | {var} | {doc} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description="Generate the config schema and reference.")
    ap.add_argument("--check", action="store_true", help="fail when a committed file is out of date")
    args = ap.parse_args()
    stale = []
    for rel, kind in OUTPUTS.items():
        text = schema_json() if kind == "schema" else reference_markdown()
        path = ROOT / rel
        if args.check:
            if rel in CHECKED and (not path.is_file() or path.read_text(encoding="utf-8") != text):
                stale.append(rel)
        else:
            write_atomic(path, text)
    if stale:
        print(f"out of date: {', '.join(stale)} (run python -m toolchain.config.reference)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
