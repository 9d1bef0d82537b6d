#!/usr/bin/env bash
# Sourced by the device scripts: the Python packages the task graph needs, from the
# wheels carried in .whl (README.md, "The GPU run"), where python3 lacks them;
# returns 1 when they cannot be installed.
if [[ -d .whl ]] && ! python3 -c "import doit, pydantic, pefile, elftools, zstandard, cyclonedx" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl ||
    return 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
