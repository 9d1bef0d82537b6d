"""The task graph: `doit list` shows the stages; see toolchain/tasks.py."""

import os
import sys
from pathlib import Path

from toolchain.doit_vars import command_line_variables
from toolchain.errors import ColiError, os_error_line
from toolchain.project import load_plan
from toolchain.tasks import doit_config, make_tasks

ROOT = Path(__file__).resolve().parent

try:
    LOADED = load_plan(ROOT, command_line_variables(), os.environ)
except ColiError as exc:
    print(exc.one_line(), file=sys.stderr)
    sys.exit(exc.exit_code)
except OSError as exc:  # the file system's refusal (the build folder cannot be made): one line too
    if os.environ.get("COLI_DEBUG") == "1":
        raise
    print(f"error: {os_error_line(exc)}", file=sys.stderr)
    sys.exit(1)

DOIT_CONFIG = doit_config(LOADED)
globals().update(make_tasks(LOADED))
