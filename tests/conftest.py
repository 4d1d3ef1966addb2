import contextlib
import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One compute thread per process: the tests run two at a time (xdist) and most start further processes; on 2 cores,
# torch's OpenMP threads then spin against each other (the quality run took 15x longer so), while the tiny models
# gain nothing from a second thread. Every process the tests start inherits it.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Tests never reach a model or dataset hub: a hub id must fail fast and clearly, as on an air-gapped box.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A fresh working directory: its own MLflow store (sqlite:///mlflow.db) and runs/ folder."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def pytest_collection_modifyitems(config, items):
    """The quick tier (python -m pytest -m quick): every test not marked integration, slow or network."""
    for item in items:
        if not {"integration", "slow", "network"} & set(item.keywords):
            item.add_marker(pytest.mark.quick)
    order(items)


def order(items):
    """Longest first, so the two xdist workers (pyproject's addopts) end together: the notebooks under nbval (about
    9 minutes on 2 cores), then the other integration tests (each starts processes that import torch, transformers,
    peft, DeepSpeed and MLflow: about 20 s apiece), then the unit tests."""
    items.sort(key=lambda item: 0 if item.name == "test_committed_notebooks_pass_nbval"
               else 1 if "integration" in item.keywords else 2)


# A variant that trains for minutes unless stopped: the interrupt tests stop it once it has logged a few steps.
LONG = dict(model="synthetic:tiny", dataset="synthetic", num_samples=64, dtype="fp32", max_length=128,
            max_steps=5000, logging_steps=1, save_model=False, eval_samples=0, quantization="none", repeats=1)


def fake_colab(monkeypatch, **parts):
    """sys.modules' google.colab made of `parts` (drive, output, ...) as stand-ins: a module with a spec, as Colab's
    own is (accelerate, which transformers imports, asks importlib.util.find_spec("google.colab"), which refuses a
    module without one)."""
    import importlib.machinery
    import types

    colab = types.ModuleType("google.colab")
    colab.__spec__ = importlib.machinery.ModuleSpec("google.colab", None)
    colab.__dict__.update(parts)
    monkeypatch.setitem(sys.modules, "google.colab", colab)
    return colab


def free_port() -> int:
    """A port nothing on 127.0.0.1 listens on now (a fixed one may be taken by another checkout's tests), below the
    kernel's ephemeral range, as dsnb picks its rendezvous port: one bind(0) hands out can be taken by another
    process's connection before the server listens."""
    from dsnb.train import rendezvous_port

    return rendezvous_port()


def wait_for_training(uri: str, name: str, timeout: float = 240):
    """The run named `name` once it has logged a few steps' loss."""
    from dsnb.tracking import mlflow_client  # under dsnb's lock: a client of its own would race dsnb's table set-up

    client = None
    deadline = time.time() + timeout
    while time.time() < deadline:
        client = client or (mlflow_client(uri) if os.path.exists(uri[10:]) else None)
        exps = [e.experiment_id for e in client.search_experiments()] if client else []
        runs = [r for r in client.search_runs(exps) if r.info.run_name == name] if exps else []
        if runs and len(client.get_metric_history(runs[0].info.run_id, "loss")) >= 3:
            return runs[0]
        time.sleep(0.5)
    pytest.fail(f"{name} did not start training within {timeout} s")


