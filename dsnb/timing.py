"""How long a run will take on a GPU, said before anything trains: the work (optimizer steps, and the tokens each
micro-batch really computes, padding included) against rates measured on GPUs.

    est = time_estimate(cfg, samples, world=1, gpu="Tesla T4")   # seconds per step, training, answers, the whole run
    describe_time(cfg, est)                                       # one line for the plan

A micro-batch of the HF Trainer's loop takes FLOOR seconds of host and kernel-launch work whatever its size, plus its
tokens at the GPU's RATE; a step is its micro-batches, plus what offloading the optimizer adds (OFFLOAD); held-out
answers take ANSWER_STEP seconds per generated token of a batch of 32 questions. Each number says where it was
measured. A T4 is calibrated on the tutorial's own T4 runs (625 steps of 8-bit LoRA, pad 512, 2 x 4: 2,424.7 s, and
2,680.7 s with ZeRO-2 + CPU offload) and its floor is the H200's times the T4 host's slower cores (an assumption: no
T4 was reachable from where dsnb is built); L4, A100 and H100 are the H200's floor and its rate scaled by their
datasheet peaks (not measured). dsnb's compiled loop is timed from its own runs on the H200 only.
benchmarks/time_estimate.py checks these estimates against every committed GPU run.
"""
from __future__ import annotations

import math
import random

from .config import RunConfig, tutorial_pair
from .metrics import GPU_PEAK_FLOPS, flops_per_token

# (GPU, weights) -> (floor s per micro-batch, tokens per second beyond it, where it was measured)
MEASURED = {
    ("H200", "8bit"): (0.17, 12_000, "H200: the tutorial's recipe at pad 512 (bench, colab runs: 0.21-0.26 s per 1,024 "
                                     "tokens) and the colab_t4 preset per-batch padded"),
    ("H200", "none"): (0.19, 200_000, "H200: the fast recipe's Trainer step (batch 8: 265 ms; batch 64: 203 ms)"),
    ("T4", "8bit"): (0.26, 1_450, "T4: the tutorial's 625 steps (3.88 s a step of 4 x 1,024 tokens); floor the H200's "
                                  "x 1.5 (assumed)"),
}
HOST_FACTOR = {"T4": 1.5}  # a Colab T4's 2 host cores against the H200 host's (assumed), for what is not measured
OFFLOAD = {"H200": 0.25, "T4": 0.41}  # s a step that ZeRO-2 + CPU optimizer offload adds (H200 colab runs; tutorial)
ANSWER_STEP = {"H200": 0.055, "T4": 0.085}  # s per generated token of a 32-question batch (H200 colab runs; T4 x1.5)
COMPILED_STEP_FLOOR = 0.016  # s a compiled step takes at least (H200, fast recipe: 16.5 ms), then 45% of peak FLOP/s
COMPILED_MFU = 0.45
GPUS = ("T4", "L4", "A100", "H100", "H200")
LOAD_SECONDS = 40  # a process's start, imports and the model's load (H200 runs: 20-60 s of wall time beyond training)
DOWNLOAD_GB_S = 0.1  # a hub model's first download (assumed; cached afterwards)


def gpu_class(name: str) -> str | None:
    """The calibrated class of a GPU's name (torch.cuda.get_device_name), else None."""
    for key in ("H200", "H100", "A100", "L4", "T4"):
        if key in name:
            return key
    return None


def micro_batch_tokens(cfg: RunConfig, lengths: list[int], shuffles: int = 8) -> float:
    """Tokens one micro-batch computes on average, padding included: batch x max_length padded to it, or the batch's
    longest sample (rounded up as bucket rounds it), or whole rows of max_length tokens (packed, filled)."""
    if cfg.padding in ("max_length", "filled"):
        return cfg.batch_size * cfg.max_length
    if cfg.padding == "packed":
        return max(1, math.ceil(cfg.batch_size * sum(lengths) / len(lengths) / cfg.max_length)) * cfg.max_length
    from .data import BUCKET

    total = batches = 0
    for seed in range(shuffles):
        order = lengths[:]
        random.Random(seed).shuffle(order)
        for i in range(0, len(order), cfg.batch_size):
            longest = max(order[i:i + cfg.batch_size])
            total += cfg.batch_size * (math.ceil(longest / BUCKET) * BUCKET if cfg.padding == "bucket" else longest)
            batches += 1
    return total / batches


def steps_of(cfg: RunConfig, samples: int, world: int) -> int:
    """Optimizer steps the run takes (max_steps, else its epochs over the data, the last step of each short)."""
    if cfg.max_steps:
        return cfg.max_steps
    micro = math.ceil(samples / (cfg.batch_size * world))
    return math.ceil(math.ceil(micro / cfg.grad_accum) * cfg.epochs)


