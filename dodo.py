"""The task graph: `doit list` shows the stages; see toolchain/tasks.py."""

import os
import sys
from pathlib import Path

from doit import doit_cmd

from toolchain.errors import ColiError
from toolchain.tasks import doit_config, load_plan, make_tasks

ROOT = Path(__file__).resolve().parent

try:
    LOADED = load_plan(ROOT, dict(doit_cmd._CMDLINE_VARS or {}), os.environ)
except ColiError as exc:
    print(exc.one_line(), file=sys.stderr)
    sys.exit(exc.exit_code)

DOIT_CONFIG = doit_config(LOADED)
globals().update(make_tasks(LOADED))
