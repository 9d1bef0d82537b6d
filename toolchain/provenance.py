"""A release's provenance: an in-toto Statement (v1) whose subjects are the release's
packages by SHA-256 and whose predicate is SLSA Provenance v1: what was asked for
(the release, its version, its entries), from which source revision, by which
builder. Nothing in it depends on the clock, so the same release gives the same
bytes. Signing it is a hook (release.sign): no signing service is reached here."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["PROVENANCE", "STATEMENT_TYPE", "PREDICATE_TYPE", "release_statement"]

PROVENANCE = "provenance.intoto.json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "urn:coli-build:release:v1"
BUILDER = "urn:coli-build:doit-release"


def release_statement(head: Mapping[str, Any], entries: Sequence[Mapping[str, Any]], builder_version: str) -> str:
    """The Statement's exact text over the published `entries` (each built one with its
    package and sha256) and the manifest's `head` (release, version, source revision
    and date)."""
    built = [e for e in entries if e.get("package")]
    revision = str(head["source_revision"])
    commit = revision.removesuffix("-dirty")
    # a resource descriptor needs a digest: a source outside git (or not a clean commit's
    # hash) is named in the parameters only
    sources = []
    if len(commit) in (40, 64) and all(c in "0123456789abcdef" for c in commit):
        sources.append({"name": "source", "digest": {"gitCommit": commit}, "annotations": {"revision": revision}})
    statement = {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": e["package"], "digest": {"sha256": e["sha256"]}} for e in built],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {
                    "release": head["release"],
                    "version": head["version"],
                    "entries": [e["id"] for e in entries],
                },
                "internalParameters": {"source_date_epoch": head["source_date_epoch"], "source_revision": revision},
                "resolvedDependencies": sources,
            },
            "runDetails": {
                "builder": {"id": BUILDER, "version": {"coli-build": builder_version}},
                "metadata": {"invocationId": f"{head['release']}-{head['version']}-{revision}"},
            },
        },
    }
    return json.dumps(statement, indent=2, sort_keys=True) + "\n"
