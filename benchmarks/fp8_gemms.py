"""The frozen layers' matmuls of one throughput-mode step, timed alone in each form fp8 could take them (issue 38).

    python benchmarks/fp8_gemms.py [--rows 12288] [--iters 30] [--out FILE]    # on the GPU machine, ~1 minute
    python benchmarks/fp8_gemms.py --offline                                   # a check of this script on the CPU

The synthetic Llama 3.2 3B shape's seven Linears of a layer (q, k, v, o, gate, up, down) and its LM head, each at
`rows` tokens (the throughput mode's 12 rows of 1,024), forward (y = x W^T) and input gradient (dx = dy W), in:
  bf16          torch's matmul of bf16 operands (the bf16 throughput mode)
  rowwise       torch._scaled_mm with a scale per row of each operand (dsnb/fp8.py), fp32 accumulation
  rowwise_fast  the same with use_fast_accum (Hopper's faster, less exact accumulation; torchao's forward default)
  tensorwise    one scale per operand, fp32 accumulation; tensorwise_fast with use_fast_accum
The input gradient's rowwise forms scale W^T's rows here (dsnb/fp8.py folds W's row scales into dy and passes ones:
the same kernel, other scale values). The input gradient's fp8 forms take W transposed (dsnb/fp8.py copies it per
layer at each backward); that copy is timed apart (transpose). Each line also gives the output's error against the
same operands' exact product (fp32, relative to its norm: rel_err) beside bf16 rounding's own (bf16_rounding).
Operands are quantized beforehand: this times the matmuls only, not the quantizing kernels (those are in the
profiles, profile_throughput_fp8_h100.txt). Prints one JSON line per (layer, pass, form) with the median of `iters`
timed calls, then each form's total for a step's 28 layers and one head; --out appends the lines.
"""
import argparse
import json
import statistics

LAYERS = 28  # the 3B shape's decoder layers
HIDDEN, INTER, KV, VOCAB = 3072, 8192, 1024, 128256
LINEARS = {"q": (HIDDEN, HIDDEN), "k": (HIDDEN, KV), "v": (HIDDEN, KV), "o": (HIDDEN, HIDDEN),
           "gate": (HIDDEN, INTER), "up": (HIDDEN, INTER), "down": (INTER, HIDDEN)}  # (in, out)
FORMS = ("bf16", "rowwise", "rowwise_fast", "tensorwise", "tensorwise_fast")


def timed(fn, iters: int, device: str) -> float:
    """Median milliseconds of fn() over iters calls after 3 untimed ones: CUDA events on the GPU (matmul_shapes.py's
    timing), the host clock on the CPU."""
    import time

    if device == "cuda":
        from matmul_shapes import timed as on_gpu  # this script's own folder is on sys.path

        return on_gpu(fn, iters)
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def calls(rows: int, k: int, n: int, device: str) -> dict:
    """{(pass, form): (fn, exact)} for one Linear of k inputs and n outputs at `rows` tokens: fn runs the matmul, exact
    is the same operands' product in fp32 (None for the transpose, ('dgrad', 'transpose'))."""
    import torch

    from dsnb.fp8 import quantize_rows

    torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 references exact
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(rows, k, device=device, generator=g, dtype=torch.bfloat16)
    dy = torch.randn(rows, n, device=device, generator=g, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=device, generator=g, dtype=torch.bfloat16) / k ** 0.5
    w8, w_s = quantize_rows(w)                       # rows of W: its output features
    wt8, wt_s = quantize_rows(w.t().contiguous())    # rows of W^T: for the input gradient's rowwise scales
    x8, x_s = quantize_rows(x)
    g8, g_s = quantize_rows(dy)
    one = torch.ones((), device=device)
    wt_col = wt8.t()  # W (n x k) laid out column-major: the input gradient's second operand

    def mm(a, b, sa, sb, fast):
        return lambda: torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, use_fast_accum=fast)

    def exact(a, b, sa, sb):  # the fp8 operands' product, scaled, in fp32
        return lambda: (a.float() * sa) @ (b.float() * sb)

    forward_rows, dgrad_rows = exact(x8, w8.t(), x_s, w_s.view(1, -1)), exact(g8, wt_col, g_s, wt_s.view(1, -1))
    forward_one, dgrad_one = exact(x8, w8.t(), one, one), exact(g8, wt_col, one, one)
    return {("forward", "bf16"): (lambda: x @ w.t(), lambda: x.float() @ w.float().t()),
            ("dgrad", "bf16"): (lambda: dy @ w, lambda: dy.float() @ w.float()),
            ("forward", "rowwise"): (mm(x8, w8.t(), x_s, w_s.view(1, -1), False), forward_rows),
            ("forward", "rowwise_fast"): (mm(x8, w8.t(), x_s, w_s.view(1, -1), True), forward_rows),
            ("forward", "tensorwise"): (mm(x8, w8.t(), one, one, False), forward_one),
            ("forward", "tensorwise_fast"): (mm(x8, w8.t(), one, one, True), forward_one),
            ("dgrad", "rowwise"): (mm(g8, wt_col, g_s, wt_s.view(1, -1), False), dgrad_rows),
            ("dgrad", "rowwise_fast"): (mm(g8, wt_col, g_s, wt_s.view(1, -1), True), dgrad_rows),
            ("dgrad", "tensorwise"): (mm(g8, wt_col, one, one, False), dgrad_one),
            ("dgrad", "tensorwise_fast"): (mm(g8, wt_col, one, one, True), dgrad_one),
            ("dgrad", "transpose"): (lambda: w8.t().contiguous(), None)}


