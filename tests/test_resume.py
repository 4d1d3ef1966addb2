"""Checkpoints and --resume: a run killed at any moment of its life resumes into the same MLflow run, and what it
records means what a run that was never stopped records."""
import json
import os
import re
import shutil
import subprocess
import sys

import mlflow
import pytest

from dsnb.config import OFFLINE, ConfigError, RunConfig
from dsnb.report import loss_curve
from dsnb.tracking import CHECKPOINT_FILES, create_run, finish, mlflow_client, resumable_run, unreadable
from dsnb.train import mean_loss

pytestmark = pytest.mark.integration
FLAGS = ["--offline", "--strategy", "zero2", "--quantization", "none", "--max_steps", "8", "--checkpoint_steps", "2",
         "--logging_steps", "1", "--eval_samples", "0", "--save_model", "false", "--run_name", "killed"]
# `python -m dsnb` with a SIGKILL planted at one moment of one checkpoint's life: while it is written (in the middle of
# the Trainer's own writing: its RNG state), or just after it is published (renamed into place, curve written).
KILLER = r"""
import os, signal, sys
import transformers.trainer as hf
from dsnb import train
from dsnb.cli import main
moment, step = sys.argv[1], int(sys.argv[2])
def die(): os.kill(os.getpid(), signal.SIGKILL)
if moment == "interrupted_after_log":  # Ctrl-C once step's loss is logged: the run ends KILLED, its curve written
    log = train.StepCallback.on_log
    def planted(self, args, state, control, **kwargs):
        log(self, args, state, control, **kwargs)
        if state.global_step == step and "loss" in (kwargs.get("logs") or {}):
            # what Python's SIGINT handler raises in the main thread, here and now (a signal sent to this process
            # once let the run finish on a loaded CI machine)
            raise KeyboardInterrupt
    train.StepCallback.on_log = planted
elif moment == "while_writing":
    write = hf.Trainer._save_rng_state
    def planted(self, *args, **kwargs):
        if self.state.global_step == step:
            die()
        return write(self, *args, **kwargs)
    hf.Trainer._save_rng_state = planted
else:
    save = train.CheckpointTrainer._save_checkpoint
    def planted(self, *args, **kwargs):
        save(self, *args, **kwargs)
        if self.state.global_step == step:
            die()
    train.CheckpointTrainer._save_checkpoint = planted
sys.exit(main(sys.argv[3:]))
"""


def dsnb(*args, cwd, kill=None):
    command = [sys.executable, "-c", KILLER, *kill, *args] if kill else [sys.executable, "-m", "dsnb", *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=900)


def the_run(workdir):
    client = mlflow.MlflowClient(f"sqlite:///{workdir}/mlflow.db")
    [run] = client.search_runs([client.get_experiment_by_name("DeepSpeed_Comparison").experiment_id])
    return client, run


def test_a_run_killed_while_writing_and_after_a_checkpoint_resumes_to_a_true_record(workdir):
    killed = dsnb("run", *FLAGS, cwd=workdir, kill=["while_writing", "4"])
    assert killed.returncode == -9, killed.stderr[-2000:]
    folder = next((workdir / "runs").iterdir())
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith("checkpoint")) == ["checkpoint-2"]
    # the half-written checkpoint-4 sits in the staging folder, where no reader looks for a checkpoint
    again = dsnb("run", *FLAGS, "--resume", cwd=workdir, kill=["after_publishing", "6"])
    assert again.returncode == -9, again.stderr[-2000:]
    client, run = the_run(workdir)
    assert run.data.tags["resumed"].startswith("from checkpoint-2 after: ")
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith("checkpoint")) == ["checkpoint-6"]
    listed = json.loads((folder / "checkpoint-6" / CHECKPOINT_FILES).read_text())  # every file, with its size
    assert {"trainer_state.json", "dsnb_progress.json"} <= set(listed)
    assert unreadable(str(folder / "checkpoint-6")) is None
    assert max(loss_curve(client, run.info.run_id)[0]) >= 6  # the curve went to MLflow before checkpoint-6 showed

    done = dsnb("run", *FLAGS, "--resume", cwd=workdir)
    assert done.returncode == 0, done.stderr[-3000:]
    client, after = the_run(workdir)
    assert after.info.run_id == run.info.run_id and after.info.status == "FINISHED"
    assert after.data.tags["resumed"].endswith("from checkpoint-6 after: process " + after.data.tags["resumed"].split(
        "after: process ")[-1]) and "failure" not in after.data.tags and "error" not in after.data.tags
    steps, losses = loss_curve(client, after.info.run_id)
    assert steps == list(range(1, 9))  # every step once, however often the runs before wrote it
    metrics = after.data.metrics
    assert metrics["train_loss"] == pytest.approx(mean_loss(dict(zip(steps, losses, strict=True))), rel=1e-6)
    assert 5 < metrics["train_loss"] < 7  # a random tiny model's loss: log(420) is 6.0
    assert metrics["samples_per_second"] > 0 and metrics["timed_steps"] == 1  # steps 7-8, the first untimed
    assert metrics["peak_cpu_rss_mb"] > 100
    nothing = dsnb("run", *FLAGS, "--resume", cwd=workdir)
    assert nothing.returncode == 2 and "nothing to resume" in nothing.stderr


