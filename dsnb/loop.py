"""dsnb's own training loop for `torch_compile=True`: the Trainer's data, loss, optimizer and schedule, a compiled step.

    metrics = train_compiled(trainer, cfg, timer, on_step, on_log)    # instead of trainer.train()
    python -m dsnb run ... --torch_compile true --profile step.txt    # also profile the last untimed step
    ... --loss_scale true                                             # the fp16 loss scaler on an fp32 run (its math)
    ... --cuda_graphs false                                           # compiled, but no CUDA graphs on a GPU
    ... --strategy zero3 --deepcompile true                           # DeepSpeed's DeepCompile compiles ZeRO (GPU)
    ... --strategy zero2 --zero_flat_step false                       # DeepSpeed's own ZeRO-1/2 step (flat_step.py)

Why: on a 3B LoRA step of 8 short samples the GPU's arithmetic takes ~5 ms, but the HF Trainer's step
costs ~265 ms of Python and kernel launches (MISSION.md's profile). This loop takes the batches, the loss
normalisation, AdamW and the linear schedule from the same Trainer object (same order, same math), runs
the model under torch.compile, which fuses kernels and, on a GPU, replays each step as CUDA graphs, and
reads nothing back to the host between steps except at the timer's marks and every LOG_FLUSH logged steps.

Two ways to step:
- no DeepSpeed: the compiled model, the Trainer's fused AdamW, clipping, and for fp16 a loss scaler
  (torch.amp.GradScaler), so a T4 (no bf16) gets the compiled speed too;
- ZeRO-0/1/2/3: the DeepSpeed engine the Trainer would build (its config, optimizer, offload and, for fp16,
  its loss scaler), with its module compiled in place by engine.compile().
  On one GPU in bf16 at ZeRO-1/2, dsnb takes over the host side of DeepSpeed's step (flat_step.take_over: the same
  updates, without DeepSpeed's per-gradient hooks and host read; zero_flat_step false keeps DeepSpeed's own).
  At ZeRO-0/1/2 on a GPU the forward and backward replay as CUDA graphs, as without DeepSpeed, when accumulating
  only at ZeRO-2 with contiguous gradients and no weight over its bucket, or with the flat step (graphs_under_zero);
  ZeRO-3 fetches and releases parameters in hooks between graphs (compiled with dynamo's recompile limits raised
  for those hooks) and runs without them.

A CUDA graph's outputs live in memory its next replay overwrites. A gradient the backward graph hands to a parameter
without one becomes that parameter's .grad as it is, so gradients summed over several micro-batches need .grad
buffers of their own: PlainStep allocates them once when it accumulates, ZeRO-2 with contiguous_gradients copies
each gradient within its bucket into its buffers during the backward, and the other ZeRO steps, which keep the
tensor to the step, run without graphs when accumulating.
"""
from __future__ import annotations

import contextlib
import math
import time
import warnings

from .config import ConfigError
from .flat_step import take_over

LOG_FLUSH = 32  # logged steps kept on the device before one host read sends them to MLflow


