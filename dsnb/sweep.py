"""A sweep: a notebook executed once per variant with papermill, one fresh kernel each, a failure stopping nothing.

    results = run_sweep("variants/sweep_zero_stages.yaml")    # papermill: one fresh kernel per variant

A sweep file (YAML, headed by the command that runs it):

    notebook: notebooks/02_zero_stages.ipynb   # executed once per variant (relative to the YAML file)
    base: {max_steps: 30}                      # fields every variant shares
    variants:                                  # each: fields on top of base; run_name names the run
      - {run_name: Without_DeepSpeed}
      - {run_name: With_DeepSpeed, strategy: zero2, offload_optimizer: cpu}
"""
from __future__ import annotations

import contextlib
import os

from . import preflight, tracking
from .compare import newest_run, reuse, run_ended
from .config import OFFLINE_ENV, ConfigError, RunConfig, describe, read_yaml
from .launch import SWEEP_RESUME_ENV, SWEEP_RUN_ENV
from .tracking import RunResult, mlflow_client

SWEEP_KEYS = {"notebook", "base", "variants", "output_dir"}


def load_sweep(path: str, offline: bool = False, overrides: dict | None = None) -> tuple[str, list[RunConfig], str]:
    """(notebook, configs, output folder) of a sweep file; every variant is validated before any runs."""
    spec = read_yaml(path)
    unknown = sorted(set(spec) - SWEEP_KEYS, key=str)
    if unknown:
        raise ConfigError(f"{path}: {unknown[0]} is not a sweep key; use {', '.join(sorted(SWEEP_KEYS))}")
    variants = spec.get("variants")
    if not isinstance(variants, list) or not variants or not all(isinstance(v, dict) for v in variants) or \
            not isinstance(spec.get("base") or {}, dict):
        raise ConfigError(f"{path}: variants must be a non-empty list of field: value mappings (base one mapping)")
    for key in ("notebook", "output_dir"):
        if not isinstance(spec.get(key, ""), str) or key in spec and not spec[key].strip():
            raise ConfigError(f"{path}: {key} must be a path")
    notebook = os.path.join(os.path.dirname(os.path.abspath(path)),
                            spec.get("notebook", "../notebooks/02_zero_stages.ipynb"))
    if not os.path.isfile(notebook):
        default = "" if "notebook" in spec else (" (the default, ../notebooks/02_zero_stages.ipynb from the sweep "
                                                 "file's folder, as in the project's variants/)")
        raise ConfigError(f"{path}: notebook {notebook} does not exist{default}; set notebook: to the notebook's "
                          "path (relative to the sweep file, or absolute)")
    cfgs = []
    for i, variant in enumerate(variants):
        try:
            cfgs.append(RunConfig.layered(spec.get("base") or {}, variant, overrides or {}, offline=offline))
        except ConfigError as e:
            raise ConfigError(f"{path}: variant {i + 1}: {e}") from None
    names = [c.name for c in cfgs]
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}: two variants share a run name; give each a distinct run_name")
    stem = os.path.splitext(os.path.basename(path))[0]
    return notebook, cfgs, spec.get("output_dir", os.path.join("sweeps", stem))


