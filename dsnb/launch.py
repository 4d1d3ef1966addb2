"""Each variant in a fresh child process: run_variant for one, run_all for several.

    result = run_variant(RunConfig(**OFFLINE, strategy="zero2", offload_optimizer="cpu"))
    result.status, result.metrics["peak_cpu_rss_mb"]   # and peak_gpu_allocated_mb where it trained on a GPU
    results = run_all(cfgs, gpus=2)        # two at a time, one per GPU

The parent opens the MLflow run and writes one child description (config, run id, progress file) as
JSON; the child (`python -m dsnb.child child.json`, under torchrun for several GPUs) trains and logs
into that run, writing its output to the run's train.log and its progress to the progress file. A child
that fails or dies leaves a FAILED or KILLED run with its log; an interrupt (Ctrl-C, Jupyter's "Interrupt
kernel", SIGTERM) stops the child too, which ends its run KILLED with what it measured so far.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from . import metrics, preflight, tracking
from .config import ConfigError, RunConfig, redact
from .tracking import RunResult

SWEEP_RUN_ENV = "DSNB_SWEEP_RUN_ID"  # a sweep opens the run, then its notebook's run_variant logs into it ...
SWEEP_RESUME_ENV = "DSNB_SWEEP_RESUME"  # ... resuming it from this checkpoint where the sweep found it interrupted
STOP_GRACE_S = 60  # an interrupted child gets this long to record its run KILLED before it is killed
_ACTIVE: set[subprocess.Popen] = set()  # children running now, stopped together on an interrupt
_LOCK = threading.Lock()


def run_variant(cfg: RunConfig, progress: bool = True, tags: dict | None = None, env: dict | None = None,
                beside: int = 1, resume: tuple[str, str] | None = None) -> RunResult:
    """Run cfg in a fresh Python process as one MLflow run; never raises for a failed run.

    env adds variables to the child's environment (CUDA_VISIBLE_DEVICES, say); beside: how many variants share the
    host at once (their cores are shared out: child_env); resume: (run id, checkpoint) to continue that run from.
    """
    with tracking.interrupts_after_writes():  # a kernel's interrupt mid-write would leave the store locked
        return _run_variant(cfg, progress, tags, env, beside, resume)


def _run_variant(cfg: RunConfig, progress: bool, tags: dict | None, env: dict | None, beside: int,
                 resume: tuple[str, str] | None) -> RunResult:
    from tqdm.auto import tqdm

    preflight.check(cfg)
    sweep_run, sweep_checkpoint = os.environ.pop(SWEEP_RUN_ENV, None), os.environ.pop(SWEEP_RESUME_ENV, None)
    if resume is None and sweep_run and sweep_checkpoint:
        if not tracking.same_config(tracking.mlflow_client(cfg.tracking_uri).get_run(sweep_run), cfg):
            raise ConfigError(f"the sweep resumes run {sweep_run} from {sweep_checkpoint}, but this notebook's first "
                              f"variant is {cfg.name} with another config; a sweep's notebook runs the sweep's variant")
        resume = sweep_run, sweep_checkpoint
    if resume:
        tracking.reopen_run(resume[0], cfg.tracking_uri)
    run_id = tracking.create_run(cfg, tags, resume[0] if resume else sweep_run)
    bar = tqdm(desc=cfg.name, unit="step", disable=not progress, leave=True)
    started = time.perf_counter()
    preflight.remove_left_folders()
    with tempfile.TemporaryDirectory(prefix="dsnb-") as tmp:
        log_file, progress_file = os.path.join(tmp, "train.log"), os.path.join(tmp, "progress")
        child_file = os.path.join(tmp, "child.json")
        if resume:
            _log_so_far(run_id, cfg.tracking_uri, tmp)
        with open(child_file, "w") as f:
            json.dump({"config": cfg.to_dict(), "run_id": run_id, "progress": progress_file,
                       "parent_pid": os.getpid(), "checkpoint": resume[1] if resume else None}, f)
        # Several GPUs: torchrun starts one process per GPU; each rank trains, rank 0 logs into run_id.
        launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={cfg.num_gpus}"]
        command = [sys.executable, *(launcher if cfg.num_gpus > 1 else []), "-m", "dsnb.child", child_file]
        kills, log_start = metrics.oom_kills(), os.path.getsize(log_file) if os.path.exists(log_file) else 0
        try:  # this process beats too, from the run's first second: a run lost while its child loads is seen
            with tracking.heartbeat(run_id, cfg.tracking_uri):
                returncode, peak_mb = _watch(command, child_env(cfg.num_gpus * beside, {
                    **os.environ, **(env or {}), preflight.PARENT_ENV: str(os.getpid())}), log_file, progress_file, bar)
        except BaseException:
            _close(run_id, cfg, log_file, "KILLED")
            raise
        finally:
            bar.close()
        host_oom = _host_oom(returncode, cfg, kills, run_id, peak_mb, (log_file, log_start))
        ending = "FAILED" if returncode > 0 or host_oom else "KILLED" if returncode else None
        status = _close(run_id, cfg, log_file, ending)
        if returncode and progress:
            print(f"{cfg.name}: the run ended {status} (exit {returncode}); last lines of its log:\n" + _tail(log_file))
            if host_oom:
                print(f"{cfg.name}: {tracking.HOST_OOM}")
    return RunResult.read(cfg.tracking_uri, run_id, returncode=returncode,
                          wall_seconds=time.perf_counter() - started)


def child_env(processes: int, env: dict, cpus: int | None = None) -> dict:
    """The environment of a child that shares the host's cores with `processes` - 1 others (its torchrun ranks,
    or variants side by side on other GPUs): OMP_NUM_THREADS = its share. Unset, torchrun would give each rank
    one thread, and side-by-side children would each take every core; DeepSpeed's CPU Adam runs on these
    OpenMP threads, so an offloaded optimizer would update on one core per rank, or fight the other runs for
    the cores. A value the user set is kept."""
    env = {**env, "PYTHONUNBUFFERED": "1"}
    if processes > 1 and not env.get("OMP_NUM_THREADS"):
        cpus = cpus or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
        env["OMP_NUM_THREADS"] = str(max(1, cpus // processes))
    return env


def _watch(command: list[str], env: dict, log_file: str, progress_file: str, bar) -> tuple[int, float | None]:
    """Start the child, follow its progress file into the bar until it exits; stop it on an interrupt. Returns its
    exit code and its peak resident memory in MB (its largest process's, torchrun's ranks included; None where it
    could not be read)."""
    with open(log_file, "a") as log:  # after what a resumed run's log holds (_log_so_far)
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    with _LOCK:
        _ACTIVE.add(child)
    try:
        seen = 0
        while True:
            peak_mb = _reap(child)
            done = child.returncode is not None
            seen = _follow(progress_file, seen, bar)
            if done:
                return child.returncode, peak_mb
            time.sleep(0.2)
    except BaseException:
        stop(child)
        raise
    finally:
        with _LOCK:
            _ACTIVE.discard(child)


def _host_oom(returncode: int, cfg: RunConfig, kills_before: int | None, run_id: str, peak_mb: float | None,
              log: tuple[str, int]) -> bool:
    """Whether the child died of the kernel's out-of-memory killer: SIGKILLed (for several GPUs, torchrun saying a
    rank was), while the killer's count in this memory cgroup went up by a kill no other child of this process has
    claimed (children side by side); if so its run is recorded FAILED out of memory (host RAM). The count is the
    cgroup's: in a container, any process of it that the killer took counts, so a SIGKILL from elsewhere at that
    very moment would be read as out of memory."""
    global _OOM_CLAIMED
    if kills_before is None or not (returncode == -signal.SIGKILL or cfg.num_gpus > 1 and returncode != 0
                                    and _rank_sigkilled(*log)):
        return False
    with _LOCK:
        if (metrics.oom_kills() or 0) <= max(kills_before, _OOM_CLAIMED):
            return False
        _OOM_CLAIMED = max(kills_before, _OOM_CLAIMED) + 1
    tracking.record_host_oom(run_id, cfg.tracking_uri, peak_mb)
    return True


_OOM_CLAIMED = 0  # the out-of-memory killer's count up to which kills were put down to this process's children


def _rank_sigkilled(log_file: str, start: int) -> bool:
    """Whether torchrun's output from start on (a resumed run's log holds its earlier passes' before) says a rank
    ended by SIGKILL ("exitcode  : -9", "Signal 9 (SIGKILL) received")."""
    with open(log_file, errors="replace") as f:
        f.seek(start)
        return re.search(r"exitcode\s*:\s*-9\b|Signal 9 \(SIGKILL\)", f.read()) is not None


def _reap(child: subprocess.Popen) -> float | None:
    """Wait for the child if it has ended (its returncode set, as Popen.poll would), with its peak resident memory in
    MB: what its processes had reached, read from the kernel's record of it, where the child could not log it. Under
    Popen's own wait lock, so a poll or wait from another thread (stop_all) never reaps it first and takes it for 0."""
    lock = getattr(child, "_waitpid_lock", None)
    if lock is None:  # another Python's Popen: its own poll
        child.poll()
        return None
    if not lock.acquire(False):  # Popen is waiting for it elsewhere: ask again next time
        return None
    try:
        if child.returncode is not None:
            return None
        pid, status, usage = os.wait4(child.pid, os.WNOHANG)
    except ChildProcessError:  # not ours to wait for: Popen's own poll decides, as it always did
        pid = None
    finally:
        lock.release()
    if pid is None:
        child.poll()
        return None
    if pid:
        child.returncode = os.waitstatus_to_exitcode(status)
        return usage.ru_maxrss / 1024  # KiB on Linux
    return None