def train_compiled(trainer, cfg, timer, on_step, on_log, begin) -> dict:
    """Train trainer.model for cfg's steps; returns the Trainer's train() metrics (runtime, loss, ...).

    on_step(step, max_steps, loss) reports progress; on_log(step, {"loss", "grad_norm", "learning_rate"})
    receives the records the Trainer would log, at the same steps (the last one too), averaged the same way;
    begin() runs once the model is ready, before the clock starts (the "before" answers).
    """
    import torch

    loader = trainer.get_train_dataloader()
    per_epoch = math.ceil(len(loader) / cfg.grad_accum)  # the Trainer's update steps an epoch, the last one short
    max_steps = cfg.max_steps or math.ceil(per_epoch * cfg.epochs)
    stepper = (DeepSpeedStep if cfg.zero_stage is not None else PlainStep)(trainer, cfg, max_steps)
    device = stepper.device
    window = torch.zeros((), device=device)  # loss summed since the last log, as the Trainer's tr_loss
    total_loss = torch.zeros((), device=device)
    pending: list = []
    last_logged, loss_seen = 0, None
    profile = cfg.profile
    begin()
    timer.mark(0)
    start = time.perf_counter()
    tables = rotary_tables(trainer.model, cfg.max_length)
    try:
        for step, (micro, items) in enumerate(step_batches(trainer, loader, cfg.grad_accum, max_steps, device), 1):
            # The last untimed step: compiled and recorded by then, and outside the timed steps.
            profiling = bool(profile) and step == max(1, timer.untimed_steps)
            began = time.perf_counter()
            with torch.profiler.profile() if profiling else contextlib.nullcontext() as profiler:
                step_loss, grad_norm, lr = stepper.step(micro, items, timer)
            if profiling:
                write_profile(profiler, profile, step, 1000 * (time.perf_counter() - began))
            window += step_loss
            total_loss += step_loss
            if step == 1 or step % cfg.logging_steps == 0 or step == max_steps:
                pending.append((step, window / (step - last_logged), grad_norm, lr))
                window = torch.zeros((), device=device)
                last_logged = step
            # Before the logs, as the Trainer's step ends before its log; every step where DeepSpeed's phase timers
            # are read (they synchronize anyway).
            if step in (timer.untimed_steps, max_steps) or timer.phases:
                timer.mark(step)
            if len(pending) >= LOG_FLUSH or step == max_steps:
                loss_seen = flush(pending, on_log)
            on_step(step, max_steps, loss_seen)
    except BaseException:  # an interrupt or an error mid-run: the logged steps still on the device reach the curve
        with contextlib.suppress(Exception):
            flush(pending, on_log)
        raise
    finally:
        tables.close()
    runtime = time.perf_counter() - start
    trainer.state.global_step = max_steps
    return {"train_runtime": runtime, "train_loss": total_loss.item() / max_steps,
            "train_steps_per_second": max_steps / runtime, "epoch": max_steps / per_epoch,
            **({"zero_flat_step": float(stepper.flat)} if isinstance(stepper, DeepSpeedStep) else {})}


def step_batches(trainer, loader, accum: int, max_steps: int, device):
    """(micro-batches, label tokens) of each optimizer step, epoch after epoch, grouped and counted as the HF Trainer
    does: `accum` micro-batches a step, the epoch's last step taking what remains."""
    step, epoch = 0, 0
    while True:
        for target in (loader, getattr(getattr(loader, "batch_sampler", None), "batch_sampler", None)):
            if hasattr(target, "set_epoch"):
                target.set_epoch(epoch)
        batches, left = iter(loader), len(loader)
        while left > 0:
            take = min(accum, left)
            yield trainer.get_batch_samples(batches, take, device)
            left -= take
            step += 1
            if step == max_steps:
                return
        epoch += 1


def keep_masks(model, cfg, device) -> None:
    """On a GPU, LoRA's dropout masks from dsnb's kernel, four elements a Philox call (cfg.dropout_kernel; dsnb/
    dropout.py), swapped in before the model is compiled."""
    if device.type == "cuda" and cfg.dropout_kernel:
        from . import dropout  # deferred: only a GPU run swaps its dropouts (the module loads torch at import)

        try:
            dropout.use_keep_masks(model)
        except ImportError as e:  # torch.library's triton_op came in torch 2.6, Triton with torch's CUDA builds
            raise ConfigError(f"dropout_kernel: dsnb's dropout kernel cannot load here ({e}); set dropout_kernel "
                              "false to keep inductor's masks") from e


# Rotary types whose inverse frequencies do not change with the length: a table of positions holds their cos and sin.
TABLE_ROPE = ("default", "llama3", "linear")


def rotary_tables(model, rows: int) -> contextlib.ExitStack:
    """Rotary's cos and sin looked up in a table of positions 0..rows-1 in compiled steps, until close().

    Compiled on a GPU, inductor computes cos and sin of every position inside each kernel that applies rotary (every
    layer's queries and keys, forward and backward: 14.5 ms of the 3B throughput step on an H100, 5.6 with the table;
    1.025x the step, benchmarks/results/rope_table_h100.md) instead of once. A table holds the values Llama's rotary
    computes (positions times its inv_freq, in fp32, both halves alike, cos and sin times its attention scaling, cast
    to the input's dtype), and a module gets one only where its own eager forward returns exactly the table's numbers,
    dtype and shape for every position of the table in fp32, bf16 and fp16 (table_matches): a rotary that lays out
    or casts its frequencies otherwise (Cohere interleaves them, OLMo 2 keeps fp32, Llama 4 returns complex numbers)
    keeps its own forward. Uncompiled calls, rows longer than the table, positions not of shape (rows, length) and
    rotary types whose frequencies move with the length (dynamic, longrope) keep the module's own forward too."""
    stack = contextlib.ExitStack()
    try:
        add_tables(model, rows, stack)
    except BaseException:  # a failure part way puts back the modules already changed
        stack.close()
        raise
    return stack


