"""Every run in an MLflow store as JSON lines: what a GPU stage left behind, even when it was cut short.

    python benchmarks/dump_runs.py sqlite:////tmp/dsnb_gpu/mlflow.db > runs.jsonl

One object a run, oldest first: run_id, name, status, failure, wall_seconds and every metric (per-rank
peaks included). benchmarks/tables_from_runs.py reads these listings back.
"""
import json
import sys

from dsnb.tracking import mlflow_client, search

client = mlflow_client(sys.argv[1])
experiments = [e.experiment_id for e in client.search_experiments()]
for run in search(client, experiments, order_by=["attributes.start_time ASC"]) if experiments else []:
    info = run.info
    print(json.dumps({"run_id": info.run_id, "name": info.run_name, "status": info.status,
                      "failure": run.data.tags.get("failure", ""),
                      "wall_seconds": (info.end_time - info.start_time) / 1000 if info.end_time else None,
                      "metrics": {k: round(v, 4) for k, v in run.data.metrics.items()}}))
