"""A run's plan, made before any weight loads: the data read and checked, held-out questions, trainable weights,
memory and time estimates; and how a run reports its progress. Apart from train.py, so a process that only plans (the
notebook's kernel, `dsnb check`, a launching parent) never imports transformers' Trainer, peft or bitsandbytes.

    print(describe_plan(cfg, plan(cfg)))
"""
from __future__ import annotations

import os
import random
from dataclasses import dataclass

from . import preflight
from .config import ConfigError, RunConfig
from .data import (CLOSED_BOOK, EVAL_SEED, NO_ANSWER, build_dataset, fill_rows, held_out, held_out_warning,
                   load_records, truncated)
from .estimate import CPU_HOST_ERROR, HOST_ERROR, estimate_memory, row_length, tokens_per_micro_batch, trainable_params
from .estimate import error_text as estimate_error
from .evaluate import scoring_mode
from .model import (check_architecture, check_packing, eager_attention, eager_weight_bytes, load_tokenizer,
                    lora_matches, model_config, weight_shapes)
from .timing import describe_time, faster_settings, gpu_class, minutes, pair_estimate, time_estimate


class Reporter:
    """How a run tells its user how it goes: progress (step, steps, last logged loss) and short messages.

    This one prints messages (the HF Trainer draws its own bar); launch gives a child process one that also
    passes both to the parent's bar.
    """

    def step(self, step: int, total: int, loss: float | None) -> None:
        pass

    def say(self, text: str) -> None:
        print(f"dsnb: {text}", flush=True)

    def finishing(self, run_id: str) -> None:
        """The run has recorded all it measured and saved, and is about to be ended FINISHED."""


class Silent(Reporter):
    """For the ranks other than 0: rank 0 speaks for the run."""

    def say(self, text: str) -> None:
        pass


@dataclass
class Plan:
    """What a run will train on and what it should take, known before any weight loads."""

    tokenizer: object
    train_set: object
    eval_rows: list
    config: object  # the model's config
    trainable: int
    estimate: dict
    truncated: int  # samples whose answer max_length cuts
    samples: int  # in train_set, whose rows are samples or (padding filled) rows of several
    recall_rows: list  # trained questions asked again (closed-book prompts)
    data: dict  # counts logged as run params: training rows left out or windowed, held-out questions left out, why
    scoring: str  # how every answer is scored: squad or korquad
    lengths: list  # each training sample's real tokens (after max_length)
    world: int = 1  # the processes training together


def plan(cfg: RunConfig, world: int = 1) -> Plan:
    """Read and check the data (training and held-out rows) and estimate the run's memory, loading no weights; refuse a
    run that the host's RAM or the NVMe folder's free space cannot hold."""

    tokenizer = load_tokenizer(cfg)
    rows = load_records(cfg)
    samples = build_dataset(cfg, tokenizer, rows)  # rows whose passage lacks their answer left out
    train_set = samples
    if cfg.padding == "filled":
        train_set = fill_rows(samples, cfg.max_length)
        if cfg.samples_per_step(world) > len(train_set):
            raise ConfigError(f"padding filled puts the {len(samples)} samples in {len(train_set)} rows of "
                              f"{cfg.max_length} tokens, but one step takes batch_size x grad_accum x {world} "
                              f"process(es) = {cfg.samples_per_step(world)} rows; raise num_samples or lower "
                              "batch_size or grad_accum")
    elif cfg.samples_per_step(world) > len(samples):  # the rows left out leave less than a step
        raise ConfigError(f"{len(rows) - len(samples)} of the {len(rows)} training rows are left out (their passage "
                          f"lacks their answer), and the {len(samples)} left are fewer than one step takes: "
                          f"batch_size x grad_accum x {world} process(es) = {cfg.samples_per_step(world)}; raise "
                          "num_samples or lower batch_size or grad_accum")
    eval_rows, held = held_out(cfg, cfg.eval_samples, tokenizer) if cfg.eval_samples else ([], {})
    data = {"train_left_out_not_in_passage": len(rows) - len(samples),
            "train_windows_moved": sum(samples["window_moved"]),
            "train_no_answer": sum(not any(t.strip() for t in r["answers"]["text"]) for r in rows), **held}
    recall_rows = []
    if cfg.eval_samples and cfg.prompt in CLOSED_BOOK:  # what the run learned, where held-out scores cannot show it
        recall_rows = [rows[i] for i in sorted(random.Random(EVAL_SEED).sample(range(len(rows)),
                                                                               min(cfg.eval_samples, len(rows))))]
    config = model_config(cfg.model)
    check_architecture(cfg.model, config)
    check_packing(cfg, config)
    trainable = trainable_params(cfg, config)
    check_lora_targets(cfg, config)
    device = preflight.pick_device()
    estimate = estimate_memory(cfg, config, trainable, tokens_per_micro_batch(cfg, samples), world,
                               row_length(cfg, samples), on_gpu=device != "cpu")
    preflight.check_host_ram(cfg, world, device, estimate)  # now with the data's activations, before any weight loads
    if cfg.uses_nvme:  # in the plan, so `dsnb check` and the notebook's plan cell say it too, before any weight loads;
        # every process of this host swaps its own partition into the one folder
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        preflight.check_nvme_space(cfg.nvme_path, estimate["est_nvme_mb"] * local)
    return Plan(tokenizer, train_set, eval_rows, config, trainable, estimate, truncated(samples), len(samples),
                recall_rows, data, scoring_mode(cfg), [sum(m) for m in samples["attention_mask"]], world)


