"""The model card every folder dsnb saves carries (README.md, as the hub shows it), from the run's config and numbers.

    write_card(folder, cfg, metrics, run_id, kind="adapter")   # train.save and publish.save_model call it
    describe_base(cfg)                                         # the base as a card names it: a hub id, never a path
    portable_config(cfg)                                       # the config as a saved folder's dsnb_run.json holds it

No local path goes into a card, an adapter's config or dsnb_run.json: a synthetic model is named synthetic:<shape>, a
local folder or file by its name alone, and where the run was kept is left out.
"""
from __future__ import annotations

import json
import os
from importlib import metadata

from .config import PLACES, RunConfig, redact
from .data import HUB_DATASETS, eval_task
from .metrics import busy_host, mfu_text, scores_text, synthetic_note

KINDS = {"adapter": "LoRA adapter", "merged": "base model with the LoRA adapter merged in",
         "full": "fully fine-tuned model"}
KEPT_AT = (*PLACES, "nvme_path")  # where this machine kept the run
SCORING = {"squad": "SQuAD v1.1's normalization, F1 over words", "korquad": "KorQuAD 1.0's, F1 over characters"}


def describe_base(cfg: RunConfig) -> str:
    """cfg.model as the world can find it: a hub id as it is, synthetic:<shape>, or a local folder's last name."""
    if cfg.model.startswith("synthetic:") or not os.path.exists(cfg.model):
        return cfg.model
    return os.path.basename(os.path.normpath(cfg.model))


def portable_config(cfg: RunConfig) -> dict:
    """cfg's fields as a saved folder carries them, naming no place on this machine: the model as describe_base names
    it, a data file, DeepSpeed JSON or profile by its file name, and where the run was kept (KEPT_AT) left out (a
    RunConfig read back takes their defaults)."""
    values = {k: v for k, v in cfg.to_dict().items() if k not in KEPT_AT}
    values["model"] = describe_base(cfg)
    for name in ("dataset", "ds_config_path", "profile"):
        values[name] = os.path.basename(values[name])
    return values


def write_card(folder: str, cfg: RunConfig, metrics: dict, run_id: str, kind: str, extra: dict | None = None,
               scoring: str = "") -> None:
    """README.md (the card) into folder, over PEFT's blank template; an adapter's config names its base as
    describe_base does (PEFT writes the path it was loaded from: a cache folder for synthetic models). scoring: how
    the run scored its answers (its scoring_mode param), else cfg.scoring."""
    config = os.path.join(folder, "adapter_config.json")
    if os.path.isfile(config):
        with open(config) as f:
            adapter = json.load(f)
        adapter["base_model_name_or_path"] = describe_base(cfg)
        with open(config, "w") as f:
            json.dump(adapter, f, indent=2)
    with open(os.path.join(folder, "README.md"), "w", encoding="utf-8") as f:
        f.write(redact(card(cfg, metrics, run_id, kind, extra or {}, scoring or cfg.scoring)))


