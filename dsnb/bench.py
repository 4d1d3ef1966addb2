"""The benchmark: the tutorial's recipe against dsnb's fast recipe, each variant in its own process, repeated.

    python -m dsnb bench                         # on a GPU: writes bench_results/<gpu>.json and .md (--out)
    python -m dsnb bench --gpus 2                # two variants at a time, one per GPU (same GPU model)
    python -m dsnb bench --offline --repeats 2   # the same on the CPU with synthetic:tiny

Every variant uses the tutorial's LoRA settings, learning rate, seed, data and effective batch of 8 (the
throughput mode excepted), and runs untimed steps before the timed ones (the compiled variants compile
in the first and record their CUDA graphs in the second). Ratios are to the tutorial's recipe measured
in the same invocation; absolute times on a shared machine are noise.
"""
from __future__ import annotations

import json
import os
import statistics
import sys

from . import preflight
from .config import OFFLINE, ConfigError, RunConfig
from .launch import run_all
from .tracking import RunResult

# dsnb's fast recipe: bf16 weights instead of 8-bit, each batch padded only to its longest sample, and
# one micro-batch of 8 instead of 2 x 4 accumulation (same effective batch, a quarter of the steps).
FAST = dict(quantization="none", dtype="bf16", padding="longest", batch_size=8, grad_accum=1)
FULL = dict(FAST, lora_r=0)
# ... then dsnb's compiled loop instead of the Trainer's step: one fixed shape (8 x 64 tokens), CUDA graphs.
COMPILED = dict(FAST, padding="bucket", torch_compile=True)
VARIANTS = {
    "tutorial": {},
    "tutorial_zero2_offload": dict(strategy="zero2", offload_optimizer="cpu"),
    "fast": FAST,
    "fast_zero2": dict(FAST, strategy="zero2"),
    "fast_compiled": COMPILED,
    # DeepSpeed in dsnb's compiled loop: what ZeRO costs once the step is no longer the Trainer's.
    "fast_zero2_compiled": dict(COMPILED, strategy="zero2"),
    "fast_zero3_compiled": dict(COMPILED, strategy="zero3"),
    # Full fine-tuning (every weight trained), where DeepSpeed's partitioning pays off.
    "full": FULL,
    "full_compiled": dict(FULL, padding="bucket", torch_compile=True),
    "full_zero2_compiled": dict(FULL, padding="bucket", torch_compile=True, strategy="zero2"),
    "full_zero3_compiled": dict(FULL, padding="bucket", torch_compile=True, strategy="zero3"),
    # Full fine-tuning of the 3B shape in a T4's 15 GB: parameters and optimizer states in CPU RAM, a larger
    # micro-batch so each fetch of the weights over PCIe serves more samples.
    "full_zero3_offload_15gb": dict(FULL, padding="bucket", torch_compile=True, strategy="zero3", batch_size=32,
                                    offload_optimizer="cpu", offload_param="cpu", memory_budget_gb=15),
    # The throughput mode: 24 rows of 512 tokens a step, filled before training with as many samples as fit (about
    # 272 of the synthetic set's), whose attention skips the blocks where no sample meets another (flex; on the CPU,
    # which has no flex backward, SDPA); 6,000 samples make 529 rows, 22 full batches: every step the bench times.
    "throughput_compiled": dict(COMPILED, padding="filled", attention="flex", batch_size=24, num_samples=6000),
}
OFFLINE_MAX_BATCH = 16  # the offline set has 64 samples
OFFLINE_ROWS = 5  # ... which fill 25 rows of 128 tokens: 5 full batches of filled rows
GPU_BASE = dict(model="synthetic:llama-3.2-3b", dataset="synthetic", num_samples=1000)


def bench_configs(offline: bool, untimed: int, steps: int, tracking_uri: str) -> dict[str, RunConfig]:
    common = dict(untimed_steps=untimed, max_steps=untimed + steps, logging_steps=1, save_model=False, eval_samples=0,
                  experiment="dsnb_bench", tracking_uri=tracking_uri)
    cfgs = {}
    for name, changes in VARIANTS.items():
        # Offline, on the CPU: fp32 (fp16 needs a GPU, bf16 is emulated) and the offline set's 64 samples.
        cpu = dict(dtype="fp32", num_samples=OFFLINE["num_samples"], memory_budget_gb=0, attention="sdpa",
                   batch_size=OFFLINE_ROWS if changes.get("padding") == "filled" else
                   min(changes.get("batch_size", RunConfig.batch_size), OFFLINE_MAX_BATCH))
        cfgs[name] = RunConfig.layered({} if offline else GPU_BASE, common, changes, cpu if offline else {},
                                       {"run_name": name}, offline=offline)
    return cfgs


def summarize(name: str, results: list[dict]) -> dict:
    """Median and spread over the repeats that finished."""
    ok = [r.metrics for r in results if r.status == "FINISHED"]
    row = {"name": name, "repeats": len(results), "finished": len(ok)}
    for key, metric in (("samples_per_second", "samples_per_second"), ("tokens_per_second", "tokens_per_second"),
                        ("mfu", "mfu"), ("peak_gpu_allocated_mb", "peak_gpu_allocated_mb"),
                        ("peak_gpu_nvml_mb", "peak_gpu_nvml_mb"), ("peak_cpu_rss_mb", "peak_cpu_rss_mb"),
                        ("final_loss", "loss"), ("step_time_ms", "step_time_ms")):
        values = [m[metric] for m in ok if metric in m]
        row[key] = statistics.median(values) if values else None
        if key in ("samples_per_second", "step_time_ms") and values:
            row[f"{key}_min"], row[f"{key}_max"] = min(values), max(values)
    row["wall_seconds"] = statistics.median(r.wall_seconds for r in results) if results else None
    return row


