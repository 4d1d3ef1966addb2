"""Several variants, one fresh process each, a failure never stopping the rest.

    results = run_all(tutorial_pair(RunConfig(**OFFLINE)))    # Without_DeepSpeed, With_DeepSpeed
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

from .config import OFFLINE, OFFLINE_ENV, ConfigError, RunConfig, describe, read_yaml
from .run import SWEEP_RUN_ENV, gpu_ids, run_variant
from .tracking import mlflow_client

SWEEP_KEYS = {"notebook", "base", "variants", "output_dir"}


def tutorial_pair(cfg: RunConfig) -> list[RunConfig]:
    """The tutorial's two runs on cfg's model and data: no DeepSpeed, then ZeRO-2 with CPU optimizer offload."""
    return [cfg.replace(strategy="baseline", offload_optimizer="none", offload_param="none",
                        run_name="Without_DeepSpeed"),
            cfg.replace(strategy="zero2", offload_optimizer="cpu", offload_param="none", run_name="With_DeepSpeed")]


def run_all(cfgs: list[RunConfig], progress: bool = True, gpus: int = 1, tags: list[dict] | None = None) -> list[dict]:
    """Run each config with run_variant, with a bar over the variants; return every result, in order.

    gpus > 1 runs that many at a time, each on a GPU of its own (CUDA_VISIBLE_DEVICES); tags[i] tags run i.
    """
    from concurrent.futures import ThreadPoolExecutor

    from tqdm.auto import tqdm

    from .tracking import experiment_id

    for cfg in {(c.tracking_uri, c.experiment): c for c in cfgs}.values():
        experiment_id(cfg)  # each store and experiment exists before runs start side by side
    free = ["0"]
    if gpus > 1:
        import torch

        free = gpu_ids(os.environ.get("CUDA_VISIBLE_DEVICES"), torch.cuda.device_count())[:gpus]
        if len(free) < gpus:
            raise ConfigError(f"gpus is {gpus} but this machine shows {len(free)} GPU(s); ask for at most {len(free)}")
    bar = tqdm(total=len(cfgs), desc="variants", unit="variant", disable=not progress or len(cfgs) < 2)

    def run(i: int, side_by_side: bool) -> dict:
        gpu = free.pop() if side_by_side else None
        try:
            env = {"CUDA_VISIBLE_DEVICES": gpu} if side_by_side else {}
            return run_variant(cfgs[i], progress=progress and not side_by_side, tags=tags[i] if tags else None,
                               env=env)
        finally:
            if gpu is not None:
                free.append(gpu)
            bar.update()

    # One-GPU runs go `gpus` at a time; a run over several GPUs then gets all of them to itself.
    single = [i for i, cfg in enumerate(cfgs) if cfg.num_gpus == 1]
    results: dict[int, dict] = {}
    with ThreadPoolExecutor(gpus) as pool, bar:
        results.update(zip(single, pool.map(lambda i: run(i, gpus > 1), single)))
        results.update({i: run(i, False) for i in range(len(cfgs)) if i not in results})
    return [results[i] for i in range(len(cfgs))]


def load_sweep(path: str, offline: bool = False, overrides: dict | None = None) -> tuple[str, list[RunConfig], str]:
    """(notebook, configs, output folder) of a sweep file; every variant is validated before any runs."""
    spec = read_yaml(path)
    unknown = sorted(set(spec) - SWEEP_KEYS)
    if unknown:
        raise ConfigError(f"{path}: {unknown[0]} is not a sweep key; use {', '.join(sorted(SWEEP_KEYS))}")
    if not isinstance(spec.get("variants"), list) or not spec["variants"]:
        raise ConfigError(f"{path}: variants must be a non-empty list of field: value mappings")
    notebook = os.path.join(os.path.dirname(os.path.abspath(path)), spec.get("notebook", "../notebooks/02_zero_stages.ipynb"))
    if not os.path.isfile(notebook):
        raise ConfigError(f"{path}: notebook {notebook} does not exist")
    cfgs = []
    for i, variant in enumerate(spec["variants"]):
        try:
            cfgs.append(RunConfig.from_dict({**(OFFLINE if offline else {}), **(spec.get("base") or {}),
                                             **variant, **(overrides or {})}))
        except ConfigError as e:
            raise ConfigError(f"{path}: variant {i + 1}: {e}") from None
    names = [c.run_name or c.derived_name() for c in cfgs]
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}: two variants share a run name; give each a distinct run_name")
    stem = os.path.splitext(os.path.basename(path))[0]
    return notebook, cfgs, spec.get("output_dir", os.path.join("sweeps", stem))


def run_sweep(path: str, offline: bool = False, overrides: dict | None = None, progress: bool = True) -> list[dict]:
    """Execute the sweep's notebook with papermill once per variant, each in a fresh kernel.

    Each executed notebook is saved under the output folder and logged to its MLflow run; a variant that
    fails keeps its notebook and a FAILED run, and the sweep goes on.
    """
    import papermill
    from tqdm.auto import tqdm

    from . import tracking
    from .run import check_environment, pick_device

    notebook, cfgs, out_dir = load_sweep(path, offline, overrides)
    device = pick_device()
    for cfg in cfgs:
        check_environment(cfg, device)
    os.makedirs(out_dir, exist_ok=True)
    sweep = os.path.splitext(os.path.basename(path))[0]
    results = []
    for cfg in tqdm(cfgs, desc=f"sweep {sweep}", unit="variant", disable=not progress):
        name = cfg.run_name or cfg.derived_name()
        done = finished_run(cfg, sweep)
        if done is not None:  # a sweep started again skips what already finished and reruns the rest
            if progress:
                print(f"{name}: already FINISHED in run {done.info.run_id}; skipped")
            results.append({"run_id": done.info.run_id, "name": name, "status": "FINISHED", "skipped": True,
                            "notebook": None, "tracking_uri": cfg.tracking_uri, "metrics": dict(done.data.metrics)})
            continue
        run_id = tracking.create_run(cfg, tags={"sweep": sweep, "notebook": os.path.basename(notebook)})
        executed = os.path.join(out_dir, f"{name}-{run_id[:8]}.ipynb")
        error = None
        # The kernel inherits this environment: it logs into the run opened here, and takes the
        # parameters as given (the offline preset, if asked for, is already in them).
        with _environ({SWEEP_RUN_ENV: run_id, OFFLINE_ENV: None}):
            try:
                papermill.execute_notebook(notebook, executed, parameters=cfg.to_dict(), kernel_name="python3",
                                           cwd=os.getcwd(), progress_bar=False)
            except Exception as e:  # PapermillExecutionError and kernel deaths alike: record and go on
                error = e
        client = mlflow_client(cfg.tracking_uri)
        client.log_artifact(run_id, executed)
        if error is not None:
            client.set_tag(run_id, "notebook_error", describe(error, 500))
            tracking.finish(run_id, cfg.tracking_uri, "FAILED")
            if progress:
                print(f"{name}: failed ({describe(error)}); notebook kept at {executed}")
        run = client.get_run(run_id)
        results.append({"run_id": run_id, "name": name, "status": run.info.status, "notebook": executed,
                        "tracking_uri": cfg.tracking_uri, "metrics": dict(run.data.metrics)})
    return results


def finished_run(cfg: RunConfig, sweep: str):
    """The FINISHED run of this sweep with cfg's name and exactly cfg's params, if there is one."""

    from . import tracking

    client = mlflow_client(cfg.tracking_uri)
    name = cfg.run_name or cfg.derived_name()
    for run in client.search_runs([tracking.experiment_id(cfg)], f"tags.sweep = '{sweep}' and attributes.run_name = "
                                  f"'{name}' and attributes.status = 'FINISHED'"):
        if tracking.same_config(run, cfg):
            return run
    return None


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
