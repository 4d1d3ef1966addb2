"""Read runs back from MLflow: side-by-side tables, plots, and which variant fits a GPU budget.

    runs = results                                   # RunResults from run_all / run_variant / sweeps, or:
    runs = find_runs(uri, experiment)                # the newest run of each name
    compare_table(runs)                              # metrics as rows, runs as columns, ratios to the first
    plot_runs(runs)                                  # memory, throughput, runtime, loss curves; PNG logged to each run
    savings_table(runs); best_for_budget(runs, 15)

Plots are drawn on matplotlib Figures of their own, so your pyplot backend and figures are left alone.
"""
from __future__ import annotations

import io

from .tracking import RunResult, mlflow_client, search

# The tutorial's metrics first, then the ones that measure what it meant to.
METRICS = ["gpu_memory_used_mb", "train_runtime_sec", "train_samples_per_second", "train_steps_per_second",
           "train_loss", "peak_gpu_allocated_mb", "peak_gpu_reserved_mb", "peak_gpu_nvml_mb", "peak_cpu_rss_mb",
           "samples_per_second", "tokens_per_second", "mfu", "eval_exact_match_before", "eval_exact_match", "eval_f1",
           "eval_tokens_per_second"]
SAME_WORK = ("model", "dataset", "num_samples", "max_length", "padding", "batch_size", "grad_accum", "max_steps",
             "epochs", "seed", "learning_rate")


def load_runs(runs: list[RunResult]) -> list:
    """The MLflow runs behind results, as the store holds them now."""
    return [mlflow_client(r.tracking_uri).get_run(r.run_id) for r in runs]


