"""A profiled step's GPU time by kind of kernel, from the files `profile` writes (RunConfig.profile).

    python benchmarks/profile_categories.py benchmarks/results/profile_throughput_gqa_h100.txt ...

Each kernel of the "By GPU time" table is put in one category by its name: cuBLAS's matmuls (nvjet, gemm, split-K
reductions), flex attention, rotary (inductor's kernels that compute cos and sin, or look them up: `index_mul_neg`),
RMSNorm (rsqrt, pow_sum), SiLU, the loss (softmax, nll), LoRA's dropout masks (dsnb's `keep`), copies and fills,
the optimizer's step and the clipping's norms, the other Triton kernels and torch's other kernels; any other is
"uncategorized". Prints one line a file: the milliseconds of each category in
the profiled step (of the kernels its table lists: a long table is cut at its top rows, under the step's stated total).
"""
import re
import sys

CATEGORIES = [("matmul", r"^nvjet|gemm|splitKreduce"), ("flex attention", r"flex_attention"),
              ("sdpa attention", r"_sdpa_|flash|fmha|cudnn::fusion"),
              ("rotary", r"_cos_|_sin_|mul_neg"), ("rmsnorm", r"rsqrt|pow_sum"), ("silu", r"silu"),
              ("loss", r"softmax|nll_loss"), ("dropout masks", r"^keep$"),
              ("copies and fills", r"^(Memcpy|Memset)|FillFunctor"),
              ("optimizer and clipping", r"multi_tensor_apply|Adam|LpNorm|foreach"),
              ("other triton", r"^triton_"), ("other torch", r"^void at::native::")]
COLUMNS = 10  # the numbers after a kernel's name in torch's table: CPU %, CPU, ..., CUDA time avg, calls


def milliseconds(cell: str) -> float | None:
    unit = {"ms": 1.0, "us": 1e-3}.get(cell[-2:])
    return float(cell[:-2]) * unit if unit else None


def kernels(text: str) -> list[tuple[str, float]]:
    """(name, ms) of each kernel in a profile's "By GPU time" table; torch's own ops (aten::) and annotations (a
    compiled graph's ##, the optimizer's step#) are left out, since their kernels are listed too. A name is the text
    before the table's ten number columns (a CUDA kernel's holds spaces)."""
    rows = []
    for line in text.split("By host time")[0].splitlines():
        cells = line.split()
        if len(cells) <= COLUMNS or milliseconds(cells[-5]) is None:
            continue
        name = " ".join(cells[:-COLUMNS])
        if not name.startswith(("##", "aten::", "Name")) and "#" not in name and milliseconds(cells[-5]):
            rows.append((name, milliseconds(cells[-5])))
    return rows


def categories(text: str) -> dict:
    """{category: ms} over the kernels of a profile's table."""
    found: dict = {}
    for name, ms in kernels(text):
        kind = next((kind for kind, pattern in CATEGORIES if re.search(pattern, name)), "uncategorized")
        found[kind] = found.get(kind, 0.0) + ms
    return found


def main(paths: list[str]) -> None:
    for path in paths:
        with open(path, encoding="utf-8") as f:
            found = categories(f.read())
        parts = ", ".join(f"{kind} {ms:.1f}" for kind, ms in sorted(found.items(), key=lambda kv: -kv[1]))
        print(f"{path}: {parts}; {sum(found.values()):.1f} ms")


if __name__ == "__main__":
    main(sys.argv[1:])
