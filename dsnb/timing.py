"""How long a run will take on a GPU, said before anything trains: the work (optimizer steps, the tokens each
micro-batch really computes, padding included, the layers, the weights trained and moved) against rates measured on
GPUs.

    est = time_estimate(cfg, lengths, config, trainable, world=1, gpu="T4")  # s per step, training, answers, the run
    describe_time(est)                                                        # one line for the plan

A micro-batch takes host and kernel-launch work per layer (the HF Trainer's eager loop, or dsnb's compiled loop with
or without CUDA graphs) and its tokens' FLOPs at a share of the GPU's peak; ZeRO-3 adds its per-layer fetch and
release, and parameter offload moves the weights over PCIe for the forward and again for the backward. A step is its
micro-batches plus the optimizer's update over the trained weights (on the GPU at its memory bandwidth, or on the host
under optimizer offload), DeepSpeed's own ZeRO-1/2 step where dsnb's flat step does not take it, and on several GPUs
the gradients and weights sent between them. A run is its steps, the held-out answers, loading, and compiling.
Each constant says where it was measured (benchmarks/results/h200_runs/: the listing), and
benchmarks/time_vs_measured.py checks the estimates against every committed GPU run, in and out of sample.

A T4 is calibrated on the tutorial's own T4 runs (625 steps of 8-bit LoRA, pad 512, 2 x 4: 2,424.7 s, and 2,680.7 s
with ZeRO-2 + CPU offload), its host work taken as the H200's times the T4 host's slower cores (assumed: no T4 was
reachable from where dsnb is built); L4, A100 and H100 are the H200's figures scaled by their datasheet peaks. Where
an estimate rests on such assumptions or on one run (NVMe offload, DeepCompile, DDP, more than two GPUs, the T4 off the
tutorial's recipe), est["rough"] says why and describe_time's line says "rough".
"""
from __future__ import annotations

import math
import random

from .config import RunConfig, tutorial_pair
from .data import BUCKET
from .estimate import total_params
from .metrics import GPU_PEAK_FLOPS, flops_per_token

# s of host and launch work per layer of a micro-batch under the HF Trainer (H200), by weight storage
TRAINER_LAYER = {"none": 0.0075,  # bench.jsonl, fast.jsonl: the fast recipe's 3B step, 0.217-0.238 s on 28 layers
                 "8bit": 0.0061,  # bench.jsonl, colab.jsonl: the tutorial's recipe, 0.17 s a micro-batch on 28 layers
                 "4bit": 0.0100}  # capacity.jsonl: qlora_4bit, 0.197 / 0.276 / 0.334 s on 16 / 28 / 32 layers
# share of the GPU's peak FLOP/s its tokens compute at: the 8-bit matmuls (bitsandbytes) as measured, else MFU
EIGHT_BIT_SHARE = {"H200": 0.156,  # the tutorial's recipe beyond its floor: 12,000 tokens/s on the 3B shape
                   "T4": 0.284}  # the tutorial's T4 runs: 3.88 s a step of 4 x 1,024 tokens, less the floor
MFU = 0.45  # throughput.jsonl, throughput_levers.jsonl: the throughput mode (45-51%); the Trainer's 8B ZeRO-3 step
#             grew 45 ms from 8 to 16 samples (scale_8b*.jsonl), about 50%
# s per layer a compiled micro-batch takes at least: with CUDA graphs (fast.jsonl, zero_flat.jsonl: fast_compiled,
# 16.5 ms on 28 layers), without (graphscheck.jsonl: the _nographs runs, 42-58 ms a micro-batch on 28 layers)
COMPILED_LAYER = {True: 0.0006, False: 0.0018}
# s per billion trained weights of the optimizer's update on the H200 (HBM-bound), scaled by memory bandwidth
UPDATE = {"fused": 0.012,  # speed.jsonl: full_compiled (torch's fused AdamW), 60 ms against 22 ms of FLOPs for 3.2B
          "foreach": 0.022}  # capacity.jsonl: full minus lora_bf16 under the Trainer (1B +25 ms, 3B +77 ms); DeepSpeed
