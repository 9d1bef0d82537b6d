"""Files that appear whole or not at all, and their SHA-256 lists.

Every writer of build state, reports, packages and docs goes through `replacing`
(or `write_atomic`): the new bytes go to a temporary name beside the target, are
flushed to disk, and are renamed over it, so a killed or failed writer leaves the
old file or none, never half of one.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

__all__ = ["file_sha256", "replacing", "sha256sums", "write_atomic"]


@contextmanager
def replacing(path: Path, *, fixed_name: bool = False) -> Iterator[Path]:
    """A temporary path to write `path`'s new content to; renamed over `path` when the
    block ends without an error, removed when it raises. The name is hidden and holds
    the process id, or, with `fixed_name`, is `<name>.part` (for a compiler, whose
    output may record its own file name, so that the bytes do not depend on the pid)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(f"{path.name}.part" if fixed_name else f".{path.name}.{os.getpid()}.part")
    try:
        yield part
        with part.open("rb") as fh:
            os.fsync(fh.fileno())
        os.replace(part, path)
    finally:
        part.unlink(missing_ok=True)


def write_atomic(path: Path, data: str | bytes) -> None:
    """`data` (text as UTF-8) as the whole of `path`."""
    with replacing(path) as part:
        part.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256sums(digests: Mapping[str, str]) -> str:
    """The SHA256SUMS text (`sha256sum -c` reads it) of name -> hex digest, sorted by name."""
    return "".join(f"{digest}  {name}\n" for name, digest in sorted(digests.items()))
