"""Interrupts as users send them, each while a variant trains: Jupyter's "Interrupt kernel" (SIGINT to the kernel's
process alone), Ctrl-C in a terminal (SIGINT to the whole foreground group) and SIGTERM (a scheduler, `kill`).
Every time the variant stops at once, its run ends KILLED with its log and what it measured, nothing is left
running or behind, and a notebook's kernel lives on."""
import os
import re
import signal
import subprocess
import sys

import mlflow
import pytest

from conftest import LONG, assert_killed_with_what_it_measured, no_child_left, reply_to, wait_for_training

from dsnb.config import OFFLINE

pytestmark = pytest.mark.integration


def test_jupyter_interrupt_stops_the_running_variant(workdir):
    from jupyter_client.manager import start_new_kernel

    uri = f"sqlite:///{workdir}/mlflow.db"
    km, kc = start_new_kernel(kernel_name="python3", cwd=str(workdir), env={**os.environ, "TMPDIR": str(workdir)})
    try:
        msg_id = kc.execute("import dsnb\n"
                            f"dsnb.run_all([dsnb.RunConfig(**{LONG!r}, tracking_uri={uri!r}, run_name='nb-long')], "
                            "progress=False)")
        run = wait_for_training(uri, "nb-long")
        km.interrupt_kernel()  # what Jupyter's button does: SIGINT to the kernel's process, not its children
        reply = reply_to(kc, msg_id, timeout=180)
        assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt"
        assert_killed_with_what_it_measured(uri, run.info.run_id)
        # what stopped it in words (a resumed run's tag quotes this), not "KeyboardInterrupt"
        assert mlflow.MlflowClient(uri).get_run(run.info.run_id).data.tags["error"] == \
            "interrupted: its parent stopped it (Ctrl-C, a stop button, SIGTERM)"
        no_child_left(str(workdir))
        assert not [p for p in os.listdir(workdir) if p.startswith("dsnb-")]  # the child's temporary folder is gone
        assert reply_to(kc, kc.execute("x = 6 * 7"), timeout=60)["status"] == "ok"  # the kernel lives on
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_sigterm_to_compare_stops_its_variant_and_leaves_nothing(workdir):
    uri = f"sqlite:///{workdir}/mlflow.db"
    flags = [f"--{k}={v}" for k, v in LONG.items() if OFFLINE.get(k) != v]  # --offline, then LONG's own
    compare = subprocess.Popen([sys.executable, "-m", "dsnb", "compare", "--offline", *flags], cwd=workdir,
                               env={**os.environ, "TMPDIR": str(workdir)}, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    run = wait_for_training(uri, "Without_DeepSpeed")
    compare.send_signal(signal.SIGTERM)
    assert compare.wait(timeout=180) == 130
    stderr = compare.stderr.read()
    assert "interrupted" in stderr
    bars = re.findall(r"variants: .*?\| (\d+)/(\d+)", stderr)  # the bar over the variants, each time it was drawn
    assert bars and bars[-1][0] == "0", bars  # the stopped variant is not counted as done
    assert_killed_with_what_it_measured(uri, run.info.run_id)
    client = mlflow.MlflowClient(uri)
    names = [r.info.run_name for r in client.search_runs([client.get_experiment_by_name("DeepSpeed_Comparison")
                                                           .experiment_id])]
    assert names == ["Without_DeepSpeed"]  # the next variant never started
    no_child_left(str(workdir))
    assert not [p for p in os.listdir(workdir) if p.startswith("dsnb-")]


def test_ctrl_c_in_a_terminal_ends_the_run_killed(workdir):
    uri = f"sqlite:///{workdir}/mlflow.db"
    flags = [f"--{k}={v}" for k, v in LONG.items() if OFFLINE.get(k) != v]  # --offline, then LONG's own
    run_process = subprocess.Popen([sys.executable, "-m", "dsnb", "run", "--offline", *flags, "--run_name", "ctrl-c"],
                                   cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   start_new_session=True,  # a terminal's foreground job: SIGINT not ignored
                                   preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    run = wait_for_training(uri, "ctrl-c")
    os.killpg(run_process.pid, signal.SIGINT)  # a terminal sends it to the whole foreground group
    assert run_process.wait(timeout=180) == 130
    client = mlflow.MlflowClient(uri)
    run = client.get_run(run.info.run_id)
    assert run.info.status == "KILLED" and run.data.tags["failure"] == "interrupted"
    assert run.data.metrics["peak_cpu_rss_mb"] > 100 and "error.txt" in {a.path for a in
                                                                        client.list_artifacts(run.info.run_id)}


def test_a_variant_whose_parent_is_killed_stops_itself(workdir):
    """SIGKILL to the process that started a variant (a kernel killed, a terminal closed): no orphan trains on, also
    where it was started as a shell's background job (SIGINT ignored, which Python and its children inherit)."""
    uri = f"sqlite:///{workdir}/mlflow.db"
    code = ("import dsnb; dsnb.run_all([dsnb.RunConfig(**%r, tracking_uri=%r, run_name='orphan')], progress=False)"
            % (LONG, uri))
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=workdir, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, env={**os.environ, "TMPDIR": str(workdir)},  # child.json here
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    run = wait_for_training(uri, "orphan")
    parent.kill()
    parent.wait()
    assert_killed_with_what_it_measured(uri, run.info.run_id)  # KILLED, failure=interrupted, its log and metrics
    assert mlflow.MlflowClient(uri).get_run(run.info.run_id).data.tags["error"] == \
        f"interrupted: its parent process {parent.pid} ended (killed, or its kernel or runtime stopped)"
    no_child_left(str(workdir))
    assert not [p for p in os.listdir(workdir) if p.startswith("dsnb-")]  # the orphan removed its folder


def test_a_process_ended_by_exit_now_keeps_what_it_printed_and_what_its_threads_finish(tmp_path):
    """exit_now (how `python -m dsnb` and a variant's process end, less the interpreter's slow teardown): output of C
    code (DeepSpeed's CPU Adam and NCCL print through the C library's buffer), Python's own, a non-daemon thread's and
    an exit handler's all reach a file, and the code is the process's."""
    script = ("import atexit, ctypes, sys, threading, time\n"
              "from dsnb.launch import exit_now\n"
              "ctypes.CDLL(None).printf(b'from C\\n')\n"
              "threading.Thread(target=lambda: (time.sleep(0.5), print('thread finished'))).start()\n"
              "atexit.register(lambda: print('exit handler ran'))\n"
              "print('from Python', end='')\n"
              "exit_now(3)\n")
    with open(tmp_path / "out.txt", "w") as out:
        done = subprocess.run([sys.executable, "-c", script], stdout=out, stderr=subprocess.STDOUT, timeout=300,
                              env={k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"})
    text = (tmp_path / "out.txt").read_text()
    assert done.returncode == 3 and "from C" in text and "thread finished" in text and "exit handler ran" in text, text
    assert "from Python" in text, text
