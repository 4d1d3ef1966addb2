"""How long a run will take on a GPU, said before anything trains: the work (optimizer steps, the tokens each
micro-batch really computes, padding included, the layers, the weights trained and moved) against rates measured on
GPUs.

    est = time_estimate(cfg, lengths, config, trainable, world=1, gpu="T4")  # s per step, training, answers, the run
    describe_time(est)                                                        # one line for the plan

A micro-batch takes host and kernel-launch work per layer (the HF Trainer's eager loop, by weight storage and by
whether each micro-batch has a length of its own or one of few, as max_length and bucket give; or dsnb's compiled loop
with or without CUDA graphs) and its tokens' FLOPs at a share of the GPU's peak; ZeRO-3 adds its per-layer fetch and
release, and parameter offload moves the weights over PCIe for the forward and again for the backward. A step is its
micro-batches plus the optimizer's update over the trained weights (on the GPU at its memory bandwidth, or on the host
under optimizer offload), DeepSpeed's own ZeRO-1/2 step where dsnb's flat step does not take it, and on several GPUs
the gradients and weights sent between them. A run is its steps, the held-out answers, loading, and compiling. RATES
are fitted to every committed GPU run (benchmarks/time_vs_measured.py, which also predicts each run with the rates
fitted without it).

A T4 is calibrated on the tutorial's own T4 runs (625 steps of 8-bit LoRA, pad 512, 2 x 4: 2,424.7 s, and 2,680.7 s
with ZeRO-2 + CPU offload), its host work taken as the H200's times the T4 host's slower cores (assumed: no T4 was
reachable from where dsnb is built); L4, A100 and H100 are the H200's figures scaled by their datasheet peaks. Where
an estimate rests on such assumptions or on one run (NVMe offload, DeepCompile, DDP, DeepSpeed's own compiled step,
more than two GPUs, the T4 off the tutorial's recipe), est["rough"] says why and describe_time's line says "rough".
"""
from __future__ import annotations

import math
import random

from .config import RunConfig, tutorial_pair
from .data import BUCKET
from .estimate import total_params
from .metrics import GPU_PEAK_FLOPS, flops_per_token

