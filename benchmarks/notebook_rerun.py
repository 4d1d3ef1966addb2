"""Notebook 01 killed after its pair finished, its runtime wiped but for the results folder, then run all again: what a
Colab user meets after a disconnect during the quality check. The second pass must train nothing that finished.

    python benchmarks/notebook_rerun.py OUT_DIR WORK_DIR [papermill -p flags ...]

WORK_DIR/content is the runtime's working directory (wiped between the passes) and WORK_DIR/drive/dsnb the results
folder (kept). Writes OUT_DIR/notebook_rerun.json: each pass's seconds and exit, the moment of the kill, and every run
of the store (name, status, comparison, repeat); prints it.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import mlflow

NOTEBOOK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "notebooks", "01_deepspeed_vs_baseline.ipynb")


def papermill(work: str, drive: str, out: str, flags: list[str], name: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "papermill", NOTEBOOK, os.path.join(out, name), "-k", "python3",
                             "--cwd", work, "-p", "results_folder", drive, *flags],
                            stdout=open(os.path.join(out, name + ".log"), "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def runs(db: str) -> list:
    if not os.path.isfile(db):
        return []
    client = mlflow.MlflowClient(f"sqlite:///{db}")
    return [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]


def main(out: str, root: str, flags: list[str]) -> dict:
    work, drive = os.path.join(root, "content"), os.path.join(root, "drive", "dsnb")
    os.makedirs(work, exist_ok=True)
    db = os.path.join(drive, "mlflow.db")
    facts: dict = {"passes": []}
    started = time.time()
    first = papermill(work, drive, out, flags, "pass1.ipynb")
    while first.poll() is None:  # the pair finished: both variants' runs FINISHED or FAILED, the quality check next
        pair = [r for r in runs(db) if r.info.run_name in ("Without_DeepSpeed", "With_DeepSpeed")]
        if len(pair) >= 2 and all(r.info.status in ("FINISHED", "FAILED") for r in pair):
            time.sleep(float(os.environ.get("KILL_DELAY", "5")))  # into the quality check
            os.killpg(first.pid, signal.SIGKILL)
            facts["killed_after_s"] = round(time.time() - started, 1)
            break
        time.sleep(1)
    first.wait()
    facts["passes"].append({"exit": first.returncode, "seconds": round(time.time() - started, 1)})
    before = {r.info.run_id for r in runs(db)}
    shutil.rmtree(work)  # a new runtime: only the results folder is left
    os.makedirs(work)
    started = time.time()
    second = papermill(work, drive, out, flags, "pass2.ipynb")
    second.wait()
    facts["passes"].append({"exit": second.returncode, "seconds": round(time.time() - started, 1)})
    facts["runs"] = [{"name": r.info.run_name, "status": r.info.status, "comparison": r.data.tags.get("comparison"),
                      "repeat": r.data.params.get("repeat"), "new_in_pass2": r.info.run_id not in before}
                     for r in runs(db)]
    facts["pair_runs_trained_in_pass2"] = sum(r["new_in_pass2"] and r["comparison"] is not None for r in facts["runs"])
    facts["comparisons"] = len({r["comparison"] for r in facts["runs"] if r["comparison"]})
    with open(os.path.join(out, "notebook_rerun.json"), "w") as f:
        json.dump(facts, f, indent=1)
    return facts


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], sys.argv[3:]), indent=1))
