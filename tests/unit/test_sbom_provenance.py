"""A package's SBOM (toolchain/sbom.py) against CycloneDX 1.6's JSON schema, a
release's provenance (toolchain/provenance.py) against the in-toto Statement / SLSA
v1 schema, and the signing hook (release.sign) with a stand-in signer. The real
packages' and release's are checked in tests/integration (test_build, test_release)."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from tests.conftest import provenance_errors, sbom_errors
from toolchain.errors import ReleaseError
from toolchain.provenance import PROVENANCE, release_statement
from toolchain.publish import publish_release
from toolchain.sbom import package_sbom

MEMBERS = {"coli.exe": b"host", "coli_hip.dll": b"backend", "amdhip64_7.dll": b"runtime", "amd_comgr_3.dll": b"comgr"}
ROLES = {
    "coli.exe": ("host", "0.1.0"),
    "coli_hip.dll": ("backend", "0.1.0"),
    "amdhip64_7.dll": ("runtime", "7.1.0"),
    "amd_comgr_3.dll": ("runtime", "7.1.0"),
}
TOOLCHAIN = {
    "host": {"path": "C:/msvc/cl.exe", "version": "19.44"},
    "hip": {"compiler": "C:/rocm/clang.exe", "version": "7.1.0"},
}
HEAD = {"release": "local", "version": "0.2.0", "source_revision": "ab" * 20, "source_date_epoch": 1_700_000_000}


def _sbom(members: dict[str, bytes] = MEMBERS) -> bytes:
    return package_sbom(
        name="coli-0.1.0-windows-x86_64-hip-gfx1151", version="0.1.0", revision="ab" * 20, epoch=1_700_000_000,
        members=members, roles=ROLES, toolchain=TOOLCHAIN,
    )  # fmt: skip


def test_the_sbom_is_cyclonedx_1_6_with_every_binary_by_hash() -> None:
    data = _sbom()
    assert sbom_errors(data) is None
    bom = json.loads(data)
    assert bom["specVersion"] == "1.6" and bom["metadata"]["timestamp"] == "2023-11-14T22:13:20+00:00"
    hashes = {c["name"]: (c["version"], c["hashes"][0]["content"]) for c in bom["components"]}
    assert hashes == {n: (ROLES[n][1], hashlib.sha256(b).hexdigest()) for n, b in MEMBERS.items()}
    deps = {d["ref"]: set(d.get("dependsOn", [])) for d in bom["dependencies"]}
    assert deps["member:coli_hip.dll"] == {"member:amdhip64_7.dll", "member:amd_comgr_3.dll"}
    assert {t["name"]: t["version"] for t in bom["metadata"]["tools"]["components"]} == {
        "cl.exe": "19.44",
        "clang.exe": "7.1.0",
    }
    # the same inputs, the same bytes; another member, another serial number
    assert _sbom() == data
    assert json.loads(_sbom(MEMBERS | {"coli.exe": b"other"}))["serialNumber"] != bom["serialNumber"]


def test_the_schema_check_can_fail() -> None:
    broken = _sbom().replace(b'"SHA-256"', b'"SHA-999"')
    assert sbom_errors(broken) is not None


def _entries() -> list[dict[str, object]]:
    return [
        {"id": "linux-x86_64-ref-cpu", "status": "built", "package": "a.tar.gz", "sha256": "1" * 64},
        {"id": "windows-x86_64-hip-gfx1151", "status": "not-built", "needs": "needs Windows"},
    ]


def test_the_provenance_names_every_package_by_sha256() -> None:
    text = release_statement(HEAD, _entries(), "0.1.0")
    assert provenance_errors(text) == []
    st = json.loads(text)
    assert st["subject"] == [{"name": "a.tar.gz", "digest": {"sha256": "1" * 64}}]
    assert st["predicate"]["buildDefinition"]["resolvedDependencies"][0]["digest"] == {"gitCommit": "ab" * 20}
    assert st["predicate"]["buildDefinition"]["externalParameters"]["entries"] == [e["id"] for e in _entries()]
    dirty = json.loads(release_statement(HEAD | {"source_revision": "unknown"}, _entries(), "0.1.0"))
    assert dirty["predicate"]["buildDefinition"]["resolvedDependencies"] == []
    # the schema check can fail: no subject, a digest that is not hex
    assert provenance_errors(json.dumps(st | {"subject": []})) != []
    bad = st | {"subject": [{"name": "a", "digest": {"sha256": "xyz"}}]}
    assert any("subject/0/digest/sha256" in e for e in provenance_errors(json.dumps(bad)))


def _publish(tmp_path: Path, sign: list[str]) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    pkg = tmp_path / "a.tar.gz"
    pkg.write_bytes(b"package")
    dest = tmp_path / "dist" / "release-0.2.0"
    publish_release(dest, HEAD, [_entries()[0] | {"sha256": None}], {"a.tar.gz": pkg}, sign)
    return dest


SIGNER = (
    "import hashlib,sys; open(sys.argv[2],'w').write('sig:'+hashlib.sha256(open(sys.argv[1],'rb').read()).hexdigest())"
)


def test_a_signer_signs_the_provenance_before_it_is_published(tmp_path: Path) -> None:
    dest = _publish(tmp_path, [sys.executable, "-c", SIGNER, "{file}", "{signature}"])
    statement = (dest / PROVENANCE).read_bytes()
    assert (dest / f"{PROVENANCE}.sig").read_text() == "sig:" + hashlib.sha256(statement).hexdigest()
    sums = {line.split("  ")[1]: line.split("  ")[0] for line in (dest / "SHA256SUMS").read_text().splitlines()}
    assert set(sums) == {"a.tar.gz", "release-manifest.json", PROVENANCE, f"{PROVENANCE}.sig"}
    unsigned = _publish(tmp_path / "unsigned", [])
    assert not (unsigned / f"{PROVENANCE}.sig").exists() and (unsigned / PROVENANCE).read_bytes() == statement


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        ([sys.executable, "-c", "import sys; sys.exit('no key')"], "exited 1: no key"),
        ([sys.executable, "-c", "pass"], "wrote no signature"),
        (["/nonexistent/signer"], "cannot run /nonexistent/signer"),
    ],
)
def test_a_failing_signer_publishes_nothing(tmp_path: Path, argv: list[str], needle: str) -> None:
    with pytest.raises(ReleaseError) as err:
        _publish(tmp_path, argv)
    line = err.value.one_line()
    assert needle in line and "release.sign" in line and "\n" not in line, line
    assert not (tmp_path / "dist" / "release-0.2.0").exists() and not list((tmp_path / "dist").iterdir())