# Rates on the H200, each fitted to the committed runs of the path it serves (benchmarks/time_vs_measured.py: a run
# fits the last rate, in this order, its step depends on; each rate is the median of what its runs imply given the
# rates before it). tests/test_timing.py holds these figures to that fit; time_vs_measured_h200.md lists each rate's
# runs and every run predicted with the rates fitted without it.
RATES = {
    "mfu": 0.504,  # share of the GPU's peak FLOP/s a compiled step's tokens compute at (FLOP-bound; 18 runs)
    "compiled_layer": 0.000589,  # s per layer a compiled micro-batch takes at least, replayed as CUDA graphs (6 runs)
    "fp8_flops": 0.769,  # an fp8-weights step's FLOP time against bf16's: the frozen matmuls at fp8's rate, the rest
    #                      (attention, LoRA, norms, the loss) not (the throughput mode, three calls of one shape)
    "fp8_layer": 0.000326,  # s per layer a micro-batch with fp8 weights adds on the GPU whatever its tokens: each
    #                         layer's weights transposed for the backward, its activations quantized (2 runs)
    "ds_step_layer": 0.000253,  # s per layer of DeepSpeed's own compiled ZeRO-1/2 step beyond dsnb's flat one (1 run)
    "compiled_layer_nographs": 0.00158,  # the same floor without CUDA graphs (4 runs)
    "trainer_layer": 0.00499,  # s per layer of host and launch work in a micro-batch under the HF Trainer, 16-bit
    #                            weights, micro-batches of few lengths (bucket; 2 runs)
    "trainer_layer_varying": 0.00234,  # s per layer more where each micro-batch has its own length (longest; 7 runs)
    "trainer_layer_4bit": 0.00954,  # the same with 4-bit weights (bitsandbytes' NF4), padded per batch (2 runs)
    "trainer_layer_8bit": 0.00594,  # the same with 8-bit weights, micro-batches of few lengths (max_length, bucket;
    #                                5 runs)
    "eight_bit_varying": 0.0064,  # s per layer more with 8-bit weights where each micro-batch has its own length
    #                                (longest: notebook 01 and t4pad under colab_t4, the capacity map's 8-bit cells;
    #                                6 runs)
    "update_fused": 0.012,  # s per billion trained weights of torch's fused AdamW (HBM-bound; scaled by bandwidth):
    #                         its one run (speed.jsonl full_compiled) also wrote to MLflow every step, so not fitted
    "update_foreach": 0.0299,  # the same for the Trainer's foreach AdamW and DeepSpeed's (fp32 master; 5 runs)
    "zero3_layer": 0.0231,  # s per layer of a micro-batch: ZeRO-3's fetch and release hooks (6 runs)
    "deepcompile_layer": 0.000589,  # the same under DeepCompile, gathers and releases in the graph (1 run)
    "offload": 0.18,  # s a step that optimizer offload adds whatever is trained (8-bit LoRA, 3 runs)
    "param_offload_s_gb": 0.0503,  # s per GB of 16-bit weights a micro-batch, ZeRO-3 with parameters in CPU RAM (6)
    "offload_s_per_b": 0.331,  # s per billion trained weights of CPU Adam and the copies to and from the host (11 runs)
    "nvme_s_per_b": 24.2,  # s per billion trained weights with optimizer and parameters on disk (1 run)
    "link_gb_s": 82.5,  # GB/s between two GPUs of one host as DeepSpeed used them (gradients and weights; 8 runs)
    "ddp_s_per_b": 0.444,  # s per billion trained weights that DDP's gradient all-reduce took beyond that (1 run)
    # the T4's, fitted last to the tutorial's own T4 runs (8-bit LoRA, pad 512, 2 x 4, 625 steps: 2,424.7 s, and
    # 2,680.7 s with ZeRO-2 + CPU offload), its host work taken as the H200's x HOST_FACTOR:
    "t4_eight_bit_share": 0.282,  # the 8-bit matmuls' share of the T4's fp16 peak
    "t4_offload": 0.409,  # s a step that optimizer offload adds on the T4
}
EIGHT_BIT_SHARE_H200 = 0.156  # the 8-bit matmuls' share of the H200's peak (the tutorial's recipe beyond its floor):
#                               8.3e-5 s a token of the 3B shape, where t4pad's runs padded to 512 and to bucket, one
#                               session, differ by 0.259 s a step for 3,072 tokens (8.4e-5)
HBM_GB_S = {"T4": 320, "L4": 300, "A100": 2039, "H100": 3350, "H200": 4800}  # datasheet memory bandwidth
HOST_FACTOR = {"T4": 1.5}  # a Colab T4's 2 host cores against the H200 host's (assumed), for host work not measured
ANSWER_STEP = {"H200": 0.055, "T4": 0.085}  # s per generated token of a 32-question batch (H200 colab runs; T4 x1.5)
LOAD_SECONDS = 30  # a process's start, imports and the model's load: the Trainer runs' wall time beyond training
#                    (every listing: 10-43 s, median 29 s)
OFFLOAD_SETUP_S_PER_B = 12  # s per billion trained weights to allocate and pin the optimizer's host state (capacity,
#                             scale_8b: full_zero2_offload +18 / +40 s for 1B / 3B, zero2_offload_1gpu +100 s for 8B)
COMPILE_SECONDS = 60  # the compiled loop's first compile, inductor's cache cold (fast.jsonl: fast_compiled 108.6 s of
#                       wall time cold, 40.5 s warm; graphscheck.jsonl 74-97 s)
FP8_HEAD_RATE = {"fast": 0.518, "fp32": 0.645}  # fp8_head: the LM head's forward matmul in fp8 against bf16, alone
#                       on an H100 (fp8_gemms_h100.jsonl, 12,288 tokens of the 3B shape: 14.09 ms in bf16, 7.30 with
#                       fast accumulation, 9.09 with fp32's); the rest of an fp8 step as fp8_flops says (its runs'
#                       heads were bf16)
FP8_COMPILE = 1.6  # fp8 weights' first compile against bf16's, the same shape cold (advise_verify_h200.md: the first
#                   step at 194 s against 132, about 164 s of compiling against 102)
DEEPCOMPILE_SECONDS = 290  # DeepCompile compiles, profiles and compiles again (deepcompile.jsonl: zero3_dc, 323 s)
DOWNLOAD_GB_S = 0.1  # a hub model's first download (assumed; cached afterwards)
GPUS = ("T4", "L4", "A100", "H100", "H200")
# The estimate's error out of sample: committed GPU runs held out (each predicted with its path's rate fitted without
# it), how many came within 25%, the median absolute error (benchmarks/time_vs_measured.py; tests/test_timing.py holds
# these to its figures)
HELD_OUT = (92, 81, 0.082)


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


