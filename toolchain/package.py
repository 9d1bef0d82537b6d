"""What goes into a package, and writing it: the host, the backend,
build-info.json, the HIP runtime's README (and the runtime where the config asks),
the SBOM (sbom.cdx.json, over all of those) and SHA256SUMS; sorted members, fixed
times and owners, written to a temporary name and renamed, so dist/ never holds a
partial package."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import stat
import tarfile
import time
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .atomic import replacing
from .atomic import sha256sums as _sums_text
from .closure import runtime_companions
from .plan import BackendSpec
from .revision import Revision
from .sbom import SBOM_NAME, package_sbom

__all__ = ["BUILD_INFO_SCHEMA", "HipRuntime", "build_info", "package_files", "sha256sums", "write_package"]

BUILD_INFO_SCHEMA = 1
TEMPLATE_DIR = Path(__file__).parent / "templates" / "package"


@dataclass(frozen=True)
class HipRuntime:
    """The HIP runtime a HIP package's backend binds: its file, the SDK folder that
    holds it, the SDK's version, and whether the package carries it."""

    name: str
    folder: Path
    sdk_version: str
    bundled: bool


def build_info(
    *,
    name: str,
    version: str,
    spec: BackendSpec,
    abi: str,
    revision: Revision,
    toolchain: Mapping[str, Mapping[str, str]],
    verify: Mapping[str, Mapping[str, Any]],
    validate: Mapping[str, Any],
    hip_runtime: str | None = None,
    device_code: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """build-info.json: what was built, from which source and toolchains, what verify and
    validate found, the backend's device code per arch and kind with its sizes, and for a
    HIP package the runtime its host binds and its backend imports."""
    info = {
        "schema": BUILD_INFO_SCHEMA,
        "name": name,
        "version": version,
        "platform": spec.platform,
        "api": spec.api,
        "arches": list(spec.arches),
        "abi": abi,
        "source_revision": revision.label,
        "source_date_epoch": revision.epoch,
        "toolchain": dict(toolchain),
        "verify": {k: {"ok": r["ok"], "checks": r["checks"]} for k, r in verify.items()},
        "validate": dict(validate),
        "device_code": [dict(c) for c in device_code],
    }
    if hip_runtime is not None:
        info["hip_runtime"] = hip_runtime
    return info


def _hip_readme(spec: BackendSpec, version: str, host: str, backend: str, runtime: HipRuntime) -> bytes:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATE_DIR),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    text = env.get_template("README-hip-runtime.txt.j2").render(
        version=version,
        platform=spec.platform,
        arches=spec.arches,
        backend=backend,
        runtime=runtime.name,
        windows=spec.windows,
        bundled=runtime.bundled,
        sdk_version=runtime.sdk_version,
        host=host,
    )
    return text.encode()


def package_files(
    spec: BackendSpec, host: Path, lib: Path, info: Mapping[str, Any], runtime: HipRuntime | None
) -> dict[str, bytes]:
    """A package's members: name -> bytes, SHA256SUMS last over all the others."""
    files = {
        host.name: host.read_bytes(),
        lib.name: lib.read_bytes(),
        "build-info.json": (json.dumps(info, indent=2, sort_keys=True) + "\n").encode(),
    }
    version = str(info["version"])
    roles = {host.name: ("host", version), lib.name: ("backend", version)}
    if runtime is not None:
        files["README-hip-runtime.txt"] = _hip_readme(spec, version, host.name, lib.name, runtime)
        if runtime.bundled:  # the runtime and what it imports from its own folder
            files[runtime.name] = (runtime.folder / runtime.name).read_bytes()
            roles[runtime.name] = ("runtime", runtime.sdk_version)
            for companion in runtime_companions(runtime.folder / runtime.name, spec.windows):
                files[companion.name] = companion.read_bytes()
                roles[companion.name] = ("runtime", runtime.sdk_version)
    files[SBOM_NAME] = package_sbom(
        name=str(info["name"]),
        version=version,
        revision=str(info["source_revision"]),
        epoch=int(info["source_date_epoch"]),
        members=files,
        roles=roles,
        toolchain=info["toolchain"],
    )
    files["SHA256SUMS"] = sha256sums(files)
    return files


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
