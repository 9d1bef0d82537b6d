"""PyTorch/cuBLAS f16 matmul at the same shapes, timed the same way (back-to-back
launches over rotating weight copies larger than L2). Runs on the GPU machine."""

import json

import torch

for rows, cols in ((4096, 4096), (4096, 14336), (14336, 4096)):
    for s in (1, 8, 64):
        n_bytes = rows * cols * 2
        copies = (512 << 20) // n_bytes + 2
        ws = [torch.randn(rows, cols, device="cuda", dtype=torch.float16) for _ in range(copies)]
        x = torch.randn(s, cols, device="cuda", dtype=torch.float16)
        for w in ws:
            torch.matmul(x, w.t())
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        iters = 200
        e0.record()
        for i in range(iters):
            torch.matmul(x, ws[i % copies].t())
        e1.record()
        torch.cuda.synchronize()
        us = e0.elapsed_time(e1) * 1e3 / iters
        gbps = (n_bytes + s * (rows + cols) * 2) / (us * 1e-6) / 1e9
        print(
            json.dumps(
                {"rows": rows, "cols": cols, "s": s, "format": "torch-f16", "us": round(us, 2), "gbps": round(gbps, 1)}
            )
        )
        del ws