def _follow(path: str, seen: int, bar) -> int:
    """Show the child's new progress records (JSON lines: a step, or a message) on the bar; returns the bytes
    read so far."""
    if not os.path.exists(path):
        return seen
    with open(path, "rb") as f:
        f.seek(seen)
        lines = f.read().splitlines(keepends=True)
    complete = [line for line in lines if line.endswith(b"\n")]
    for record in map(json.loads, complete):
        if "say" in record:
            if not bar.disable:
                bar.write(f"{bar.desc}: {record['say']}")
            continue
        bar.total = record["total"]
        if record["loss"] is not None:
            bar.set_postfix(loss=f"{record['loss']:.4g}", refresh=False)
        bar.update(record["step"] - bar.n)
    return seen + sum(len(line) for line in complete)


def stop(child: subprocess.Popen) -> None:
    """Interrupt a child's whole process group (torchrun's ranks too); kill it if it has not ended in time."""
    if child.poll() is not None:
        return
    try:
        os.killpg(child.pid, signal.SIGINT)
        child.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    except ProcessLookupError:
        child.wait()


def stop_all() -> None:
    """Stop every child this process runs (run_all's side-by-side variants on an interrupt)."""
    with _LOCK:
        children = list(_ACTIVE)
    for child in children:
        stop(child)