#                              (fp32 master weights) the same
HBM_GB_S = {"T4": 320, "L4": 300, "A100": 2039, "H100": 3350, "H200": 4800}  # datasheet memory bandwidth
DS_STEP_LAYER = 0.0005  # s per layer of DeepSpeed's own compiled ZeRO-1/2 step (per-gradient hooks, fp64 norms, a host
#                         read) beyond dsnb's flat one: zero_flat*.jsonl, lora_zero2_stock +8 ms, full_stock +29 ms
ZERO3_LAYER = 0.025  # s per layer of a micro-batch: ZeRO-3's fetch and release hooks (deepcompile.jsonl: zero3 0.91 s
#                      on 28 layers compiled; scale_8b.jsonl: zero3_1gpu 1.01 s on 32 layers under the Trainer)
PARAM_OFFLOAD_S_GB = 0.06  # s per GB of 16-bit weights a micro-batch, ZeRO-3 with parameters in CPU RAM (both passes
#                            over PCIe; capacity, big.jsonl: lora_zero3_offload, 0.77 / 1.33 / 2.09 s, 1B / 3B / 8B)
OFFLOAD = {"H200": 0.25, "T4": 0.41}  # s a step that optimizer offload adds whatever is trained (colab.jsonl: the
#                                       LoRA pair, With_DeepSpeed against Without; the tutorial's T4 pair)
OFFLOAD_S_PER_B = 0.30  # s per billion trained weights of CPU Adam and the copies to and from the host (capacity.jsonl:
#                         full_zero2_offload 0.80 / 1.75 s for 1B / 3B; scale_8b.jsonl: zero2_offload_1gpu 3.11 s)
NVME_S_PER_B = 24.0  # s per billion trained weights with optimizer and parameters on disk (nvme_attempts.md: the
#                      only NVMe run, 1B full fine-tuning, 30.8 s a step)
LINK_GB_S = 60  # GB/s between two GPUs of one host as DeepSpeed used them (multi_gpu.jsonl: zero1_2gpu and zero2_2gpu,
#                 0.35-0.38 s against 0.27 s of the rest of the step, for 6.4 GB of gradients and weights)
HOST_FACTOR = {"T4": 1.5}  # a Colab T4's 2 host cores against the H200 host's (assumed), for host work not measured
ANSWER_STEP = {"H200": 0.055, "T4": 0.085}  # s per generated token of a 32-question batch (H200 colab runs; T4 x1.5)
LOAD_SECONDS = 30  # a process's start, imports and the model's load: the Trainer runs' wall time beyond training
#                    (every listing: 10-43 s, median 29 s)
OFFLOAD_SETUP_S_PER_B = 12  # s per billion trained weights to allocate and pin the optimizer's host state (capacity,
#                             scale_8b: full_zero2_offload +18 / +40 s for 1B / 3B, zero2_offload_1gpu +100 s for 8B)
COMPILE_SECONDS = 60  # the compiled loop's first compile, inductor's cache cold (fast.jsonl: fast_compiled 108.6 s of
#                       wall time cold, 40.5 s warm; graphscheck.jsonl 74-97 s)
DEEPCOMPILE_SECONDS = 290  # DeepCompile compiles, profiles and compiles again (deepcompile.jsonl: zero3_dc, 323 s)
DOWNLOAD_GB_S = 0.1  # a hub model's first download (assumed; cached afterwards)
GPUS = ("T4", "L4", "A100", "H100", "H200")


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


def cuda_graphs(cfg: RunConfig) -> bool:
    """Whether the compiled step replays as CUDA graphs (loop.graphs_under_zero): not at ZeRO-3, nor at ZeRO-1
    summing several micro-batches."""
    return cfg.cuda_graphs and cfg.strategy != "zero3" and not (cfg.strategy == "zero1" and cfg.grad_accum > 1)


def micro_batch_seconds(cfg: RunConfig, config, trainable: int, tokens: float, gpu: str) -> float:
    """One micro-batch's forward and backward: per-layer host work and its tokens' FLOPs."""
    layers, host = config.num_hidden_layers, HOST_FACTOR.get(gpu, 1.0)
    flops = tokens * flops_per_token(config, trainable, full=cfg.lora_r == 0)
    if cfg.torch_compile:
        return max(layers * COMPILED_LAYER[cuda_graphs(cfg)] * host, flops / (GPU_PEAK_FLOPS[gpu] * MFU))
    weights = cfg.quantization if cfg.quantization in TRAINER_LAYER else "none"
    share = EIGHT_BIT_SHARE.get(gpu, EIGHT_BIT_SHARE["H200"]) if weights == "8bit" else MFU
    return layers * TRAINER_LAYER[weights] * host + flops / (GPU_PEAK_FLOPS[gpu] * share)