def run_sweep(path: str, offline: bool = False, overrides: dict | None = None,
              progress: bool = True) -> list[RunResult]:
    """Execute the sweep's notebook with papermill once per variant, each in a fresh kernel.

    Each executed notebook is saved under the output folder and logged to its MLflow run; a variant that
    fails keeps its notebook and a FAILED run, and the sweep goes on. Started again, a sweep keeps each variant's run
    that ended (finished, or out of memory) and resumes one that was interrupted from its last checkpoint (into the
    same run, with a notebook of its own beside the interrupted pass's), as a comparison does.
    """
    try:
        import papermill
    except ImportError:
        raise ConfigError("a sweep executes its notebook with papermill, which is not installed: pip install "
                          "'papermill>=2.6' ipykernel (setup.sh installs both)") from None
    from tqdm.auto import tqdm

    notebook, cfgs, out_dir = load_sweep(path, offline, overrides)
    preflight.check_output_folder(out_dir, f"{path}: the sweep's output folder (output_dir)")
    # A tracking URI's user and password reach the kernels as MLFLOW_TRACKING_USERNAME and _PASSWORD (inherited), never
    # as a parameter: papermill writes every parameter into the executed notebook and its metadata.
    cfgs = [cfg.replace(tracking_uri=tracking.without_credentials(cfg.tracking_uri)) for cfg in cfgs]
    for cfg in cfgs:
        preflight.check(cfg)
    os.makedirs(out_dir, exist_ok=True)
    sweep = os.path.splitext(os.path.basename(path))[0]
    results = []
    for cfg in tqdm(cfgs, desc=f"sweep {sweep}", unit="variant", disable=not progress):
        name = cfg.name
        earlier = newest_run(cfg, {"sweep": sweep})
        if run_ended(earlier):  # a sweep started again skips what already finished and reruns the rest
            if progress:
                print(f"{name}: already {earlier.info.status}{' (out of memory)' * (earlier.info.status == 'FAILED')}"
                      f" in run {earlier.info.run_id}; skipped")
            results.append(RunResult.read(cfg.tracking_uri, earlier.info.run_id, skipped=True))
            continue
        try:  # an interrupted one resumes from its last checkpoint
            _, resume = reuse(cfg, earlier, progress, name)
        except ConfigError as e:  # still running elsewhere (another sweep on this store): the sweep goes on
            print(f"{name}: not run: {e}")
            results.append(RunResult.read(cfg.tracking_uri, earlier.info.run_id, skipped=True))  # RUNNING: exit 1
            continue
        # a file name's limit is 255 bytes, and a name may hold a hub id's "/" (a capacity cell's, a sweep's)
        short = name.replace("/", "_").replace("\\", "_").encode()[:200].decode(errors="ignore")
        if resume:
            run_id = resume[0]
            tracking.reopen_run(run_id, cfg.tracking_uri)
            keep_notebooks(out_dir, f"{short}-{run_id[:8]}", run_id, cfg.tracking_uri)
        else:
            run_id = tracking.create_run(cfg, tags={"sweep": sweep, "notebook": os.path.basename(notebook)})
        executed = unused_path(os.path.join(out_dir, f"{short}-{run_id[:8]}{'-resumed' * bool(resume)}"), ".ipynb")
        error = execute(papermill, notebook, executed, cfg, run_id, resume[1] if resume else None)
        results.append(record_pass(cfg, run_id, notebook, executed, error, progress))
    return results


def record_pass(cfg: RunConfig, run_id: str, notebook: str, executed: str, error: Exception | None,
                progress: bool) -> RunResult:
    """A variant's notebook pass into its run: the executed notebook logged (papermill writes none where it fails
    before the first cell: a file that is not a notebook), and where it failed, the run FAILED with the error."""
    client = mlflow_client(cfg.tracking_uri)
    written = os.path.exists(executed)
    if written:
        client.log_artifact(run_id, executed)
    run = client.get_run(run_id)
    if error is None and run.info.status == "FAILED" and progress:  # failed in its own process, the cell went on
        print(f"{cfg.name}: failed ({run.data.tags.get('error', 'its run says why')}); notebook kept at {executed}")
    if error is not None:
        client.set_tag(run_id, "notebook_error", describe(error, 500))
        tracking.finish(run_id, cfg.tracking_uri, "FAILED")
        if progress:
            print(f"{cfg.name}: failed ({describe(error)})" + (f"; notebook kept at {executed}" if written else
                                                               f"; {notebook} did not run at all"))
    return RunResult.read(cfg.tracking_uri, run_id, notebook=executed if written else None)


def keep_notebooks(folder: str, stem: str, run_id: str, tracking_uri: str) -> None:
    """Log the notebooks of a run's earlier passes (stem*.ipynb in folder) to it: a sweep killed outright wrote its
    notebook as far as it ran, but could not log it."""
    client = mlflow_client(tracking_uri)
    for name in sorted(os.listdir(folder)):
        if name.startswith(stem) and name.endswith(".ipynb"):
            client.log_artifact(run_id, os.path.join(folder, name))


