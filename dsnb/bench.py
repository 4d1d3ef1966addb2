"""The benchmark: the tutorial's recipe against dsnb's fast recipe, each variant in its own process, repeated.

    python -m dsnb bench                         # on a GPU: writes bench_results/<gpu>.json and .md (--out)
    python -m dsnb bench --gpus 2                # two variants at a time, one per GPU (same GPU model)
    python -m dsnb bench --offline --repeats 2   # the same on the CPU with synthetic:tiny

Every variant uses the tutorial's LoRA settings, learning rate, seed, data and effective batch of 8 (the
throughput mode excepted), and runs untimed steps before the timed ones (the compiled variants compile
in the first and record their CUDA graphs in the second). Ratios are to the tutorial's recipe measured
in the same invocation; absolute times on a shared machine are noise. A bench stopped part way and run again on
the same machine keeps the runs it had finished and runs the rest, and says so beside its table.
"""
from __future__ import annotations

import json
import os
import statistics
import sys

from . import preflight, tracking
from .config import OFFLINE, ConfigError, RunConfig, read_variants, redact
from .compare import continue_jobs, mark_written
from .tracking import RunResult

# The bench's variants and the fields they share: a YAML file like the other variant sets, shipped in the package
# (as the presets are) so an installed dsnb benches too; -f names another.
BENCH_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench.yaml")
OFFLINE_MAX_BATCH = 16  # the offline set has 64 samples
OFFLINE_ROWS = 5  # ... which fill 25 rows of 128 tokens: 5 full batches of filled rows
BASELINE_NUMBERS = ("ratio_to_tutorial", "samples_per_second", "tokens_per_second")  # what regressions reads of a
# baseline's rows (each a number or null)


def bench_variants(path: str = BENCH_FILE) -> tuple[dict, dict[str, dict]]:
    """(the fields every bench variant shares on a GPU, {name: its own fields}) from the bench's variants file."""
    return read_variants(path)[:2]


