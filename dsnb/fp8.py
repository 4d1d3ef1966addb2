"""FP8 frozen base weights (`quantization fp8`): the frozen Linear weights under LoRA in float8, one byte a weight.

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, device_map={"": "cuda:0"})
    check_device("cuda:0")      # a GPU with FP8 matmuls (compute capability 8.9 or more), else a ConfigError
    quantize_linears(model)     # each Linear but the LM head becomes an Fp8Linear, the head an Fp8Head (its forward
                                # in fp8: RunConfig fp8_head; head=False keeps it bf16); peft wraps them in LoRA

What is stored: float8 e4m3 (torch.float8_e4m3fn) with a power-of-two scale for each output row of a weight. Rows,
not one scale a tensor: torch._scaled_mm scales rows of both operands or of neither, and activations need rows (one
token far larger than the rest, as Llama's first token is, would push every other token's values toward fp8's
smallest under one scale). Powers of two: multiplying by one is exact, and so is casting one to bf16. The fp8 bytes
are kept as uint8: a module cast (model.to(dtype), .bfloat16(), as older DeepSpeed releases applied to a bf16 model)
converts every floating-point tensor, float8 included, and leaves integer ones alone.

The math, through torch._scaled_mm (fp8 operands, bf16 out), W = diag(s_w) W8:
  forward   y  = x W^T = (s_x x8) W8^T s_w^T     x8, s_x: x quantized per token at each call (dynamic)
  backward  dx = dy W  = s_g g8 W8                g8, s_g: (dy s_w^T) quantized per token
and no gradient for W (frozen). Accumulation: Hopper's fast accumulation (use_fast_accum) in both passes unless the
run's fp8_fast_accum says otherwise (forward: the forward's only, as torchao's float8 training; none: fp32, as every
fp8 run before that field). On an H200 the 3B shape's throughput mode ran 1.30x bf16's real tokens/s with it in both
passes, 1.27x in the forward only and 1.23x with none, the mean loss within 0.03% of none's (one cold run each,
benchmarks/results/fp8_accum_h200.md). Its matmuls alone: 10-12% faster in each pass (two calls); their outputs'
error against the exact product of their fp8 operands 1.05-1.6x bf16 rounding's, growing with the reduction's length
(1,024 to 8,192), against 1.01x with fp32 accumulation, and 6.2x for a 128,256-long one (the LM head's input
gradient, which dsnb's fp8 leaves in bf16; fp8_gemms_h200.md, call 2). The head's forward (the logits, a reduction of
the hidden size) runs in fp8 with fp8_head (Fp8Head): 1.335x bf16's throughput mode on an H100 against 1.297-1.306x
with the head in bf16 (benchmarks/results/fp8_head_h100.md).

_scaled_mm on CUDA takes its first operand row-major and its second column-major: W8 as stored (out x in, row-major)
is the forward's second operand as it is, and the backward's only transposed. So the backward copies each layer's W8
transposed while it runs, one byte a weight of one layer at a time (25 MB for the 3B shape's largest), and then drops
it. The alternatives: dequantizing W to bf16 for a bf16 matmul takes two bytes a weight of a layer and runs that half
of the frozen layers' matmuls at bf16's rate (the backward's is as large as the forward's); keeping a transposed copy
takes a second byte a weight for the whole run, bf16's memory. On an H200, the 3B shape's layers forward and backward:
6.10 ms a layer so, 6.92 dequantized, 8.23 in bf16 (docs/speed.md).
"""
from __future__ import annotations

import torch

from .config import ConfigError

E4M3_MAX = 448.0  # the largest float8_e4m3fn value
FP8_CAPABILITY = (8, 9)  # Ada (L4, RTX 40xx) and later: Hopper (H100, H200), Blackwell
ALIGN = 16  # _scaled_mm on CUDA takes operands whose widths are multiples of 16
GPUS = "L4, RTX 40xx, H100, H200"


def refusal(device: str, name: str = "", capability: tuple = (0, 0)) -> str | None:
    """Why fp8 weights cannot train on `device` (a GPU called `name` of compute `capability`), or None where they can.
    Without FP8 matmuls _scaled_mm is emulated (the CPU: 6-11x slower than a bf16 matmul) or missing (a T4, an A100)."""
    if not device.startswith("cuda"):
        return (f"quantization fp8 needs a GPU with FP8 matmuls (compute capability 8.9 or more: {GPUS}); on the CPU "
                "they are emulated, slower than bf16; use quantization none")
    if tuple(capability) < FP8_CAPABILITY:
        return (f"quantization fp8 needs FP8 matmuls (compute capability 8.9 or more: {GPUS}) and {name} has "
                f"{capability[0]}.{capability[1]}; use quantization 8bit or 4bit for 8-bit memory, or none")
    return None


