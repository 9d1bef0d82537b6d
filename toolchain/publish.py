"""Publishing a release: dist/release-<version>/ with every built entry's package,
release-manifest.json (entries, status, hashes, toolchains, device code, source
revision), provenance.intoto.json (the packages by SHA-256 in an in-toto
Statement with an SLSA v1 predicate; its signature too when release.sign names a
signer) and SHA256SUMS.

The folder is assembled under a hidden name and renamed into place, so it is
either the previous complete release or the new complete one, never a mix.
`merge` joins the folders that CI's fanned-out jobs publish into one.

    python -m toolchain.publish merge OUT DIR...
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .atomic import file_sha256, sha256sums, write_atomic
from .config.release import ReleaseEntry
from .errors import ColiError, ConfigError, ReleaseError
from .provenance import PROVENANCE, release_statement
from .table import aligned

__all__ = [
    "MANIFEST",
    "SUMS",
    "BuiltEntry",
    "format_summary",
    "manifest_json",
    "merge_releases",
    "publish_release",
    "release_rows",
]

MANIFEST = "release-manifest.json"
SUMS = "SHA256SUMS"
SCHEMA = 1


def manifest_json(head: Mapping[str, Any], entries: Sequence[Mapping[str, Any]]) -> str:
    """The manifest's exact text: sorted keys, entries in matrix order, no clock time."""
    return json.dumps({"schema": SCHEMA, **head, "entries": list(entries)}, indent=2, sort_keys=True) + "\n"


def _sums(folder: Path, names: Iterable[str]) -> str:
    return sha256sums({n: file_sha256(folder / n) for n in names})


@dataclass(frozen=True)
class BuiltEntry:
    """A release entry that was built: its package, its validation report, its toolchains, its device code."""

    package: Path
    validation: Mapping[str, Any]
    toolchain: Mapping[str, Mapping[str, str]]
    device_code: Sequence[Mapping[str, Any]] = ()  # per arch and kind, with sizes (sizes.device_code)


def release_rows(
    entries: Sequence[ReleaseEntry], built: Mapping[str, BuiltEntry], not_built: Mapping[str, str]
) -> list[dict[str, Any]]:
    """The manifest's entries, in matrix order: each built one with its package, validation
    and toolchains, each other one with what this machine lacks to build it."""
    rows: list[dict[str, Any]] = []
    for e in entries:
        row: dict[str, Any] = {"id": e.id, "platform": e.platform, "api": e.api, "arches": list(e.arches)}
        if e.group:
            row["group"] = e.group
        if e.id in built:
            b = built[e.id]
            reason = b.validation["reason"]
            row |= {
                "status": "built",
                "package": b.package.name,
                "validation": b.validation["status"] + (f": {reason}" if reason else ""),
                "toolchain": {k: dict(v) for k, v in b.toolchain.items()},
                "device_code": [dict(c) for c in b.device_code],
            }
        else:
            row |= {"status": "not-built", "needs": not_built.get(e.id, "not planned")}
        rows.append(row)
    return rows


def _builder_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("coli-build")
    except PackageNotFoundError:
        return "unknown"


def _sign(stage: Path, argv: Sequence[str]) -> str:
    """Runs the signer on the provenance in `stage` ({file}: the statement, {signature}:
    where the signature goes); the signature's name, or ReleaseError in one line."""
    statement, signature = stage / PROVENANCE, stage / f"{PROVENANCE}.sig"
    cmd = [a.replace("{file}", str(statement)).replace("{signature}", str(signature)) for a in argv]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as exc:
        raise ReleaseError(f"release.sign: cannot run {argv[0]}: {exc.strerror}") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        raise ReleaseError(f"release.sign: {argv[0]} exited {proc.returncode}: {last}")
    if not signature.is_file():
        raise ReleaseError(f"release.sign: {argv[0]} wrote no signature to {{signature}} ({signature.name})")
    return signature.name


def publish_release(
    dest: Path,
    head: Mapping[str, Any],
    entries: Sequence[Mapping[str, Any]],
    packages: Mapping[str, Path],
    sign: Sequence[str] = (),
) -> None:
    """Write `dest` atomically. `entries` lack hashes; each built one names its package file,
    found in `packages` (file name -> path), which is copied in and hashed here. `sign`: the
    signer's command (release.sign), run on the provenance before anything is published."""
    parent = dest.parent
    parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(parent, dest.name)
    stage = parent / f".{dest.name}.{os.getpid()}.part"
    if stage.exists():
        shutil.rmtree(stage)
    stage.mkdir()
    try:
        out = []
        for entry in entries:
            e = dict(entry)
            name = e.get("package")
            if name:
                shutil.copyfile(packages[name], stage / name)
                e["sha256"] = file_sha256(stage / name)
                e["size"] = (stage / name).stat().st_size
            out.append(e)
        write_atomic(stage / MANIFEST, manifest_json(head, out))
        write_atomic(stage / PROVENANCE, release_statement(head, out, _builder_version()))
        names = [e["package"] for e in out if e.get("package")] + [MANIFEST, PROVENANCE]
        if sign:
            names.append(_sign(stage, sign))
        write_atomic(stage / SUMS, _sums(stage, names))
        _swap_in(stage, dest)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


