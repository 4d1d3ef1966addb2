"""The throughput mode's matmuls alone: how fast cuBLAS runs each frozen-weight shape of the 3B layer, and fused.

    python benchmarks/matmul_shapes.py [--tokens 12288] > matmul_shapes.json    # on a GPU (gpu_runs.sh matmuls)

The throughput mode (12 rows of 1,024 tokens, LoRA on q and v) spends about 72% of its step in cuBLAS matmuls
(profile_throughput_compiled_h200.txt): each frozen Linear's forward, y = x W^T, and its input gradient, dx = dy W (no
weight gradient). This times those matmuls at the mode's token count, one shape at a time (CUDA events, the median of
REPEATS after warm-up), and the two fusions a model could make of them: q, k and v as one matmul over their
concatenated weights, gate and up as one. Their achieved share of the GPU's dense bf16 peak is the MFU ceiling of a
step that did nothing but matmuls; the gap between that and the mode's measured MFU is everything else (attention,
norms, the loss, LoRA's small matmuls, launches), the gap between the shapes' share and the fused shapes' is what
fusing would buy.
"""
from __future__ import annotations

import argparse
import json
import statistics

import torch

REPEATS = 20
SHAPE = dict(hidden=3072, heads=24, kv_heads=8, head_dim=128, mlp=8192, vocab=128256, layers=28)  # llama-3.2-3b


def timed(fn, repeats: int = REPEATS) -> float:
    """Median milliseconds of fn() over repeats, after three warm-up calls."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def forward_backward(tokens: int, k: int, n: int) -> dict:
    """y = x W^T (x: tokens x k, W: n x k) and dx = dy W, bf16: each one's ms and TFLOP/s."""
    x = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
    dy = torch.randn(tokens, n, device="cuda", dtype=torch.bfloat16)
    flops = 2 * tokens * k * n
    fwd, bwd = timed(lambda: x @ w.t()), timed(lambda: dy @ w)
    return {"k": k, "n": n, "forward_ms": round(fwd, 4), "backward_ms": round(bwd, 4),
            "forward_tflops": round(flops / fwd / 1e9, 1), "backward_tflops": round(flops / bwd / 1e9, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=12 * 1024)
    tokens = parser.parse_args().tokens
    s = SHAPE
    h, q, kv, mlp = s["hidden"], s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"], s["mlp"]
    layer = {"q": (h, q), "k": (h, kv), "v": (h, kv), "o": (q, h), "gate": (h, mlp), "up": (h, mlp), "down": (mlp, h)}
    fused = {"qkv": (h, q + 2 * kv), "o": (q, h), "gate_up": (h, 2 * mlp), "down": (mlp, h)}
    out = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "tokens": tokens, "shape": s}
    for name, shapes in (("separate", layer), ("fused", fused)):
        rows = {k: forward_backward(tokens, *kn) for k, kn in shapes.items()}
        total = sum(r["forward_ms"] + r["backward_ms"] for r in rows.values())
        flops = sum(4 * tokens * kn[0] * kn[1] for kn in shapes.values())
        out[name] = {"matmuls": rows, "layer_ms": round(total, 3), "layer_tflops": round(flops / total / 1e9, 1)}
    out["lm_head"] = forward_backward(tokens, h, s["vocab"])
    out["fused_over_separate"] = round(out["separate"]["layer_ms"] / out["fused"]["layer_ms"], 4)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