def add_tables(model, rows: int, stack: contextlib.ExitStack) -> None:
    import torch

    for module in model.modules():
        if getattr(module, "rope_type", None) not in TABLE_ROPE or not isinstance(
                getattr(module, "inv_freq", None), torch.Tensor) or "forward" in vars(module):
            continue
        with torch.no_grad():
            freqs = torch.arange(rows, device=module.inv_freq.device, dtype=torch.float)[:, None] * \
                module.inv_freq.float()
            angles = torch.cat((freqs, freqs), dim=-1)
            scale = getattr(module, "attention_scaling", 1.0)
            cos, sin = angles.cos() * scale, angles.sin() * scale
        own = module.forward
        if not table_matches(own, cos, sin):
            continue
        module.register_buffer("cos_table", cos, persistent=False)
        module.register_buffer("sin_table", sin, persistent=False)
        stack.callback(forget_table, module)

        def lookup(x, position_ids, *args, module=module, own=own, **kwargs):
            # dsnb's collators count a row's positions from 0 within it (data.py), so a row no longer than the table
            # stays inside it; positions of another shape (several sections, as multimodal rotary has) are not rows
            longer = position_ids.ndim != 2 or position_ids.shape[-1] > module.cos_table.shape[0]
            if not torch.compiler.is_compiling() or longer or args or kwargs:
                return own(x, position_ids, *args, **kwargs)
            return module.cos_table[position_ids].to(x.dtype), module.sin_table[position_ids].to(x.dtype)

        module.forward = lookup


def table_matches(own, cos, sin) -> bool:
    """Whether a rotary module's own forward returns, for positions 0..rows-1 of one row and an input in each compute
    dtype, a (cos, sin) pair equal to the tables' lookup in value, dtype and shape."""
    import torch

    positions = torch.arange(cos.shape[0], device=cos.device)[None]
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x = torch.zeros(1, 1, cos.shape[0], cos.shape[1], dtype=dtype, device=cos.device)
        try:
            with torch.no_grad():
                out = own(x, positions)
        except Exception:  # a forward that wants other inputs is no rotary of Llama's kind
            return False
        if not (isinstance(out, tuple | list) and len(out) == 2 and all(
                isinstance(o, torch.Tensor) and o.dtype == dtype and torch.equal(o, t[positions].to(dtype))
                for o, t in zip(out, (cos, sin), strict=True))):
            return False
    return True


def forget_table(module) -> None:
    vars(module).pop("forward", None)
    for name in ("cos_table", "sin_table"):
        module._buffers.pop(name, None)


def loss_only(trainer):
    """The model to compile, returning only its loss where the Trainer reads nothing else of its outputs (no label
    smoothing, no compute_loss_func).

    A compiled forward's outputs that need a gradient are the backward graph's inputs: the logits, which the loss does
    not use outside the graph, got a zero gradient each step, the size of the logits (3.15 GB in bf16 for the 3B
    throughput step's 12,288 tokens x 128,256), and CUDA graphs copied it into their own buffer."""
    import torch

    model = trainer.model
    if getattr(trainer, "label_smoother", None) is not None or getattr(trainer, "compute_loss_func", None) is not None:
        return model

    class LossOnly(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, **inputs):
            out = self.model(**inputs)  # a tuple where the model's config says return_dict false: the loss first
            return {"loss": out["loss"] if isinstance(out, dict) else out[0]}

    return LossOnly()


