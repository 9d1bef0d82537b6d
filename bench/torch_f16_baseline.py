"""PyTorch/cuBLAS f16 matmul at the kernels' shapes (and f32 without TF32 where
S > 8, the same arithmetic as the tile kernel), timed the way
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


def rotating(rows: int, cols: int, dtype: torch.dtype) -> list[torch.Tensor]:
    """Copies of a random weight, more bytes in all than L2 holds."""
    n_bytes = rows * cols * torch.finfo(dtype).bits // 8
    return [torch.randn(rows, cols, device="cuda", dtype=dtype) for _ in range((512 << 20) // n_bytes + 2)]


def matmul_us(ws: list[torch.Tensor], s: int) -> float:
    x = torch.randn(s, ws[0].shape[1], device="cuda", dtype=ws[0].dtype)
    return time_graph(lambda i: torch.matmul(x, ws[i % len(ws)].t()))


def main() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False  # f32 means f32, as in the tile kernel
    for rows, cols in ((4096, 4096), (4096, 14336), (14336, 4096)):
        shape = {"rows": rows, "cols": cols}
        ws = rotating(rows, cols, torch.float16)
        for s in (1, 2, 4, 8, 16, 64, 256):
            us = matmul_us(ws, s)
            gbps = (rows * cols + s * (rows + cols)) * 2 / (us * 1e-6) / 1e9
            tflops = 2 * s * rows * cols / (us * 1e-6) / 1e12
            row = {**shape, "s": s, "format": "torch-f16", "us": round(us, 2), "gbps": round(gbps, 1)}
            print(json.dumps({**row, "tflops": round(tflops, 2)}), flush=True)
        ws = rotating(rows, cols, torch.float32)
        for s in (16, 64, 256):
            us = matmul_us(ws, s)
            tflops = 2 * s * rows * cols / (us * 1e-6) / 1e12
            print(json.dumps({**shape, "s": s, "format": "torch-f32", "us": round(us, 2), "tflops": round(tflops, 2)}))
        del ws


if __name__ == "__main__":
    main()
