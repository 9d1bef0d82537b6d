"""Twenty-third pass: globaltimer stamps in a copy of kernels/gpu_decode_mma.cuh's decode_mma_kernel
(usage: python3 THIS COPY_OF_gpu_decode_mma.cuh; then build 2026-12-01-h200-pass23-trace.cu against
that copy, as its first comment says). Each block's thread 0 stamps s0 start, s1 past the wait, s2 x's
values in (their largest found), s3 x's digits in, s4 the tiles in registers summed, s5 this lane's
copies in, s6 its sums done, s7 past the block's barrier (every warp's sums in), s8 y written; and the
block's last warp's lane 0 s9: its sums done."""

import sys
from pathlib import Path

STAMP = """
__device__ unsigned long long dmma_trace[160][160][10];
__device__ unsigned int dmma_calls[160];
#define DMMA_STAMP(k) if ((k != 9 && threadIdx.x == 0) || (k == 9 && threadIdx.x == blockDim.x - WARP)) { \\
    unsigned long long t_; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_)); \\
    dmma_trace[call_ % 160][blockIdx.x % 160][k] = t_; }
"""


def insert(text: str, anchor: str, what: str, after: bool = True) -> str:
    if text.count(anchor) != 1:
        sys.exit(f"anchor not found once: {anchor!r}")
    at = text.index(anchor) + (len(anchor) if after else 0)
    return text[:at] + what + text[at:]


def main(path: Path) -> None:
    text = path.read_text()
    text = insert(
        text, "template <int FORMAT, int NW, int CH, int RT, int RR, int MINB>\n__global__", STAMP, after=False
    )
    text = insert(
        text,
        "    using shape = dmma_shape<FORMAT, NW, CH, RT, RR>;\n"
        "    extern __shared__ __align__(16) uint8_t dmma_shared[];\n",
        "    __shared__ unsigned call_sh; "
        "if (threadIdx.x == 0) call_sh = atomicAdd(&dmma_calls[blockIdx.x % 160], 1u);\n"
        "    __syncthreads(); const unsigned call_ = call_sh; DMMA_STAMP(0)\n",
    )
    text = text.replace(
        "    coli_wait_prior_grid(); /* x is the last call's from here on */\n\n    /* x's slice",
        "    coli_wait_prior_grid(); /* x is the last call's from here on */\n    DMMA_STAMP(1)\n    /* x's slice",
        1,
    )
    text = insert(
        text,
        "    const dmma_power e = dmma_slice<FORMAT, shape::vpl>(x, warp * CH * shape::chunk_cols, lane, v);\n",
        "    DMMA_STAMP(2)\n",
    )
    text = insert(text, "    __syncwarp(); /* the warp's digits (and scales) are in */\n", "    DMMA_STAMP(3)\n")
    text = insert(
        text,
        "        if (i == RR) coli_copy_wait<0>(); /* this lane's copies are in */\n",
        "        if (i == RR) { DMMA_STAMP(5) }\n",
    )
    text = text.replace(
        "        if (i == RR) coli_copy_wait<0>(); /* this lane's copies are in */\n",
        "        if (i == RR) { DMMA_STAMP(4) }\n"
        "        if (i == RR) coli_copy_wait<0>(); /* this lane's copies are in */\n",
        1,
    )
    text = insert(
        text,
        "    float *part = (float *)(dmma_shared + shape::w_bytes + shape::s_bytes + shape::x_bytes);\n",
        "    DMMA_STAMP(6)\n    DMMA_STAMP(9)\n",
        after=False,
    )
    text = insert(text, "    __syncthreads();\n    if (my_row < row_end) y[my_row]", "    DMMA_STAMP(7)\n", after=False)
    text = text.replace("    DMMA_STAMP(7)\n    __syncthreads();\n", "    __syncthreads();\n    DMMA_STAMP(7)\n", 1)
    text = insert(
        text,
        "    if (my_row < row_end) y[my_row] = dmma_meet<NW, shape::rows>(part, threadIdx.x) * row_scale;\n",
        "    DMMA_STAMP(8)\n",
    )
    path.write_text(text)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
