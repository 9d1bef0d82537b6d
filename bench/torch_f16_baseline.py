"""PyTorch/cuBLAS f16 matmul at the kernels' shapes, timed the way
bench/gpu_matmul_bench.cu times them: weights rotate over copies larger than L2,
100 matmuls are captured in a CUDA graph and the graph replayed 7 times; the
median replay counts. Runs on the GPU machine."""

import json
import statistics

import torch

LAUNCHES, REPLAYS = 100, 7


def time_graph(step: object) -> float:
    """Median microseconds per matmul over the graph's replays."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for i in range(3):  # warm-up outside the capture: cuBLAS picks its kernel here
            step(i)  # type: ignore[operator]
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(LAUNCHES):
            step(i)  # type: ignore[operator]
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(REPLAYS):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        graph.replay()
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3 / LAUNCHES)
    return statistics.median(times)


def main() -> None:
    for rows, cols in ((4096, 4096), (4096, 14336), (14336, 4096)):
        n_bytes = rows * cols * 2
        copies = (512 << 20) // n_bytes + 2
        ws = [torch.randn(rows, cols, device="cuda", dtype=torch.float16) for _ in range(copies)]
        for s in (1, 2, 4, 8, 16, 64, 256):
            x = torch.randn(s, cols, device="cuda", dtype=torch.float16)
            us = time_graph(lambda i: torch.matmul(x, ws[i % copies].t()))
            gbps = (n_bytes + s * (rows + cols) * 2) / (us * 1e-6) / 1e9
            tflops = 2 * s * rows * cols / (us * 1e-6) / 1e12
            row = {"rows": rows, "cols": cols, "s": s, "format": "torch-f16", "us": round(us, 2)}
            print(json.dumps({**row, "gbps": round(gbps, 1), "tflops": round(tflops, 2)}), flush=True)
        del ws


if __name__ == "__main__":
    main()
