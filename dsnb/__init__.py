"""dsnb: what DeepSpeed buys you when you fine-tune a language model, measured on your own GPU.

A notebook uses it like this:

    import dsnb
    cfg = dsnb.from_notebook(globals())                 # the parameters cell -> a validated RunConfig
    results = dsnb.run_all(dsnb.tutorial_pair(cfg))     # each variant in its own process, one MLflow run each
    dsnb.compare_table(results)
    dsnb.plot_runs(results)

Modules, lowest layer first (each imports only from those before it): config; data, model, zero, metrics,
estimate; preflight; tracking; loop, train; launch; sweep, bench, capacity; report; notebook; cli.
"""
from .capacity import run_capacity
from .config import OFFLINE, ConfigError, RunConfig
from .launch import run_all, run_variant
from .notebook import from_notebook
from .preflight import check, pick_device
from .report import best_for_budget, compare_table, find_runs, plot_runs, same_work, savings_table
from .sweep import tutorial_pair
from .tracking import RunResult, export_store, ui_command

__all__ = ["OFFLINE", "ConfigError", "RunConfig", "RunResult", "from_notebook", "best_for_budget", "compare_table",
           "find_runs", "plot_runs", "same_work", "savings_table", "check", "pick_device", "run_variant", "run_all",
           "tutorial_pair", "export_store", "ui_command", "run_capacity"]
