"""Every run in an MLflow store, one line each: what a GPU stage left behind, even when it was cut short.

    python benchmarks/dump_runs.py sqlite:////tmp/dsnb_gpu/mlflow.db > runs.txt
"""
import sys

from dsnb.tracking import mlflow_client

KEYS = ("samples_per_second", "tokens_per_second", "mfu", "step_time_ms", "peak_gpu_allocated_mb",
        "peak_gpu_reserved_mb", "peak_gpu_nvml_mb", "peak_cpu_rss_mb", "est_peak_gpu_mb", "loss")

client = mlflow_client(sys.argv[1])
experiments = [e.experiment_id for e in client.search_experiments()]
for run in client.search_runs(experiments, order_by=["attributes.start_time ASC"]):
    m, info = run.data.metrics, run.info
    seconds = (info.end_time - info.start_time) / 1000 if info.end_time else None
    ranks = {k: round(v) for k, v in m.items() if "_rank" in k and k.startswith("peak_gpu_allocated")}
    print(info.run_name, info.status, run.data.tags.get("failure", ""), f"{seconds or 0:.0f}s",
          {k: round(m[k], 4) for k in KEYS if k in m}, ranks or "")
