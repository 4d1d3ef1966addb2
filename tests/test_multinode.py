"""Several nodes, simulated on one machine as a multi-node job starts them: a launcher per node on 127.0.0.1 with a
rendezvous (torchrun, and DeepSpeed's own launcher with a hostfile), one CPU process per node, DeepSpeed on gloo.
The job is one MLflow run written by global rank 0, trains the curve one process trains on the same global batch
(tests/test_curves.py's pinned one), counts every rank's samples and records each rank's and each node's peaks; a
node that dies ends the run FAILED with what it measured, and nothing is left running."""
import os
import subprocess
import sys
import time

import mlflow
import psutil
import pytest
from conftest import free_port
from test_curves import PINNED, TOLERANCE

pytestmark = pytest.mark.integration
# tests/test_curves.py's run (4 samples a step, every step the same 4, lr 1e-3), as 2 nodes x 1 rank x 2 micro-batches
# of 1 sample: the same global batch.
FLAGS = ["--offline", "--quantization", "none", "--max_steps", "4", "--logging_steps", "1", "--learning_rate", "1e-3",
         "--batch_size", "1", "--grad_accum", "2", "--num_samples", "4", "--eval_samples", "0", "--lora_dropout", "0",
         "--padding", "bucket", "--save_model", "false", "--checkpoint_minutes", "0"]


def nodes(launcher: list[str], workdir, flags, name: str) -> list[subprocess.Popen]:
    """One launcher per node, as each machine of a job starts its own."""
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    return [subprocess.Popen([sys.executable, "-m", *launcher(n), "-m" if launcher(n)[0] != "deepspeed.launcher.runner"
                              else "--module", "dsnb", "run", *flags, "--run_name", name], cwd=workdir, env=env,
                             stdout=open(workdir / f"node{n}.log", "w"), stderr=subprocess.STDOUT)
            for n in range(2)]


def torchrun(port: int):
    return lambda n: ["torch.distributed.run", "--nnodes", "2", "--node_rank", str(n), "--nproc_per_node", "1",
                      "--master_addr", "127.0.0.1", "--master_port", str(port)]


def the_run(workdir, name):
    client = mlflow.MlflowClient(f"sqlite:///{workdir}/mlflow.db")
    [run] = [r for r in client.search_runs([e.experiment_id for e in client.search_experiments()])
             if r.info.run_name == name]
    return client, run


def curve(client, run):
    return [m.value for m in sorted(client.get_metric_history(run.info.run_id, "loss"), key=lambda m: m.step)]


def port() -> int:
    """A free port below the kernel's ephemeral range (one there can be taken by any connection before torchrun's
    store listens)."""
    return free_port()


def test_two_nodes_through_torchrun_train_the_one_process_curve_as_one_run(workdir):
    jobs = nodes(torchrun(port()), workdir, [*FLAGS, "--strategy", "zero2"], "two_nodes")
    assert [j.wait(timeout=600) for j in jobs] == [0, 0], (workdir / "node1.log").read_text()[-3000:]
    client, run = the_run(workdir, "two_nodes")  # one run: rank 0 alone writes it
    assert run.info.status == "FINISHED"
    assert curve(client, run) == pytest.approx(PINNED, abs=TOLERANCE)
    m = run.data.metrics
    assert m["train_samples_per_second"] * m["train_runtime"] == pytest.approx(16, rel=1e-3)  # both nodes' samples
    assert {"peak_cpu_rss_mb_rank0", "peak_cpu_rss_mb_rank1", "peak_cpu_rss_mb_node0",
            "peak_cpu_rss_mb_node1"} <= set(m)
    assert m["peak_cpu_rss_mb_node1"] == m["peak_cpu_rss_mb_rank1"] > 100
    assert client.get_run(run.info.run_id).data.params["strategy"] == "zero2"


def test_two_nodes_through_deepspeeds_launcher_and_a_hostfile(workdir):
    """The recipe of docs/deepspeed-and-capacity.md: a hostfile, `deepspeed ... --node_rank N --no_ssh` on each node
    (what pdsh would run over ssh), ZeRO-3 across the nodes."""
    (workdir / "hostfile").write_text("node-a slots=1\nnode-b slots=1\n")
    master = port()
    launcher = lambda n: ["deepspeed.launcher.runner", "--hostfile", "hostfile", "--no_ssh", "--node_rank", str(n),  # noqa: E731
                          "--num_nodes", "2", "--num_gpus", "1", "--master_addr", "127.0.0.1", "--master_port",
                          str(master)]
    jobs = nodes(launcher, workdir, [*FLAGS, "--strategy", "zero3"], "deepspeed_nodes")
    assert [j.wait(timeout=600) for j in jobs] == [0, 0], (workdir / "node0.log").read_text()[-3000:]
    client, run = the_run(workdir, "deepspeed_nodes")
    assert run.info.status == "FINISHED" and curve(client, run) == pytest.approx(PINNED, abs=TOLERANCE)
    assert "peak_cpu_rss_mb_node1" in run.data.metrics


def test_a_node_that_dies_fails_the_run_and_leaves_nothing_running(workdir):
    """Node 1's launcher killed (its machine gone): its rank stops by itself instead of running on orphaned, node 0's
    next collective fails, and the run ends FAILED with what it measured."""
    flags = [*FLAGS, "--max_steps", "5000", "--strategy", "zero2"]  # the later value wins
    jobs = nodes(torchrun(port()), workdir, flags, "dying")
    deadline, client, run = time.time() + 600, None, None
    while time.time() < deadline and all(j.poll() is None for j in jobs):
        if (workdir / "mlflow.db").exists():
            client = client or mlflow.MlflowClient(f"sqlite:///{workdir}/mlflow.db")
            runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
            if runs and len(client.get_metric_history(runs[0].info.run_id, "loss")) >= 3:
                run = runs[0]
                break
        time.sleep(0.5)
    assert run is not None, (workdir / "node0.log").read_text()[-3000:]
    rank1 = psutil.Process(jobs[1].pid).children(recursive=True)
    jobs[1].kill()  # the agent, as its machine goes
    assert jobs[0].wait(timeout=120) != 0
    psutil.wait_procs(rank1, timeout=60)
    assert not [p for p in rank1 if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]  # no orphan left training
    deadline = time.time() + 60
    while client.get_run(run.info.run_id).info.status == "RUNNING" and time.time() < deadline:
        time.sleep(0.5)
    failed = client.get_run(run.info.run_id)
    assert failed.info.status in ("FAILED", "KILLED"), failed.info
    assert failed.data.metrics["peak_cpu_rss_mb"] > 100 and failed.data.metrics["samples_per_second"] > 0
    assert failed.data.tags["error"]
