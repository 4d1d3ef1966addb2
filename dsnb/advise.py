"""Which setup fits and is fastest, answered before a GPU is touched: every variant worth trying for a model, a task
and a machine, ranked by its predicted time for the whole run, with its predicted GPU and host-RAM peaks.

    python -m dsnb advise --model synthetic:llama-3.2-3b --gpu T4 --ram 12.7     # a table, best first, and commands
    python -m dsnb advise --preset kaggle_t4x2 --gpu T4 --gpus 2                  # Kaggle's two T4s over PCIe
    python -m dsnb advise --memory_budget_gb 15 --verify 3                        # on a GPU: run the top 3, measure

    table = dsnb.advise(cfg, gpu="T4", ram_gb=12.7)     # in a notebook: a pandas table, best first
    table = dsnb.advise(cfg, verify=3)                   # on this machine's GPU: measured beside predicted

The model's config and the task's data are read (no weight is loaded); each variant is a RunConfig of the task with
its own training kind (LoRA in bf16/fp16, 8-bit or 4-bit; full fine-tuning), DeepSpeed stage and offload, micro-batch
(the effective batch kept) and loop (the HF Trainer's, or dsnb's compiled one where it applies), and only variants
RunConfig accepts are offered; a variant whose whole logits keep it off the GPU is offered again with its loss chunked
(loss_chunk) where that fits. Memory comes from dsnb/estimate.py, time from dsnb/timing.py; a variant "fits" where
its estimate, with FIT_MARGIN above it, and what CUDA takes outside PyTorch's allocator fit the GPU (and the run's
memory_budget_gb), and its processes' host RAM fits the machine's. benchmarks/advise_vs_measured.py checks both
against every committed GPU run.
"""
from __future__ import annotations

import math
import shlex
from dataclasses import dataclass

from . import estimate, timing
from .compare import newest_run, reuse
from .config import ConfigError, RunConfig
from .data import build_dataset, load_records
from .estimate import MB, estimate_memory, row_length, tokens_per_micro_batch, trainable_params
from .launch import run_all
from .model import load_tokenizer, model_config
from .timing import GPUS, gpu_class, minutes, time_estimate
from .tracking import mlflow_client

# GiB PyTorch can use on each class of GPU (T4: 14.75, as Colab's shows; H200: 139.8, as the measured runs' showed;
# L4, A100 (40 GB, Colab's) and H100 from their datasheets); memory_budget_gb caps it lower.
GPU_GB = {"T4": 14.75, "L4": 22.5, "A100": 39.6, "H100": 79.6, "H200": 139.8}
BF16 = ("L4", "A100", "H100", "H200")  # compute capability 8.0 or more: native bf16 (a T4 has fp16 only)
FIT_MARGIN = 0.15  # "fits" keeps this much above the GPU estimate: the worst underestimate of a committed run is 12%
OUTSIDE_GB = 2.2  # what CUDA takes outside PyTorch's allocator (context, NCCL, compiled kernels): measured 0.75-2.2 GB
#                   between NVML's figure and the allocator's reserve on the H200 runs, the most taken
PCIE_GB_S = 5.0  # GB/s between two GPUs over PCIe without NVLink, as NCCL reaches it through the host (assumed; the
#                  time model's link, timing.RATES["link_gb_s"], is NVLink's as measured on two H200s)
NVLINK = ("A100", "H100", "H200")  # the classes whose multi-GPU machines join them by NVLink (SXM boards)
SAME_MEMORY = 0.05  # memory estimates closer than this are the same (the estimate's 95th-percentile error: 2.9%)
FITS = ("fits", "tight", "no")
LOSS_CHUNK = 1024  # tokens a chunk of the loss where advise offers it: a variant's whole logits do not fit, chunked do
VERIFY_STEPS, VERIFY_UNTIMED = 10, 3  # --verify: a few steps each, the first ones (compiling) untimed
STRATEGIES = (("baseline", "none", "none"), ("zero1", "none", "none"), ("zero2", "none", "none"),
              ("zero3", "none", "none"), ("zero2", "cpu", "none"), ("zero3", "cpu", "none"), ("zero3", "cpu", "cpu"),
              ("zero3", "nvme", "nvme"))
KINDS = (("LoRA", "none"), ("LoRA", "8bit"), ("LoRA", "4bit"), ("LoRA", "fp8"), ("full", "none"))
FP8_GPUS = ("L4", "H100", "H200")  # the classes with FP8 matmuls (compute capability 8.9 or more: dsnb/fp8.py)
COLUMNS = ("rank", "fits", "time", "step_s", "gpu_gb", "host_gb", "training", "weights", "deepspeed", "loop", "batch",
           "why", "rough", "rests_on", "command")