class PlainStep:
    """One optimizer step without DeepSpeed: the compiled model, the Trainer's AdamW and schedule, clipping, and a
    loss scaler for fp16."""

    def __init__(self, trainer, cfg, max_steps: int):
        import torch

        self.trainer, self.cfg = trainer, cfg
        model = trainer.model
        self.device = next(model.parameters()).device
        trainer.create_optimizer_and_scheduler(num_training_steps=max_steps)
        self.optimizer, self.scheduler = trainer.optimizer, trainer.lr_scheduler
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.cuda = self.device.type == "cuda" and cfg.cuda_graphs
        keep_masks(model, cfg, self.device)
        # Static shapes: each batch shape (few: bucket rounds lengths to 64 tokens, packed rounds row counts to
        # PACK_ROWS, filled has one) compiles once, and "reduce-overhead" replays it as CUDA graphs.
        self.forward = torch.compile(loss_only(trainer), mode="reduce-overhead" if self.cuda else None, dynamic=False)
        # Summed over micro-batches, gradients need buffers outside the graphs' memory (module docstring): allocated
        # here, zeroed after each step (on the CPU too, where there are no graphs: one code path, tested there). With
        # one micro-batch the optimizer reads the graph's output before the next replay, and .grad is dropped.
        self.own_grads = cfg.grad_accum > 1
        for p in self.params if self.own_grads else []:
            p.grad = torch.zeros_like(p)
        half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.dtype)
        self.autocast = torch.autocast(self.device.type, dtype=half or torch.float32, enabled=half is not None)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=cfg.dtype == "fp16" or
                                           cfg.loss_scale)
        model.train()

    def step(self, micro: list, items, timer):
        import torch

        trainer, device = self.trainer, self.device
        step_loss = torch.zeros((), device=device)
        for batch in micro:
            if self.cuda:
                torch.compiler.cudagraph_mark_step_begin()
            with self.autocast:
                loss = trainer.compute_loss(self.forward, batch, num_items_in_batch=items)
            self.scaler.scale(loss).backward()
            step_loss += loss.detach()
            timer.consume()
        self.scaler.unscale_(self.optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, trainer.args.max_grad_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        lr = self.scheduler.get_last_lr()[0]  # the rate this step used, as the Trainer logs it
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=not self.own_grads)
        return step_loss, grad_norm.detach(), lr


class DeepSpeedStep:
    """One optimizer step under ZeRO: the engine the HF Trainer would build (same config, optimizer, offload and
    schedule), its module compiled in place, backward and step through the engine."""

    def __init__(self, trainer, cfg, max_steps: int):
        import torch

        self.trainer, self.cfg = trainer, cfg
        if cfg.zero_stage == 3:
            # ZeRO-3's fetch and release hooks guard on module depth and requires_grad: past dynamo's default
            # limit of 8 recompiles, frames quietly run uncompiled (seen on the CPU with DeepSpeed 0.19.8).
            torch._dynamo.config.recompile_limit = 64
            torch._dynamo.config.accumulated_recompile_limit = 4096
            torch._dynamo.config.force_parameter_static_shapes = False
        self.engine = prepare_engine(trainer, max_steps)
        self.device = self.engine.device
        cuda = torch.device(self.device).type == "cuda"
        self.flat = cfg.zero_flat_step and take_over(self.engine)
        # DeepCompile's backend is a function of its own, which takes no torch.compile mode (and so no CUDA graphs).
        largest = max((p.numel() for p in self.engine.module.parameters() if p.requires_grad), default=0)
        copied = (self.flat and cfg.zero_stage == 2) or (
            self.engine.zero_contiguous_gradients() and largest <= self.engine.zero_reduce_bucket_size())
        graphs = cfg.cuda_graphs and graphs_under_zero(cfg.zero_stage, cfg.grad_accum, copied) and \
            not self.engine.is_deepcompile_enabled()
        mode = "reduce-overhead" if cuda and graphs else None
        self.engine.compile(compile_kwargs={"mode": mode, "dynamic": False} if mode else {"dynamic": False})
        self.cuda = mode is not None
        self.engine.train()
        # DeepSpeed steps the torch optimizer that the Trainer's schedule wraps through a reference of its own, so
        # torch warns on the schedule's first step that it came before the optimizer's; the rate is right all the same.
        warnings.filterwarnings("ignore", "Detected call of `lr_scheduler.step", UserWarning)

    def step(self, micro: list, items, timer):
        import torch

        trainer, engine = self.trainer, self.engine
        step_loss = torch.zeros((), device=self.device)
        for i, batch in enumerate(micro):
            if self.cuda:
                torch.compiler.cudagraph_mark_step_begin()
            last = i == len(micro) - 1
            engine.set_gradient_accumulation_boundary(last)  # as accelerate's backward does for the Trainer
            loss = trainer.compute_loss(engine, batch, num_items_in_batch=items)
            engine.backward(loss, scale_wrt_gas=False)  # already normalised over the step's tokens
            if last:
                engine.step()  # clipping, the optimizer, the loss scale (and a schedule given to DeepSpeed)
            step_loss += loss.detach()
            timer.consume()
        lr = trainer.lr_scheduler.get_last_lr()[0]
        if not trainer.accelerator.optimizer_step_was_skipped:
            trainer.lr_scheduler.step()  # the Trainer's own schedule; a no-op where DeepSpeed steps it
        norm = engine.get_global_grad_norm()
        return step_loss, torch.as_tensor(0.0 if norm is None else norm, device=self.device), lr


