"""dsnb's own training loop for `torch_compile=True`: the Trainer's data, optimizer and schedule, a compiled step.

    metrics = train_compiled(trainer, cfg, timer, on_step, on_log)    # instead of trainer.train()
    DSNB_PROFILE=step.txt python -m dsnb run ... --torch_compile true # also profile the last warm-up step

Why: on a 3B LoRA step of 8 short samples the GPU's arithmetic takes ~5 ms, but the HF Trainer's step
costs ~265 ms of Python and kernel launches (MISSION.md's profile). This loop takes the batches, AdamW
and linear schedule from the same Trainer object (same order, same math), runs the model under
torch.compile, which fuses kernels and, on a GPU, replays each step as CUDA graphs, and reads nothing
back to the host between steps except at the timer's marks and every LOG_FLUSH logged steps.
On an H200 this took the 3B shape's batch-8 LoRA step from ~220 ms to ~32 ms (benchmarks/results/nvidia_h200.md).
"""
from __future__ import annotations

import contextlib
import math
import os
import time

LOG_FLUSH = 32  # logged steps kept on the device before one host read sends them to MLflow
PROFILE_ENV = "DSNB_PROFILE"  # a file path: where the last warm-up step's profile (top kernels, host vs GPU) goes


def train_compiled(trainer, cfg, timer, on_step, on_log) -> dict:
    """Train trainer.model for cfg's steps; returns the Trainer's train() metrics (runtime, loss, ...).

    on_step(step, max_steps) reports progress; on_log(step, {"loss", "grad_norm", "learning_rate"})
    receives the records the Trainer would log, at the same steps, averaged the same way.
    """
    import torch

    from .data import real_tokens

    model, args = trainer.model, trainer.args
    device = next(model.parameters()).device
    loader = trainer.get_train_dataloader()
    per_epoch = max(1, len(loader) // cfg.grad_accum)
    max_steps = cfg.max_steps or math.ceil(per_epoch * cfg.epochs)
    trainer.create_optimizer_and_scheduler(num_training_steps=max_steps)
    optimizer, scheduler = trainer.optimizer, trainer.lr_scheduler
    params = [p for p in model.parameters() if p.requires_grad]
    cuda = device.type == "cuda"
    # Static shapes: each batch shape (few: bucket rounds lengths to 64 tokens, packed rounds row counts to
    # PACK_ROWS) compiles once, and "reduce-overhead" replays it as CUDA graphs.
    forward = torch.compile(model, mode="reduce-overhead" if cuda else None, dynamic=False)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.dtype == "bf16")
    pad_id = trainer.processing_class.pad_token_id
    model.train()

    def batches():
        epoch = 0
        while True:
            if hasattr(loader, "set_epoch"):
                loader.set_epoch(epoch)
            yield from loader
            epoch += 1

    data = batches()
    seen = torch.zeros((), dtype=torch.long, device=device)
    window = torch.zeros((), device=device)  # loss summed since the last log, as the Trainer's tr_loss
    total_loss = torch.zeros((), device=device)
    pending: list[tuple[int, torch.Tensor, torch.Tensor, float]] = []
    last_logged = 0
    profile = os.environ.get(PROFILE_ENV)
    timer.mark(0, 0)
    start = time.perf_counter()
    for step in range(1, max_steps + 1):
        # The last warm-up step: compiled and recorded by then, and outside the timed steps.
        profiling = bool(profile) and step == max(1, timer.warmup_steps)
        profiler = torch.profiler.profile() if profiling else contextlib.nullcontext()
        began = time.perf_counter()
        with profiler:
            micro = [next(data) for _ in range(cfg.grad_accum)]
            # The Trainer's loss: summed over the step's label tokens, divided by their count.
            items = sum((b["labels"][..., 1:] != -100).sum() for b in micro)
            step_loss = torch.zeros((), device=device)
            for batch in micro:
                seen += real_tokens(batch, pad_id)
                if cuda:
                    torch.compiler.cudagraph_mark_step_begin()
                with autocast:
                    loss = forward(**batch, num_items_in_batch=items).loss
                loss.backward()
                step_loss += loss.detach()
            grad_norm = torch.nn.utils.clip_grad_norm_(params, args.max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            if profiling and cuda:
                torch.cuda.synchronize(device)
        if profiling:
            write_profile(profiler, profile, step, 1000 * (time.perf_counter() - began))
        window += step_loss
        total_loss += step_loss
        if step == 1 or step % cfg.logging_steps == 0 or step == max_steps:
            pending.append((step, window / (step - last_logged), grad_norm.detach(), scheduler.get_last_lr()[0]))
            window = torch.zeros((), device=device)
            last_logged = step
        if len(pending) >= LOG_FLUSH or step == max_steps:
            for s, loss_value, norm, lr in pending:
                on_log(s, {"loss": loss_value.item(), "grad_norm": norm.item(), "learning_rate": lr})
            pending = []
        if step in (timer.warmup_steps, max_steps):
            timer.mark(step, int(seen))
        on_step(step, max_steps)
    runtime = time.perf_counter() - start
    trainer.state.global_step, trainer.state.num_input_tokens_seen = max_steps, int(seen)
    samples = max_steps * cfg.batch_size * cfg.grad_accum
    return {"train_runtime": runtime, "train_loss": total_loss.item() / max_steps,
            "train_samples_per_second": samples / runtime, "train_steps_per_second": max_steps / runtime,
            "epoch": max_steps / per_epoch}


def write_profile(profiler, path: str, step: int, wall_ms: float) -> None:
    """One step's profile: its wall time, then the top operators with torch's CPU and GPU totals."""
    events = profiler.key_averages()
    gpu = any(e.self_device_time_total for e in events)
    with open(path, "w") as f:
        f.write(f"step {step}: wall {wall_ms:.1f} ms (GPU busy time: 'Self CUDA time total' below)\n\n")
        f.write(events.table(sort_by="self_device_time_total" if gpu else "self_cpu_time_total", row_limit=30))