def unused_path(stem: str, suffix: str) -> str:
    """stem + suffix, or where that exists (the notebook of an interrupted pass, resumed), stem-2 + suffix, ..."""
    path, n = stem + suffix, 1
    while os.path.exists(path):
        n += 1
        path = f"{stem}-{n}{suffix}"
    return path


def execute(papermill, notebook: str, executed: str, cfg: RunConfig, run_id: str,
            checkpoint: str | None = None) -> Exception | None:
    """The notebook run with cfg's parameters in a fresh kernel into `executed`; the error that stopped it, if one did.

    The kernel inherits this environment: it logs into the run opened here (resuming it from checkpoint where one is
    given), and takes the parameters as given (the offline preset, if asked for, is already in them). It beats from
    here (the kernel starts and runs the cells before the notebook's run_variant beats too). Ctrl-C or SIGTERM ends
    the run KILLED, with its notebook as far as it ran."""
    changes = {SWEEP_RUN_ENV: run_id, SWEEP_RESUME_ENV: checkpoint, OFFLINE_ENV: None}
    stopped: list[int] = []
    with _environ(changes), tracking.heartbeat(run_id, cfg.tracking_uri), _stops_kernels(stopped, run_id):
        try:
            papermill.execute_notebook(notebook, executed, parameters=cfg.to_dict(), kernel_name="python3",
                                       cwd=os.getcwd(), progress_bar=False)
            error = None
        except Exception as e:  # PapermillExecutionError and kernel deaths alike: record and go on
            error = e
        except BaseException:
            _killed(executed, cfg, run_id)
            raise
    if stopped:  # the interrupt reached the kernel, but papermill let the notebook end as if it had failed
        _killed(executed, cfg, run_id)
        raise KeyboardInterrupt
    return error


def _killed(executed: str, cfg: RunConfig, run_id: str) -> None:
    if os.path.exists(executed):
        mlflow_client(cfg.tracking_uri).log_artifact(run_id, executed)
    tracking.finish(run_id, cfg.tracking_uri, "KILLED")


@contextlib.contextmanager
def _stops_kernels(stopped: list, run_id: str):
    """While the block runs, Ctrl-C or SIGTERM also interrupts the notebook kernel this sweep started for run_id (the
    processes started with it in their environment; their process group, as Jupyter's button does: the kernel's
    run_variant stops its training process, which records its run KILLED) and is noted in stopped, then raised here as
    KeyboardInterrupt (once: a second stops the kernel again but leaves the KILLED record to be written); papermill's
    event loop can swallow that, and the notebook then ended as a cell's error, the sweep going on to the next variant.
    Outside the main thread signals cannot be caught: nothing changes."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        first = not stopped
        stopped.append(signum)
        interrupt_kernels(run_id)
        if first:
            raise KeyboardInterrupt

    saved = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with tracking.interrupts_after_writes():  # raised mid-write, it would leave the store locked
            yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def interrupt_kernels(run_id: str) -> None:
    """SIGINT to the process groups of this process's descendants started for run_id (SWEEP_RUN_ENV in their
    environment: the kernel, whatever launches it), never to this process's own group."""
    import signal

    import psutil

    own, groups = os.getpgid(0), set()
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if child.environ().get(SWEEP_RUN_ENV) == run_id:
                group = os.getpgid(child.pid)
                if group != own and group not in groups:
                    groups.add(group)
                    os.killpg(group, signal.SIGINT)
                elif group == own:
                    child.send_signal(signal.SIGINT)


@contextlib.contextmanager
def _environ(changes: dict):
    """Set (or, for None, remove) environment variables for the block, then restore them."""
    saved = {k: os.environ.get(k) for k in changes}
    try:
        for key, value in changes.items():
            os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)
        yield
    finally:
        for key, value in saved.items():
            os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)
