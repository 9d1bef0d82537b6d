"""A CUDA program built with the project's own command builder (the GPU bench):

    python -m toolchain.program SOURCE OUTPUT [arch=sm_90] [-- EXTRA_FLAG...]

The plan (config, toolchains) is loaded as `doit build arch=...` loads it, and
the ABI headers must be rendered already (`doit codegen`, or any build). Like
every compile here, OUTPUT appears whole or not at all; the compiler's messages
(ptxas -v, say) go to stderr.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from .build import run_command
from .commands import cuda_program_command
from .errors import ColiError, ConfigError
from .project import load_plan

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str]) -> int:
    own, extra = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    variables = dict(a.split("=", 1) for a in own if "=" in a)
    paths = [a for a in own if "=" not in a]
    try:
        if len(paths) != 2 or set(variables) - {"arch"}:
            raise ConfigError("usage: python -m toolchain.program SOURCE OUTPUT [arch=sm_XX] [-- EXTRA_FLAG...]")
        arch = variables.get("arch", "sm_90")
        if not arch.startswith("sm_"):
            raise ConfigError(f"arch={arch}: a CUDA program needs a CUDA arch (sm_*)")
        loaded = load_plan(ROOT, {"arch": arch}, os.environ)
        source, output = (Path(p).absolute() for p in paths)
        run_command(cuda_program_command(loaded.plans[0], (arch,), source, output, tuple(extra)), source.name)
    except ColiError as exc:
        print(exc.one_line(), file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
