"""Every run in an MLflow store as JSON lines: what a GPU stage left behind, even when it was cut short.

    python benchmarks/dump_runs.py sqlite:////tmp/dsnb_gpu/mlflow.db > runs.jsonl
    python benchmarks/dump_runs.py sqlite:////tmp/dsnb_gpu/mlflow.db --tails tails.txt   # + the end of each
                                                                                          # unfinished run's log
One object a run, oldest first: run_id, name, status, failure, wall_seconds, every metric (per-rank peaks
included) and the loss curve ([step, loss] pairs). benchmarks/tables_from_runs.py reads these listings back.
"""
import json
import sys
import tempfile

from dsnb.tracking import mlflow_client, search

client = mlflow_client(sys.argv[1])
tails = sys.argv[sys.argv.index("--tails") + 1] if "--tails" in sys.argv else None
experiments = [e.experiment_id for e in client.search_experiments()]
for run in search(client, experiments, order_by=["attributes.start_time ASC"]) if experiments else []:
    info = run.info
    curve = sorted((m.step, round(m.value, 5)) for m in client.get_metric_history(info.run_id, "loss"))
    print(json.dumps({"run_id": info.run_id, "name": info.run_name, "status": info.status,
                      "failure": run.data.tags.get("failure", ""),
                      "wall_seconds": (info.end_time - info.start_time) / 1000 if info.end_time else None,
                      "metrics": {k: round(v, 4) for k, v in run.data.metrics.items()}, "loss_curve": curve}))
    if tails and info.status != "FINISHED":
        with tempfile.TemporaryDirectory() as tmp, open(tails, "a") as out:
            try:
                lines = open(client.download_artifacts(info.run_id, "train.log", tmp), errors="replace").readlines()
            except Exception as e:  # a run with no log yet
                lines = [f"(no train.log: {e})\n"]
            out.write(f"==== {info.run_name} {info.status} {info.run_id}\n" + "".join(lines[-60:]))
