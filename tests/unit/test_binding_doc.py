"""docs/binding.md's table of the seed's loader-contract scenarios is kept true: each
class has the seed's count, and every test it names exists."""

from __future__ import annotations

import re
from collections import Counter

from tests.conftest import ROOT
from tests.loader_fixtures import doc_table

# the seed's classes and how many tests each has (78 in all)
SEED_CLASSES = {
    "StubFixture": 12,
    "Cleanup": 1,
    "RuntimeBinding": 4,
    "RuntimeDirContract": 19,
    "FileIdentity": 7,
    "PathHelper": 8,
    "Inventory": 6,
    "BindingDecision": 3,
    "FailureDiagnostic": 5,
    "CudaModeIgnoresRuntimeDir": 2,
    "ProductionStructure": 7,
    "BackendSelection": 4,
}


def _defined() -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "tests").rglob("*.py"):
        names |= set(re.findall(r"^def (\w+)\(", path.read_text(encoding="utf-8"), re.M))
    return names


def test_every_seed_class_has_its_scenarios() -> None:
    rows = doc_table("The seed's scenarios")
    assert Counter(r[0] for r in rows) == Counter(SEED_CLASSES)
    assert sum(SEED_CLASSES.values()) == 78 == len(rows)
    assert len({r[1] for r in rows}) == len(rows), "a scenario is listed twice"


def test_every_named_test_exists() -> None:
    defined = _defined()
    for cls, scenario, tests in doc_table("The seed's scenarios"):
        names = [re.sub(r"\s*\(.*\)$", "", t.strip()).strip("`") for t in tests.split(",")]
        missing = [n for n in names if n not in defined]
        assert names and not missing, (cls, scenario, missing)
