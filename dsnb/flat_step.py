"""dsnb's flat ZeRO-1/2 step: DeepSpeed's own updates on one process, without its per-gradient host work.

    from .flat_step import take_over
    taken = take_over(engine)    # after the engine is built, before its first backward; False keeps DeepSpeed's step

This patches DeepSpeed 0.19's DeepSpeedZeroOptimizer in place (its hooks removed, its gradient epilogue and step
replaced); it is guarded to the one configuration it reproduces (flat_step_fits) and the DeepSpeed versions it was
checked against (tests/test_train.py holds its updates bit for bit against DeepSpeed's on the CPU).
"""
from __future__ import annotations

import math

NORM_CHUNK = 1 << 26  # elements per fp64 temporary in the flat step's norm (512 MB at most)
FLAT_STEP_DEEPSPEED = ("0.19.8",)  # the DeepSpeed versions whose ZeRO-1/2 internals FlatStep was checked against


def take_over(engine) -> bool:
    """On one process at ZeRO-1/2 in bf16 without offload, take over the host side of DeepSpeed's step
    (DeepSpeed 0.19's DeepSpeedZeroOptimizer): its flat fp32 partition, optimizer, clipping rule and config stay, its
    per-gradient work goes. DeepSpeed hooks each trained tensor (a copy into a bucket, then into a partition buffer),
    takes one fp64 norm per gradient and reads the norm's validity back to the host to clip: for 3B LoRA's 112
    tensors, a compiled step of 29-33 ms whose GPU work is 17 ms (benchmarks/results/archive/zero_graphs_h200.md).
    FlatStep makes the same updates with a few multi-tensor operations and no host read. fp16 and fp32 (DeepSpeed skips
    a step whose norm is not finite, which needs the host read), several processes and offload keep DeepSpeed's step, as
    does zero_flat_step false (the caller's choice), and so does a DeepSpeed version FlatStep was not checked against
    (it reads DeepSpeed's internals), with a note. Under it DeepSpeed's own gradient lists stay empty
    (safe_get_full_grad returns None), and gradients are taken in engine.backward (a bare loss.backward() would leave
    them in .grad): dsnb does neither. Returns whether the step was taken over."""
    import deepspeed

    o = engine.optimizer
    if type(o).__name__ != "DeepSpeedZeroOptimizer" or not flat_step_fits(engine, o):
        return False
    if deepspeed.__version__ not in FLAT_STEP_DEEPSPEED:
        print(f"dsnb: note: DeepSpeed {deepspeed.__version__} runs its own ZeRO step (dsnb's flat step is checked "
              f"against {', '.join(FLAT_STEP_DEEPSPEED)} only)", flush=True)
        return False
    for hook in o._grad_acc_hooks:  # DeepSpeed's hook on each trained tensor's gradient
        hook.remove()
    o._grad_acc_hooks.clear()
    flat = FlatStep(o)
    o.overlapping_partition_gradients_reduce_epilogue = flat.take_grads  # ZeRO-2: after each backward
    o.reduce_gradients = flat.take_grads  # ZeRO-1: after the step's last backward
    o.step = flat.step
    return True


def flat_step_fits(engine, o) -> bool:
    """The configuration FlatStep reproduces: one process, bf16 weights and gradients, loss scale 1, no overflow
    check, clipping by norm, no offload, overlap, pre-division, MoE, Muon, ZenFlow or DeepCompile (which takes the
    gradients itself)."""
    import torch

    return (engine.world_size == 1 and not engine.is_deepcompile_enabled() and o.dtype == torch.bfloat16
            and o.gradient_accumulation_dtype == o.dtype and all(c == 1 for c in o.partition_count)
            and not o.cpu_offload and not getattr(o, "zenflow", False) and not o.has_moe_layers
            and o.loss_scale == 1.0 and not o.dynamic_loss_scale and not o.custom_loss_scaler
            and o.torch_autocast_gradscaler is None and o.compute_grad_norm and not o.check_grad_overflow
            and not o.overlap_comm and o.gradient_predivide_factor == 1.0
            and not any(getattr(p, "use_muon", False) for g in o.bit16_groups for p in g))


class FlatStep:
    """DeepSpeed's one-process ZeRO-1/2 step on its own optimizer's state: the gradients go into one flat buffer per
    parameter group, in DeepSpeed's layout, with one multi-tensor copy (or add, accumulating) after a backward; the norm
    is one fp64 reduction over it (DeepSpeed: an fp64 norm per tensor, summed, then fp32), and DeepSpeed's clip factor
    is applied as a tensor, never read back (an inf/NaN norm clips with inf in both). DeepSpeed's arithmetic but for
    the order of the norm's fp64 sum, which rounds to the same fp32 norm (tests/test_train.py finds the updates equal
    bit for bit on the CPU). The buffer lives from a step's first backward to its optimizer step, as DeepSpeed's
    partition buffer does."""

    def __init__(self, zero):
        self.zero, self.flats = zero, []

    def take_grads(self, pipeline_parallel: bool = False) -> None:
        import torch

        zero, fresh = self.zero, not self.flats
        for i, params in enumerate(zero.round_robin_bit16_groups):
            if fresh:
                self.flats.append(torch.zeros_like(zero.bit16_groups_flat[i]))  # its padding stays zero
            views = [self.flats[i].narrow(0, at, m.numel()).view(m.shape)
                     for at, m in zip(zero.round_robin_bit16_offsets[i], zero.round_robin_bit16_meta[i], strict=True)]
            have = [(v, p.grad) for p, v in zip(params, views, strict=True) if p.grad is not None]
            if have:
                into, grads = (list(t) for t in zip(*have, strict=True))
                (torch._foreach_copy_ if fresh else torch._foreach_add_)(into, grads)
            for p in params:
                p.grad = None  # a CUDA graph's output: the next replay may overwrite it

    def step(self, closure=None) -> None:
        import torch

        zero = self.zero
        zero.micro_step_id, zero.overflow = -1, False
        norms = torch.stack([sum(torch.linalg.vector_norm(c, 2, dtype=torch.float64).pow(2)
                                 for c in flat.split(NORM_CHUNK)).float().pow(0.5) for flat in self.flats])
        norm = torch.linalg.vector_norm(norms)  # as DeepSpeed combines its groups' norms
        zero._global_grad_norm = norm = torch.where(torch.isfinite(norms).all(), norm, torch.full_like(norm, math.inf))
        fp32s = zero.single_partition_of_fp32_groups
        grads = [flat.to(fp32.dtype) for flat, fp32 in zip(self.flats, fp32s, strict=True)]
        self.flats.clear()
        if zero.clip_grad > 0.0:  # DeepSpeed's factor (its loss scale is 1 here)
            torch._foreach_mul_(grads, 1.0 / torch.clamp((norm + 1e-6) / zero.clip_grad, min=1.0))
        for fp32, grad in zip(fp32s, grads, strict=True):
            fp32.grad = grad
        zero.optimizer.step()
        zero._lazy_init_hp_params_optimizer_state()
        for i, fp32 in enumerate(fp32s):
            fp32.grad = None
            zero.parallel_partitioned_bit16_groups[i][0].data.copy_(fp32.data)  # the model's weights are views of it