def regressions(result: dict, baseline: dict, slack: float = 0.5, pair_seconds: float = 300) -> list[str]:
    """What got worse than a committed bench result: failed runs, a speed-up to the tutorial's recipe
    below `slack` times the committed one, or the offline tutorial pair taking over `pair_seconds`."""
    problems, committed = [], {v["name"]: v for v in baseline["variants"]}
    for row in result["variants"]:
        name, ref = row["name"], committed.get(row["name"], {})
        if row["finished"] < row["repeats"]:
            problems.append(f"{name}: {row['finished']}/{row['repeats']} runs finished")
        if ref.get("ratio_to_tutorial") and (row["ratio_to_tutorial"] or 0) < slack * ref["ratio_to_tutorial"]:
            problems.append(f"{name}: {row['ratio_to_tutorial'] or 0:.2f}x the tutorial's recipe, "
                            f"committed {ref['ratio_to_tutorial']:.2f}x")
    pair = [r["wall_seconds"] for r in result["variants"] if r["name"] in ("tutorial", "tutorial_zero2_offload")]
    if len(pair) == 2 and sum(pair) > pair_seconds:
        problems.append(f"the tutorial pair took {sum(pair):.0f} s (each run's process, start to end); "
                        f"it must stay under {pair_seconds:.0f} s")
    return problems


def run_bench(offline: bool = False, repeats: int = 3, untimed: int = 3, steps: int = 10, only: list[str] | None = None,
              out_dir: str = "benchmarks/results", tracking_uri: str = "sqlite:///mlflow.db", gpus: int = 1) -> dict:
    """Run every variant `repeats` times, interleaved, `gpus` at a time (each run on a GPU of its own)."""
    cfgs = bench_configs(offline, untimed, steps, tracking_uri)
    names = only or list(cfgs)
    device = preflight.pick_device()
    gpu = "cpu"
    if device.startswith("cuda"):
        import torch

        gpu = torch.cuda.get_device_name(device)
    stem = os.path.join(out_dir, gpu.replace(" ", "_").lower())
    taken = [p for p in (stem + ".json", stem + ".md") if os.path.exists(p)]
    if taken:  # a committed result that --baseline compares against must never be overwritten by a new run
        raise ConfigError(f"{taken[0]} exists; move it or give --out another folder")
    # Interleaved, so drift on a shared machine hits every variant alike.
    jobs = [(repeat, name) for repeat in range(repeats) for name in names]
    results = run_all([cfgs[name] for _, name in jobs], progress=True, gpus=gpus,
                      tags=[{"bench_repeat": repeat} for repeat, _ in jobs])
    runs: dict[str, list[RunResult]] = {n: [] for n in names}
    for (_, name), result in zip(jobs, results, strict=True):
        runs[name].append(result)
    rows = [summarize(n, runs[n]) for n in names]
    base = next((r for r in rows if r["name"] == "tutorial"), None)
    for row in rows:
        ok = base and base["samples_per_second"] and row["samples_per_second"]
        row["ratio_to_tutorial"] = row["samples_per_second"] / base["samples_per_second"] if ok else None
    command = "python -m dsnb bench " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["bench"] else "python -m dsnb bench"
    result = {"gpu": gpu, "command": command, "untimed_steps": untimed, "timed_steps": steps, "gpus_side_by_side": gpus,
              "mfu_convention": "model FLOPs per real token (6N full, 4N + 6N_trainable LoRA; N = matmul weights) "
                                "/ dense bf16 datasheet peak",
              "variants": rows}
    os.makedirs(out_dir, exist_ok=True)
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=2)
    with open(stem + ".md", "w") as f:
        f.write(markdown(result))
    return result


def markdown(result: dict) -> str:
    def num(value, fmt):
        return "" if value is None else format(value, fmt)

    lines = [f"# dsnb bench on {result['gpu']}", "", f"    {result['command']}", "",
             f"{result['untimed_steps']} untimed steps, then {result['timed_steps']} timed optimizer steps; each "
             "variant in its own process" + (f", {result['gpus_side_by_side']} at a time on GPUs of their own"
                                            if result.get("gpus_side_by_side", 1) > 1 else "")
             + "; medians over the repeats (min-max in brackets).", "",
             "| variant | samples/s | real tokens/s | MFU | step ms | peak alloc MB | peak NVML MB | final loss | "
             "vs tutorial | runs ok |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["variants"]:
        spread = (f" [{num(r.get('samples_per_second_min'), '.3g')}-{num(r.get('samples_per_second_max'), '.3g')}]"
                  if r.get("samples_per_second_min") is not None else "")
        ratio = "-" if r.get("ratio_to_tutorial") is None else f"{r['ratio_to_tutorial']:.1f}x"
        lines.append(f"| {r['name']} | {num(r['samples_per_second'], '.3g')}{spread} | "
                     f"{num(r['tokens_per_second'], ',.0f')} | {num(r['mfu'] and 100 * r['mfu'], '.2f')}% | "
                     f"{num(r['step_time_ms'], '.0f')} | {num(r['peak_gpu_allocated_mb'], ',.0f')} | "
                     f"{num(r['peak_gpu_nvml_mb'], ',.0f')} | {num(r['final_loss'], '.3f')} | "
                     f"{ratio} | {r['finished']}/{r['repeats']} |")
    lines += ["", f"MFU: {result['mfu_convention']}.", ""]
    return "\n".join(lines)