def bench_configs(offline: bool, untimed: int, steps: int, tracking_uri: str, path: str = BENCH_FILE
                  ) -> dict[str, RunConfig]:
    common = dict(untimed_steps=untimed, max_steps=untimed + steps, logging_steps=1, save_model=False, eval_samples=0,
                  experiment="dsnb_bench", tracking_uri=tracking_uri)
    base, variants = bench_variants(path)
    cfgs = {}
    for name, changes in variants.items():
        # Offline, on the CPU: fp32 (fp16 needs a GPU, bf16 is emulated; fp8 weights keep bf16, theirs, and are
        # listed as not run there) and the offline set's 64 samples and rows.
        cpu = dict(dtype="bf16" if changes.get("quantization") == "fp8" else "fp32",
                   num_samples=OFFLINE["num_samples"], max_length=OFFLINE["max_length"],
                   memory_budget_gb=0, attention="sdpa",
                   batch_size=OFFLINE_ROWS if changes.get("padding") == "filled" else
                   min(changes.get("batch_size", RunConfig.batch_size), OFFLINE_MAX_BATCH))
        cfgs[name] = RunConfig.layered({} if offline else base, common, changes, cpu if offline else {},
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
    walls = [r.wall_seconds for r in results if r.wall_seconds is not None]
    row["wall_seconds"] = statistics.median(walls) if walls else None
    return row


def regressions(result: dict, baseline: dict, slack: float = 0.5, pair_seconds: float = 300) -> list[str]:
    """What got worse than a committed bench result: failed runs, a speed-up to the tutorial's recipe
    below `slack` times the committed one, or the offline tutorial pair taking over `pair_seconds`."""
    problems, committed = [], {v["name"]: v for v in baseline["variants"]}
    mine = {v["name"]: v for v in result["variants"]}
    for row in result["variants"]:
        name, ref = row["name"], committed.get(row["name"], {})
        if row.get("not_run"):
            if ref.get("finished"):
                problems.append(f"{name}: not run on this machine, so not compared ({row['not_run']})")
            continue
        if row["finished"] < row["repeats"]:
            problems.append(f"{name}: {row['finished']}/{row['repeats']} runs finished")
        # this variant's samples, then the tutorial's (the ratios' reference), against the baseline's
        moved = [(n, why) for n in dict.fromkeys((name, "tutorial"))
                 if (why := other_work(mine.get(n, {}), committed.get(n, {})))]
        if moved and ref.get("ratio_to_tutorial"):  # a ratio to other work says nothing of a regression
            (which, why), *_ = moved
            whose = "" if which == name else f" for {which}, the ratios' reference"
            problems.append(f"{name}: not compared: {why}{whose}; make a new baseline from this commit")
        elif ref.get("ratio_to_tutorial") and (row["ratio_to_tutorial"] or 0) < slack * ref["ratio_to_tutorial"]:
            problems.append(f"{name}: {row['ratio_to_tutorial'] or 0:.2f}x the tutorial's recipe, "
                            f"committed {ref['ratio_to_tutorial']:.2f}x")
    pair = [r["wall_seconds"] for r in result["variants"]
            if r["name"] in ("tutorial", "tutorial_zero2_offload") and r.get("wall_seconds") is not None]
    if len(pair) == 2 and sum(pair) > pair_seconds:
        problems.append(f"the tutorial pair took {sum(pair):.0f} s (each run's process, start to end); "
                        f"it must stay under {pair_seconds:.0f} s")
    return problems


def other_work(row: dict, ref: dict, tolerance: float = 0.02) -> str:
    """Why a bench row and its baseline's trained different samples (real tokens a sample, from tokens/s over
    samples/s, apart by more than tolerance: another prompt, data or max_length), or ""."""
    def per_sample(r):
        return (r.get("tokens_per_second") or 0) / r["samples_per_second"] if r.get("samples_per_second") else None

    a, b = per_sample(row), per_sample(ref)
    if a and b and abs(a - b) > tolerance * b:
        return f"{a:.1f} real tokens a sample against the baseline's {b:.1f}"
    return ""


def run_bench(offline: bool = False, repeats: int = 3, untimed: int = 3, steps: int = 10, only: list[str] | None = None,
              out_dir: str = "benchmarks/results", tracking_uri: str = "sqlite:///mlflow.db", gpus: int = 1,
              path: str = BENCH_FILE) -> dict:
    """Run every variant of the bench's file (or those in only) `repeats` times, interleaved, `gpus` at a time (each
    run on a GPU of its own); one bench at a time on a store (a second waits: two would time each other's load)."""
    with tracking.one_at_a_time(tracking_uri, "bench"):
        return _run_bench(offline, repeats, untimed, steps, only, out_dir, tracking_uri, gpus, path)


def _run_bench(offline: bool, repeats: int, untimed: int, steps: int, only: list[str] | None, out_dir: str,
               tracking_uri: str, gpus: int, path: str) -> dict:
    cfgs = bench_configs(offline, untimed, steps, tracking_uri, path)
    names = only or list(cfgs)
    device = preflight.pick_device()
    gpu = preflight.device_name(device)
    stem = os.path.join(out_dir, gpu.replace(" ", "_").lower())
    taken = [p for p in (stem + ".json", stem + ".md") if os.path.exists(p)]
    if taken:  # a committed result that --baseline compares against must never be overwritten by a new run
        raise ConfigError(f"{taken[0]} exists; move it or give --out another folder")
    # A variant this machine cannot run (fp8 weights without FP8 matmuls, a budget above its GPU) is listed with why,
    # not run; every other variant runs
    not_here = {}
    for name in names:
        try:
            preflight.check_device(cfgs[name], device)
        except ConfigError as e:
            not_here[name] = str(e)
    # Interleaved, so drift on a shared machine hits every variant alike.
    jobs = [(repeat, name) for repeat in range(repeats) for name in names if name not in not_here]
    results, continued = continue_jobs("bench", [(f"{repeat}/{name}", cfgs[name]) for repeat, name in jobs],
                                       preflight.this_machine(), gpus=gpus,
                                       tags=[{"bench_repeat": repeat} for repeat, _ in jobs])
    runs: dict[str, list[RunResult]] = {n: [] for n in names}
    for (_, name), result in zip(jobs, results, strict=True):
        runs[name].append(result)
    rows = [{**summarize(n, runs[n]), "quantization": cfgs[n].quantization,
             **({"not_run": not_here[n]} if n in not_here else {})} for n in names]
    base = next((r for r in rows if r["name"] == "tutorial"), None)
    for row in rows:
        ok = base and base["samples_per_second"] and row["samples_per_second"]
        row["ratio_to_tutorial"] = row["samples_per_second"] / base["samples_per_second"] if ok else None
    command = redact("python -m dsnb bench " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["bench"] else
                     "python -m dsnb bench")  # a --tracking_uri's credentials masked: the result is committed
    result = {"gpu": gpu, "command": command, "untimed_steps": untimed, "timed_steps": steps, "gpus_side_by_side": gpus,
              "mfu_convention": "model FLOPs per real token (6N full, 4N + 6N_trainable LoRA; N = matmul weights) "
                                "/ dense bf16 datasheet peak (the CPU: its nominal fp32 peak)",
              "variants": rows, **({"continued": continued} if continued else {})}
    os.makedirs(out_dir, exist_ok=True)  # each file whole, none over another's (a bench finished into --out meanwhile)
    written = [preflight.write_new(stem + ".md", markdown(result)),
               preflight.write_new(stem + ".json", json.dumps(result, indent=2))]
    if written != [stem + ".md", stem + ".json"]:
        print(f"{stem}.md or .json appeared while this bench ran; this one's result: {', '.join(written)}")
    mark_written("bench", results, written[1])
    return result


FP8_MARK = "†"  # beside an fp8 variant's MFU


def markdown(result: dict) -> str:
    def num(value, fmt, missing=""):
        return missing if value is None else format(value, fmt)

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
                     f"{num(r['tokens_per_second'], ',.0f')} | {num(r['mfu'] and 100 * r['mfu'], '.2f')}%"
                     f"{FP8_MARK if r.get('quantization') == 'fp8' else ''} | "
                     f"{num(r['step_time_ms'], '.0f')} | {num(r.get('peak_gpu_allocated_mb'), ',.0f', '-')} | "
                     f"{num(r.get('peak_gpu_nvml_mb'), ',.0f', '-')} | {num(r['final_loss'], '.3f')} | "
                     f"{ratio} | {r['finished']}/{r['repeats']} |")
    not_run = [f"Not run on this machine: {r['name']}: {r['not_run']}" for r in result["variants"] if r.get("not_run")]
    lines += ([""] + not_run if not_run else []) + ["", f"MFU: {result['mfu_convention']}.", ""]
    if result.get("continued"):  # measured in two invocations: the ratios mix them
        lines += [f"Continued: {result['continued']}; ratios mix the two invocations.", ""]
    if any(r.get("quantization") == "fp8" for r in result["variants"]):
        lines += [f"{FP8_MARK} fp8 weights: of bf16's peak too, so bf16-equivalent (fp8's own peak is twice bf16's).",
                  ""]
    return "\n".join(lines)