def reply_to(kc, msg_id: str, timeout: float) -> dict:
    """The content of a Jupyter kernel's reply to request msg_id; other replies are skipped: on a busy machine
    start_new_kernel asks for kernel_info more than once while the kernel starts, and the spare replies wait in the
    shell channel (a plain get_shell_msg returned one of them, status "ok", in place of the interrupted run's)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        reply = kc.get_shell_msg(timeout=max(deadline - time.time(), 0.1))
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply["content"]
    pytest.fail(f"no reply to request {msg_id} within {timeout} s")


def assert_killed_with_what_it_measured(uri: str, run_id: str):
    import mlflow

    client = mlflow.MlflowClient(uri)
    deadline = time.time() + 120
    logged = lambda: "train.log" in {a.path for a in client.list_artifacts(run_id)}  # noqa: E731
    # an orphan's own process ends its run, then attaches its log as it exits: both, or the deadline
    while (client.get_run(run_id).info.status == "RUNNING" or not logged()) and time.time() < deadline:
        time.sleep(0.5)
    run = client.get_run(run_id)
    assert run.info.status == "KILLED" and run.data.tags.get("failure") == "interrupted", run.info
    assert run.data.metrics["peak_cpu_rss_mb"] > 100 and run.data.metrics["samples_per_second"] > 0
    assert logged()
    log = open(client.download_artifacts(run_id, "train.log")).read()
    assert "dsnb: interrupted" in log  # the child's own record of being stopped


def planted(folder, code: str, env: dict | None = None) -> dict:
    """env (default: this process's) with folder/sitecustomize.py holding code first on PYTHONPATH: every Python
    process started with it runs code at its start (the code picks the processes it acts in)."""
    folder.mkdir(exist_ok=True)
    (folder / "sitecustomize.py").write_text(code)
    env = dict(os.environ if env is None else env)
    return {**env, "PYTHONPATH": os.pathsep.join([str(folder), *filter(None, [env.get("PYTHONPATH")])])}


def kill_tree(pid: int) -> None:
    """SIGKILL a process and everything it started (each perhaps in a session of its own), as a machine that dies
    would: all frozen first, so none sees another go and records it (a training process notices its dsnb gone within
    a second; a dsnb, its child's exit)."""
    import psutil

    tree, frozen = {}, None
    while frozen != set(tree):  # listed again once frozen: a process started meanwhile is frozen too
        frozen = set(tree)
        with contextlib.suppress(psutil.NoSuchProcess):
            top = psutil.Process(pid)
            tree.update((p.pid, p) for p in [top, *top.children(recursive=True)])
        for process in tree.values():
            with contextlib.suppress(psutil.NoSuchProcess):
                process.suspend()
    for process in tree.values():
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()


def no_child_left(marker: str, grace: float = 30):
    """No process whose command line holds marker is still running `grace` seconds on (one that has just recorded
    its run may still be exiting)."""
    import psutil

    found = [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]
    _, alive = psutil.wait_procs(found, timeout=grace)
    assert not alive, alive


TRAIN_HERE = r"""
import json, sys
from dsnb.config import RunConfig
from dsnb.report import loss_curve
from dsnb.tracking import create_run, mlflow_client
from dsnb.planning import Reporter
from dsnb.train import train

class Quiet(Reporter):
    def say(self, text):
        pass

done = []
for fields in json.loads(sys.argv[1]):
    cfg = RunConfig.from_dict(fields)
    run_id = create_run(cfg)
    metrics = train(cfg, run_id, reporter=Quiet())
    done.append({"name": cfg.name, "run_id": run_id, "metrics": metrics,
                 "curve": loss_curve(mlflow_client(cfg.tracking_uri), run_id)[1]})
print(json.dumps(done))
"""


def train_here(cfgs, cwd, timeout: float = 900) -> dict:
    """Each config trained in turn in one fresh process (dsnb.train, as a variant's own process runs it), for tests of
    what the runs compute: starting Python, torch and DeepSpeed once rather than once a run. Returns name -> an object
    with run_id, metrics and curve (the logged losses). Measurements that need a process of their own (peaks, the
    launcher's paths) go through launch.run_all instead."""
    done = subprocess.run([sys.executable, "-c", TRAIN_HERE, json.dumps([c.to_dict() for c in cfgs])], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-4000:]
    return {r["name"]: SimpleNamespace(**r) for r in json.loads(done.stdout.strip().splitlines()[-1])}


BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")


def benchmark_module(name: str):
    """A script of benchmarks/ imported as a module (the tests hold the figures its results file states)."""
    import importlib

    sys.path.insert(0, BENCHMARKS)
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(BENCHMARKS)