def _swap_in(stage: Path, dest: Path) -> None:
    """Rename `stage` to `dest`; an old `dest` is moved aside first and removed after."""
    old = dest.with_name(f".{dest.name}.{os.getpid()}.old")
    if dest.exists():
        os.replace(dest, old)
    os.replace(stage, dest)
    if old.exists():
        shutil.rmtree(old)


def _remove_stale(parent: Path, name: str) -> None:
    """Hidden leftovers of a publish that was killed part-way."""
    for p in parent.glob(f".{name}.*"):
        if p.suffix in (".part", ".old") and p.is_dir():
            shutil.rmtree(p, ignore_errors=True)


def format_summary(entries: Sequence[Mapping[str, Any]], dest: Path | None) -> str:
    """A table of the entries: status, validation (the manifest has its reason) and package or need."""
    rows = [("entry", "status", "validation", "package / what it needs")]
    for e in entries:
        if e["status"] == "built":
            detail = f"{e['package']}  sha256 {e['sha256'][:16]}" if "sha256" in e else e.get("package", "")
            rows.append((e["id"], "built", str(e.get("validation", "")).split(":")[0], detail))
        else:
            rows.append((e["id"], e["status"], "", e.get("needs", "")))
    lines = aligned(rows)
    built = sum(1 for e in entries if e["status"] == "built")
    tail = f"release: {built} of {len(entries)} entries built"
    if dest is not None:
        tail += f", published in {dest}"
    return "\n".join([*lines, tail])


def _read_release(folder: Path) -> dict[str, Any]:
    manifest = folder / MANIFEST
    if not manifest.is_file():
        raise ConfigError(f"{folder}: no {MANIFEST}; give the folders `doit release` published")
    data: dict[str, Any] = json.loads(manifest.read_text(encoding="utf-8"))
    sums = dict(
        (name, digest)
        for digest, name in (line.split("  ", 1) for line in (folder / SUMS).read_text(encoding="utf-8").splitlines())
    )
    for e in data["entries"]:
        name = e.get("package")
        digest = file_sha256(folder / name) if name and (folder / name).is_file() else None
        if name and (digest is None or digest != e.get("sha256") or digest != sums.get(name)):
            raise ConfigError(f"{folder / name}: missing or does not match its sha256 in {MANIFEST}")
    return data


def merge_releases(dest: Path, folders: Sequence[Path]) -> list[dict[str, Any]]:
    """One release from several partial ones (one per CI job): same release, version and source;
    an entry built in any of them counts as built."""
    parts = [(_read_release(f), f) for f in folders]
    if not parts:
        raise ConfigError("merge: no release folders given")
    head = {k: v for k, v in parts[0][0].items() if k not in ("entries", "schema")}
    merged: dict[str, dict[str, Any]] = {}
    packages: dict[str, Path] = {}
    for data, folder in parts:
        mine = {k: v for k, v in data.items() if k not in ("entries", "schema")}
        if mine != head:
            diff = sorted(k for k in set(mine) | set(head) if mine.get(k) != head.get(k))
            raise ConfigError(f"merge: {folder} is another release ({', '.join(diff)} differ)")
        for e in data["entries"]:
            have = merged.get(e["id"])
            if have and have["status"] == "built" and e["status"] == "built" and have["sha256"] != e["sha256"]:
                raise ConfigError(f"merge: {e['id']} was built twice with different bytes")
            if have is None or (e["status"] == "built" and have["status"] != "built"):
                merged[e["id"]] = e
            if e.get("package"):
                packages[e["package"]] = folder / e["package"]
    entries = [{k: v for k, v in e.items() if k not in ("sha256", "size")} for e in merged.values()]
    publish_release(dest, head, entries, packages)
    return [dict(e) for e in json.loads((dest / MANIFEST).read_text(encoding="utf-8"))["entries"]]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m toolchain.publish", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("merge", help="join release folders published by separate jobs")
    m.add_argument("out", type=Path)
    m.add_argument("folders", type=Path, nargs="+")
    args = ap.parse_args(argv)
    try:
        entries = merge_releases(args.out, args.folders)
    except ColiError as exc:
        print(exc.one_line(), file=sys.stderr)
        return exc.exit_code
    print(format_summary(entries, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