def check_device(device: str) -> None:
    """A ConfigError where `device` has no FP8 matmuls (see refusal)."""
    on_gpu = device.startswith("cuda")
    why = refusal(device, torch.cuda.get_device_name(device) if on_gpu else "",
                  torch.cuda.get_device_capability(device) if on_gpu else (0, 0))
    if why:
        raise ConfigError(why)


def quantize_rows(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(t8, scale): t in float8 e4m3 and a power-of-two fp32 scale per row (over its last dimension); t ~ t8 * scale."""
    amax = t.detach().abs().amax(dim=-1, keepdim=True).float().clamp(min=2**-100)
    scale = torch.exp2(torch.ceil(torch.log2(amax / E4M3_MAX)))
    # in t's own dtype: dividing by a power of two is exact in bf16 too, and an uncompiled step makes no fp32 copy
    return (t / scale.to(t.dtype)).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), scale


def matmul(a: torch.Tensor, b8_t: torch.Tensor, b_scale: torch.Tensor, out_dtype, fast: bool) -> torch.Tensor:
    """a (rows x k) times b8_t (k x n, float8, column-major) scaled by b_scale (1 x n): a is quantized per row here;
    fast: Hopper's fast accumulation (fp32 otherwise)."""
    a8, a_scale = quantize_rows(a)
    return torch._scaled_mm(a8, b8_t, scale_a=a_scale, scale_b=b_scale, out_dtype=out_dtype, use_fast_accum=fast)


def aligned(n: int) -> int:
    """n rounded up to a multiple of ALIGN."""
    return -(-n // ALIGN) * ALIGN


def quantize_padded(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize_rows of weight (out x in) with zero rows and columns up to multiples of ALIGN (Fp8Linear, Fp8Head)."""
    rows, columns = weight.shape
    return quantize_rows(torch.nn.functional.pad(weight.detach(), (0, aligned(columns) - columns,
                                                                   0, aligned(rows) - rows)))


def forward_matmul(x: torch.Tensor, w8: torch.Tensor, w_scale: torch.Tensor, out_features: int, fast: bool):
    """x (... x in) times the padded fp8 weight w8 (row-major, as stored) transposed, cut to out_features: y with x's
    leading shape, in x's dtype."""
    y = matmul(padded(x.reshape(-1, x.shape[-1]), w8.shape[1]), w8.t(), w_scale.view(1, -1), x.dtype, fast)
    return y[:, :out_features].view(*x.shape[:-1], out_features)


def padded(t: torch.Tensor, width: int) -> torch.Tensor:
    """t with zero columns added to its last dimension up to width (t itself where it is that wide)."""
    return t if t.shape[-1] == width else torch.nn.functional.pad(t, (0, width - t.shape[-1]))


class Fp8Matmul(torch.autograd.Function):
    """y = x W^T for a frozen W = diag(w_scale) w8: forward and x's gradient through _scaled_mm (module docstring).
    w8 may be wider than W (zero rows and columns up to multiples of ALIGN: Fp8Linear); y and dx are cut to W's own
    out_features and in_features."""

    @staticmethod
    def forward(ctx, x, w8, w_scale, out_features, fast_forward, fast_backward):
        ctx.save_for_backward(w8, w_scale)
        ctx.lead, ctx.in_features, ctx.fast_backward = x.shape[:-1], x.shape[-1], fast_backward
        return forward_matmul(x, w8, w_scale, out_features, fast_forward)

    @staticmethod
    def backward(ctx, dy):
        w8, w_scale = ctx.saved_tensors
        ones = torch.ones(1, w8.shape[1], device=dy.device, dtype=torch.float32)
        dy = padded(dy.reshape(-1, dy.shape[-1]), w8.shape[0])
        # w8 transposed into the layout _scaled_mm takes as its second operand, for this layer only (module docstring)
        dx = matmul(dy * w_scale.view(1, -1).to(dy.dtype), w8.t().contiguous().t(), ones, dy.dtype,
                    ctx.fast_backward)
        return dx[:, :ctx.in_features].reshape(*ctx.lead, ctx.in_features), None, None, None, None, None


class Fp8Linear(torch.nn.Linear):
    """A frozen Linear whose weight is float8 e4m3 (its bytes, as uint8) with a power-of-two scale per output row.

    A Linear to peft, which wraps it in LoRA as it wraps the bf16 one: it makes the adapters in compute_dtype (as for
    bitsandbytes' layers), so a seed draws the same initial adapters as in a bf16 run. A width that is not a multiple
    of ALIGN (which _scaled_mm does not take on CUDA; no layer of the Llama shapes dsnb knows, synthetic:tiny's and
    small's MLPs) is stored with zero rows or columns up to the next multiple: zeros add nothing to a product, so the
    math is the unpadded layer's, the input padded and the output cut at each call."""

    def __init__(self, linear: torch.nn.Linear, fast_accum: str = "both"):
        torch.nn.Module.__init__(self)
        self.fast_accum = fast_accum  # which passes take fast accumulation: both, forward or none (RunConfig)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.compute_dtype = linear.weight.dtype
        w8, scale = quantize_padded(linear.weight)
        self.weight = torch.nn.Parameter(w8.view(torch.uint8), requires_grad=False)
        self.weight.unpadded_numel = self.in_features * self.out_features  # what model.count_parameters counts
        self.register_buffer("scale", scale.view(-1))
        self.bias = None if linear.bias is None else torch.nn.Parameter(linear.bias.detach(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = Fp8Matmul.apply(x.to(self.compute_dtype), self.weight.view(torch.float8_e4m3fn), self.scale.float(),
                            self.out_features, self.fast_accum != "none", self.fast_accum == "both")
        return y if self.bias is None else y + self.bias


TRAINED_HEAD = ("fp8_head makes the logits from a copy of the LM head's weight taken once, so the head cannot train "
                "(modules_to_save, full fine-tuning); set fp8_head false")


class Fp8HeadMatmul(torch.autograd.Function):
    """logits = x W^T for the frozen LM head W: the forward through W's fp8 copy (w8, w_scale: Fp8Head), x's gradient
    dy W through W itself, in bf16 as without fp8. That gradient is a reduction over the whole vocabulary (128,256 for
    Llama 3), where fp8's fast accumulation erred 6.2x bf16 rounding against 1.05-1.6x for every other layer
    (fp8_gemms_h200.md); quantizing its dy (tokens x vocabulary) would also hold 1.5 GB more on the 3B shape's
    throughput mode. W gets no gradient: frozen, as under LoRA; a head that trains would leave its fp8 copy behind, so
    its backward refuses."""

    @staticmethod
    def forward(ctx, x, weight, w8, w_scale, fast):
        ctx.save_for_backward(weight)
        return forward_matmul(x, w8, w_scale, weight.shape[0], fast)

    @staticmethod
    def backward(ctx, dy):
        if ctx.needs_input_grad[1]:
            raise ConfigError(TRAINED_HEAD)
        (weight,) = ctx.saved_tensors
        return dy @ weight, None, None, None, None


class Fp8Head(torch.nn.Linear):
    """The frozen LM head with an fp8 copy of its weight (e4m3, a power-of-two scale a row, padded as Fp8Linear's) for
    the forward's logits (RunConfig fp8_head; Fp8HeadMatmul). Its weight is the head's own Parameter, kept in bf16 for
    x's gradient: a head tied to the input embedding (Llama 3.2's) stays tied. The copy costs a byte a weight more
    (376 MB on the 3B shape) and is not saved with the model (a buffer outside the state dict): a reload makes it
    again from the weight."""

    def __init__(self, head: torch.nn.Linear, fast: bool = True):
        torch.nn.Module.__init__(self)
        self.in_features, self.out_features, self.fast = head.in_features, head.out_features, fast
        self.weight, self.bias = head.weight, head.bias
        w8, scale = quantize_padded(head.weight)
        self.register_buffer("weight8", w8.view(torch.uint8), persistent=False)
        self.register_buffer("scale", scale.view(-1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = Fp8HeadMatmul.apply(x.to(self.weight.dtype), self.weight, self.weight8.view(torch.float8_e4m3fn),
                                self.scale.float(), self.fast)
        return y if self.bias is None else y + self.bias

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """The forward's logits of h (tokens x hidden) without autograd: what the chunked loss (dsnb/loss.py) makes
        chunk by chunk, its gradients through self.weight."""
        y = forward_matmul(h.to(self.weight.dtype), self.weight8.view(torch.float8_e4m3fn), self.scale.float(),
                           self.out_features, self.fast)
        return y if self.bias is None else y + self.bias


def quantize_linears(model: torch.nn.Module, fast_accum: str = "both", head: bool = True) -> int:
    """Each Linear of model (before LoRA wraps it) becomes an Fp8Linear accumulating as fast_accum says (RunConfig
    fp8_fast_accum), in place; returns how many.

    The LM head (the logits; Llama 3.2's is the input embedding itself) keeps its weight in the model's precision;
    with `head` (RunConfig fp8_head) it becomes an Fp8Head, its forward in fp8 (fast accumulation unless fast_accum is
    none). Widths that are not a multiple of 16 are padded (Fp8Linear). One layer at a time, so its bf16 weight is
    freed as it goes."""
    out = model.get_output_embeddings()
    names = [name for name, m in model.named_modules() if type(m) is torch.nn.Linear and m is not out]
    for name in names:
        parent, _, child = name.rpartition(".")
        owner = model.get_submodule(parent)
        setattr(owner, child, Fp8Linear(getattr(owner, child), fast_accum))
    if head and type(out) is torch.nn.Linear:
        model.set_output_embeddings(Fp8Head(out, fast_accum != "none"))
    return len(names)