def test_a_resumed_run_records_what_an_uninterrupted_run_records(workdir):
    """Interrupted once its step 4 is logged (after checkpoint-3; its curve written as the run ends KILLED), then
    resumed: its record is the uninterrupted run's, step by step, but for the tag `resumed` and the time lost: the
    same curve with each step once (checkpoint_steps 3 is not a logging step of 2: a checkpoint's step logs), the same
    train_loss, the "before" answers the first process measured, the after ones, no failure tag, and a runtime and
    throughput that cover every step."""
    flags = ["--offline", "--quantization", "none", "--max_steps", "8", "--checkpoint_steps", "3", "--logging_steps",
             "2", "--eval_samples", "4", "--save_model", "false"]
    whole = dsnb("run", *flags, "--run_name", "whole", cwd=workdir)
    assert whole.returncode == 0, whole.stderr[-3000:]
    stopped = dsnb("run", *flags, "--run_name", "resumed", cwd=workdir, kill=["interrupted_after_log", "4"])
    assert stopped.returncode != 0, stopped.stderr[-3000:]
    client = mlflow.MlflowClient(f"sqlite:///{workdir}/mlflow.db")
    exp = client.get_experiment_by_name("DeepSpeed_Comparison").experiment_id
    runs = {r.info.run_name: r for r in client.search_runs([exp])}
    assert runs["resumed"].info.status == "KILLED" and runs["resumed"].data.tags["failure"] == "interrupted"
    assert {m.step for m in client.get_metric_history(runs["resumed"].info.run_id, "loss")} == {1, 2, 3, 4}
    first = json.loads((workdir / "runs" / runs["resumed"].info.run_id / "checkpoint-3" / "dsnb_progress.json")
                       .read_text())
    again = dsnb("run", *flags, "--run_name", "resumed", "--resume", cwd=workdir)
    assert again.returncode == 0, again.stderr[-3000:]
    runs = {r.info.run_name: r for r in client.search_runs([exp])}
    a, b = runs["whole"], runs["resumed"]
    assert b.info.status == "FINISHED" and b.data.tags["resumed"].startswith("from checkpoint-3 after: ")
    assert not {"failure", "error"} & set(b.data.tags)
    history = [m.step for m in client.get_metric_history(b.info.run_id, "loss")]
    assert sorted(history) == [1, 2, 3, 4, 6, 8]  # each step once: step 4 was logged by the first process only
    (steps_b, losses_b), (steps_a, losses_a) = loss_curve(client, b.info.run_id), loss_curve(client, a.info.run_id)
    assert steps_b == steps_a and losses_b == pytest.approx(losses_a, rel=1e-5)
    for key in ("train_loss", "eval_exact_match_before", "eval_f1_before", "eval_exact_match", "eval_f1",
                "real_tokens_per_sample"):  # of the whole run: the first process's samples counted in
        assert b.data.metrics[key] == pytest.approx(a.data.metrics[key], rel=1e-5), key

    def answers(run):
        with open(client.download_artifacts(run.info.run_id, "answers.json")) as f:
            return [{k: r[k] for k in ("key", "before", "after", "before_em", "after_em")} for r in json.load(f)]
    assert answers(b) == answers(a) and len(answers(a)) == 4
    m = b.data.metrics
    assert m["train_samples_per_second"] * m["train_runtime_sec"] == pytest.approx(64)  # 8 steps of 2 x 4 samples
    assert m["train_steps_per_second"] * m["train_runtime_sec"] == pytest.approx(8)
    assert 0 < first["train_seconds"] < m["train_runtime_sec"]  # the first process's time is counted in
    assert first["samples"] == 24  # 3 steps of 2 x 4 samples