def _close(run_id: str, cfg: RunConfig, log_file: str, status: str | None) -> str:
    """Attach the log and end the run `status` if its process could not; returns the status the store holds."""
    client = tracking.mlflow_client(cfg.tracking_uri)
    attach_log(client, run_id, log_file)
    if status:
        tracking.finish(run_id, cfg.tracking_uri, status)
    return client.get_run(run_id).info.status


def attach_log(client, run_id: str, log_file: str) -> None:
    """The child's output as the run's train.log, credentials masked (a traceback may quote a URI with them)."""
    if os.path.exists(log_file):
        with open(log_file, errors="replace") as f:
            client.log_text(run_id, redact(f.read()), "train.log")


def _log_so_far(run_id: str, tracking_uri: str, folder: str) -> None:
    """Put the train.log of a run being resumed (the output of the processes that trained it so far) in folder, for
    the resumed child's output to follow: the run keeps one log of every step, as an uninterrupted run does, rather
    than the resumed part's alone over it."""
    client = tracking.mlflow_client(tracking_uri)
    if any(a.path == "train.log" for a in client.list_artifacts(run_id)):  # none where no process could attach it
        client.download_artifacts(run_id, "train.log", folder)


def _tail(path: str, lines: int = 15) -> str:
    with open(path, errors="replace") as f:
        return redact("".join(f.readlines()[-lines:]))