def micro_batch_seconds(cfg: RunConfig, config, trainable: int, tokens: float, gpu: str, rates: dict) -> float:
    """One micro-batch's forward and backward: per-layer host work and its tokens' FLOPs (compiled: whichever is
    longer, the host running ahead of the GPU)."""
    layers, host = config.num_hidden_layers, HOST_FACTOR.get(gpu, 1.0)
    flops = tokens * flops_per_token(config, trainable, full=cfg.lora_r == 0)
    # fp8 weights: the matmuls at fp8's rate, and per layer a cost that is mostly kernels' fixed time (its bytes, a
    # layer's weights transposed once, take 0.04 ms of the 0.33 on an H200), so taken as the H200's on every GPU
    fp8_flops, fp8_layer = (rates["fp8_flops"], rates["fp8_layer"]) if cfg.quantization == "fp8" else (1.0, 0.0)
    if cfg.quantization == "fp8" and cfg.fp8_head:  # the head's forward FLOPs (2 V h a token) at FP8_HEAD_RATE
        rate = FP8_HEAD_RATE["fp32" if cfg.fp8_fast_accum == "none" else "fast"]
        fp8_flops -= 2 * config.vocab_size * config.hidden_size * tokens / flops * (1 - rate)
    if cfg.torch_compile:
        floor = rates["compiled_layer" if cuda_graphs(cfg) else "compiled_layer_nographs"]
        return max(layers * floor * host,
                   flops / (GPU_PEAK_FLOPS[gpu] * rates["mfu"]) * fp8_flops + layers * fp8_layer)
    varying = cfg.padding == "longest"  # max_length and bucket: one length or few, each met again within steps
    if cfg.quantization == "8bit":  # bitsandbytes reads its outliers back to the host in every matmul: no overlap
        per_layer = rates["trainer_layer_8bit"] + (rates["eight_bit_varying"] if varying else 0.0)
        share = rates["t4_eight_bit_share"] if gpu == "T4" else EIGHT_BIT_SHARE_H200
    elif cfg.quantization == "4bit":
        per_layer, share = rates["trainer_layer_4bit"], rates["mfu"]
    else:
        per_layer = rates["trainer_layer"] + (rates["trainer_layer_varying"] if varying else 0.0)
        share = rates["mfu"]
    return layers * (per_layer * host + fp8_layer) + flops / (GPU_PEAK_FLOPS[gpu] * share) * fp8_flops


