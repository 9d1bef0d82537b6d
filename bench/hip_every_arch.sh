#!/usr/bin/env bash
# The HIP backend compiled and verified for every arch the project knows
# (toolchain/data/arches.toml) that the installed HIP SDK has a device library for
# (`doit toolchain` lists those): one fat binary, its .hip_fatbin naming each arch.
# Compile only: no AMD GPU runs it here. Several minutes (each arch compiles every
# kernel); not part of `nox -s ci`, which builds gfx1030 and gfx90a (wave32, wave64).
#   bash bench/hip_every_arch.sh
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
sdk=$("$py" -m doit toolchain 2>/dev/null | sed -n 's/^ *hip arches: //p')
[[ -n $sdk ]] || { echo "hip_every_arch.sh: doit toolchain lists no HIP arch: is a HIP SDK installed?" >&2; exit 1; }
arches=$("$py" - "$sdk" <<'PY'
import sys
from toolchain.arches import arch_table
known = [a for family in arch_table().hip.values() for a in family]
print(",".join(a for a in known if a in sys.argv[1].split()))
PY
)
echo "the SDK builds: $sdk"
echo "known to the project and built here: $arches"
start=$(date +%s)
"$py" -m doit -n "$(nproc)" verify "arch=$arches" | grep -E "libcoli_hip|tasks ran"
echo "seconds: $(( $(date +%s) - start ))"