def optimizer_seconds(cfg: RunConfig, config, trainable: int, world: int, gpu: str) -> float:
    """A step's update over the trained weights: on the GPU, split over the GPUs under ZeRO; or on the host (the
    H200 host's CPU Adam; every GPU of a host shares its cores) or disk under optimizer offload."""
    billions = trainable / 1e9
    kind = "fused" if cfg.torch_compile and cfg.strategy == "baseline" else "foreach"
    update = billions * UPDATE[kind] * HBM_GB_S["H200"] / HBM_GB_S.get(gpu, HBM_GB_S["H200"])
    if cfg.offload_optimizer != "none":  # never below the GPU's own update: a slow GPU's host is taken as no faster
        per_b = NVME_S_PER_B if cfg.offload_optimizer == "nvme" else OFFLOAD_S_PER_B * HOST_FACTOR.get(gpu, 1.0)
        return OFFLOAD.get(gpu, OFFLOAD["H200"]) + max(billions * per_b, update)
    own = cfg.torch_compile and cfg.strategy in ("zero1", "zero2") and not (
        cfg.zero_flat_step and world == 1 and cfg.dtype == "bf16")  # dsnb's flat step: one process, bf16, no offload
    return update / (world if cfg.zero_stage else 1) + (config.num_hidden_layers * DS_STEP_LAYER if own else 0.0)


def step_parts(cfg: RunConfig, config, trainable: int, tokens: float, world: int, gpu: str) -> dict:
    """A step's seconds by what takes them (their sum is the step)."""

    parts = {"micro-batches": cfg.grad_accum * micro_batch_seconds(cfg, config, trainable, tokens, gpu),
             "optimizer": optimizer_seconds(cfg, config, trainable, world, gpu)}
    if cfg.strategy == "zero3" and not (cfg.torch_compile and cfg.deepcompile):
        parts["ZeRO-3 fetch"] = cfg.grad_accum * config.num_hidden_layers * ZERO3_LAYER * HOST_FACTOR.get(gpu, 1.0)
    if cfg.offload_param != "none":
        parts["parameter offload"] = cfg.grad_accum * weight_gb(config) * PARAM_OFFLOAD_S_GB
    if world > 1:  # gradients reduced and trained weights gathered (allreduce under DDP); ZeRO-3's weight gathers
        sent = 4 * trainable + (cfg.grad_accum * 4 * total_params(config) if cfg.strategy == "zero3" else 0)
        parts["between GPUs"] = sent * (world - 1) / world / (LINK_GB_S * 1e9)
    return parts


def rough_reasons(cfg: RunConfig, gpu: str, world: int) -> list[str]:
    """Why an estimate is rough: what it rests on that no run measured, or one run measured."""
    reasons = []
    if gpu not in ("H200", "T4"):
        reasons.append(f"the {gpu} is not measured, its figures are the H200's scaled by datasheet peaks")
    elif gpu == "T4" and (cfg.torch_compile or cfg.quantization != "8bit" or cfg.lora_r == 0
                          or cfg.strategy == "zero3" or cfg.padding != "max_length"):
        reasons.append("a T4 is measured only on the tutorial's recipe (8-bit LoRA padded to max_length), the rest is "
                       "the H200's host work x1.5, assumed")
    if "nvme" in (cfg.offload_optimizer, cfg.offload_param):
        reasons.append("NVMe offload is not calibrated, one 1B run took 31 s a step, disk-bound")
    if cfg.torch_compile and cfg.deepcompile and cfg.strategy == "zero3":
        reasons.append("DeepCompile is measured once")
    if cfg.quantization == "8bit" and cfg.dtype != "fp16":
        reasons.append("8-bit weights are calibrated in fp16, in bf16 they measured 1.6-6x this")
    elif cfg.quantization == "8bit" and cfg.padding in ("longest", "bucket") and gpu == "H200":
        reasons.append("8-bit weights are calibrated on rows padded to max_length; padded per batch, notebook 01's "
                       "runs under colab_t4 measured 1.4-2.1x this")
    if world > 2:
        reasons.append("more than two GPUs are not measured")
    elif world > 1 and cfg.strategy == "baseline":
        reasons.append("DDP is measured once, at 4.5x this")
    return reasons


