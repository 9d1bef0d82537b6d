"""What a run's extra decoded tokens cost, op kind by op kind: the difference of two
COLI_GPU_PROFILE outputs (the same prompt, `tokens` more decoded in the second),
per token. Used by bench/gpu_step.sh for the decode after a long prompt, whose
profile would otherwise be mostly the prompt's prefill.

    python3 bench/gpu_profile_diff.py short.txt long.txt tokens
"""

import sys
from pathlib import Path


def kinds(path: Path) -> dict[str, tuple[int, float]]:
    """Each op kind's calls and milliseconds, from the profile's lines."""
    out: dict[str, tuple[int, float]] = {}
    for line in path.read_text().splitlines():
        if not line.startswith("  ") or " calls " not in line:
            continue
        name, rest = line[2:14].strip(), line[14:].split()
        out[name] = (int(rest[0]), float(rest[2]))
    return out


def main() -> None:
    if len(sys.argv) != 4:
        sys.exit("usage: gpu_profile_diff.py SHORT LONG TOKENS")
    short, long_, tokens = kinds(Path(sys.argv[1])), kinds(Path(sys.argv[2])), int(sys.argv[3])
    rows = [(n, long_[n][0] - short.get(n, (0, 0.0))[0], long_[n][1] - short.get(n, (0, 0.0))[1]) for n in long_]
    total = sum(ms for _, _, ms in rows)
    print(f"GPU time a decoded token, by op kind ({tokens} tokens): {total / tokens:.3f} ms")
    for name, calls, ms in sorted(rows, key=lambda r: -r[2]):
        share = 100.0 * ms / total if total else 0.0
        print(f"  {name:12} {calls / tokens:6.1f} calls {1e3 * ms / tokens:9.1f} us {share:5.1f}%")


if __name__ == "__main__":
    main()