def optimizer_seconds(cfg: RunConfig, config, trainable: int, world: int, gpu: str, rates: dict) -> float:
    """A step's update over the trained weights: on the GPU, split over the GPUs under ZeRO; or on the host (the
    H200 host's CPU Adam; every GPU of a host shares its cores) or disk under optimizer offload."""
    billions = trainable / 1e9
    kind = "update_fused" if cfg.torch_compile and cfg.strategy == "baseline" else "update_foreach"
    update = billions * rates[kind] * HBM_GB_S["H200"] / HBM_GB_S.get(gpu, HBM_GB_S["H200"])
    if cfg.offload_optimizer != "none":  # never below the GPU's own update: a slow GPU's host is taken as no faster
        per_b = rates["nvme_s_per_b"] if cfg.offload_optimizer == "nvme" else \
            rates["offload_s_per_b"] * HOST_FACTOR.get(gpu, 1.0)
        return rates["t4_offload" if gpu == "T4" else "offload"] + max(billions * per_b, update)
    own = config.num_hidden_layers * rates["ds_step_layer"] if deepspeed_step(cfg, world) else 0.0
    return update / (world if cfg.zero_stage else 1) + own


def deepspeed_step(cfg: RunConfig, world: int) -> bool:
    """Whether a compiled ZeRO-1/2 step without offload is DeepSpeed's own (dsnb's flat step takes it on one process
    in bf16)."""
    return cfg.torch_compile and cfg.strategy in ("zero1", "zero2") and cfg.offload_optimizer == "none" and not (
        cfg.zero_flat_step and world == 1 and cfg.dtype == "bf16")


def step_parts(cfg: RunConfig, config, trainable: int, tokens: float, world: int, gpu: str,
               rates: dict = RATES) -> dict:
    """A step's seconds by what takes them (their sum is the step)."""
    parts = {"micro-batches": cfg.grad_accum * micro_batch_seconds(cfg, config, trainable, tokens, gpu, rates),
             "optimizer": optimizer_seconds(cfg, config, trainable, world, gpu, rates)}
    if cfg.strategy == "zero3":
        fetch = rates["deepcompile_layer" if cfg.torch_compile and cfg.deepcompile else "zero3_layer"]
        parts["ZeRO-3 fetch"] = cfg.grad_accum * config.num_hidden_layers * fetch * HOST_FACTOR.get(gpu, 1.0)
    if cfg.offload_param != "none":
        parts["parameter offload"] = cfg.grad_accum * weight_gb(config) * rates["param_offload_s_gb"]
    if world > 1:  # gradients reduced and trained weights gathered (allreduce under DDP); ZeRO-3's weight gathers
        sent = 4 * trainable + (cfg.grad_accum * 4 * total_params(config) if cfg.strategy == "zero3" else 0)
        parts["between GPUs"] = sent * (world - 1) / world / (rates["link_gb_s"] * 1e9)
        if cfg.strategy == "baseline":
            parts["DDP all-reduce"] = trainable / 1e9 * rates["ddp_s_per_b"]
    return parts


def offload_reasons(cfg: RunConfig) -> list[str]:
    """Why an estimate with offload is rough: parameters in CPU RAM vary by machine, NVMe is measured once."""
    reasons = []
    if cfg.offload_param == "cpu":
        reasons.append("parameters in CPU RAM move at the host's speed: the same 8B LoRA step took 1.2-1.4 s on one "
                       "H200 machine and 2.0-2.6 s on two others (time_vs_measured_h200.md)")
    if "nvme" in (cfg.offload_optimizer, cfg.offload_param):
        reasons.append("NVMe offload is measured once, one 1B run took 31 s a step, disk-bound")
    return reasons


