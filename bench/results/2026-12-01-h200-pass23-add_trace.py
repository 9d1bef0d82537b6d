"""Twenty-third pass: globaltimer stamps in a copy of one of two kernels, for
2026-12-01-h200-pass23-trace.cu (build it against that copy, as its first comment says).
Usage: python3 THIS mma COPY_OF_gpu_decode_mma.cuh | paced COPY_OF_gpu_decode_tiled.cuh.

mma, kernels/gpu_decode_mma.cuh's decode_mma_kernel: each block's thread 0 stamps s0 start, s1 past
the wait, s2 x's values in (their largest found), s3 x's digits in, s4 the tiles in registers summed,
s5 this lane's copies in, s6 its sums done, s7 past the block's barrier (every warp's sums in), s8 y
written; and the block's last warp's lane 0 s9: its sums done.

paced, kernels/gpu_decode_tiled.cuh's decode_paced_kernel with 2026-12-01-h200-pass23-paced.patch
applied (blocks alone, P = 1): thread 0 stamps s0 start, s1 past the wait, s2 x's digits in, s3 tile
0's piece in, s4 tile 1's, s5 sums done, s6 y written; the producer s7: its last piece landed."""

import sys
from pathlib import Path


def insert(text: str, anchor: str, what: str, after: bool = True) -> str:
    if text.count(anchor) != 1:
        sys.exit(f"anchor not found once: {anchor!r}")
    at = text.index(anchor) + (len(anchor) if after else 0)
    return text[:at] + what + text[at:]


def start_stamps(text: str, name: str, n: int, who: str, kernel: str, body: str) -> str:
    """Before `kernel` (the kernel's template line), NAME_trace[call][block][n] and NAME_STAMP(k),
    which the threads `who` take; after `body`, the block's call number (call_, by the block's own
    count of calls) and stamp 0."""
    upper = name.upper()
    text = insert(
        text,
        kernel,
        f"""
__device__ unsigned long long {name}_trace[160][160][{n}];
__device__ unsigned int {name}_calls[160];
#define {upper}_STAMP(k) if ({who}) {{ \\
    unsigned long long t_; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_)); \\
    {name}_trace[call_ % 160][blockIdx.x % 160][k] = t_; }}
""",
        after=False,
    )
    return insert(
        text,
        body,
        "    __shared__ unsigned call_sh; "
        f"if (threadIdx.x == 0) call_sh = atomicAdd(&{name}_calls[blockIdx.x % 160], 1u);\n"
        f"    __syncthreads(); const unsigned call_ = call_sh; {upper}_STAMP(0)\n",
    )


def add_mma(path: Path) -> None:
    text = path.read_text()
    text = start_stamps(
        text,
        "dmma",
        10,
        "(k != 9 && threadIdx.x == 0) || (k == 9 && threadIdx.x == blockDim.x - WARP)",
        "template <int FORMAT, int NW, int CH, int RT, int RR, int MINB>\n__global__",
        "    using shape = dmma_shape<FORMAT, NW, CH, RT, RR>;\n"
        "    extern __shared__ __align__(16) uint8_t dmma_shared[];\n",
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


def add_paced(path: Path) -> None:
    text = path.read_text()
    text = start_stamps(
        text,
        "dpaced",
        8,
        "threadIdx.x == 0 || (k == 7 && threadIdx.x == NW * WARP)",
        "template <int NW, int CH, int H, int K, int P, int MINB>\n__global__",
        "    uint64_t *full = (uint64_t *)dpaced_shared;\n",
    )
    text = insert(
        text,
        "        if constexpr (P > 1) cluster_arrive_relaxed(), cluster_wait(), "
        "cluster_arrive_relaxed(), cluster_wait();\n        return;\n",
        "        if (lane == 0) { stage_wait(&full[shape::pieces - 1], 0); DPACED_STAMP(7) }\n",
        after=False,
    )
    text = insert(
        text,
        "    coli_wait_prior_grid(); /* x is the last call's from here on */\n    float v[shape::vpl];\n",
        "    DPACED_STAMP(1)\n",
    )
    text = insert(
        text,
        "(x, (rank * NW + warp) * CH * 128, lane, v);\n"
        "    dmma_put_digits<COLI_FMT_Q4, shape::vpl, shape::digit_words, 4>(v, e, lane, patch);\n"
        "    __syncwarp();\n",
        "    DPACED_STAMP(2)\n",
    )
    text = insert(
        text,
        "        stage_wait(&full[item / shape::piece_items], 0);\n",
        "        if (i == 0) { DPACED_STAMP(3) } else { DPACED_STAMP(4) }\n",
    )
    text = insert(
        text,
        "    float *part = (float *)(ssh + shape::s_bytes + shape::x_bytes);\n",
        "    DPACED_STAMP(5)\n",
        after=False,
    )
    text = insert(
        text,
        "        if (j < 32 && my_row < rows) y[my_row] = dmma_meet<NW, shape::tiles * 16>(part, j) * 0.0625f;\n",
        "        DPACED_STAMP(6)\n",
    )
    path.write_text(text)


if __name__ == "__main__":
    kinds = {"mma": add_mma, "paced": add_paced}
    if len(sys.argv) != 3 or sys.argv[1] not in kinds:
        sys.exit("usage: add_trace.py mma|paced FILE")
    kinds[sys.argv[1]](Path(sys.argv[2]))