def test_a_checkpoint_of_the_last_step_leaves_nothing_to_train_and_the_record_stands(workdir):
    """A checkpoint that holds every step (dsnb never writes one, older versions did) must not turn into a FINISHED
    run with a zero-length run's numbers."""
    cfg = RunConfig.layered(dict(OFFLINE, max_steps=4, checkpoint_steps=2, run_name="done-training"))
    run_id = create_run(cfg)
    client = mlflow_client(cfg.tracking_uri)
    client.log_metric(run_id, "loss", 6.05, step=4)
    finish(run_id, cfg.tracking_uri, "KILLED")
    checkpoint = workdir / "runs" / run_id / "checkpoint-4"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 4, "max_steps": 4}))
    with pytest.raises(ConfigError, match="had trained all 4 steps.*nothing is left to train.*stay as they are"):
        resumable_run(cfg)
    run = client.get_run(run_id)
    assert run.info.status == "KILLED" and "train_loss" not in run.data.metrics
    shutil.rmtree(checkpoint)
    with pytest.raises(ConfigError, match="nothing to resume"):
        resumable_run(cfg)
    assert os.listdir(workdir / "runs" / run_id) == []


COMPARE = ["compare", "--offline", "--max_steps", "24", "--checkpoint_steps", "2", "--logging_steps", "1",
           "--repeats", "1", "--eval_samples", "0", "--save_model", "false"]


def runs_child(process) -> bool:
    """Whether process is a variant's training process (python -m dsnb.child)."""
    import psutil

    try:
        return "dsnb.child" in process.cmdline()
    except psutil.Error:  # a short-lived helper process (ldconfig, say) that has ended meanwhile
        return False


def freeze_holding_no_store_lock(proc, db) -> None:
    """SIGSTOP proc (a psutil.Process) at a moment it holds no lock on the SQLite store db. Frozen inside a write it
    would keep the lock, and every reader and writer would wait for it and fail after MLflow's 20 s busy wait: the
    test's own reads (CI saw that), the rerun's, the orphan's stop record. Probed by taking the store's exclusive lock
    without waiting; held by anyone, the process runs on a moment and is frozen again."""
    import sqlite3
    import time

    for _ in range(500):
        proc.suspend()
        probe = sqlite3.connect(db, timeout=0, isolation_level=None)
        try:
            probe.execute("BEGIN EXCLUSIVE")
            probe.execute("ROLLBACK")
            return
        except sqlite3.OperationalError:
            proc.resume()
        except BaseException:
            proc.resume()
            raise
        finally:
            probe.close()
        time.sleep(0.02)
    raise AssertionError(f"the store {db} stayed locked: no moment to freeze {proc.pid} outside a write")


# sitecustomize for the training processes (python -m dsnb.child) of the pass kill_compare kills: each step 0.25 s
# longer, so the kill lands between step 3 and the end however late a loaded machine lets the test see step 3 (24
# steps took 1.8 s in all)
SLOW_STEPS = r"""
import sys, threading, time
if b"dsnb.child" in open("/proc/self/cmdline", "rb").read():
    def plant():
        while not hasattr(sys.modules.get("dsnb.train"), "StepCallback"):
            time.sleep(0.01)
        callback = sys.modules["dsnb.train"].StepCallback
        step_end = callback.on_step_end
        def slowed(self, *args, **kwargs):
            time.sleep(0.25)
            return step_end(self, *args, **kwargs)
        callback.on_step_end = slowed
    threading.Thread(target=plant, daemon=True).start()
"""


