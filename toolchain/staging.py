"""A compile's inputs copied into a folder named by their content.

sccache splits an nvcc compile into its steps and hashes each step's arguments as
they are; nvcc hands cicc and cudafe++ the source's absolute path
(`--orig_src_path_name`), and sccache's base folders rewrite only preprocessor
output, so those steps miss in a checkout at any other path. Compiled from a copy
at a path that depends on the sources alone, every checkout with the same sources
gives the same arguments, and a clean checkout elsewhere hits every step.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

__all__ = ["stage_files"]


def stage_files(files: Sequence[tuple[str, Path]], under: Path | None = None) -> Path:
    """The folder (in `under`, default `<temp>/coli-stage`) holding each (name, source)
    of `files` at its name. It appears whole: a copy is built beside it and renamed, so a
    folder that exists is complete, and builds of the same sources share it."""
    digest = hashlib.sha256()
    for name, source in sorted(files):
        digest.update(name.encode() + b"\0" + hashlib.sha256(source.read_bytes()).digest())
    root = under or Path(tempfile.gettempdir()) / "coli-stage"
    folder = root / digest.hexdigest()[:20]
    if folder.is_dir():
        return folder
    root.mkdir(parents=True, exist_ok=True)
    part = Path(tempfile.mkdtemp(dir=root, prefix=".part-"))
    try:
        for name, source in files:
            (part / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, part / name)
        os.rename(part, folder)
    except OSError:
        if not folder.is_dir():  # not another build's rename winning the race: a real failure
            raise
    finally:
        shutil.rmtree(part, ignore_errors=True)
    return folder