def card(cfg: RunConfig, m: dict, run_id: str, kind: str, extra: dict, scoring: str) -> str:
    base = describe_base(cfg)
    hub = "/" in base and not cfg.model.startswith("synthetic:") and not os.path.exists(cfg.model)
    front = ["---", *([f"base_model: {base}"] if hub else []),
             f"library_name: {'peft' if kind == 'adapter' else 'transformers'}",
             "tags: [dsnb, " + ("deepspeed, " if cfg.zero_stage is not None else "") + ("lora, " if cfg.lora_r else "")
             + "question-answering]",
             *([f"datasets: [{HUB_DATASETS[cfg.dataset]}]"] if cfg.dataset in HUB_DATASETS else []), "---", ""]
    synthetic = cfg.model.startswith("synthetic:")
    task = eval_task(cfg)
    rows = [("base model", base + (synthetic_note(cfg.model, cfg.preset) if synthetic else "")),
            ("data", f"{data_name(cfg)}: the first {cfg.num_samples} training rows, prompt `{cfg.prompt}` ({task})"),
            ("recipe", recipe(cfg, "peak_gpu_allocated_mb" in m)), ("DeepSpeed", deepspeed_name(cfg))]
    for name, label in (("eval", f"held-out questions ({task})"), ("recall", "trained questions (recall)")):
        if f"{name}_exact_match" in m:
            rows.append((label, scores_text(m, name)))
    if "eval_exact_match" in m or "recall_exact_match" in m:
        rows.append(("scoring", scoring + (f" ({SCORING[scoring]})" if scoring in SCORING else "")))
    if "samples_per_second" in m:
        busy = busy_host(m)
        rows.append(("speed", f"{m['samples_per_second']:.3g} samples/s, {m.get('tokens_per_second', 0):,.0f} real "
                              f"tokens/s (steady state), {mfu_text(m, cfg.quantization, 1)}"
                     + (f"; timed on a busy machine ({busy}): not this run's speed alone" if busy else "")))
    host = f"host {m.get('peak_cpu_rss_mb', 0) / 1024:.1f} GB"
    rows.append(("memory", f"peak GPU {m['peak_gpu_allocated_mb'] / 1024:.1f} GB allocated "
                           f"({m['peak_gpu_nvml_mb'] / 1024:.1f} GB by NVML), {host}" if "peak_gpu_allocated_mb" in m
                 else f"peak {host} (trained on the CPU: no GPU figures)"))
    if "train_loss" in m:
        rows.append(("training loss", f"{m['train_loss']:.4g} (mean over the steps)"))
    rows += [(k, v) for k, v in extra.items()]
    table = ["| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)]
    return "\n".join(front + [f"# {cfg.name}: {KINDS[kind]} of {base}", "",
                              f"Trained and measured by dsnb {version()} (MLflow run `{run_id}`, experiment "
                              f"`{cfg.experiment}`); the run's whole config is in dsnb_run.json where dsnb saved this "
                              "folder.", "", *table, ""])


def data_name(cfg: RunConfig) -> str:
    if cfg.dataset in HUB_DATASETS:
        return HUB_DATASETS[cfg.dataset]
    return "dsnb's synthetic SQuAD-format set" if cfg.dataset == "synthetic" else os.path.basename(cfg.dataset)


def recipe(cfg: RunConfig, on_gpu: bool) -> str:
    """How the run trained, in a line: what was trained, its weights, loop, learning rate, batch (per GPU, or the CPU's
    processes), steps and the seed it trained with (seed + repeat)."""
    trained = (f"LoRA r {cfg.lora_r}, alpha {cfg.lora_alpha}, dropout {cfg.lora_dropout} on {cfg.lora_targets}"
               if cfg.lora_r else "every weight trained")
    steps = f"{cfg.max_steps} steps" if cfg.max_steps else f"{cfg.epochs:g} epochs"
    weights = cfg.quantization if cfg.quantization != "none" else "unquantized"
    loop = "dsnb's compiled loop" if cfg.torch_compile else "the HF Trainer"
    where = f"{cfg.num_gpus} GPU(s)" if on_gpu else f"{cfg.num_gpus} CPU process(es)"
    seed = f"seed {cfg.run_seed}" + (f" ({cfg.seed} + repeat {cfg.repeat})" if cfg.repeat else "")
    return (f"{trained}; base weights {weights}, {cfg.dtype}; {loop}; "
            f"lr {cfg.learning_rate:g} (warm-up {cfg.lr_warmup_steps}), batch {cfg.batch_size} x {cfg.grad_accum} "
            f"x {where}, {steps}, {seed}")


def deepspeed_name(cfg: RunConfig) -> str:
    if cfg.zero_stage is None:
        return "none"
    where = [f"{what} offloaded to {device}" for what, device in (("optimizer", cfg.offload_optimizer),
                                                                 ("parameters", cfg.offload_param)) if device != "none"]
    return f"ZeRO-{cfg.zero_stage}" + (f", {', '.join(where)}" if where else "")


def version() -> str:
    try:
        return metadata.version("dsnb")
    except metadata.PackageNotFoundError:
        return "(not installed)"