def graphs_under_zero(stage: int, accum: int, copied: bool) -> bool:
    """Whether a compiled ZeRO step on a GPU replays as CUDA graphs. Not at ZeRO-3: it swaps parameter storage on
    every fetch. With one micro-batch a step, at ZeRO-0/1/2 (3B LoRA on the H200, ZeRO-2: a compiled step of 29-42 ms
    with graphs against 66-78 ms without; benchmarks/results/archive/zero_graphs_h200.md). Summing over several, only
    where DeepSpeed copies each gradient out of the graph's memory during the backward that wrote it (`copied`): ZeRO-2
    with contiguous_gradients (dsnb's configs) and no trained weight larger than its reduce bucket. ZeRO-0/1 keep each
    gradient as .grad and non-contiguous ZeRO-2 in a list of its own until the step, and ZeRO-2 keeps an oversized one
    as it is until its bucket is reduced, once seen past the backward (8B's embedding, 525M elements, exceeds
    the default 500M; module docstring; tests/test_train.py checks this against DeepSpeed). dsnb's flat ZeRO-2 step
    copies every gradient out after each backward, before the next replay (flat_step.take_over). cuda_graphs false
    turns them off before this is asked.
    """
    return stage < 3 and (accum == 1 or (stage == 2 and copied))


def prepare_engine(trainer, max_steps: int):
    """The DeepSpeed engine, optimizer and schedule exactly as Trainer.train() prepares them (transformers 5)."""
    from transformers.integrations.deepspeed import deepspeed_init

    trainer.optimizer, trainer.lr_scheduler = deepspeed_init(trainer, num_training_steps=max_steps)
    if type(trainer.lr_scheduler).__name__ == "DummyScheduler":
        engine, trainer.optimizer, trainer.lr_scheduler = trainer.accelerator.prepare(
            trainer.model, trainer.optimizer, trainer.lr_scheduler)
    else:
        engine, trainer.optimizer = trainer.accelerator.prepare(trainer.model, trainer.optimizer)
        trainer.create_scheduler(num_training_steps=max_steps)
    trainer.model_wrapped = trainer.deepspeed = engine
    return engine


def flush(pending: list, on_log) -> float | None:
    """Send the logged steps kept on the device to on_log, in one host read, and forget them; the last loss."""
    import torch

    if not pending:
        return None
    values = torch.stack([v.float() for _, loss, norm, _ in pending for v in (loss, norm)]).tolist()
    for i, (step, _, _, lr) in enumerate(pending):
        on_log(step, {"loss": values[2 * i], "grad_norm": values[2 * i + 1], "learning_rate": lr})
    pending.clear()
    return values[-2]


def write_profile(profiler, path: str, step: int, wall_ms: float) -> None:
    """One step's profile: its wall time against the GPU's busy time, then the top operators by GPU time and by host
    time (a step whose GPU sits idle is host-bound: the second table says where the host's time goes)."""
    events = profiler.key_averages()
    # Device-side events only (kernels, copies), as torch's own total: a host op or a compiled graph's annotation
    # carries its kernels' time again.
    gpu_ms = sum(e.self_device_time_total for e in events
                 if e.device_type.name != "CPU" and not e.is_user_annotation) / 1000
    with open(path, "w") as f:
        f.write(f"step {step}: wall {wall_ms:.1f} ms, GPU kernels {gpu_ms:.1f} ms (annotations left out)\n\n")
        if gpu_ms:
            # Inductor's kernel names say what each fused kernel holds: the full width, so they can be told apart.
            f.write("By GPU time:\n" + events.table(sort_by="self_device_time_total", row_limit=60,
                                                     max_name_column_width=200) + "\n\n")
        f.write("By host time:\n" + events.table(sort_by="self_cpu_time_total", row_limit=30) + "\n")