def time_estimate(cfg: RunConfig, lengths: list[int], config, trainable: int, world: int, gpu: str,
                  samples: int | None = None) -> dict:
    """The run's expected seconds on `gpu` (a class of GPUS) with `world` GPUs: per step (and its parts), training,
    the held-out answers (before and after), loading and compiling, in all; the tokens a micro-batch computes and how
    much of them is padding; and why the estimate is rough, if it is."""
    samples = samples or len(lengths)
    steps = steps_of(cfg, samples, world)
    tokens = micro_batch_tokens(cfg, lengths)
    real = min(tokens, cfg.batch_size * sum(lengths) / len(lengths)) if cfg.padding != "filled" else tokens * 0.98
    parts = step_parts(cfg, config, trainable, tokens, world, gpu)
    step = sum(parts.values())
    questions = cfg.eval_samples * (2 if cfg.prompt in ("eos", "tutorial", "chat") else 1)
    answers = 2 * math.ceil(questions / 32) * 32 * ANSWER_STEP.get(gpu, ANSWER_STEP["H200"] *
                                                                  HOST_FACTOR.get(gpu, 1.0)) if questions else 0.0
    load = LOAD_SECONDS + (0 if cfg.model.startswith("synthetic:") else weight_gb(config) / DOWNLOAD_GB_S)
    if cfg.offload_optimizer != "none":
        load += trainable / 1e9 * OFFLOAD_SETUP_S_PER_B
    compiling = (DEEPCOMPILE_SECONDS if cfg.deepcompile and cfg.strategy == "zero3" else COMPILE_SECONDS) * \
        HOST_FACTOR.get(gpu, 1.0) if cfg.torch_compile else 0.0
    source = "dsnb's compiled loop on the H200 (per-layer floor, 45% of the GPU's peak)" if cfg.torch_compile else \
        "the HF Trainer on the H200 (per-layer floor, the weights trained and moved)"
    source += {"H200": "", "T4": " and the tutorial's T4 runs"}.get(gpu, ", scaled by datasheet peaks")
    return {"gpu": gpu, "steps": steps, "step_seconds": step,
            "train_seconds": steps * step, "answer_seconds": answers, "load_seconds": load,
            "compile_seconds": compiling, "seconds": steps * step + answers + load + compiling,
            "micro_batch_tokens": tokens, "padding_share": 1 - real / tokens if tokens else 0.0, "source": source,
            "rough": rough_reasons(cfg, gpu, world)}


def weight_gb(config) -> float:

    return total_params(config) * 2 / 1e9  # as the hub stores the model: 16-bit


def pair_estimate(cfg: RunConfig, lengths: list[int], config, trainable: int, world: int, gpu: str) -> float:
    """Seconds the tutorial's pair takes with cfg's repeats (the notebook's comparison), each variant timed."""
    return cfg.runs_each * sum(time_estimate(c, lengths, config, trainable, world, gpu)["seconds"]
                               for c in tutorial_pair(cfg))


# Settings that shorten the pair without changing what it compares (the closed-book prompt is shorter, but it asks
# another task, and its own lengths would be needed to estimate it).
FASTER = (("padding", "longest", "per-batch padding (the same loss: padding is masked)"),
          ("max_steps", 100, "100 steps"))


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
    """One line: the run's expected time on its GPU, and for `runs` runs (a notebook's pair with its repeats); an
    estimate that rests on what was not measured says "rough" and why, first."""
    whole = f"; {runs} runs (the pair with its repeats): about {minutes(est['seconds'] * runs)}" if runs > 1 else ""
    rough = f" (rough: {'; '.join(est['rough'])})" if est.get("rough") else ""
    compiling = "compiling, " if est.get("compile_seconds") else ""
    return (f"time on {est['gpu']}{rough}: about {minutes(est['seconds'])} a run ({est['steps']} steps of about "
            f"{est['step_seconds']:.2g} s, {est['micro_batch_tokens']:.0f} tokens a micro-batch of which "
            f"{est['padding_share']:.0%} padding, plus {compiling}the held-out answers and loading){whole}; rates from "
            f"{est['source']}")