def check_lora_targets(cfg: RunConfig, config) -> None:
    """Each of LoRA's target names matches a layer of the model, before it loads (peft says so only once it has loaded,
    and drops a misspelled name silently where another matches): the model built on the meta device names its layers
    (model.weight_shapes), whatever the architecture."""
    if not cfg.lora_r or cfg.lora_targets == "all-linear":
        return
    shapes = weight_shapes(config)
    names = [*shapes["linear"], *shapes["embedding"]]
    missing = [t for t in map(str.strip, cfg.lora_targets.split(",")) if not any(lora_matches(n, [t]) for n in names)]
    if missing:
        layers = sorted({name.rsplit(".", 1)[-1] for name in names})
        raise ConfigError(f"lora_targets {cfg.lora_targets!r}: {', '.join(missing)} names no layer of {cfg.model} "
                          f"({getattr(config, 'model_type', '?')}); its layers are {', '.join(layers)} (or all-linear)")


def describe_plan(cfg: RunConfig, p: Plan) -> str:
    """The plan in one paragraph: data, held-out questions, trainable weights, estimated GPU and host memory."""
    est = p.estimate
    real = sum(sum(m) for m in p.train_set["attention_mask"])
    on_gpu = preflight.pick_device() != "cpu"
    gpu = f"GPU peak about {est['est_peak_gpu_mb'] / 1024:.1f} GB" + (
        f" (budget {cfg.memory_budget_gb:g} GB)" if cfg.memory_budget_gb else "") + (
        f" ({estimate_error()})") if on_gpu else "no GPU"
    host = f"host RAM about {est['est_peak_host_mb'] / 1024:.1f} GB" + (
        f" (budget {cfg.ram_budget_gb:g} GB)" if cfg.ram_budget_gb else "") + (
        f" ({estimate_error(HOST_ERROR)})" if on_gpu else
        f" (the weights, gradients, optimizer and activations included; {estimate_error(CPU_HOST_ERROR)})")
    rows = (f" in {len(p.train_set)} rows of {cfg.max_length} tokens ({real / (len(p.train_set) * cfg.max_length):.1%}"
            " real)") if cfg.padding == "filled" else ""

    asked = f"{len(p.eval_rows)} held-out questions" + (
        f" (closed-book: they measure what the model already knew; {p.scoring} scoring) and {len(p.recall_rows)} "
        "trained ones (recall)" if cfg.prompt in CLOSED_BOOK and p.eval_rows else
        f" (reading the passage; {p.scoring} scoring)" if p.eval_rows else "")
    lines = [f"{p.samples} samples of {real / p.samples:.0f} real tokens on average{rows}, {asked}; "
             f"{p.trainable:,} trainable weights; estimate: {gpu}, {host}"]
    d = p.data
    eager = eager_attention(cfg, p.config)
    if eager:
        size, why = eager_weight_bytes(p.config, cfg.dtype)
        lines.append(f"note: {eager} has no SDPA attention in transformers: it attends eagerly (the run's parameter "
                     "attention_used says so), keeping each layer's length x length attention weights per head: "
                     + (f"{size:g} bytes each in {cfg.dtype} (measured on the CPU on a small copy of it)" if not why
                        else f"taken as {size:g} bytes each (not measured: a small copy of it failed here, {why})")
                     + ", which the memory estimate counts; the time estimate does not count eager attention's "
                     "own speed")
    if d["train_no_answer"]:
        lines.append(f"note: {d['train_no_answer']} of the {p.samples} training samples have no answer (SQuAD 2.0's "
                     f"unanswerable questions, or an answer left empty): they train the answer {NO_ANSWER!r}, as the "
                     "tutorial's do")
    if d["train_left_out_not_in_passage"]:
        lines.append(f"note: {d['train_left_out_not_in_passage']} training rows left out: their passage does not hold "
                     "their answer, which the sample would teach unseen")
    if d["train_windows_moved"]:
        lines.append(f"note: max_length {cfg.max_length} cuts {d['train_windows_moved']} training passages around "
                     "their answer (the passage's start would lose it); raise max_length to keep them whole")
    why = {"shares_training": "share a passage (or, without one, question and answer) with a training row",
           "not_in_passage": "have no answer in their passage",
           "answer_cut": f"lose their answer where max_length {cfg.max_length} cuts the passage"}
    left = [f"{d[f'eval_left_out_{k}']} {text}" for k, text in why.items() if d.get(f"eval_left_out_{k}")]
    if left:
        lines.append(f"note: held-out questions left out, the next of the same draw asked instead: {'; '.join(left)}")
    short = held_out_warning(cfg, d, len(p.eval_rows))
    if short:
        lines.append(f"warning: {short}")
    lines += time_lines(cfg, p)
    lines += step_notes(cfg) + lora_notes(cfg)
    if cfg.max_steps and cfg.untimed_steps >= cfg.max_steps:
        lines.append(f"note: untimed_steps {cfg.untimed_steps} leaves none of the {cfg.max_steps} steps timed, so the "
                     "throughput covers every step, start-up included (throughput_includes_startup 1); raise max_steps")
    if p.truncated:
        lines.append(f"warning: max_length {cfg.max_length} cuts the answer of {p.truncated} of {p.samples} samples "
                     "(out of the passage's window, or tokens of the answer itself); raise max_length to keep them "
                     "whole")
    return "\n".join(lines)


