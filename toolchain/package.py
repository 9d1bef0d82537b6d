"""Deterministic packages: sorted members, fixed times and owners, written to a
temporary name and renamed, so dist/ never holds a partial package."""

from __future__ import annotations

import gzip
import hashlib
import io
import stat
import tarfile
import time
import zipfile
from collections.abc import Mapping
from pathlib import Path

from .atomic import replacing
from .atomic import sha256sums as _sums_text

__all__ = ["sha256sums", "write_package"]


def sha256sums(files: Mapping[str, bytes]) -> bytes:
    """The package's SHA256SUMS member over `files` (name -> bytes)."""
    return _sums_text({name: hashlib.sha256(data).hexdigest() for name, data in files.items()}).encode()


def _mode(name: str, executable: set[str]) -> int:
    return 0o755 if name in executable else 0o644


def write_package(dest: Path, top: str, files: Mapping[str, bytes], executable: set[str], epoch: int) -> None:
    """`files` maps member name (inside `top/`) to bytes; `dest` ends in .tar.gz or .zip."""
    names = sorted(files)
    with replacing(dest) as part:
        if dest.name.endswith(".zip"):
            # zip timestamps start at 1980
            when = max(epoch, 315532800)
            t = time.gmtime(when)[:6]
            with zipfile.ZipFile(part, "w", compression=zipfile.ZIP_DEFLATED) as zf:
                for name in names:
                    zinfo = zipfile.ZipInfo(f"{top}/{name}", date_time=t)
                    zinfo.external_attr = (stat.S_IFREG | _mode(name, executable)) << 16
                    zinfo.create_system = 3
                    zinfo.compress_type = zipfile.ZIP_DEFLATED
                    zf.writestr(zinfo, files[name])
        else:
            raw = io.BytesIO()
            with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tf:
                for name in names:
                    info = tarfile.TarInfo(f"{top}/{name}")
                    info.size = len(files[name])
                    info.mtime = epoch
                    info.mode = _mode(name, executable)
                    info.uid = info.gid = 0
                    info.uname = info.gname = ""
                    tf.addfile(info, io.BytesIO(files[name]))
            with part.open("wb") as fh, gzip.GzipFile(filename="", mode="wb", fileobj=fh, mtime=epoch) as gz:
                gz.write(raw.getvalue())
