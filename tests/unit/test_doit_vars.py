"""toolchain/doit_vars.py reads doit's command-line variables from a private name:
doit run for real on a small dodo file shows that it still finds them there, and
that they agree with doit's public get_var."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT


def test_every_variable_of_the_command_line_is_read(tmp_path: Path) -> None:
    (tmp_path / "dodo.py").write_text(
        "import json, sys\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from doit import get_var\n"
        "from toolchain.doit_vars import command_line_variables\n"
        "seen = command_line_variables()\n"
        "print(json.dumps({'all': seen, 'public': {k: get_var(k) for k in seen}}))\n"
        "def task_nothing():\n"
        "    return {'actions': []}\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "doit", "list", "arch=sm_90a", "os=windows", "empty="],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.splitlines()[0])
    assert seen["all"] == {"arch": "sm_90a", "os": "windows", "empty": ""}
    assert seen["public"] == seen["all"]


def test_outside_a_doit_run_there_are_none() -> None:
    from toolchain.doit_vars import command_line_variables

    assert command_line_variables() == {}
