"""Twenty-third pass: put globaltimer stamps into a copy of kernels/gpu_decode_tiled.cuh's
decode_paced_kernel, with 2026-12-01-h200-pass23-paced.patch applied (blocks alone, P = 1;
usage: python3 THIS COPY_OF_gpu_decode_tiled.cuh; then build
2026-12-01-h200-pass23-trace.cu -DPACED against that copy, as its first comment says).
Thread 0 stamps s0 start, s1 past the wait, s2 x's digits in, s3 tile 0's piece in,
s4 tile 1's, s5 sums done, s6 y written; the producer s7: its last piece landed."""

import sys
from pathlib import Path

STAMP = """
__device__ unsigned long long dpaced_trace[160][160][8];
__device__ unsigned int dpaced_calls[160];
#define DPACED_STAMP(k) if (threadIdx.x == 0 || (k == 7 && threadIdx.x == NW * WARP)) { \\
    unsigned long long t_; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_)); \\
    dpaced_trace[call_ % 160][blockIdx.x % 160][k] = t_; }
"""


def insert(text: str, anchor: str, what: str, after: bool = True) -> str:
    if text.count(anchor) != 1:
        sys.exit(f"anchor not found once: {anchor!r}")
    at = text.index(anchor) + (len(anchor) if after else 0)
    return text[:at] + what + text[at:]


def main(path: Path) -> None:
    text = path.read_text()
    text = insert(text, "template <int NW, int CH, int H, int K, int P, int MINB>\n__global__", STAMP, after=False)
    text = insert(
        text,
        "    uint64_t *full = (uint64_t *)dpaced_shared;\n",
        "    __shared__ unsigned call_sh; "
        "if (threadIdx.x == 0) call_sh = atomicAdd(&dpaced_calls[blockIdx.x % 160], 1u);\n"
        "    __syncthreads(); const unsigned call_ = call_sh; DPACED_STAMP(0)\n",
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
    main(Path(sys.argv[1]))