def lora_notes(cfg: RunConfig) -> list[str]:
    """LoRA's settings changed from their defaults in a run that trains every weight (lora_r 0), where they do
    nothing (a sweep's base may set them for its LoRA variants: said, not refused)."""
    default = RunConfig()
    changed = [f"{name} {getattr(cfg, name)}" for name in ("lora_alpha", "lora_dropout", "lora_targets")
               if getattr(cfg, name) != getattr(default, name)]
    return [f"note: lora_r 0 trains every weight; without effect in this run: {', '.join(changed)}"] \
        if cfg.lora_r == 0 and changed else []


def step_notes(cfg: RunConfig) -> list[str]:
    """Step counts that leave a setting without effect in a run of max_steps: a warm-up that never ends (the learning
    rate logged is a peak never reached) and a checkpoint interval past the run's end."""
    lines, steps = [], cfg.max_steps
    if steps and cfg.lr_warmup_steps > steps:
        lines.append(f"note: lr_warmup_steps {cfg.lr_warmup_steps} is more than max_steps {steps}: the learning rate "
                     f"rises to about {cfg.learning_rate * steps / cfg.lr_warmup_steps:.2g}, never to its "
                     f"{cfg.learning_rate:g}; lower lr_warmup_steps")
    if steps and cfg.checkpoint_steps > steps:
        lines.append(f"note: checkpoint_steps {cfg.checkpoint_steps} is more than max_steps {steps}: no checkpoint at "
                     "a step" + (f" (checkpoint_minutes {cfg.checkpoint_minutes:g} may still write one)"
                               if cfg.checkpoint_minutes else "; a killed run starts again from its first step"))
    return lines


def time_lines(cfg: RunConfig, p: Plan) -> list[str]:
    """The expected time on this GPU (and, under the colab_t4 preset, on a T4), with faster settings where the
    notebook's pair would run for more than an hour; nothing on the CPU, where no rate is calibrated."""
    here, world = None, p.world
    if preflight.pick_device() != "cpu":
        import torch

        here = gpu_class(torch.cuda.get_device_name())
    gpus = list(dict.fromkeys([g for g in (here, "T4" if cfg.preset == "colab_t4" else None) if g]))
    lines = []
    for gpu in gpus:
        est = time_estimate(cfg, p.lengths, p.config, p.trainable, world, gpu, p.samples)
        try:
            pair = pair_estimate(cfg, p.lengths, p.config, p.trainable, world, gpu)
        except ConfigError:  # a variant the tutorial's pair cannot be made of (flex attention under DeepSpeed, say)
            lines.append(describe_time(est))
            continue
        lines.append(describe_time(est) + f"; the tutorial's pair ({cfg.runs_each} run(s) each): about "
                     f"{minutes(pair)}")
        if pair > 3600:
            lines.append(f"on {gpu} that is over an hour; faster, each with the pair's time: "
                         + "; ".join(faster_settings(cfg, p.lengths, p.config, p.trainable, world, gpu)))
    if not gpus:
        lines.append("time: not estimated on the CPU (the rates are measured on GPUs); the CPU's own steps are timed "
                     "as the run goes")
    return lines
