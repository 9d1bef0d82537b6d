"""The task graph: `doit list` shows the stages; see toolchain/tasks.py."""

import os
import sys
from pathlib import Path

from toolchain.doit_vars import command_line_variables
from toolchain.errors import ColiError
from toolchain.project import load_plan
from toolchain.tasks import doit_config, make_tasks

ROOT = Path(__file__).resolve().parent

try:
    LOADED = load_plan(ROOT, command_line_variables(), os.environ)
except ColiError as exc:
    print(exc.one_line(), file=sys.stderr)
    sys.exit(exc.exit_code)

DOIT_CONFIG = doit_config(LOADED)
globals().update(make_tasks(LOADED))
