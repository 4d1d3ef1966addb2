"""What one MLflow write costs on a SQLite store, against one batch: why dsnb's loss curve goes in batches.

    python benchmarks/mlflow_writes.py [--steps 32]

Logs `steps` loss records (loss, grad_norm, learning_rate) one call each, as dsnb did before tracking.Curve, then the
same number of records with tracking.Curve (one write), into a fresh store in a temporary folder; prints both times.
"""
import argparse
import os
import tempfile
import time

from dsnb.config import OFFLINE, RunConfig
from dsnb.tracking import Curve, create_run


def main() -> None:
    import mlflow

    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=32)
    steps = p.parse_args().steps
    record = {"loss": 1.0, "grad_norm": 2.0, "learning_rate": 3e-4}
    with tempfile.TemporaryDirectory() as folder:
        cfg = RunConfig(**OFFLINE, tracking_uri=f"sqlite:///{os.path.join(folder, 'mlflow.db')}")
        run_id = create_run(cfg)
        mlflow.set_tracking_uri(cfg.tracking_uri)
        with mlflow.start_run(run_id=run_id):
            started = time.perf_counter()
            for step in range(steps):
                mlflow.log_metrics(record, step=step)  # what dsnb called for each logged step
            single = time.perf_counter() - started
        curve = Curve(run_id, cfg.tracking_uri, records=steps, seconds=3600)
        started = time.perf_counter()
        for step in range(steps, 2 * steps):
            curve(step, record)  # the last record writes the batch
        batch = time.perf_counter() - started
    print(f"{steps} records, one write each: {1000 * single:.0f} ms ({1000 * single / steps:.1f} ms a write); "
          f"as one batch: {1000 * batch:.0f} ms")


if __name__ == "__main__":
    main()
