"""The notebooks' entry: their parameters cell becomes a validated RunConfig.

    cfg = dsnb.from_notebook(globals())     # in the first dsnb cell, after the parameters cell
    runs = dsnb.compared_runs(dsnb.from_notebook(globals(), check=False))   # notebook 03: a store's runs

A value counts as set on purpose when a cell other than the parameters cell assigned it (papermill's
injected cell, or a cell of your own), or when the parameters cell holds another value than its
default. Values set on purpose win over the offline default that DSNB_OFFLINE=1 applies, even where they
equal RunConfig's default.
"""
from __future__ import annotations

import ast
import os

from . import preflight
from .config import OFFLINE_ENV, RENAMED, ConfigError, RunConfig, field_names, offline_requested
from .report import find_runs
from .tracking import existing_store, mlflow_client, open_store


def from_notebook(namespace: dict, check: bool = True) -> RunConfig:
    """A RunConfig from a notebook's parameters (the fields found in `namespace`), checked against this machine unless
    check is False (a notebook that only reads a store); on Colab, a results_folder on Drive is mounted first (Colab
    asks for access once)."""
    offline = offline_requested()
    cfg = RunConfig.layered(explicit_parameters(namespace), offline=offline)
    on_colab, on_kaggle = "COLAB_RELEASE_TAG" in os.environ, KAGGLE in os.environ
    # on Drive: "/content/drive/MyDrive/dsnb", or "drive/MyDrive/dsnb" from Colab's working directory /content
    if on_colab and cfg.results_folder and os.path.abspath(cfg.results_folder).startswith(DRIVE):
        mount_drive()
    if not check:
        return cfg
    preflight.check(cfg)  # a bad parameter fails here, in the notebook's first dsnb cell
    source = f"{OFFLINE_ENV}=1: the offline default" if offline else f"{OFFLINE_ENV} unset: the tutorial's defaults"
    print(f"{source}; model {cfg.model}, dataset {cfg.dataset}, {cfg.derived_name()}")
    if on_colab and not cfg.results_folder:
        print(f'note: the store and checkpoints are on this runtime\'s disk, lost if it ends; results_folder = '
              f'"{DRIVE}/MyDrive/dsnb" keeps them on Drive, and running all again then resumes')
    if on_kaggle and not cfg.results_folder.startswith(KAGGLE_WORKING):
        print(f'note: on Kaggle only {KAGGLE_WORKING} is kept (with the notebook\'s saved version); results_folder = '
              f'"{KAGGLE_WORKING}/dsnb" keeps the store and checkpoints there, and running all again then resumes')
    return cfg


DRIVE = "/content/drive"
KAGGLE, KAGGLE_WORKING = "KAGGLE_KERNEL_RUN_TYPE", "/kaggle/working"  # Kaggle's notebooks set the variable
QUALITY_PRESET = "quality"  # compare.quality_check's runs: another model on other data, no variant of a comparison


def compared_runs(cfg: RunConfig) -> list:
    """The newest run of each name, with its comparison's other repeats (report.find_runs), in cfg's store (an
    uploaded zip too) and experiment, the quality check's left out: it lands in the pair's experiment, and its toy
    model's speed and memory would be compared with the pair's."""
    uri = existing_store(open_store(cfg.tracking_uri))  # a store that is not there is said, not made empty
    client = mlflow_client(uri)
    return [r for r in find_runs(uri, cfg.experiment)
            if client.get_run(r.run_id).data.params.get("preset") != QUALITY_PRESET]


def mount_drive() -> None:
    """Google Drive at /content/drive, unless it is there already."""
    if os.path.ismount(DRIVE):
        return
    try:
        from google.colab import drive
    except ImportError:  # Colab's variable without Colab (a rehearsal): the folder is used as it is
        return
    drive.mount(DRIVE)


def preview(cfg: RunConfig) -> str:
    """What the run will train on and what it should take (data read and checked, GPU and host RAM estimated), before
    any model downloads or loads."""
    from .planning import describe_plan, plan  # deferred: transformers and torch load only when a plan is asked for

    return describe_plan(cfg, plan(cfg, cfg.num_gpus))


def explicit_parameters(namespace: dict) -> dict:
    """The run-config fields in `namespace` that were set on purpose (see the module's docstring)."""
    defaults = RunConfig().to_dict()
    assigned = assigned_outside_parameters(namespace.get("_ih") or [])
    for old in sorted(assigned & set(RENAMED)):
        raise ConfigError(RENAMED[old])
    return {k: namespace[k] for k in field_names() if k in namespace and (k in assigned or namespace[k] != defaults[k])}


def assigned_outside_parameters(cells: list[str]) -> set[str]:
    """Names assigned at the top level of executed cells (IPython's input history) other than the parameters
    cell, which is the one that declares run-config fields with annotations (`batch_size: int = 2`)."""
    fields, names = set(field_names()), set()
    for source in cells:
        try:
            body = ast.parse(source).body
        except SyntaxError:  # magics and shell escapes: IPython's own syntax, no parameters there
            continue
        if any(isinstance(n, ast.AnnAssign) and getattr(n.target, "id", None) in fields for n in body):
            continue
        for node in body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, (ast.AugAssign, ast.AnnAssign)) else []
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names
