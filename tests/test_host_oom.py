"""Host RAM that runs out: the kernel's out-of-memory killer SIGKILLs a variant's training process. Its run must read
FAILED out of memory (host RAM), with the peak its process reached, as one out of GPU memory does, so that a comparison
run again keeps it as the answer (it does not fit) instead of training it again; a process SIGKILLed for any other
reason stays KILLED (and is resumed or run again).

The real killer, in a memory cgroup of its own with a limit (v1 or v2; skipped where the test may not make one): dsnb
runs in it, and its training process is made to outgrow the limit (a planted allocation at its start, standing for a
model too large for the machine's RAM)."""
import contextlib
import os
import signal
import subprocess
import sys
import time

import mlflow
import pytest

from conftest import planted
from dsnb.compare import run_ended
from dsnb.metrics import oom_kills

pytestmark = pytest.mark.integration
LIMIT = 2 * 2**30  # the cgroup's: dsnb's own process stays well under half of it, so the killer picks the trainer
# sitecustomize for the training process alone (python -m dsnb.child): grow until killed, or SIGKILL itself
PLANT = r"""
import os, signal
if b"dsnb.child" in open("/proc/self/cmdline", "rb").read():
    if os.environ.get("PLANT") == "grow":
        grown = []
        while True:
            grown.append(b"x" * 2**26)  # written, so resident: 64 MB at a time
    else:
        os.kill(os.getpid(), signal.SIGKILL)
"""
# the same for `python -m dsnb run`, which trains in its own process: grow (or SIGKILL itself) once it trains
PLANT_RUN = r"""
import os, signal, sys, threading, time
if open("/proc/self/cmdline", "rb").read().split(b"\0")[1:4] == [b"-m", b"dsnb", b"run"] and os.environ.get("PLANT"):
    def plant():
        while "dsnb.train" not in sys.modules:  # imported once its run is open
            time.sleep(0.05)
        grown = []
        while os.environ["PLANT"] == "grow":
            grown.append(b"x" * 2**26)
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(target=plant, daemon=True).start()
"""


def own_cgroup() -> tuple[str, str] | None:
    """(the folder of this process's memory cgroup, "v1" or "v2"), where a child cgroup can be made in it."""
    for line in open("/proc/self/cgroup").read().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            folder, version = f"/sys/fs/cgroup/memory{path}", "v1"
        elif controllers == "" and os.path.exists(f"/sys/fs/cgroup{path}/memory.events"):
            folder, version = f"/sys/fs/cgroup{path}", "v2"
        else:
            continue
        if os.path.isdir(folder) and os.access(folder, os.W_OK):
            return folder, version
    return None


@contextlib.contextmanager
def memory_cgroup(limit: int):
    """A new memory cgroup limited to `limit` bytes (no swap either); its cgroup.procs file, for a process to join."""
    found = own_cgroup()
    if found is None:
        pytest.skip("needs a memory cgroup this user may make a child of (root, cgroup v1 or v2 with the memory "
                    "controller)")
    parent, version = found
    folder = os.path.join(parent, f"dsnb-test-{os.getpid()}-{time.monotonic_ns()}")
    try:
        os.mkdir(folder)
        files = {"v1": ["memory.limit_in_bytes", "memory.memsw.limit_in_bytes"],
                 "v2": ["memory.max", "memory.swap.max"]}
        for name in files[version]:
            if os.path.exists(os.path.join(folder, name)):
                with open(os.path.join(folder, name), "w") as f:
                    f.write(str(limit) if "swap" not in name else "0")
    except OSError as e:
        with contextlib.suppress(OSError):
            os.rmdir(folder)
        pytest.skip(f"a memory cgroup could not be made here ({e})")
    try:
        yield os.path.join(folder, "cgroup.procs")
    finally:
        deadline = time.time() + 30
        while time.time() < deadline:
            pids = [int(p) for p in open(os.path.join(folder, "cgroup.procs")).read().split()]
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.rmdir(folder)
                break
            time.sleep(0.5)


def dsnb_in(procs: str | None, workdir, plant: str, *args: str) -> subprocess.CompletedProcess:
    """`python -m dsnb ARGS` in the cgroup of `procs` (None: where the test runs), its training processes planted."""
    env = {**planted(workdir / "plant", PLANT + PLANT_RUN), "PLANT": plant if plant != "none" else ""}
    join = f'echo $$ > "{procs}" && ' if procs else ""
    command = ["sh", "-c", join + 'exec "$@"', "sh", sys.executable, "-m", "dsnb", *args]
    return subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=600)


COMPARE = ["compare", "--offline", "--repeats", "1", "--max_steps", "4", "--eval_samples", "0", "--save_model", "false"]


def the_runs(workdir) -> list:
    client = mlflow.MlflowClient(f"sqlite:///{workdir}/mlflow.db")
    return client.search_runs([e.experiment_id for e in client.search_experiments()],
                              order_by=["attributes.start_time ASC"])