def rough_reasons(cfg: RunConfig, gpu: str, world: int) -> list[str]:
    """Why an estimate is rough: a path no run measured, or one run measured (a rate fitted to one run cannot be
    held out; benchmarks/time_vs_measured.py lists them)."""
    reasons = []
    if gpu == "H100" and not (cfg.torch_compile and cfg.cuda_graphs and cfg.lora_r and cfg.quantization == "none"
                              and cfg.dtype == "bf16" and cfg.strategy == "baseline" and world == 1
                              and cfg.padding in ("bucket", "filled")):
        reasons.append("an H100 is measured only on dsnb's compiled bf16 LoRA of the 1B and 3B shapes, padded to a "
                       "multiple of 64 or in filled rows (18 runs, from 11% under the estimate to 2% over; fp8 "
                       "weights 7 runs, from 3% under to 4% over; the colab_t4 preset's fp16 recipes 10-19% under; "
                       "time_vs_measured_h200.md), the rest is the H200's figures scaled by datasheet peaks")
    elif gpu not in ("H200", "T4", "H100"):
        reasons.append(f"the {gpu} is not measured, its figures are the H200's scaled by datasheet peaks")
    elif gpu == "T4" and (cfg.torch_compile or cfg.quantization != "8bit" or cfg.lora_r == 0
                          or cfg.strategy == "zero3" or cfg.padding != "max_length"):
        reasons.append("a T4 is measured only on the tutorial's recipe (8-bit LoRA padded to max_length), the rest is "
                       "the H200's host work x1.5, assumed")
    reasons += offload_reasons(cfg)
    if cfg.torch_compile and cfg.deepcompile and cfg.strategy == "zero3":
        reasons.append("DeepCompile is measured once")
    if deepspeed_step(cfg, world):
        reasons.append("DeepSpeed's own compiled ZeRO-1/2 step is measured once")
    if cfg.torch_compile and cfg.strategy == "baseline" and cfg.lora_r == 0:
        reasons.append("compiled full fine-tuning without DeepSpeed is measured once, by code since changed")
    if cfg.quantization == "fp8":
        reasons.append("fp8 weights' matmul rate rests on one shape (the throughput mode, fp8_h200.md), their cost a "
                       "micro-batch on two runs, both compiled, all with fp32 accumulation" + (
                           "" if cfg.fp8_fast_accum == "none" else
                           f" (fast accumulation, fp8_fast_accum {cfg.fp8_fast_accum}, ran that shape's step "
                           f"{ {'both': 6, 'forward': 3}[cfg.fp8_fast_accum]}% faster: fp8_accum_h200.md)") + (
                           "; the LM head's forward in fp8 (fp8_head) at its matmul's rate alone (the estimate "
                           "1.7% above one H100 run's step: fp8_head_h100.md)" if cfg.fp8_head else "") + (
                           f"; their first compile is taken as {FP8_COMPILE:g}x bf16's" if cfg.torch_compile else
                           "; uncompiled fp8 is not measured: the Trainer's bf16 host work plus the compiled runs' fp8 "
                           "terms, its extra kernel launches not counted"))
    if world > 2:
        reasons.append("more than two GPUs are not measured")
    elif world > 1 and cfg.strategy == "baseline":
        reasons.append("DDP is measured once")
    return reasons


def time_estimate(cfg: RunConfig, lengths: list[int], config, trainable: int, world: int, gpu: str,
                  samples: int | None = None, rates: dict = RATES) -> dict:
    """The run's expected seconds on `gpu` (a class of GPUS) with `world` GPUs: per step (and its parts), training,
    the held-out answers (before and after), loading and compiling, in all; the tokens a micro-batch computes and how
    much of them is padding; and why the estimate is rough, if it is."""
    samples = samples or len(lengths)
    steps = steps_of(cfg, samples, world)
    tokens = micro_batch_tokens(cfg, lengths)
    real = min(tokens, cfg.batch_size * sum(lengths) / len(lengths)) if cfg.padding != "filled" else tokens * 0.98
    parts = step_parts(cfg, config, trainable, tokens, world, gpu, rates)
    step = sum(parts.values())
    questions = cfg.eval_samples * (2 if cfg.prompt in ("eos", "tutorial", "chat") else 1)
    answers = 2 * math.ceil(questions / 32) * 32 * ANSWER_STEP.get(gpu, ANSWER_STEP["H200"] *
                                                                  HOST_FACTOR.get(gpu, 1.0)) if questions else 0.0
    load = LOAD_SECONDS + (0 if cfg.model.startswith("synthetic:") else weight_gb(config) / DOWNLOAD_GB_S)
    if cfg.offload_optimizer != "none":
        load += trainable / 1e9 * OFFLOAD_SETUP_S_PER_B
    compiling = (DEEPCOMPILE_SECONDS if cfg.deepcompile and cfg.strategy == "zero3" else COMPILE_SECONDS) * \
        HOST_FACTOR.get(gpu, 1.0) * (FP8_COMPILE if cfg.quantization == "fp8" else 1.0) if cfg.torch_compile else 0.0
    source = (f"dsnb's compiled loop on the H200 (per-layer floor, {rates['mfu']:.0%} of the GPU's peak)"
              if cfg.torch_compile else "the HF Trainer on the H200 (per-layer floor, the weights trained and moved)")
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