def kill_compare(workdir, freeze: bool = False, env: dict | None = None):
    """Start COMPARE, its steps slowed (SLOW_STEPS), and SIGKILL its process group once With_DeepSpeed has logged
    step 3; returns that run and its training process (a psutil.Process), which lives on in a session of its own (an
    orphan, stopping itself). freeze: SIGSTOP that process first, so it is still there, its run not yet recorded,
    however long the next command takes to start."""
    import signal
    import time

    import psutil

    from conftest import planted

    env = planted(workdir / "slow", SLOW_STEPS, env)
    child = subprocess.Popen([sys.executable, "-m", "dsnb", *COMPARE], cwd=workdir, start_new_session=True, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client, target, trainer = None, None, None
    deadline = time.time() + 600
    while child.poll() is None and time.time() < deadline:
        if (workdir / "mlflow.db").exists():
            client = client or mlflow_client(f"sqlite:///{workdir}/mlflow.db")
            exp = client.get_experiment_by_name("DeepSpeed_Comparison")
            runs = client.search_runs([exp.experiment_id]) if exp else []
            target = next((r for r in runs if r.info.run_name == "With_DeepSpeed"), None)
            if target and any(m.step >= 3 for m in client.get_metric_history(target.info.run_id, "loss")):
                trainer = next(p for p in psutil.Process(child.pid).children(recursive=True) if runs_child(p))
                if freeze:
                    freeze_holding_no_store_lock(trainer, workdir / "mlflow.db")
                os.killpg(child.pid, signal.SIGKILL)
                break
        time.sleep(0.2)
    child.wait()
    assert target is not None and child.returncode == -9
    killed = mlflow.MlflowClient(f"sqlite:///{workdir}/mlflow.db").get_run(target.info.run_id)
    assert killed.info.status != "FINISHED", "the kill came after the run finished: nothing was left to resume"
    return target, trainer


def assert_resumed_whole(workdir, again, target):
    """The comparison run again kept the finished variant and resumed the other into its own run, which reads as one
    never stopped: FINISHED, every step's loss once, no failure recorded on it."""
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Without_DeepSpeed (run 1 of 1: repeat 0): kept its FINISHED run" in again.stdout
    # interrupted: its process saw the launcher go, stopped and recorded it (the rerun waits for that)
    assert re.search(f"With_DeepSpeed \\(run 1 of 1: repeat 0\\): resumes its run {target.info.run_id} "
                     "\\(interrupted\\) from checkpoint-", again.stdout), (  # its stopped process's log, on a failure
        again.stdout, again.stderr[-3000:],
        read_log(mlflow.MlflowClient(f"sqlite:///{workdir}/mlflow.db"), target.info.run_id)[-4000:])
    client = mlflow.MlflowClient(f"sqlite:///{workdir}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("DeepSpeed_Comparison").experiment_id])
    assert sorted((r.info.run_name, r.info.status) for r in runs) == [("With_DeepSpeed", "FINISHED"),
                                                                      ("Without_DeepSpeed", "FINISHED")]
    resumed = client.get_run(target.info.run_id)
    assert not {"failure", "error"} & set(resumed.data.tags), resumed.data.tags
    assert loss_curve(client, target.info.run_id)[0] == list(range(1, 25))
    # its log is every process's that trained it: the stopped one's steps and stop, then the resumed one's (the
    # resumed part's alone had replaced it)
    log = read_log(client, target.info.run_id)
    assert "dsnb: interrupted" in log and log.count("{'loss'") >= 24, log[-3000:]


def read_log(client, run_id: str) -> str:
    with open(client.download_artifacts(run_id, "train.log")) as f:
        return f.read()


def test_compare_run_again_after_a_kill_keeps_what_finished_and_resumes_what_did_not(workdir):
    """The whole comparison killed mid-way (a Colab runtime that ends): running it again keeps the finished variant,
    resumes the interrupted one from its checkpoint into its own run, and says so (a finished comparison run again
    starts a new one: tests/test_compare.py). 24 steps: on a loaded machine the loss reaches the store in batches at
    checkpoints, and with 8 the run had sometimes finished by the time the kill came."""
    target, _ = kill_compare(workdir)
    assert_resumed_whole(workdir, dsnb(*COMPARE, cwd=workdir), target)


def test_a_rerun_waits_for_the_training_process_a_killed_dsnb_left(workdir):
    """A kernel killed while a variant trains (Jupyter's restart, a terminal closed) leaves that variant's training
    process running alone until it notices and stops, recording its run. Run again before it has, the comparison
    waits for it: started at once, it would train beside it on the GPU (memory measured for two) and resume the run
    the orphan then records over (CI saw the store locked by it). The orphan is frozen here, so the rerun starts
    before it can stop; it is let go once the rerun says it waits."""
    import time

    (workdir / "tmp").mkdir()
    env = {**os.environ, "TMPDIR": str(workdir / "tmp")}  # where each variant's launch folder is made
    target, orphan = kill_compare(workdir, freeze=True, env=env)
    with open(workdir / "out.txt", "w") as out, open(workdir / "err.txt", "w") as err:
        rerun = subprocess.Popen([sys.executable, "-m", "dsnb", *COMPARE], cwd=workdir, stdout=out, stderr=err,
                                 env=env)
    deadline = time.time() + 300
    while "waiting for" not in (workdir / "err.txt").read_text() and rerun.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    orphan.resume()  # once the rerun waits for it: it stops itself now, recording its run
    rerun.wait(timeout=600)
    again = subprocess.CompletedProcess(rerun.args, rerun.returncode, (workdir / "out.txt").read_text(),
                                        (workdir / "err.txt").read_text())
    assert re.search(rf"waiting for \d+ training process\(es\) of a dsnb that was stopped \(pid [^)]*\b{orphan.pid}\b",
                     again.stderr), again.stderr[-3000:]
    assert not orphan.is_running() or orphan.status() == "zombie"
    assert_resumed_whole(workdir, again, target)
    assert not list((workdir / "tmp").glob("dsnb-*"))  # the orphan removed its killed dsnb's launch folder


def test_a_finished_run_keeps_its_log_when_its_dsnb_is_killed_as_the_run_ends(workdir):
    """A variant's training process records its run FINISHED and exits; the dsnb that started it then attaches the
    output as train.log. Killed in between (its kernel or runtime gone as the variant ends), it left the run FINISHED
    without a log, and every rerun kept it so. Here dsnb is frozen (SIGSTOP) until its first variant's process has
    ended, then killed."""
    import signal
    import time

    import psutil

    from dsnb.preflight import alive

    with open(workdir / "out.txt", "w") as out:
        parent = subprocess.Popen([sys.executable, "-m", "dsnb", *COMPARE], cwd=workdir, start_new_session=True,
                                  stdout=out, stderr=subprocess.STDOUT)
    deadline, trainer = time.time() + 600, None
    while trainer is None and parent.poll() is None and time.time() < deadline:
        trainer = next((p for p in psutil.Process(parent.pid).children() if runs_child(p)), None)
        time.sleep(0.1)
    assert trainer is not None, (workdir / "out.txt").read_text()[-3000:]
    freeze_holding_no_store_lock(psutil.Process(parent.pid), workdir / "mlflow.db")
    while alive(trainer.pid) and time.time() < deadline:  # ended: a zombie its frozen parent does not reap
        time.sleep(0.2)
    os.killpg(parent.pid, signal.SIGKILL)
    parent.wait()
    client = mlflow.MlflowClient(f"sqlite:///{workdir}/mlflow.db")
    [run] = client.search_runs([client.get_experiment_by_name("DeepSpeed_Comparison").experiment_id])
    assert (run.info.run_name, run.info.status) == ("Without_DeepSpeed", "FINISHED"), run.data.tags
    log = read_log(client, run.info.run_id)
    assert log.count("{'loss'") == 24, log[-3000:]  # every step's line


def test_checkpoints_come_by_the_clock_and_leave_the_throughput_alone(tmp_path):
    """checkpoint_minutes (colab_t4's 10, every run's default) saves a checkpoint once that much training time has
    passed, with no checkpoint_steps; the time the saving took is measured and left out of the throughput."""
    from conftest import train_here

    cfg = RunConfig(**dict(OFFLINE, quantization="none", max_steps=4, eval_samples=0, save_model=False,
                           checkpoint_minutes=0.0001, tracking_uri=f"sqlite:///{tmp_path}/mlflow.db",
                           output_dir=str(tmp_path / "runs")))
    runs = train_here([cfg, cfg.replace(checkpoint_minutes=0, run_name="none")], tmp_path)
    assert runs[cfg.name].metrics["checkpoint_seconds"] > 0 and runs["none"].metrics["checkpoint_seconds"] == 0
    assert runs[cfg.name].curve == pytest.approx(runs["none"].curve, rel=1e-6)  # saving changes nothing trained


def test_an_unreadable_checkpoint_is_moved_aside_once_and_never_resumed_from_again(workdir, capsys):
    """A checkpoint whose file is not the size written (a machine that died as Drive flushed it) or whose state cannot
    be read: a resume from it would fail the same way on every rerun. It is said, moved aside, and passed over."""
    from dsnb.tracking import list_files

    cfg = RunConfig.layered(dict(OFFLINE, max_steps=8, checkpoint_steps=2, run_name="damaged"))
    run_id = create_run(cfg)
    finish(run_id, cfg.tracking_uri, "KILLED")
    folder = workdir / "runs" / run_id
    for step in (2, 4):
        checkpoint = folder / f"checkpoint-{step}"
        checkpoint.mkdir(parents=True)
        (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": step, "max_steps": 8}))
        (checkpoint / "adapter_model.safetensors").write_bytes(b"\0" * 4096)
        list_files(str(checkpoint))
    where = os.path.join(cfg.output_dir, run_id)  # as the config names it (relative here)
    assert resumable_run(cfg) == (run_id, os.path.join(where, "checkpoint-4"))  # whole: resumed from
    (folder / "checkpoint-4" / "adapter_model.safetensors").write_bytes(b"\0" * 1000)  # cut short
    assert resumable_run(cfg) == (run_id, os.path.join(where, "checkpoint-2"))  # the older one, whole
    err = capsys.readouterr().err
    assert f"from {where}/checkpoint-4: adapter_model.safetensors is 1000 bytes, 4096 written; moved aside" in err
    assert (folder / "unreadable-checkpoint-4" / CHECKPOINT_FILES).exists()
    (folder / "checkpoint-2" / CHECKPOINT_FILES).unlink()  # as an earlier dsnb wrote it: its state alone is checked
    (folder / "checkpoint-2" / "trainer_state.json").write_text('{"global_st')
    with pytest.raises(ConfigError, match="nothing to resume"):
        resumable_run(cfg)
    assert "checkpoint-2: trainer_state.json is missing or unreadable; moved aside" in capsys.readouterr().err
    assert sorted(p.name for p in folder.iterdir()) == ["unreadable-checkpoint-2", "unreadable-checkpoint-4"]
    # the Trainer's rotation (save_total_limit 1) after a checkpoint of the resumed run: the new one stays
    from transformers.trainer_utils import get_last_checkpoint, rotate_checkpoints
    (folder / "checkpoint-3").mkdir()
    rotate_checkpoints(output_dir=str(folder), save_total_limit=1, best_model_checkpoint=None, use_mtime=False)
    assert get_last_checkpoint(str(folder)) == str(folder / "checkpoint-3")


def test_resume_after_the_run_finished_says_so_and_never_resumes_an_older_killed_run(workdir):
    """--resume once the newest run of the config finished: nothing to resume, said with that run; an older killed
    run's checkpoint (work that the finished run did since) is left alone."""
    from dsnb.tracking import list_files

    cfg = RunConfig.layered(dict(OFFLINE, max_steps=8, checkpoint_steps=2, run_name="done"))
    older = create_run(cfg)
    finish(older, cfg.tracking_uri, "KILLED")
    checkpoint = workdir / "runs" / older / "checkpoint-2"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 2, "max_steps": 8}))
    list_files(str(checkpoint))
    assert resumable_run(cfg)[0] == older
    newer = create_run(cfg)
    finish(newer, cfg.tracking_uri, "FINISHED")
    with pytest.raises(ConfigError, match=re.escape(f"nothing to resume: run done ({newer}) finished")):
        resumable_run(cfg)


def test_two_comparisons_started_at_once_on_one_store_train_it_once(workdir):
    """Two `dsnb compare` of one config started together (two terminals, or two reruns after a kill): the second waits
    for the first and keeps what it finished, so the store holds one run of each variant and no job trains twice."""
    flags = ["compare", "--offline", "--repeats", "1", "--max_steps", "2", "--eval_samples", "0", "--save_model",
             "false"]
    runs = [subprocess.Popen([sys.executable, "-m", "dsnb", *flags], cwd=workdir, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outputs = [run.communicate(timeout=600)[0] for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    client = mlflow_client(f"sqlite:///{workdir}/mlflow.db")
    found = client.search_runs([client.get_experiment_by_name("DeepSpeed_Comparison").experiment_id])
    assert sorted((r.info.run_name, r.info.status) for r in found) == [("With_DeepSpeed", "FINISHED"),
                                                                       ("Without_DeepSpeed", "FINISHED")], outputs
    waited = [out for out in outputs if "another dsnb process is running a comparison" in out]
    assert len(waited) == 1 and "nothing is trained again" in waited[0], outputs