@dataclass(frozen=True)
class Machine:
    """What a run is advised for: a GPU class, how many of them, the GiB each offers and the host's RAM (0: not
    judged); here: this machine, whose GPUs --verify can use."""

    gpu: str
    count: int
    gpu_gb: float
    ram_gb: float
    here: bool

    @property
    def link(self) -> str:
        return "NVLink" if self.gpu in NVLINK else "PCIe"

    def describe(self) -> str:
        ram = f"{self.ram_gb:g} GB of host RAM" if self.ram_gb else "host RAM not judged (give --ram)"
        pair = f" over {self.link}" if self.count > 1 else ""
        return f"{self.count} x {self.gpu} ({self.gpu_gb:g} GB each{pair}), {ram}"


def machine(gpu: str = "", gpus: int = 0, ram_gb: float = 0.0, task_gpus: int = 1) -> Machine:
    """The machine to advise for: a named GPU class, else this machine's; gpus of them (else the task's num_gpus where
    it asks for several, else this machine's count, else 1); ram_gb of host RAM (else this machine's, if it is the one
    advised for; else not judged)."""
    import psutil

    here = this_gpu()
    if gpu and gpu not in GPUS:
        raise ConfigError(f"--gpu {gpu!r} is not a GPU dsnb has figures for; use one of {', '.join(GPUS)}")
    if not gpu and here is None:
        raise ConfigError(f"this machine has no GPU dsnb has figures for; name the one to advise for with --gpu "
                          f"({', '.join(GPUS)})")
    if gpus < 0 or ram_gb < 0 or not math.isfinite(ram_gb):
        raise ConfigError("--gpus and --ram must be 0 (this machine's) or more")
    gpu = gpu or here[0]
    on_this = here is not None and here[0] == gpu
    count = gpus or (task_gpus if task_gpus > 1 else here[1] if on_this else 1)
    if not ram_gb and on_this:
        ram_gb = psutil.virtual_memory().total / 2**30
    return Machine(gpu, count, here[2] if on_this else GPU_GB[gpu], round(ram_gb, 1),
                   on_this and count <= here[1])


def this_gpu() -> tuple[str, int, float] | None:
    """(class, count, GiB) of this machine's GPUs, None without one of a known class."""
    import torch

    if not torch.cuda.is_available():
        return None
    gpu = gpu_class(torch.cuda.get_device_name(0))
    return None if gpu is None else (gpu, torch.cuda.device_count(),
                                     round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1))


def variants(cfg: RunConfig, m: Machine) -> list[RunConfig]:
    """Every variant of cfg's task worth trying on m that RunConfig accepts: training kind x DeepSpeed stage and
    offload x loop x micro-batch (batch_size x grad_accum x GPUs kept at cfg's samples a step)."""
    half = "fp32" if cfg.dtype == "fp32" else "bf16" if m.gpu in BF16 else "fp16"
    step = cfg.samples_per_step(cfg.num_gpus)
    out = []
    for (training, weights) in KINDS:
        if weights == "fp8" and (m.gpu not in FP8_GPUS or half != "bf16"):
            continue
        for strategy, opt, param in STRATEGIES:
            for compiled in (False, True):
                for batch in micro_batches(cfg, step, m.count):
                    fields = dict(quantization=weights, lora_r=(cfg.lora_r or 16) if training == "LoRA" else 0,
                                  # cfg's own fp8 accumulation and head for fp8 rows; the others the defaults
                                  fp8_fast_accum=cfg.fp8_fast_accum if weights == "fp8" else "both",
                                  fp8_head=cfg.fp8_head if weights == "fp8" else True,
                                  dtype=half, strategy=strategy, offload_optimizer=opt, offload_param=param,
                                  torch_compile=compiled,
                                  deepcompile=compiled and strategy == "zero3" and param == "none",
                                  num_gpus=m.count, batch_size=batch, grad_accum=step // (batch * m.count),
                                  padding=compiled_padding(cfg) if compiled else cfg.padding, run_name="")
                    try:
                        out.append(cfg.replace(**fields))
                    except ConfigError:  # a combination dsnb refuses (8-bit under ZeRO-3, compiled 8-bit, ...)
                        continue
    return out