# Settings that shorten the pair without changing what it compares, each with two committed runs that bear it out:
# (changes, what, the run with the setting, the run without: each (its listing or results file, as
# benchmarks/time_vs_measured.py names them; its run), one path, the setting changed; tests/test_timing.py checks
# them). One micro-batch of 8 pays the per-micro-batch host work once a step instead of four times (t4pad: 0.316 s a
# step against 1.482, one session). No padding is among them: padding changes the memory the pair compares, and
# colab_t4 already pads to bucket, measured the fastest of the three with 8-bit weights (t4pad). (The closed-book
# prompt is shorter, but it asks another task.)
FASTER = (({"batch_size": 8, "grad_accum": 1}, "one micro-batch of 8 a step instead of 2 x 4, the same samples a step",
           ("t4pad.jsonl", "pad_longest_b8"), ("t4pad.jsonl", "pad_longest")),
          ({"max_steps": 100}, "100 steps, each as long",
           ("bench.jsonl", "tutorial"), ("tutorial_pair_h200.md", "Without_DeepSpeed")))


def faster_settings(cfg: RunConfig, lengths: list[int], config, trainable: int, world: int, gpu: str) -> list[str]:
    """Settings that make the pair shorter on this GPU by the estimate, each with the pair's estimate under it."""
    now, out = pair_estimate(cfg, lengths, config, trainable, world, gpu), []
    for changes, what, _, _ in FASTER:
        if all(getattr(cfg, k) == v for k, v in changes.items()) or 0 < cfg.max_steps <= changes.get("max_steps", 0):
            continue
        try:
            faster = cfg.replace(**changes)
        except ValueError:  # a combination that cannot run
            continue
        seconds = pair_estimate(faster, lengths, config, trainable, world, gpu)
        if seconds < now:
            out.append(f"{' '.join(f'{k} {v}' for k, v in changes.items())} ({what}): about {minutes(seconds)}")
    return out


def minutes(seconds: float) -> str:
    """A time as a person reads it: seconds under 90 s (a 20-second run is no minute), minutes, then hours."""
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    return f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{round(seconds / 60)} min"


def describe_time(est: dict, runs: int = 1) -> str:
    """One line: the run's expected time on its GPU, and for `runs` runs (a notebook's pair with its repeats); an
    estimate that rests on what was not measured says "rough" and why, first."""
    whole = f"; {runs} runs (the pair with its repeats): about {minutes(est['seconds'] * runs)}" if runs > 1 else ""
    rough = f" (rough: {'; '.join(est['rough'])})" if est.get("rough") else ""
    compiling = "compiling, " if est.get("compile_seconds") else ""
    return (f"time on {est['gpu']}{rough}: about {minutes(est['seconds'])} a run ({est['steps']} steps of about "
            f"{est['step_seconds']:.2g} s, {est['micro_batch_tokens']:.0f} tokens a micro-batch of which "
            f"{est['padding_share']:.0%} padding, plus {compiling}the held-out answers and loading){whole}; rates from "
            f"{est['source']}" + ("" if rough else f"; {error_text()}"))


def error_text() -> str:
    """The time estimate's measured error, in words, for every line that shows one."""
    runs, within, median = HELD_OUT
    return (f"held out, {within} of {runs} committed GPU runs' steps came within 25% of it, median error "
            f"{median:.0%}")
