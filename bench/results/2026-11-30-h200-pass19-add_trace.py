"""Nineteenth pass: put globaltimer stamps into a copy of kernels/gpu_decode_mma.cuh (the
eighteenth pass's tracer with two more stamps).

Usage: python3 2026-11-30-h200-pass19-add_trace.py COPY_OF_gpu_decode_mma.cuh, then build
2026-11-30-h200-pass19-trace.cu against that copy (see its first comment). Thread 0 of each
block stamps: s0 start, s1 before the wait for the call before, s2 past it, s3 x's values in
(their largest found), s4 x's digits in the patch, s5 this lane's W in (its copies waited
for; the copy engine's: the first tile's), s6 sums done, s7 y written.
"""

import sys
from pathlib import Path

STAMP = (
    "#define DMMA_STAMP(k) if (threadIdx.x == 0) { unsigned long long now; "
    'asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)::"memory"); '
    "dmma_trace[trace_call][blockIdx.x][k] = now; }\n"
)
CALL = "    const unsigned trace_call = threadIdx.x == 0 ? atomicAdd(&dmma_calls[blockIdx.x], 1u) % 64 : 0;\n"
WAIT = "    coli_wait_prior_grid(); /* x is the last call's from here on */\n"


def insert(text: str, anchor: str, added: str, after: bool = True) -> str:
    if text.count(anchor) != 1:
        raise SystemExit(f"anchor not found once: {anchor!r}")
    return text.replace(anchor, anchor + added if after else added + anchor)


def main(path: Path) -> None:
    text = path.read_text()
    globals_ = "\n__device__ unsigned long long dmma_trace[64][160][8];\n__device__ unsigned int dmma_calls[160];\n"
    text = insert(text, "#define DMMA_BITS 30", globals_ + STAMP)
    text = insert(text, "    coli_allow_next_grid();\n", CALL + "    DMMA_STAMP(0)\n")
    text = insert(text, WAIT, "    DMMA_STAMP(1)\n", after=False)
    text = insert(text, WAIT, "    DMMA_STAMP(2)\n")
    text = insert(text, "    const dmma_power e = dmma_power_of<FORMAT>(coli_warp_max(top));\n", "    DMMA_STAMP(3)\n")
    text = insert(text, "    __syncwarp(); /* the warp's digits (and scales) are in */\n", "    DMMA_STAMP(4)\n")
    kept = "        if (i == RR) coli_copy_wait<0>(); /* this lane's copies are in */\n"
    if kept in text:  # the kept kernel
        text = insert(text, kept, "        if (i == RR) { DMMA_STAMP(5) }\n")
    else:  # with 2026-11-30-h200-pass19-bulk-and-groups.patch
        anchor = "        else if (i == RR) coli_copy_wait<0>(); /* this lane's copies are in */\n"
        text = insert(text, anchor, "        if (BULK ? i == 0 : i == RR) { DMMA_STAMP(5) }\n")
    text = insert(text, "    float *part = (float *)(dmma_shared", "    DMMA_STAMP(6)\n", after=False)
    text = insert(text, "        y[my_row] = s * row_scale;\n    }\n", "    DMMA_STAMP(7)\n")
    path.write_text(text)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
