"""A package's software bill of materials: CycloneDX 1.6 JSON (sbom.cdx.json), made
with cyclonedx-python-lib. The package itself is the described component, with its
source revision; its members are components with their SHA-256 (the host, the
backend, a bundled HIP runtime and its companions with the SDK's version); the
toolchains that built them are the BOM's tools. The same inputs give the same
bytes: the serial number is derived from the members' hashes, the timestamp is
SOURCE_DATE_EPOCH and every reference is named."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import PurePath

__all__ = ["SBOM_NAME", "package_sbom"]

SBOM_NAME = "sbom.cdx.json"
# a fixed namespace: a package's serial number is a UUID5 of its members' hashes in it
_SERIALS = uuid.UUID("6f7d3c2a-7c1e-5b4e-9a55-2f0c6c1b9e10")


def _tool_name(key: str, values: Mapping[str, str]) -> str:
    path = values.get("compiler") or values.get("path")
    return PurePath(path).name if path else key


def package_sbom(
    *,
    name: str,
    version: str,
    revision: str,
    epoch: int,
    members: Mapping[str, bytes],
    roles: Mapping[str, tuple[str, str]],
    toolchain: Mapping[str, Mapping[str, str]],
) -> bytes:
    """The SBOM of package `name`. `members`: name -> bytes of what it carries; `roles`:
    for the binaries among them, name -> (role, version), role one of host, backend,
    runtime; `toolchain`: per toolchain (host, hip, cuda, ref) its fingerprint."""
    from cyclonedx.model import HashAlgorithm, HashType, Property
    from cyclonedx.model.bom import Bom, BomMetaData
    from cyclonedx.model.component import Component, ComponentType
    from cyclonedx.model.tool import ToolRepository
    from cyclonedx.output.json import JsonV1Dot6

    digests = {m: hashlib.sha256(data).hexdigest() for m, data in members.items()}
    package = Component(
        name=name,
        version=version,
        type=ComponentType.APPLICATION,
        bom_ref=f"package:{name}",
        properties=[Property(name="coli:source_revision", value=revision)],
    )
    components = []
    for member, (role, member_version) in sorted(roles.items()):
        kind = ComponentType.APPLICATION if role == "host" else ComponentType.LIBRARY
        components.append(
            Component(
                name=member,
                version=member_version,
                type=kind,
                bom_ref=f"member:{member}",
                hashes=[HashType(alg=HashAlgorithm.SHA_256, content=digests[member])],
                properties=[Property(name="coli:role", value=role)],
            )
        )
    tools = [
        Component(
            name=_tool_name(key, values),
            version=values.get("compiler_version") or values.get("version") or "unknown",
            type=ComponentType.APPLICATION,
            bom_ref=f"tool:{key}",
            properties=[Property(name=f"coli:{k}", value=str(v)) for k, v in sorted(values.items())]
            + [Property(name="coli:toolchain", value=key)],
        )
        for key, values in sorted(toolchain.items())
    ]
    serial = uuid.uuid5(_SERIALS, name + "".join(f"{m}={d};" for m, d in sorted(digests.items())))
    bom = Bom(
        serial_number=serial,
        metadata=BomMetaData(
            component=package,
            tools=ToolRepository(components=tools),
            timestamp=datetime.fromtimestamp(epoch, UTC),
        ),
        components=components,
    )
    bom.register_dependency(package, components)
    runtimes = [c for c in components if roles[c.name][0] == "runtime"]
    for c in components:
        if roles[c.name][0] == "backend" and runtimes:
            bom.register_dependency(c, runtimes)
    text: str = JsonV1Dot6(bom).output_as_string(indent=2)
    return (text + "\n").encode()
