"""Medians of a GPU script's decode runs (bench/gpu_decode_quick.sh, bench/gpu_ab.sh):
the JSON lines of FILE grouped by the fields named in --by, each group's median of
--value with its range and count, the median of each --also field, and the set of
generated-token hashes, so a group whose runs produced different tokens shows.

    python3 bench/decode_medians.py FILE --by quant,setting --value decode_tokens_per_second
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
from pathlib import Path
from typing import Any


def medians(rows: list[dict[str, Any]], by: list[str], value: str, also: list[str]) -> list[str]:
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = collections.defaultdict(list)
    for r in rows:
        groups[tuple(r[k] for k in by)].append(r)
    lines = []
    for key, rs in sorted(groups.items()):
        v = [r[value] for r in rs]
        extra = "".join(f", {a} {statistics.median(r[a] for r in rs):.3f}" for a in also)
        lines.append(
            " ".join(str(k) for k in key)
            + f": median {statistics.median(v):.1f} of {len(v)} ({min(v):.1f}-{max(v):.1f}){extra}, "
            + f"tokens {sorted({r['generated'] for r in rs})}"
        )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", type=Path)
    ap.add_argument("--by", required=True, help="comma-separated fields to group by")
    ap.add_argument("--value", required=True, help="the field whose median is printed")
    ap.add_argument("--also", default="", help="comma-separated fields whose medians follow")
    a = ap.parse_args()
    rows = [json.loads(line) for line in a.file.read_text().splitlines() if line.strip()]
    also = [f for f in a.also.split(",") if f]
    for line in medians(rows, a.by.split(","), a.value, also):
        print(line)


if __name__ == "__main__":
    main()
