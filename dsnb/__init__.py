"""dsnb: what DeepSpeed buys you when you fine-tune a language model, measured on your own GPU.

A notebook uses it like this:

    import dsnb
    cfg = dsnb.from_notebook(globals())                 # the parameters cell -> a validated RunConfig
    results = dsnb.compare(cfg)                          # the tutorial's pair, each run in its own process
    dsnb.compare_table(results); print(dsnb.verdict(results))
    dsnb.plot_runs(results); dsnb.answers(results)

Modules, lowest layer first (each imports only from those before it): config; data, model, zero, metrics,
estimate, evaluate, card; preflight; tracking; flat_step, loop, train; launch, publish; compare, sweep, bench,
capacity; report; notebook; cli.
"""
from .capacity import run_capacity
from .compare import compare, quality_check, tutorial_pair
from .config import OFFLINE, ConfigError, RunConfig
from .launch import run_all, run_variant
from .notebook import from_notebook, preview
from .preflight import check, pick_device
from .publish import load_saved, push_to_hub, save_model
from .report import (answers, best_for_budget, compare_table, find_runs, plot_runs, quality_verdict, same_work,
                     savings_table, verdict)
from .tracking import RunResult, download_store, export_store, open_store, ui_command

__all__ = ["OFFLINE", "ConfigError", "RunConfig", "RunResult", "from_notebook", "preview", "check", "pick_device",
           "run_variant", "run_all", "compare", "quality_check", "tutorial_pair", "compare_table", "verdict",
           "same_work", "plot_runs", "answers", "quality_verdict", "find_runs", "savings_table", "best_for_budget",
           "save_model", "load_saved", "push_to_hub", "export_store", "download_store", "open_store", "ui_command",
           "run_capacity"]
