"""On a GPU machine: the engine through the CUDA backend against the CPU path,
using the project's own validation code (toolchain/validate.py).

    python3 bench/gpu_validate.py HOST LIB OUT.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from toolchain import validate  # noqa: E402  (the repository's own package, by path)

host, lib, out = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
models = [ROOT / "tests/fixtures/models/glm_tiny", ROOT / "tests/fixtures/models/glm_tiny2"]
cpu = validate.validate_host([], host, models, str, "cpu vs oracle")
dev = validate.validate_backend([], host, lib, models, ["f32", "int8", "int4"], str, "cuda vs cpu", shapes="gpu")
# greedy decode through the GPU, against the oracle
gen = []
for m in models:
    exp = json.loads((m / "expected.json").read_text())
    run = validate._engine(
        [],
        host,
        [
            "--model",
            str(m),
            "--ids",
            ",".join(map(str, exp["prompt"])),
            "--generate",
            str(len(exp["generated"])),
            "--backend",
            lib,
        ],
    )
    gen.append(
        {
            "model": m.name,
            "ok": bool(run.data) and run.data["generated"] == exp["generated"],
            "resident_tensors": (run.data or {}).get("resident_tensors"),
            "device": (run.data or {}).get("device"),
        }
    )
result = {"cpu": json.loads(cpu.to_json()), "cuda": json.loads(dev.to_json()), "greedy_via_cuda": gen}
out.write_text(json.dumps(result, indent=1) + "\n")
print(validate.format_validation(cpu))
print(validate.format_validation(dev))
for g in gen:
    verdict = "ok" if g["ok"] else "FAIL"
    print(f"greedy decode via cuda, {g['model']}: {verdict} ({g['resident_tensors']} tensors on {g['device']})")
sys.exit(0 if cpu.status == dev.status == "passed" and all(g["ok"] for g in gen) else 1)
