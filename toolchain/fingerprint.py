"""The toolchain fingerprint of one release entry, as a short key for a CI cache:

    python -m toolchain.fingerprint config=configs/release-full.toml entry=<id>   # prints key=<hex>

The key changes when any compiler, SDK or their versions change, so a cache of
compiled objects is only reused by the same toolchain.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from .errors import ColiError, ConfigError
from .project import entry_fingerprint, load_plan

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str]) -> int:
    variables = dict(a.split("=", 1) for a in argv if "=" in a)
    try:
        if "entry" not in variables or len(variables["entry"].split(",")) != 1:
            raise ConfigError("name one entry: python -m toolchain.fingerprint config=<file> entry=<id>")
        loaded = load_plan(ROOT, variables, os.environ)
        fingerprint = entry_fingerprint(loaded, variables["entry"])
    except ColiError as exc:
        print(exc.one_line(), file=sys.stderr)
        return exc.exit_code
    digest = hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:24]
    print(f"key={digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
