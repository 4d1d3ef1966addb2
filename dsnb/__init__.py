"""dsnb: what DeepSpeed buys you when you fine-tune a language model, measured on your own GPU.

A notebook uses it like this:

    import dsnb
    cfg = dsnb.from_notebook(globals())                 # the parameters cell -> a validated RunConfig
    results = dsnb.run_all(dsnb.tutorial_pair(cfg))     # each variant in its own process, one MLflow run each
    dsnb.compare_table(cfg.tracking_uri, results)
    dsnb.plot_runs(cfg.tracking_uri, results)
"""
from .capacity import run_capacity
from .config import OFFLINE, ConfigError, RunConfig, from_notebook
from .report import best_for_budget, compare_table, find_runs, plot_runs, same_work, savings_table
from .run import check_environment, pick_device, run_variant
from .sweep import run_all, tutorial_pair
from .tracking import export_store, ui_command

__all__ = ["OFFLINE", "ConfigError", "RunConfig", "from_notebook", "best_for_budget", "compare_table", "find_runs",
           "plot_runs", "same_work", "savings_table", "check_environment", "pick_device", "run_variant", "run_all",
           "tutorial_pair", "export_store", "ui_command", "run_capacity"]