def errors(out, exact) -> dict:
    """The matmul's error against the exact product, relative to the product's norm, beside what rounding the exact
    product to bf16 alone gives (the least error any bf16 output can have)."""
    def rel(t):
        return float((t.float() - exact).norm() / exact.norm())
    return {"rel_err": f"{rel(out):.2e}", "bf16_rounding": f"{rel(exact.bfloat16()):.2e}"}


def main() -> None:
    import torch

    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=12288)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--out", default=None)
    p.add_argument("--offline", action="store_true", help="the CPU, 64 tokens, 2 timed calls")
    a = p.parse_args()
    device = "cpu" if a.offline else "cuda"
    rows, iters = (64, 2) if a.offline else (a.rows, a.iters)
    gpu = "cpu" if a.offline else torch.cuda.get_device_name()
    shapes = dict(LINEARS, head=(HIDDEN, VOCAB))
    totals: dict = {}
    lines = []
    for name, (k, n) in shapes.items():
        if a.offline:
            k, n = k // 32, n // 32 // 16 * 16 or 16
        for (pass_, form), (fn, exact) in calls(rows, k, n, device).items():
            ms = timed(fn, iters, device)
            flops = None if form == "transpose" else round(2 * rows * k * n / ms / 1e9, 1)  # a copy: no FLOPs
            line = {"gpu": gpu, "layer": name, "pass": pass_, "form": form, "rows": rows, "k": k, "n": n,
                    "ms": round(ms, 4), "tflops": flops,
                    **(errors(fn(), exact()) if exact else {})}
            lines.append(line)
            print(json.dumps(line), flush=True)
            times = LAYERS if name != "head" else 1
            totals.setdefault((pass_, form, name == "head"), 0.0)
            totals[(pass_, form, name == "head")] += ms * times
    if a.out:
        with open(a.out, "a") as f:
            f.writelines(json.dumps(line) + "\n" for line in lines)
    print(f"\nA step's frozen matmuls ({LAYERS} layers x 7 Linears, {rows} tokens), ms; the head apart:")
    for form in FORMS + ("transpose",):
        row = {p_: totals.get((p_, form, False)) for p_ in ("forward", "dgrad")}
        head = {p_: totals.get((p_, form, True)) for p_ in ("forward", "dgrad")}
        print(f"  {form:16} " + "  ".join(f"{p_} {v:8.2f}" for p_, v in row.items() if v is not None)
              + "   head " + "  ".join(f"{p_} {v:6.2f}" for p_, v in head.items() if v is not None))


if __name__ == "__main__":
    main()