def rates(gpu: str, quantization: str) -> tuple[float, float, str]:
    """(floor s, tokens/s, source) for a GPU class and weight storage: measured, or scaled from the H200's."""
    weights = "none" if quantization == "none" else "8bit"  # 4-bit timed as 8-bit (bitsandbytes' slow path both)
    if (gpu, weights) in MEASURED:
        return MEASURED[gpu, weights]
    floor, rate, _ = MEASURED["H200", weights]
    scale = GPU_PEAK_FLOPS[gpu] / GPU_PEAK_FLOPS["H200"]
    return floor * HOST_FACTOR.get(gpu, 1.0), rate * scale, f"{gpu}: the H200's rates scaled by datasheet peak " \
                                                            "(not measured)"


def time_estimate(cfg: RunConfig, lengths: list[int], config, trainable: int, world: int, gpu: str,
                  samples: int | None = None) -> dict:
    """The run's expected seconds on `gpu` (a class of GPUS): per step, training, the held-out answers (before and
    after), and in all; with the tokens a micro-batch computes and how much of them is padding."""
    samples = samples or len(lengths)
    steps = steps_of(cfg, samples, world)
    tokens = micro_batch_tokens(cfg, lengths)
    real = min(tokens, cfg.batch_size * sum(lengths) / len(lengths)) if cfg.padding != "filled" else tokens * 0.98
    if cfg.torch_compile:
        flops = tokens * flops_per_token(config, trainable, full=cfg.lora_r == 0)
        step = max(COMPILED_STEP_FLOOR, cfg.grad_accum * flops / (GPU_PEAK_FLOPS[gpu] * COMPILED_MFU))
        source = "compiled loop: the H200's measured floor and 45% of the GPU's peak"
    else:
        floor, rate, source = rates(gpu, cfg.quantization)
        step = cfg.grad_accum * (floor + tokens / rate)
    if cfg.offload_optimizer != "none":
        step += OFFLOAD.get(gpu, OFFLOAD["H200"])
    questions = cfg.eval_samples * (2 if cfg.prompt in ("eos", "tutorial", "chat") else 1)
    answers = 2 * math.ceil(questions / 32) * 32 * ANSWER_STEP.get(gpu, ANSWER_STEP["H200"] *
                                                                  HOST_FACTOR.get(gpu, 1.0)) if questions else 0.0
    load = LOAD_SECONDS + (0 if cfg.model.startswith("synthetic:") else weight_gb(config) / DOWNLOAD_GB_S)
    return {"gpu": gpu, "steps": steps, "step_seconds": step, "train_seconds": steps * step, "answer_seconds": answers,
            "load_seconds": load, "seconds": steps * step + answers + load, "micro_batch_tokens": tokens,
            "padding_share": 1 - real / tokens if tokens else 0.0, "source": source}


def weight_gb(config) -> float:
    from .estimate import total_params

    return total_params(config) * 2 / 1e9  # as the hub stores the model: 16-bit


def pair_estimate(cfg: RunConfig, lengths: list[int], config, trainable: int, world: int, gpu: str) -> float:
    """Seconds the tutorial's pair takes with cfg's repeats (the notebook's comparison), each variant timed."""
    return cfg.runs_each * sum(time_estimate(c, lengths, config, trainable, world, gpu)["seconds"]
                               for c in tutorial_pair(cfg))


FASTER = (("padding", "longest", "per-batch padding (the same loss: padding is masked)"),
          ("max_steps", 100, "100 steps"), ("prompt", "eos", "the tutorial's closed-book text (shorter samples)"))


def faster_settings(cfg: RunConfig, lengths: list[int], config, trainable: int, world: int, gpu: str) -> list[str]:
    """Settings that make the pair shorter on this GPU, each with the pair's estimate under it."""
    out = []
    for name, value, what in FASTER:
        if getattr(cfg, name) == value or (name == "max_steps" and 0 < cfg.max_steps <= value):
            continue
        try:
            faster = cfg.replace(**{name: value})
        except ValueError:  # a combination that cannot run (compiled with per-batch shapes, say)
            continue
        seconds = pair_estimate(faster, lengths, config, trainable, world, gpu)
        out.append(f"{name} {value} ({what}): about {minutes(seconds)}")
    return out


def minutes(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{max(1, round(seconds / 60))} min"


def describe_time(est: dict, runs: int = 1) -> str:
    """One line: the run's expected time on its GPU, and for `runs` runs (a notebook's pair with its repeats)."""
    whole = f"; {runs} runs (the pair with its repeats): about {minutes(est['seconds'] * runs)}" if runs > 1 else ""
    return (f"time on {est['gpu']}: about {minutes(est['seconds'])} a run ({est['steps']} steps of about "
            f"{est['step_seconds']:.2g} s, {est['micro_batch_tokens']:.0f} tokens a micro-batch of which "
            f"{est['padding_share']:.0%} padding, plus the held-out answers and loading){whole}; rates from "
            f"{est['source']}")