def test_a_trainer_killed_by_the_host_oom_killer_is_recorded_out_of_memory_and_kept(workdir):
    assert oom_kills() is not None or own_cgroup() is None  # a machine with a memory cgroup has its counter read
    with memory_cgroup(LIMIT) as procs:
        grown = dsnb_in(procs, workdir, "grow", *COMPARE)
    assert grown.returncode == 1, grown.stderr[-3000:]  # a variant failed
    assert "host RAM ran out" in grown.stdout + grown.stderr
    runs = the_runs(workdir)
    assert [r.info.run_name for r in runs] == ["Without_DeepSpeed", "With_DeepSpeed"]
    for run in runs:
        assert run.info.status == "FAILED" and run.data.tags["failure"] == "oom", run.data.tags
        assert run.data.tags["error"].startswith("host RAM ran out")
        # what its process had reached when killed: most of the cgroup's limit (dsnb's own process holds the rest)
        assert LIMIT / 2 < run.data.metrics["peak_cpu_rss_mb"] * 2**20 < LIMIT, run.data.metrics
    again = dsnb_in(None, workdir, "none", *COMPARE)  # the comparison run again, with all the RAM it wants
    assert again.returncode == 1, again.stderr[-3000:]  # its variants did not finish
    assert again.stdout.count("kept its FAILED run") == 2, again.stdout[-3000:]
    assert again.stdout.count("FAILED: out of host RAM") == 2  # the table says why
    assert len(the_runs(workdir)) == 2  # nothing trained again: out of RAM is the answer, as out of GPU memory is


def test_a_trainer_sigkilled_from_elsewhere_is_killed_not_out_of_memory(workdir):
    with memory_cgroup(LIMIT) as procs:
        killed = dsnb_in(procs, workdir, "kill", *COMPARE[:-4])
    assert killed.returncode == 1, killed.stderr[-3000:]
    assert "host RAM" not in killed.stdout + killed.stderr
    runs = the_runs(workdir)
    assert [(r.info.status, r.data.tags.get("failure")) for r in runs] == [("KILLED", None)] * 2, \
        [r.data.tags for r in runs]
    assert not any(run_ended(r) for r in runs)  # resumed or run again next time


RUN = ["run", "--offline", "--max_steps", "2", "--eval_samples", "0", "--save_model", "false"]


@pytest.mark.parametrize("plant", ["grow", "kill"])
def test_dsnb_run_killed_in_its_own_process_is_told_likely_out_of_host_ram_only_when_the_killer_struck(workdir, plant):
    """`dsnb run` trains in its own process, so no dsnb process sees how it ended: the next dsnb started finds its run
    still RUNNING and its process gone, and records it KILLED; where the out-of-memory killer's count in the run's
    memory cgroup rose meanwhile, it says so (likely out of host RAM), and not where the process was SIGKILLed from
    elsewhere."""
    with memory_cgroup(LIMIT) as procs:
        lost = dsnb_in(procs, workdir, plant, *RUN, "--run_name", "lost")
        assert lost.returncode == -signal.SIGKILL, lost.stderr[-3000:]
        [run] = the_runs(workdir)
        assert run.info.status == "RUNNING" and run.data.tags["dsnb.oom_kills"].startswith("0 "), run.data.tags
        client = mlflow.MlflowClient(f"sqlite:///{workdir}/mlflow.db")  # a second lost run beside it, tagged the same:
        twin = client.create_run(run.info.experiment_id, run_name="twin", tags={  # one kill is put down to one run
            k: v for k, v in run.data.tags.items() if k.startswith("dsnb.")}).info.run_id
        after = dsnb_in(procs, workdir, "none", *RUN, "--run_name", "after")  # the next start, in the same cgroup
    assert after.returncode == 0, after.stderr[-3000:]
    lost, twin, _ = the_runs(workdir)
    assert lost.info.status == twin.info.status == "KILLED" and lost.data.tags["failure"] == "killed", lost.data.tags
    if "oom" in twin.data.tags:  # which of the two takes the one kill is the store's order
        lost, twin = twin, lost
    assert "oom" not in twin.data.tags and "out-of-memory" not in twin.data.tags["error"], twin.data.tags
    from dsnb.report import status_label

    if plant == "grow":
        assert lost.data.tags["oom"] == "host RAM" and "out-of-memory killer took 1 process" in lost.data.tags["error"]
        assert status_label(lost) == "KILLED: likely out of host RAM"
        assert f"run {lost.info.run_id} ({lost.info.run_name}) is recorded KILLED" in after.stderr
        assert "host RAM ran out" in after.stderr
    else:
        assert "oom" not in lost.data.tags and "out-of-memory" not in lost.data.tags["error"], lost.data.tags
        assert status_label(lost) == "KILLED" and "recorded KILLED" not in after.stderr