def micro_batches(cfg: RunConfig, step: int, gpus: int) -> list[int]:
    """Micro-batch sizes that keep `step` samples a step on `gpus` GPUs: powers of two dividing it (filled or packed
    rows: cfg's own)."""
    if cfg.padding in ("filled", "packed") or step % gpus:
        return [cfg.batch_size] if step % (cfg.batch_size * gpus) == 0 else []
    per_gpu = step // gpus
    return [b for b in (2**i for i in range(int(math.log2(per_gpu)) + 1)) if per_gpu % b == 0]


def compiled_padding(cfg: RunConfig) -> str:
    """The compiled loop needs fixed shapes: per-batch padding becomes per-batch rounded to 64 tokens (bucket)."""
    return "bucket" if cfg.padding == "longest" else cfg.padding


def task_data(cfg: RunConfig):
    """(model config, the tokenized training set's attention masks, each sample's real tokens): read once for every
    variant (they share the task's data, prompt and max_length)."""
    config = model_config(cfg.model)
    samples = build_dataset(cfg, load_tokenizer(cfg), load_records(cfg))
    masks = {"attention_mask": samples["attention_mask"]}
    return config, masks, [sum(m) for m in masks["attention_mask"]]


def predict(cfg: RunConfig, m: Machine, config, masks: dict, lengths: list[int]) -> dict:
    """One variant's predicted peaks (GB), time and whether it fits m."""
    trainable = trainable_params(cfg, config)
    est = estimate_memory(cfg, config, trainable, tokens_per_micro_batch(cfg, masks), m.count,
                          row_length(cfg, masks))
    when = time_estimate(cfg, lengths, config, trainable, m.count, m.gpu, len(lengths))
    seconds, rough = when["seconds"], list(when["rough"])
    if m.count > 1 and m.link == "PCIe":  # the time model's link is NVLink's: the gradients' traffic over PCIe instead
        from .timing import RATES, step_parts  # deferred: only a multi-GPU PCIe machine needs them

        between = step_parts(cfg, config, trainable, when["micro_batch_tokens"], m.count, m.gpu)["between GPUs"]
        seconds += when["steps"] * between * (RATES["link_gb_s"] / PCIE_GB_S - 1)
        rough.append(f"two {m.gpu}s over PCIe: the link's {PCIE_GB_S:g} GB/s is assumed")
    if cfg.loss_chunk and cfg.dtype == "fp16":
        rough.append("the loss chunked in fp16 makes each chunk's logits twice, which the time leaves out (one "
                     "compiled pair of one chunk measured: the same speed)")
    gpu_gb, host_gb = est["est_peak_gpu_mb"] * MB / 2**30, est["est_peak_host_mb"] * MB / 2**30 * m.count
    fits, why = judge(cfg, m, gpu_gb, host_gb)
    return {"fits": fits, "why": why, "seconds": seconds, "time": minutes(seconds), "step_s": when["step_seconds"],
            "verify_s": when["load_seconds"] + when["compile_seconds"] + VERIFY_STEPS * when["step_seconds"],
            "gpu_gb": round(gpu_gb, 1), "host_gb": round(host_gb, 1), "rough": "; ".join(rough),
            "rests_on": when["source"]}


def chunked_instead(cfg: RunConfig, row: dict, config) -> RunConfig | None:
    """The variant with its loss chunked (loss_chunk, LOSS_CHUNK tokens) where its whole logits are what keeps it off
    the GPU: it does not fit there, and RunConfig and the model's head allow chunking. Its time is the same (the
    H100's pairs within 0.5%, chunkloss_h100.md); in fp16 each chunk's logits are made twice (rough says so)."""
    from .loss import PLAIN_HEADS  # deferred: it loads torch at import

    if cfg.loss_chunk or row["fits"] != "no" or not row["why"].startswith("GPU") or \
            getattr(config, "model_type", "") not in PLAIN_HEADS:
        return None
    try:
        return cfg.replace(loss_chunk=LOSS_CHUNK)
    except ConfigError:  # ZeRO-3, or a LoRA adapter on lm_head
        return None


def judge(cfg: RunConfig, m: Machine, gpu_gb: float, host_gb: float) -> tuple[str, str]:
    """fits | tight | no, and why: the GPU estimate with FIT_MARGIN and what CUDA takes outside the allocator
    against the GPU, the estimate alone against memory_budget_gb's cap; all processes' host RAM against the host's."""
    room = m.gpu_gb - OUTSIDE_GB
    cap = min(room, cfg.memory_budget_gb or room)
    if m.ram_gb and host_gb > m.ram_gb:
        return "no", f"host RAM: needs {host_gb:.1f} GB of {m.ram_gb:g}"
    if gpu_gb > cap:
        return "no", f"GPU: needs {gpu_gb:.1f} GB of {cap:.1f}"
    if gpu_gb * (1 + FIT_MARGIN) > cap:
        return "tight", f"GPU: {gpu_gb:.1f} GB of {cap:.1f}, within the estimate's {FIT_MARGIN:.0%} margin"
    return "fits", ""


