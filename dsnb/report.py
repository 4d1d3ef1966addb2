"""Read runs back from MLflow into a side-by-side table (and plots).

    table = compare_table(cfg.tracking_uri, [r["run_id"] for r in results])
    print(table.to_string())
"""
from __future__ import annotations

# The tutorial's metrics first, then the ones that measure what it meant to.
METRICS = ["gpu_memory_used_mb", "train_runtime_sec", "train_samples_per_second", "train_steps_per_second",
           "train_loss", "peak_gpu_allocated_mb", "peak_gpu_reserved_mb", "peak_gpu_nvml_mb", "peak_cpu_rss_mb",
           "samples_per_second", "tokens_per_second", "mfu"]


def load_runs(tracking_uri: str, run_ids: list[str]) -> list:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    return [client.get_run(r) for r in run_ids]


def compare_table(tracking_uri: str, run_ids: list[str]):
    """Metrics as rows, runs as columns (by run name), and each run's ratio to the first."""
    import pandas as pd

    runs = load_runs(tracking_uri, run_ids)
    columns = {}
    for run in runs:
        name = run.info.run_name
        if name in columns:
            name = f"{name} ({run.info.run_id[:6]})"
        columns[name] = [run.info.status] + [run.data.metrics.get(m) for m in METRICS]
    table = pd.DataFrame(columns, index=["status"] + METRICS)
    names = list(columns)
    for name in names[1:]:
        ratio = pd.to_numeric(table[name][1:], errors="coerce") / pd.to_numeric(table[names[0]][1:], errors="coerce")
        table[f"{name} / {names[0]}"] = [""] + [f"{x:.2f}x" if pd.notna(x) and x != float("inf") else "" for x in ratio]
    return table


def format_table(table) -> str:
    def fmt(value):
        if isinstance(value, float):
            return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
        return "" if value is None else str(value)

    return table.map(fmt).to_string()
