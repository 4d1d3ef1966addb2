"""LoRA's dropout in dsnb's compiled loop on a GPU without DeepSpeed: nn.Dropout's keep mask and scale, its random
bits drawn four to a Philox call.

    use_keep_masks(model)     # every LoRA dropout of a peft model (p > 0) becomes a KeepMaskDropout

Inductor draws a dropout mask inside the fused kernel that uses it, one Philox call (ten rounds of 32-bit multiplies)
for each element. On the throughput mode's step (the 3B shape, 12 x 1024 tokens, LoRA on q and v) the two masks of a
layer made its norm kernel take 467 us where its twin without dropout takes 87 (benchmarks/results/archive/
profile_throughput_inductor_dropout_h200.txt): 12.6 of the step's 320 ms. KeepMaskDropout draws the mask in a
Triton kernel of its own, four elements from each call's four 32-bit words, as a bool tensor: the fused kernel reads
it where it drew it, and saves it for the backward as it saved its own. Measured over all 28 layers: 6.6 ms where
there were 13.0, and the mode's cold repeats at 50.2-50.7% MFU (benchmarks/results/throughput_keepmask_h200.md).

What is trained does not change: each element is kept with probability 1 - p, independently (a 24-bit uniform against
p, as torch's own dropout draws it), and kept elements are scaled by 1 / (1 - p). The random stream differs from
nn.Dropout's, as inductor's own already does. tests/test_dropout.py runs the kernel in Triton's interpreter on the CPU.
"""

import torch

BLOCK = 1024  # Philox calls a program; each writes four blocks of BLOCK elements


def keep_kernel():
    """The Triton kernel (imported on first use: the CPU build of torch has no Triton)."""
    global _KERNEL
    if _KERNEL is None:
        import triton
        import triton.language as tl

        @triton.jit
        def keep(seed_ptr, out_ptr, n, p, BLOCK: tl.constexpr):
            lane = tl.arange(0, BLOCK)
            first = tl.program_id(0) * 4 * BLOCK + lane
            w0, w1, w2, w3 = tl.randint4x(tl.load(seed_ptr), tl.program_id(0) * BLOCK + lane)
            # each word's top 24 bits as a uniform in [0, 1) (steps of 2**-24), against p
            tl.store(out_ptr + first, (w0 >> 8).to(tl.float32) * (1.0 / 16777216) >= p, mask=first < n)
            tl.store(out_ptr + first + BLOCK, (w1 >> 8).to(tl.float32) * (1.0 / 16777216) >= p,
                     mask=first + BLOCK < n)
            tl.store(out_ptr + first + 2 * BLOCK, (w2 >> 8).to(tl.float32) * (1.0 / 16777216) >= p,
                     mask=first + 2 * BLOCK < n)
            tl.store(out_ptr + first + 3 * BLOCK, (w3 >> 8).to(tl.float32) * (1.0 / 16777216) >= p,
                     mask=first + 3 * BLOCK < n)

        _KERNEL = keep
    return _KERNEL


_KERNEL = None


def launch(seed: torch.Tensor, out: torch.Tensor, p: float, wrap=lambda kernel: kernel) -> torch.Tensor:
    """Fill out (contiguous bool) with keep decisions drawn from seed (one int64 on out's device)."""
    n = out.numel()
    wrap(keep_kernel())[(-(-n // (4 * BLOCK)),)](seed, out, n, p, BLOCK=BLOCK)
    return out


_OP = None


def keep_mask_op():
    """torch.ops.dsnb.keep_mask(seed, like, p): a bool tensor of like's shape, registered as a Triton op so that
    torch.compile keeps the kernel in its graph (and its CUDA graphs)."""
    global _OP
    if _OP is None:
        from torch.library import triton_op, wrap_triton

        from triton.runtime.jit import JITFunction

        # Triton's interpreter (TRITON_INTERPRET=1: the CPU tests) makes the kernel an InterpretedFunction, which
        # wrap_triton refuses before torch 2.13; called as it is, it runs the same code eagerly.
        wrap = wrap_triton if isinstance(keep_kernel(), JITFunction) else (lambda kernel: kernel)

        @triton_op("dsnb::keep_mask", mutates_args={})
        def keep_mask(seed: torch.Tensor, like: torch.Tensor, p: float) -> torch.Tensor:
            return launch(seed, torch.empty(like.shape, dtype=torch.bool, device=like.device), p, wrap)

        _OP = keep_mask
    return _OP


class KeepMaskDropout(torch.nn.Dropout):
    """nn.Dropout(p) whose mask comes from torch.ops.dsnb.keep_mask (use_keep_masks registers it)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        if x.numel() >= 2**31:  # the kernel's offsets are 32-bit: torch's own dropout for a tensor this large
            return torch.nn.functional.dropout(x, self.p, True)
        seed = torch.randint(0, 2**62, (1,), device=x.device)  # a fresh stream each call, drawn from torch's generator
        keep = torch.ops.dsnb.keep_mask(seed, x, self.p)
        return x * keep * (1 / (1 - self.p))


def use_keep_masks(model) -> int:
    """Swap each LoRA dropout of model (peft's lora_dropout dicts, p > 0) for a KeepMaskDropout of the same p; the
    number swapped."""
    keep_mask_op()  # registered here, before torch.compile traces a forward that calls it
    swapped = 0
    for module in model.modules():
        drops = getattr(module, "lora_dropout", None)
        if isinstance(drops, torch.nn.ModuleDict):
            for name, drop in drops.items():
                if type(drop) is torch.nn.Dropout and drop.p > 0:
                    drops[name] = KeepMaskDropout(drop.p)
                    swapped += 1
    return swapped