def find_runs(tracking_uri: str, experiment: str, statuses=("FINISHED", "FAILED")) -> list[RunResult]:
    """The newest run of each name in an experiment, oldest first."""
    client = mlflow_client(tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise ValueError(f"experiment {experiment!r} has no runs in {tracking_uri}; run a variant first")
    newest = {}
    for run in search(client, [exp.experiment_id], order_by=["attributes.start_time DESC"]):
        if run.info.status in statuses:
            newest.setdefault(run.info.run_name, run)
    return [RunResult(r.info.run_id, r.info.run_name, r.info.status, tracking_uri, dict(r.data.metrics))
            for r in sorted(newest.values(), key=lambda r: r.info.start_time)]


def _names(runs) -> list[str]:
    names = []
    for run in runs:
        name = run.info.run_name
        names.append(f"{name} ({run.info.run_id[:6]})" if name in names else name)
    return names


def grouped(loaded: list) -> dict[str, list]:
    """MLflow runs by run name (a variant's repeats share one), in the order the names first appear."""
    groups: dict[str, list] = {}
    for run in loaded:
        groups.setdefault(run.info.run_name, []).append(run)
    return groups


def summary(group: list, key: str) -> tuple[float, float, float] | None:
    """(median, min, max) of a metric over a variant's finished runs (all its runs if none finished)."""
    import statistics

    done = [r for r in group if r.info.status == "FINISHED"] or group
    values = [r.data.metrics[key] for r in done if key in r.data.metrics]
    return (statistics.median(values), min(values), max(values)) if values else None


def _number(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def compare_table(runs: list[RunResult]):
    """Metrics as rows, variants as columns (a variant's repeats pooled: median [min-max]), and each variant's
    ratio of medians to the first, marked where it is within the run-to-run spread."""
    import pandas as pd

    groups = grouped(load_runs(runs))
    columns = {}
    for name, group in groups.items():
        cells = ["/".join(sorted({r.info.status for r in group})), str(len(group))]
        for key in METRICS:
            s = summary(group, key)
            cells.append("" if s is None else _number(s[0]) + (f" [{_number(s[1])}-{_number(s[2])}]"
                                                                if len(group) > 1 and s[1] != s[2] else ""))
        columns[name] = cells
    names = list(groups)
    for name in names[1:]:
        cells = ["", ""]
        for key in METRICS:
            a, b = summary(groups[name], key), summary(groups[names[0]], key)
            cells.append(_ratio(a, b, min(len(groups[name]), len(groups[names[0]]))) if a and b and b[0] else "")
        columns[f"{name} / {names[0]}"] = cells
    return pd.DataFrame(columns, index=["status", "runs"] + METRICS)


def _ratio(a: tuple, b: tuple, runs: int) -> str:
    ratio = f"{a[0] / b[0]:.2f}x"
    if runs < 2:
        return ratio
    return ratio + (" (within spread)" if a[1] <= b[2] and b[1] <= a[2] else "")


def verdict(runs: list[RunResult]) -> str:
    """In words, for speed, memory and quality: each variant against the first, and whether the difference is
    larger than the run-to-run spread (the variants' ranges over their repeats do not overlap)."""
    groups = grouped(load_runs(runs))
    names = list(groups)
    lines = []
    on_gpu = any((summary(g, "peak_gpu_allocated_mb") or (0,))[0] for g in groups.values())
    memory = "peak_gpu_allocated_mb" if on_gpu else "peak_cpu_rss_mb"
    for name in names[1:]:
        for key, what in (("samples_per_second", "samples/s"), (memory, memory.replace("_", " ")),
                          ("eval_exact_match", "held-out exact match")):
            a, b = summary(groups[name], key), summary(groups[names[0]], key)
            if a is None or b is None:
                continue
            runs_each = min(len(groups[name]), len(groups[names[0]]))
            line = f"{what}: {name} {_number(a[0])} vs {names[0]} {_number(b[0])}"
            if b[0]:
                line += f" ({a[0] / b[0]:.2f}x)"
            if runs_each < 2:
                line += "; one run each, so no run-to-run spread was measured: repeat before reading it as a finding"
            elif a[1] <= b[2] and b[1] <= a[2]:
                line += (f"; medians of {runs_each} runs, and their ranges overlap: the difference is within the "
                         "run-to-run spread, not a finding")
            else:
                line += (f"; medians of {runs_each} runs, ranges {_number(a[1])}-{_number(a[2])} and "
                         f"{_number(b[1])}-{_number(b[2])}: larger than the run-to-run spread")
            lines.append(line)
    return "\n".join(lines)


def format_table(table) -> str:
    def fmt(value):
        if isinstance(value, float):
            return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
        return "" if value is None else str(value)

    return table.map(fmt).to_string()


def loss_curve(client, run_id: str) -> tuple[list[int], list[float]]:
    """(steps, losses) of a run's curve; a step written twice (a resumed run retrains the steps after its checkpoint)
    counts once, as its newest record."""
    newest = {m.step: m.value for m in sorted(client.get_metric_history(run_id, "loss"), key=lambda m: m.timestamp)}
    steps = sorted(newest)
    return steps, [newest[step] for step in steps]


def same_work(runs: list[RunResult], loss_tolerance: float = 0.05, quality_tolerance: float = 0.1) -> str:
    """Check the runs did the same work: same data, seed and steps, final losses within loss_tolerance (relative),
    and held-out exact match within quality_tolerance (absolute: about twice the binomial spread of 64
    questions at 0.8)."""
    client = mlflow_client(runs[0].tracking_uri)
    loaded = load_runs(runs)
    lines = []
    for key in SAME_WORK:
        values = {run.data.params.get(key) for run in loaded}
        lines.append(f"{key:>14}: {'same' if len(values) == 1 else 'DIFFERENT ' + str(sorted(map(str, values)))}")
    losses = [loss_curve(client, run.info.run_id)[1] for run in loaded]
    finals = [c[-1] for c in losses if c]
    lines.append(f"{'logged losses':>14}: {[len(c) for c in losses]} records")
    if finals:
        spread = max(finals) - min(finals)
        verdict = "agree" if spread <= loss_tolerance * max(abs(min(finals)), 1e-9) else "DIFFER"
        lines.append(f"{'final loss':>14}: {', '.join(f'{x:.2f}' for x in finals)} ({verdict} within "
                     f"{loss_tolerance:.0%})")
    scores = [run.data.metrics["eval_exact_match"] for run in loaded if "eval_exact_match" in run.data.metrics]
    if scores:
        verdict = "agree" if max(scores) - min(scores) <= quality_tolerance else "DIFFER"
        lines.append(f"{'exact match':>14}: {', '.join(f'{x:.2f}' for x in scores)} on held-out questions "
                     f"({verdict} within {quality_tolerance:.2f})")
    return "\n".join(lines)


def plot_runs(runs: list[RunResult], log: bool = True):
    """Four panels: peak memory, throughput and held-out exact match per variant (medians, bars from the lowest
    to the highest repeat), and every run's loss curve. The PNG is logged to every run."""
    from IPython.display import Image
    from matplotlib.figure import Figure

    client = mlflow_client(runs[0].tracking_uri)
    loaded = load_runs(runs)
    groups = grouped(loaded)
    fig = Figure(figsize=(12, 8))
    axes = fig.subplots(2, 2)
    x = list(range(len(groups)))

    def bars(ax, key, width=0.8, offset=0.0, scale=1.0, **style):
        stats = [summary(g, key) or (0.0, 0.0, 0.0) for g in groups.values()]
        heights = [m / scale for m, _, _ in stats]
        errors = [[(m - lo) / scale for m, lo, _ in stats], [(hi - m) / scale for m, _, hi in stats]]
        ax.bar([i + offset for i in x], heights, width, yerr=errors, capsize=3, **style)

    memory = [("peak_gpu_allocated_mb", "GPU allocator peak"), ("peak_gpu_nvml_mb", "GPU NVML peak"),
              ("gpu_memory_used_mb", "GPUtil after-before (tutorial)"), ("peak_cpu_rss_mb", "CPU RSS peak")]
    memory = [m for m in memory if any(r.data.metrics.get(m[0]) for r in loaded)]  # a CPU run has no GPU figures
    width = 0.8 / len(memory)
    for i, (key, label) in enumerate(memory):
        bars(axes[0, 0], key, width, (i - (len(memory) - 1) / 2) * width, 1024, label=label)
    axes[0, 0].legend(fontsize=8)
    bars(axes[0, 1], "samples_per_second", color="tab:green")
    bars(axes[1, 0], "eval_exact_match", color="tab:purple")
    for ax, title in ((axes[0, 0], "peak memory (GB)"), (axes[0, 1], "steady-state samples/s"),
                      (axes[1, 0], "held-out exact match after training")):
        ax.set(title=title, xticks=x, xticklabels=list(groups))
        ax.tick_params(axis="x", labelrotation=15, labelsize=8)
    for name, run in zip(_names(loaded), loaded, strict=True):
        axes[1, 1].plot(*loss_curve(client, run.info.run_id), marker="o", label=name)
    axes[1, 1].set(title="training loss", xlabel="optimizer step")
    axes[1, 1].legend(fontsize=8)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    if log:
        for run in loaded:
            client.log_figure(run.info.run_id, fig, "comparison.png")
    return Image(buffer.getvalue())


def answers(runs: list[RunResult], n: int = 3):
    """The first n held-out questions with their gold answers and each variant's answers before and after training
    (read back from the runs' answers.json)."""
    import json

    import pandas as pd

    table, runs = None, [r for r in runs if r is not None]  # a skipped quality check is None
    for name, group in grouped(load_runs(runs)).items():
        run = next((r for r in group if r.info.status == "FINISHED"), group[0])
        client = mlflow_client(runs[0].tracking_uri)
        try:
            with open(client.download_artifacts(run.info.run_id, "answers.json")) as f:
                rows = json.load(f)[:n]
        except Exception:  # a run with eval_samples 0, or one that failed before answering
            continue
        if table is None:
            table = pd.DataFrame({"question": [r["question"] for r in rows],
                                  "gold": [", ".join(r["gold"]) or "(none)" for r in rows]})
        for when in ("before", "after"):
            table[f"{name}: {when}"] = [r.get(when, "") for r in rows]
    return table if table is not None else pd.DataFrame()


def quality_verdict(result: RunResult | None) -> str:
    """Whether training taught the model: held-out exact match before and after, in words."""
    if result is None:
        return "No quality check: eval_samples is 0"
    m = result.metrics
    if "eval_exact_match" not in m:
        return f"{result.name}: no held-out scores ({result.status})"
    before, after = m.get("eval_exact_match_before", 0.0), m["eval_exact_match"]
    taught = "yes" if after - before > 0.5 else "no"
    return (f"Training taught the model (held-out exact match rose by more than 0.5): {taught}\n"
            f"exact match {before:.2f} -> {after:.2f}, F1 {m.get('eval_f1_before', 0.0):.2f} -> "
            f"{m.get('eval_f1', 0.0):.2f} on {m.get('eval_questions', 0):.0f} questions no training row holds")


def savings_table(runs: list[RunResult], baseline: str | None = None):
    """Memory saved and speed lost by each run relative to the baseline run (first baseline, else the first)."""
    import pandas as pd

    loaded = load_runs(runs)
    names = _names(loaded)
    base = next((r for r in loaded if r.data.params.get("strategy") == "baseline"), loaded[0]) \
        if baseline is None else loaded[names.index(baseline)]
    rows = []
    for name, run in zip(names, loaded, strict=True):
        m, b = run.data.metrics, base.data.metrics
        peak = m.get("peak_gpu_allocated_mb") or m.get("peak_cpu_rss_mb")
        base_peak = b.get("peak_gpu_allocated_mb") or b.get("peak_cpu_rss_mb")
        speed, base_speed = m.get("samples_per_second"), b.get("samples_per_second")
        rows.append({"run": name, "status": run.info.status, "peak_mb": peak,
                     "memory_saved": 1 - peak / base_peak if peak and base_peak else None,
                     "samples_per_second": speed,
                     "speed_ratio": speed / base_speed if speed and base_speed else None})
    return pd.DataFrame(rows).set_index("run")


def best_for_budget(runs: list[RunResult], memory_budget_gb: float) -> str:
    """The fastest finished run whose peak GPU memory (NVML, context included) fits the budget."""
    loaded, fits = load_runs(runs), []
    for name, run in zip(_names(loaded), loaded, strict=True):
        peak = run.data.metrics.get("peak_gpu_nvml_mb") or run.data.metrics.get("peak_gpu_allocated_mb", 0)
        if run.info.status == "FINISHED" and peak / 1024 <= memory_budget_gb:
            fits.append((run.data.metrics.get("samples_per_second", 0), name, peak))
    if not fits:
        return f"No finished run fits in {memory_budget_gb:g} GB."
    speed, name, peak = max(fits)
    return f"Fastest within {memory_budget_gb:g} GB: {name} ({speed:.3g} samples/s, peak {peak / 1024:.1f} GB)."