def describe(cfg: RunConfig) -> dict:
    """A variant in words, column by column."""
    stage = {"baseline": "none", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3"}[cfg.strategy]
    offload = [f"{what} {where}" for what, where in (("optimizer", cfg.offload_optimizer),
                                                     ("params", cfg.offload_param)) if where != "none"]
    loop = "compiled" + (" (DeepCompile)" if cfg.deepcompile else "") if cfg.torch_compile else "Trainer"
    loop += f", loss in chunks of {cfg.loss_chunk}" if cfg.loss_chunk else ""
    return {"training": f"LoRA r{cfg.lora_r}" if cfg.lora_r else "full",
            "weights": {"none": cfg.dtype, "8bit": "8-bit", "4bit": "4-bit", "fp8": "fp8"}[cfg.quantization],
            "deepspeed": stage + (" + " + ", ".join(offload) + " offload" if offload else ""), "loop": loop,
            "batch": f"{cfg.batch_size} x {cfg.grad_accum}" + (f" x {cfg.num_gpus} GPUs" if cfg.num_gpus > 1 else "")}


def command(cfg: RunConfig) -> str:
    """The `python -m dsnb run` line of a variant: its preset and every field that differs from the defaults under
    it (names and budgets that only label or cap a run stay as the task set them)."""
    base = RunConfig.layered({"preset": cfg.preset}).to_dict()
    changed = {k: v for k, v in cfg.to_dict().items() if v != base[k] and k != "preset"}
    flags = [f"--preset {cfg.preset}"] if cfg.preset else []
    flags += [f"--{k} {shlex.quote(str(v).lower() if isinstance(v, bool) else str(v))}" for k, v in changed.items()]
    return " ".join(["python -m dsnb run", *flags])


def advise(cfg: RunConfig, gpu: str = "", gpus: int = 0, ram_gb: float = 0.0, verify: int = 0,
           progress: bool = True, report=None):
    """Every variant of cfg's task worth trying on the machine (gpu, gpus, ram_gb: see machine(); ram_gb defaults to
    cfg's ram_budget_gb), ranked: those that fit first, by predicted time for the whole run; then tight, then those
    that do not fit. With verify K, the top K that fit run here for a few steps each and their measurements join the
    table (report: see measure). Returns a pandas DataFrame (COLUMNS, and measured_* with verify); its attrs hold the
    machine and the configs, by rank."""
    import pandas as pd

    m = machine(gpu, gpus, ram_gb or cfg.ram_budget_gb, cfg.num_gpus)
    if verify:
        check_verify(m, verify)
    cfgs = variants(cfg, m)
    if not cfgs:
        step = cfg.samples_per_step(cfg.num_gpus)
        raise ConfigError(f"the task takes {step} samples (or rows) a step, which {m.count} GPUs cannot share evenly "
                          f"with batch_size {cfg.batch_size}; make batch_size x grad_accum x num_gpus a multiple of "
                          f"{m.count}, or advise for fewer GPUs (--gpus)")
    config, masks, lengths = task_data(cfg)
    rows, offered = [], []

    def offer(one: RunConfig, row: dict) -> None:
        offered.append(one)
        rows.append({**row, **describe(one), "command": command(one)})

    for variant in cfgs:
        offer(variant, predict(variant, m, config, masks, lengths))
        chunked = chunked_instead(variant, rows[-1], config)
        row = chunked and predict(chunked, m, config, masks, lengths)
        if row and row["fits"] != "no":
            offer(chunked, row)
    # equal times: the one whose time is measured (not rough) first, since fp8's rests on few runs
    order = sorted(worth_trying(rows), key=lambda i: (FITS.index(rows[i]["fits"]), rows[i]["seconds"],
                                                      bool(rows[i]["rough"])))
    table = pd.DataFrame([{**rows[i], "rank": r + 1} for r, i in enumerate(order)],
                         columns=[*COLUMNS, "seconds", "verify_s"])
    table.attrs.update(machine=m, configs=[offered[i] for i in order], samples=len(lengths))
    if verify:
        table = measure(table, verify, progress, report)
    return table


def worth_trying(rows: list[dict]) -> list[int]:
    """The rows no other row of the same training kind (LoRA or full) beats: one that fits as well, in no more time,
    with no more than SAME_MEMORY more GPU memory and host RAM (closer than the estimate can tell them apart). Of
    equals the first is kept: the simpler DeepSpeed setup, the smaller micro-batch. fp8 rows only beat fp8 rows: their
    time rests on few runs (timing.rough_reasons), so they hide no path measured more."""
    def beats(j: int, i: int) -> bool:
        a, b = rows[j], rows[i]
        return a["training"] == b["training"] and (a["weights"] == "fp8") == (b["weights"] == "fp8") and \
            FITS.index(a["fits"]) <= FITS.index(b["fits"]) and \
            a["seconds"] <= b["seconds"] and all(a[k] <= b[k] * (1 + SAME_MEMORY) for k in ("gpu_gb", "host_gb"))

    kept: list[int] = []
    for i in sorted(range(len(rows)), key=lambda i: (rows[i]["seconds"], rows[i]["gpu_gb"], rows[i]["host_gb"])):
        if not any(beats(j, i) for j in kept):
            kept.append(i)
    return kept


def check_verify(m: Machine, k: int) -> None:
    """--verify measures on this machine's GPUs: refused on a CPU, or where the advice is for another machine."""
    if k < 0:
        raise ConfigError(f"--verify is {k}; give how many of the top variants to run (or 0)")
    if this_gpu() is None:
        raise ConfigError("--verify runs the top variants on this machine's GPU for a few steps, and this machine has "
                          "none (on the CPU the GPU memory and speed it would check cannot be measured); drop "
                          "--verify, or run it on the GPU the advice is for")
    if not m.here:
        raise ConfigError(f"--verify measures this machine's GPUs, but the advice is for {m.count} x {m.gpu}; advise "
                          "for this machine (no --gpu, --gpus at most its count) or drop --verify")


def measure(table, k: int, progress: bool = True, report=None):
    """The top k variants that fit, each run for VERIFY_STEPS steps in its own process, one after another: measured
    GPU peak, seconds a step and the run's seconds beside the predicted ones. report(line), where given, gets each
    variant's line as soon as its run ends, so a verify cut short (a session's limit) still says what it measured.
    Run again, a variant whose run on this machine ended (compare.reuse) is kept, not measured again."""
    top = table[table["fits"] == "fits"].head(k)
    table, here = table.copy(), table.attrs["machine"].describe()
    for i, rank in zip(top.index, top["rank"], strict=True):
        cfg = table.attrs["configs"][rank - 1].replace(
            max_steps=VERIFY_STEPS, untimed_steps=VERIFY_UNTIMED, eval_samples=0, save_model=False,
            checkpoint_minutes=0, experiment="dsnb_advise", run_name=f"advise_{rank}")
        run = newest_run(cfg, {"advise_machine": here})  # this machine's: another's measures another machine
        kept, resume = reuse(cfg, run, progress, cfg.name)
        try:
            result = kept or run_all([cfg], progress=progress, tags=[{"advise_machine": here}], resumes=[resume])[0]
        except ConfigError as e:  # refused by the pre-run check (host RAM free now, an NVMe path): said, and the next
            table.loc[i, "measured_status"] = f"not run: {e}"  # variant measured
            if report:
                report(verified(table.loc[i]))
            continue
        metrics = result.metrics
        table.loc[i, "measured_status"] = result.status
        table.loc[i, "measured_gpu_gb"] = metrics.get("peak_gpu_allocated_mb", math.nan) / 1024
        table.loc[i, "measured_step_s"] = metrics.get("step_time_ms", math.nan) / 1000
        info = mlflow_client(cfg.tracking_uri).get_run(result.run_id).info  # the record, start to end: the same
        # seconds for a run kept from an earlier verify as for one run now
        table.loc[i, "measured_run_s"] = (info.end_time - info.start_time) / 1000 if info.end_time else math.nan
        table.loc[i, "run_id"] = result.run_id
        if report:
            report(verified(table.loc[i]))
    return table


def verified(row) -> str:
    """One verified variant: measured against predicted, with the error of each (measured / predicted - 1). A run that
    did not finish is no measurement of the variant: what it reached is said, with no error against a whole run."""
    name = f"verify {row['rank']}. {row['training']} {row['weights']}, {row['deepspeed']}, {row['loop']} {row['batch']}"
    if str(row["measured_status"]).startswith("not run"):
        return f"{name}: {row['measured_status']}"
    if row["measured_status"] != "FINISHED":
        peak = row["measured_gpu_gb"]
        return (f"{name}: {row['measured_status']} after {cell(row['measured_run_s'], '{:.0f}')} s, before a full "
                f"measurement; GPU peak so far {cell(peak, '{:.1f}')} GB ({row['gpu_gb']:g} predicted); see run "
                f"{row['run_id']}")

    def pair(measured, predicted, form: str) -> str:
        if measured != measured:  # NaN: not measured (no GPU here)
            return f"not measured, {form.format(predicted)} predicted"
        error = f" ({measured / predicted - 1:+.1%})" if predicted else ""
        return f"{form.format(measured)} measured, {form.format(predicted)} predicted{error}"

    return (f"{name}: FINISHED; s/step {pair(row['measured_step_s'], row['step_s'], '{:.3g}')}; "
            f"GPU peak GB {pair(row['measured_gpu_gb'], row['gpu_gb'], '{:.2f}')}; the run's seconds (its record, "
            f"start to end: loading, compiling, {VERIFY_STEPS} steps) "
            f"{pair(row['measured_run_s'], row['verify_s'], '{:.0f}')}")


def text(table, cfg: RunConfig, top: int = 20) -> str:
    """The table for a terminal: what is advised and on what it rests, the top rows, their commands."""
    m, shown = table.attrs["machine"], table.head(top)
    lines = [f"advise: {cfg.model} on {m.describe()}; {table.attrs['samples']} samples, "
             f"{cfg.samples_per_step(cfg.num_gpus)} a step; {len(table)} variants, "
             f"{sum(table['fits'] == 'fits')} fit" + (f", memory_budget_gb {cfg.memory_budget_gb:g}"
                                                      if cfg.memory_budget_gb else ""),
             f"GPU estimate: dsnb/estimate.py, {estimate.error_text()} "
             f"(benchmarks/results/advise_vs_measured_h200.md); host RAM {estimate.error_text(estimate.HOST_ERROR)}; "
             f"'fits' keeps {FIT_MARGIN:.0%} above it and {OUTSIDE_GB:g} GB for CUDA outside PyTorch's allocator",
             f"time: dsnb/timing.py's rates; {timing.error_text()} (benchmarks/results/time_vs_measured_h200.md)",
             ""]
    measured = "measured_step_s" in shown
    head = ["#", "fits", "time", "s/step", "GPU GB", "host GB", "training", "weights", "DeepSpeed", "loop", "batch"]
    head += ["measured s/step", "measured GPU GB", f"run s ({VERIFY_STEPS} steps): predicted, measured"] \
        if measured else []
    cells = [[str(r["rank"]), r["fits"], r["time"] + ("*" if r["rough"] else ""), f"{r['step_s']:.3g}",
              f"{r['gpu_gb']:g}", f"{r['host_gb']:g}", r["training"], r["weights"], r["deepspeed"], r["loop"],
              r["batch"]] + ([cell(r.get("measured_step_s"), "{:.3g}"), cell(r.get("measured_gpu_gb"), "{:.1f}"),
                              f"{r['verify_s']:.0f}, " + (cell(r.get("measured_run_s"), "{:.0f}")
                                                           if r.get("measured_status") == "FINISHED"
                                                           else r.get("measured_status"))
                              if r.get("measured_status") == r.get("measured_status") else "-"]
                             if measured else []) for _, r in shown.iterrows()]
    widths = [max(len(x) for x in col) for col in zip(head, *cells, strict=True)]
    lines += ["  ".join(x.ljust(w) for x, w in zip(row, widths, strict=True)).rstrip() for row in [head, *cells]]
    lines += ["", "Time rests on: " + "; ".join(dict.fromkeys(shown["rests_on"]))]
    lines += ["", "* rough: " + "; ".join(dict.fromkeys(
        part for r in shown["rough"] if r for part in r.split("; ")))] if any(shown["rough"]) else []
    lines += ["", "Why not:"] + [f"  {r['rank']}. {r['why']}" for _, r in shown.iterrows() if r["why"]] \
        if any(shown["why"]) else []
    lines += ["", "Commands:"] + [f"  {r['rank']}. {r['command']}" for _, r in shown.iterrows()]
    if len(table) > top:
        lines.append(f"({len(table) - top} more variants not shown: --top {len(table)} shows every one)")
    return "\n".join(lines)


def cell(value, form: str) -> str:
    return "-" if value is None or value != value else form.format(value)

