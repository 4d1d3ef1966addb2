"""Soak: 20 short variants in one sweep, some made to fail and one killed mid-run; every run accounted for.

    python -m pytest -q -m slow tests/test_soak.py
"""
import json
import shutil
import threading
import time

import mlflow
import psutil
import pytest

from dsnb.config import OFFLINE, RunConfig
from dsnb.model import resolve_model
from dsnb.launch import run_all

pytestmark = pytest.mark.slow
VICTIM = "soak-victim"


def kill_victim_when_training(stop):
    """SIGKILL the child process training VICTIM once it has run a few seconds."""
    while not stop.is_set():
        for child in psutil.Process().children(recursive=True):
            try:
                config = child.cmdline()[-1]
                if config.endswith("child.json") and json.load(open(config))["config"].get("run_name") == VICTIM \
                        and time.time() - child.create_time() > 8:
                    child.kill()
                    return
            except (psutil.Error, OSError, ValueError, IndexError):
                continue
        time.sleep(0.2)


def test_twenty_variants_with_failures_and_a_kill(workdir):
    broken = workdir / "broken"
    shutil.copytree(resolve_model("synthetic:tiny"), broken)
    (broken / "model.safetensors").write_bytes(b"truncated")
    base = dict(OFFLINE, num_samples=16, max_steps=2, logging_steps=1, save_model=False,
                tracking_uri=f"sqlite:///{workdir}/mlflow.db", experiment="soak")
    shapes = [dict(strategy="baseline"), dict(strategy="zero1"), dict(strategy="zero2"),
              dict(strategy="zero2", offload_optimizer="cpu"), dict(strategy="zero3", quantization="none"),
              dict(strategy="baseline", lora_r=0, quantization="none"), dict(strategy="zero3", quantization="none",
                                                                            offload_param="cpu", lora_r=0)]
    cfgs = []
    for i in range(20):
        changes = dict(shapes[i % len(shapes)], run_name=f"soak-{i:02d}", seed=i)
        if i in (4, 11, 17):
            changes["model"] = str(broken)
        if i == 8:
            changes.update(run_name=VICTIM, max_steps=400)  # long enough to be killed mid-run
        cfgs.append(RunConfig(**{**base, **changes}))
    stop = threading.Event()
    killer = threading.Thread(target=kill_victim_when_training, args=(stop,), daemon=True)
    killer.start()
    try:
        results = run_all(cfgs, progress=False)
    finally:
        stop.set()
    assert len(results) == 20
    client = mlflow.MlflowClient(base["tracking_uri"])
    runs = {r.info.run_name: r for r in client.search_runs([client.get_experiment_by_name("soak").experiment_id],
                                                           max_results=100)}
    assert len(runs) == 20
    statuses = {name: run.info.status for name, run in runs.items()}
    assert statuses[VICTIM] == "KILLED"
    assert sorted(n for n, s in statuses.items() if s == "FAILED") == [f"soak-{i:02d}" for i in (4, 11, 17)]
    assert sum(s == "FINISHED" for s in statuses.values()) == 16
    for name, run in runs.items():
        artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert "train.log" in artifacts, name  # every run keeps its log, finished or not
        if run.info.status == "FAILED":
            assert "error.txt" in artifacts and "peak_cpu_rss_mb" in run.data.metrics
        if run.info.status == "FINISHED":
            assert run.data.metrics["tokens_per_second"] > 0


def test_a_jupyter_interrupt_stops_a_sweep_mid_way(workdir):
    """Three variants started from a notebook's kernel; "Interrupt kernel" while the second trains: the first stays
    FINISHED, the second ends KILLED with its log, the third never starts, and the kernel runs on."""
    import os

    from conftest import LONG, assert_killed_with_what_it_measured, no_child_left, reply_to, wait_for_training
    from jupyter_client.manager import start_new_kernel

    uri = f"sqlite:///{workdir}/mlflow.db"
    short = dict(LONG, max_steps=2)
    km, kc = start_new_kernel(kernel_name="python3", cwd=str(workdir), env={**os.environ, "TMPDIR": str(workdir)})
    try:
        msg_id = kc.execute(
            "import dsnb\n"
            f"results = dsnb.run_all([dsnb.RunConfig(**{short!r}, tracking_uri={uri!r}, run_name='first'), "
            f"dsnb.RunConfig(**{LONG!r}, tracking_uri={uri!r}, run_name='second'), "
            f"dsnb.RunConfig(**{short!r}, tracking_uri={uri!r}, run_name='third')], progress=False)")
        second = wait_for_training(uri, "second")
        km.interrupt_kernel()
        assert reply_to(kc, msg_id, timeout=180)["ename"] == "KeyboardInterrupt"
        assert_killed_with_what_it_measured(uri, second.info.run_id)
        client = mlflow.MlflowClient(uri)
        runs = {r.info.run_name: r.info.status for r in client.search_runs(
            [client.get_experiment_by_name("DeepSpeed_Comparison").experiment_id])}
        assert runs == {"first": "FINISHED", "second": "KILLED"}
        no_child_left(str(workdir))
        assert reply_to(kc, kc.execute("x = 1"), timeout=60)["status"] == "ok"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
