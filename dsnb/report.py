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
           "samples_per_second", "tokens_per_second", "mfu"]
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


def compare_table(runs: list[RunResult]):
    """Metrics as rows, runs as columns (by run name), and each run's ratio to the first."""
    import pandas as pd

    loaded = load_runs(runs)
    names = _names(loaded)
    table = pd.DataFrame({name: [run.info.status] + [run.data.metrics.get(m) for m in METRICS]
                          for name, run in zip(names, loaded, strict=True)}, index=["status"] + METRICS)
    for name in names[1:]:
        ratio = pd.to_numeric(table[name][1:], errors="coerce") / pd.to_numeric(table[names[0]][1:], errors="coerce")
        table[f"{name} / {names[0]}"] = [""] + [f"{x:.2f}x" if pd.notna(x) and abs(x) != float("inf") else ""
                                                for x in ratio]
    return table


def format_table(table) -> str:
    def fmt(value):
        if isinstance(value, float):
            return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
        return "" if value is None else str(value)

    return table.map(fmt).to_string()


def loss_curve(client, run_id: str) -> tuple[list[int], list[float]]:
    history = sorted(client.get_metric_history(run_id, "loss"), key=lambda m: m.step)
    return [m.step for m in history], [m.value for m in history]


def same_work(runs: list[RunResult], loss_tolerance: float = 0.05) -> str:
    """Check the runs did the same work: same data, seed and steps, and final losses within tolerance."""
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
    return "\n".join(lines)


def plot_runs(runs: list[RunResult], log: bool = True):
    """Four panels (peak memory, throughput, runtime, loss curves); the PNG is logged to every run."""
    from IPython.display import Image
    from matplotlib.figure import Figure

    client = mlflow_client(runs[0].tracking_uri)
    loaded = load_runs(runs)
    names = _names(loaded)

    def metric(run, key):
        return run.data.metrics.get(key, 0.0)

    fig = Figure(figsize=(12, 8))
    axes = fig.subplots(2, 2)
    x = range(len(loaded))
    bars = [("peak_gpu_allocated_mb", "GPU allocator peak"), ("peak_gpu_nvml_mb", "GPU NVML peak"),
            ("gpu_memory_used_mb", "GPUtil after-before (tutorial)"), ("peak_cpu_rss_mb", "CPU RSS peak")]
    bars = [b for b in bars if any(metric(r, b[0]) for r in loaded)]  # a CPU run has no GPU figures
    width = 0.8 / len(bars)
    for i, (key, label) in enumerate(bars):
        offset = (i - (len(bars) - 1) / 2) * width
        axes[0, 0].bar([j + offset for j in x], [metric(r, key) / 1024 for r in loaded], width, label=label)
    axes[0, 0].set(title="peak memory (GB)", xticks=list(x), xticklabels=names)
    axes[0, 0].legend(fontsize=8)
    axes[0, 1].bar(x, [metric(r, "samples_per_second") for r in loaded], color="tab:green")
    axes[0, 1].set(title="steady-state samples/s", xticks=list(x), xticklabels=names)
    axes[1, 0].bar(x, [metric(r, "train_runtime_sec") for r in loaded], color="tab:red")
    axes[1, 0].set(title="train_runtime (s)", xticks=list(x), xticklabels=names)
    for name, run in zip(names, loaded, strict=False):
        axes[1, 1].plot(*loss_curve(client, run.info.run_id), marker="o", label=name)
    axes[1, 1].set(title="training loss", xlabel="optimizer step")
    axes[1, 1].legend(fontsize=8)
    for ax in axes.flat[:3]:
        ax.tick_params(axis="x", labelrotation=15, labelsize=8)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    if log:
        for run in loaded:
            client.log_figure(run.info.run_id, fig, "comparison.png")
    return Image(buffer.getvalue())


def savings_table(runs: list[RunResult], baseline: str | None = None):
    """Memory saved and speed lost by each run relative to the baseline run (first baseline, else the first)."""
    import pandas as pd

    loaded = load_runs(runs)
    names = _names(loaded)
    base = next((r for r in loaded if r.data.params.get("strategy") == "baseline"), loaded[0]) \
        if baseline is None else loaded[names.index(baseline)]
    rows = []
    for name, run in zip(names, loaded, strict=False):
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
    for name, run in zip(_names(loaded), loaded, strict=False):
        peak = run.data.metrics.get("peak_gpu_nvml_mb") or run.data.metrics.get("peak_gpu_allocated_mb", 0)
        if run.info.status == "FINISHED" and peak / 1024 <= memory_budget_gb:
            fits.append((run.data.metrics.get("samples_per_second", 0), name, peak))
    if not fits:
        return f"No finished run fits in {memory_budget_gb:g} GB."
    speed, name, peak = max(fits)
    return f"Fastest within {memory_budget_gb:g} GB: {name} ({speed:.3g} samples/s, peak {peak / 1024:.1f} GB)."