def run_all(cfgs: list[RunConfig], progress: bool = True, gpus: int = 1, tags: list[dict] | None = None,
            resumes: list | None = None) -> list[RunResult]:
    """Run each config with run_variant, with a bar over the variants; return every result, in order.

    gpus > 1 runs that many at a time, each on a GPU of its own (CUDA_VISIBLE_DEVICES); tags[i] tags run i;
    resumes[i], where given, is the (run id, checkpoint) run i continues.
    """
    from concurrent.futures import ThreadPoolExecutor

    from tqdm.auto import tqdm

    for cfg in {(c.tracking_uri, c.experiment): c for c in cfgs}.values():
        tracking.experiment_id(cfg)  # each store and experiment exists before runs start side by side
    for cfg in cfgs:  # here, before any thread: two threads' first imports of transformers raced on the H200
        preflight.check(cfg)
    free = free_gpus(gpus)
    bar = tqdm(total=len(cfgs), desc="variants", unit="variant", disable=not progress or len(cfgs) < 2)

    def run(i: int, side_by_side: bool) -> RunResult:
        gpu = free.pop() if side_by_side else None
        try:
            env = {"CUDA_VISIBLE_DEVICES": gpu} if side_by_side else {}
            result = run_variant(cfgs[i], progress=progress and not side_by_side, tags=tags[i] if tags else None,
                                 env=env, beside=gpus if side_by_side else 1, resume=resumes[i] if resumes else None)
        finally:
            if gpu is not None:
                free.append(gpu)
        bar.update()  # a variant whose parent was interrupted (Ctrl-C, SIGTERM) is not counted as done
        return result

    results: dict[int, RunResult] = {}
    with bar:
        if gpus > 1:  # one-GPU runs `gpus` at a time; a run over several GPUs then gets all of them to itself
            single = [i for i, cfg in enumerate(cfgs) if cfg.num_gpus == 1]
            with ThreadPoolExecutor(gpus) as pool:
                futures = {i: pool.submit(run, i, True) for i in single}
                try:
                    results.update({i: f.result() for i, f in futures.items()})
                except BaseException:
                    for f in futures.values():
                        f.cancel()
                    stop_all()
                    raise
        for i in range(len(cfgs)):  # in this thread, so an interrupt reaches the running variant at once
            if i not in results:
                results[i] = run(i, False)
    return [results[i] for i in range(len(cfgs))]


def free_gpus(gpus: int) -> list[str]:
    """The GPU ids `gpus` side-by-side runs take turns on (["0"]: one at a time)."""
    if gpus <= 1:
        return ["0"]
    import torch

    free = preflight.gpu_ids(os.environ.get("CUDA_VISIBLE_DEVICES"), torch.cuda.device_count())[:gpus]
    if len(free) < gpus:
        raise ConfigError(f"gpus is {gpus} but this machine shows {len(free)} GPU(s); ask for at most {len(free)}")
    return free


def exit_now(code: int) -> None:
    """End this process as the interpreter would, less its teardown of the ML stack's modules (2-3 s a process on 2
    CPU cores, doing nothing a run needs): non-daemon threads are waited for and the pools' hooks run
    (threading._shutdown), then the exit handlers (logging, MLflow, temporary folders, multiprocessing), then Python's
    and the C library's output buffers are flushed (DeepSpeed's and NCCL's C code print through the latter)."""
    import atexit
    import contextlib
    import ctypes

    getattr(threading, "_shutdown", lambda: None)()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a reader gone (`| head`) or a stream closed
            stream.flush()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).fflush(None)
    os._exit(code)


