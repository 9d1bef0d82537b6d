"""bench/gpu_mutants.py, the GPU selftest against wrong backends: each mutant of
bench/gpu_mutants.toml still says what it meant (its replacement applies exactly once to
today's sources, so a kernel change that moves the line fails here, not on the device),
and a mutant counts as caught only where the selftest failed its named check."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import ROOT, bench_module


def module() -> ModuleType:
    return bench_module("gpu_mutants")


def test_every_mutant_applies_once_to_todays_sources_and_changes_them() -> None:
    g = module()
    mutants = g.load(ROOT / "bench/gpu_mutants.toml")
    assert len(mutants) >= 4
    for m in mutants:
        text = (ROOT / m.file).read_text()
        changed = g.mutate(text, m)
        assert changed != text and m.new in changed, m.name
        assert m.check, m.name


def test_a_from_not_there_once_is_refused_naming_the_mutant() -> None:
    g = module()
    m = g.Mutant("twice", "k.cu", "a;", "b;", "op")
    with pytest.raises(ValueError, match=r"mutant 'twice': k\.cu holds its 'from' 2 times, not once"):
        g.mutate("a; a;", m)
    with pytest.raises(ValueError, match="0 times"):
        g.mutate("c;", m)


def report(passed: bool, failed_ops: list[str]) -> dict[str, object]:
    ops = [{"op": op, "ok": False} for op in failed_ops] + [{"op": "rope", "ok": True}]
    return {"passed": passed, "op_checks": ops,
            "checks": [{"format": "int4", "rows": 9, "cols": 30, "s": 2, "ok": passed}]}  # fmt: skip


def test_caught_only_where_the_selftest_fails_the_named_check() -> None:
    g = module()
    assert g.verdict(report(False, ["attend"]), "attend") == (True, ["attend", "matmul int4 9x30 s=2"])
    assert g.verdict(report(False, ["route"]), "attend")[0] is False  # failed, but not where meant
    assert g.verdict(report(True, []), "attend") == (False, [])
    assert g.verdict({"passed": False, "op_checks": [], "error": "no device"}, "attend") == (False, [])
    assert g.verdict(report(False, []), "matmul int4")[0] is True  # a shape of the named kind
    assert g.verdict(report(False, ["add, rmsnorm, layernorm, rope"]), "add, rmsnorm")[0] is False
    assert g.said(False, []) == "SURVIVED (failed: none)" and g.said(True, ["route"]) == "caught (failed: route)"


def test_a_bad_mutants_file_is_one_line_naming_what_is_wrong(tmp_path: Path) -> None:
    g = module()
    f = tmp_path / "m.toml"
    f.write_text('[[mutant]]\nname = "x"\nfile = "kernels/gpu_steps.cuh"\nfrom = "a"\n')
    with pytest.raises(ValueError, match=r"mutant 0 lacks to, check \(each needs name, file, from, to, check\)"):
        g.load(f)
    f.write_text("[[mutant]\n")
    with pytest.raises(ValueError, match=str(f)):
        g.load(f)
    f.write_text("")
    with pytest.raises(ValueError, match=r"no \[\[mutant\]\] entries"):
        g.load(f)


def test_a_mutant_that_no_longer_applies_stops_the_run_before_any_build(tmp_path: Path) -> None:
    f = tmp_path / "m.toml"
    f.write_text(
        '[[mutant]]\nname = "gone"\nfile = "kernels/gpu_steps.cuh"\nfrom = "no such line"\nto = "x"\ncheck = "y"\n'
    )
    proc = subprocess.run([sys.executable, str(ROOT / "bench/gpu_mutants.py"), "--host", "/bin/true", "--mutants",
                           str(f), "--out", str(tmp_path / "out")], capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 2 and not (tmp_path / "out").exists()
    assert proc.stderr == "gpu_mutants.py: mutant 'gone': kernels/gpu_steps.cuh holds its 'from' 0 times, not once\n"


def test_a_mutants_copy_of_the_tree_has_the_sources_and_no_builds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    g = module()
    root, dest = tmp_path / "root", tmp_path / "copy"
    kept = ["kernels/gpu_steps.cuh", "bench/gpu_ab.sh", "dodo.py"]
    skipped = [".git/HEAD", "build/x.o", "dist/a.zip", ".nox/ci/x", ".venv/bin/python", ".ab/tree.txt",
               ".whl/doit.whl", "bench/out/ab.jsonl", ".ruff_cache/x"]  # fmt: skip
    for f in kept + skipped:
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        (root / f).write_text(f)
    monkeypatch.setattr(g, "ROOT", root)
    g.copy_tree(dest)
    assert all((dest / f).read_text() == f for f in kept)
    assert [f for f in skipped if (dest / f).exists() or (dest / Path(f).parent).exists()] == []


def test_only_a_failed_builds_log_comes_out_beside_the_verdicts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The device tool brings back few files: a run's output is mutants.json and the build
    log of each mutant whose build failed, not one log a mutant. A stand-in tree whose
    task graph fails where the source says BROKEN, and a stand-in host whose selftest
    fails attend."""
    g = module()
    root, out = tmp_path / "root", tmp_path / "out"
    (root / "kernels").mkdir(parents=True)
    (root / "kernels/x.cuh").write_text("a;\n")
    (root / "dodo.py").write_text(
        "from pathlib import Path\n\n\ndef task_backend():\n"
        "    return {'actions': [lambda: 'BROKEN' not in Path('kernels/x.cuh').read_text()]}\n"
    )
    host = tmp_path / "host"
    host.write_text('#!/bin/sh\necho \'{"passed": false, "op_checks": [{"op": "attend", "ok": false}]}\'\n')
    host.chmod(0o755)
    mutants = tmp_path / "m.toml"
    entry = '[[mutant]]\nname = "{}"\nfile = "kernels/x.cuh"\nfrom = "a;"\nto = "{}"\ncheck = "attend"\n'
    mutants.write_text(entry.format("builds", "b;") + entry.format("breaks", "BROKEN;"))
    monkeypatch.setattr(g, "ROOT", root)
    argv = ["gpu_mutants.py", "--host", str(host), "--mutants", str(mutants), "--out", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    assert g.main() == 1  # a build failed
    assert sorted(p.name for p in out.iterdir()) == ["mutant-1-build.txt", "mutants.json"]
    rows = json.loads((out / "mutants.json").read_text())
    assert [r["mutant"] for r in rows] == ["builds", "breaks"]
    assert rows[0]["caught"] is True and rows[1]["built"] is False
    assert "mutant 1 (breaks): build failed, see mutant-1-build.txt" in capsys.readouterr().out
