"""bench/decode_medians.py, the GPU scripts' summary of their decode runs: runs grouped
by the named fields, each group's median, range and count, the medians of the extra
fields, and every token hash its runs produced."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from tests.conftest import ROOT, bench_module


def module() -> ModuleType:
    return bench_module("decode_medians")


ROWS = [
    {"build": "tree", "quant": "int8", "tok_s": 10.0, "prefill_s": 0.3, "generated": 7},
    {"build": "tree", "quant": "int8", "tok_s": 30.0, "prefill_s": 0.1, "generated": 7},
    {"build": "tree", "quant": "int8", "tok_s": 20.0, "prefill_s": 0.2, "generated": 9},
    {"build": "abc", "quant": "int8", "tok_s": 5.0, "prefill_s": 1.0, "generated": 7},
]


def test_groups_give_median_range_count_extra_medians_and_every_token_hash() -> None:
    lines = module().medians(ROWS, ["quant", "build"], "tok_s", ["prefill_s"])
    assert lines == [
        "int8 abc: median 5.0 of 1 (5.0-5.0), prefill_s 1.000, tokens [7]",
        "int8 tree: median 20.0 of 3 (10.0-30.0), prefill_s 0.200, tokens [7, 9]",
    ]


def test_the_command_reads_json_lines(tmp_path: Path) -> None:
    f = tmp_path / "runs.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    proc = subprocess.run([sys.executable, str(ROOT / "bench/decode_medians.py"), str(f), "--by", "build",
                           "--value", "tok_s"], capture_output=True, text=True, check=True)  # fmt: skip
    assert proc.stdout.splitlines() == ["abc: median 5.0 of 1 (5.0-5.0), tokens [7]",
                                        "tree: median 20.0 of 3 (10.0-30.0), tokens [7, 9]"]  # fmt: skip