def child_main(path: str) -> int:
    """The child process: train the described variant into its run; 0 finished, 1 failed, 130 interrupted."""
    with open(path) as f:
        child = json.load(f)
    cfg = RunConfig.from_dict(child["config"])
    preflight.pin_one_gpu(cfg)
    signal.signal(signal.SIGTERM, _terminated)
    # Started from a shell's background job (or nohup), a process inherits SIGINT ignored and Python leaves it so:
    # the parent's interrupt and the watch below would go unheard.
    signal.signal(signal.SIGINT, _interrupted)
    watch_parent(child["parent_pid"])
    from .planning import Reporter  # deferred: as train is
    from .train import train  # deferred: the parent that starts children never loads the training stack

    class ToParent(Reporter):
        """Progress and messages as JSON lines in the file the parent follows (messages also in train.log)."""

        def step(self, step: int, total: int, loss: float | None) -> None:
            self.write({"step": step, "total": total, "loss": loss})

        def finishing(self, run_id: str) -> None:
            # The log so far, before the run reads FINISHED: the parent attaches it whole once this process ends, but
            # a parent killed before then (its kernel, the runtime) would leave a finished run without its log.
            attach_log(tracking.mlflow_client(cfg.tracking_uri), run_id,
                       os.path.join(os.path.dirname(os.path.abspath(path)), "train.log"))

        def say(self, text: str) -> None:
            super().say(text)
            self.write({"say": text})

        def write(self, record: dict) -> None:
            with open(child["progress"], "a") as f:
                f.write(json.dumps(record) + "\n")

    # an interrupt (the parent gone, Ctrl-C, SIGTERM) waits for a store write under way: none wedges the store
    with tracking.interrupts_after_writes():
        status = None  # what the parent would end the run as, where it could not
        try:
            metrics = train(cfg, child["run_id"], child.get("checkpoint"), reporter=ToParent())
        except KeyboardInterrupt:
            print("dsnb: interrupted; the run is recorded KILLED with what it measured so far", file=sys.stderr)
            status = "KILLED"
            return 130
        except ConfigError as e:
            print(f"dsnb: error: {e}", file=sys.stderr)
            return 2
        finally:
            if os.environ.get("RANK", "0") == "0" and not preflight.alive(child["parent_pid"]):
                # Orphaned however the run ended: the parent that attaches the log, ends an interrupted run and removes
                # the folder is gone, so do its part here.
                folder = os.path.dirname(os.path.abspath(path))
                _close(child["run_id"], cfg, os.path.join(folder, "train.log"), status)
                shutil.rmtree(folder, ignore_errors=True)
        print("\n".join(f"{k:>28}: {v:.6g}" for k, v in sorted(metrics.items())))
        return 0


def _terminated(signum, frame):
    raise KeyboardInterrupt("SIGTERM")


# Why this process was sent SIGINT: its parent's interrupt (passed on to it), unless watch_parent found the parent gone
PARENT_GONE: list[str] = []


def _interrupted(signum, frame):
    """SIGINT as a KeyboardInterrupt that says where it came from: the run's error tag, and the resumed tag of a run
    resumed from it, read this (tracking.interruption)."""
    raise KeyboardInterrupt(PARENT_GONE[0] if PARENT_GONE else "its parent stopped it (Ctrl-C, a stop button, SIGTERM)")


def watch_parent(pid: int) -> None:
    """If the process that started this one dies (killed, its kernel shut down, or the launcher of a rank: torchrun's
    or DeepSpeed's agent, gone with its node), stop as if interrupted, rather than run on alone (a new dsnb here waits
    for that: preflight.wait_for_orphans)."""

    def watch():
        while preflight.alive(pid):
            time.sleep(1)
        PARENT_GONE.append(f"its parent process {pid} ended (killed, or its kernel or runtime stopped)")
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=watch, daemon=True).start()


