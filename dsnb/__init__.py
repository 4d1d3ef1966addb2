"""dsnb: what DeepSpeed buys you when you fine-tune a language model, measured on your own GPU.

A notebook uses it like this:

    import dsnb
    cfg = dsnb.from_notebook(globals())                 # the parameters cell -> a validated RunConfig
    results = dsnb.compare(cfg)                          # the tutorial's pair, each run in its own process
    dsnb.compare_table(results); print(dsnb.verdict(results))
    dsnb.plot_runs(results); dsnb.answers(results)

Modules, lowest layer first (each imports only from those before it): config; data, fp8, loss, model, zero, metrics,
estimate, evaluate, card; preflight; planning; tracking; flat_step, dropout, loop, train; launch, publish; compare,
sweep, bench, capacity, advise; report; notebook; cli.
"""
import importlib
import logging

# bitsandbytes' notes that tell a user nothing to do, quieted before anything imports it (peft does, through
# transformers' Trainer): 8-bit matmuls casting fp32 inputs to fp16 at every call (the CPU's fp32 runs), and 4-bit on
# the CPU lacking an optional kernel package (it falls back by itself); and the hub kernels' note (transformers 5.25's
# `kernels`) that offline it skips a check of a kernel it then does not fetch.
for _name in ("bitsandbytes.autograd._functions", "bitsandbytes.backends.cpu.ops", "kernels._internals.hf_hub"):
    logging.getLogger(_name).setLevel(logging.ERROR)

import os  # noqa: E402

from .config import OFFLINE_ENV, OFFLINE_ON, stay_off_the_hub  # noqa: E402  (config imports nothing heavy)

if os.environ.get(OFFLINE_ENV, "").strip().lower() in OFFLINE_ON:  # offline: the hub is not tried (a bad value is
    stay_off_the_hub()  # refused where the config is read: config.offline_requested, not at import)

from .advise import advise  # noqa: E402  eagerly (neither imports anything heavy): the module of the same name would
from .compare import compare  # noqa: E402  shadow the function once any code imported it

# Each name's module, imported on first use: `import dsnb` then costs nothing, and what reads a store (notebook 03,
# the setup cell's own installer) runs where torch, DeepSpeed or peft are not installed.
_WHERE = {
    "OFFLINE": "config", "ConfigError": "config", "RunConfig": "config", "tutorial_pair": "config",
    "from_notebook": "notebook", "preview": "notebook", "compared_runs": "notebook", "check": "preflight",
    "pick_device": "preflight",
    "run_variant": "launch", "run_all": "launch", "quality_check": "compare", "run_once": "compare",
    "compare_table": "report", "verdict": "report", "same_work": "report", "plot_runs": "report", "answers": "report",
    "quality_verdict": "report", "find_runs": "report", "savings_table": "report", "best_for_budget": "report",
    "save_model": "publish", "load_saved": "publish", "push_to_hub": "publish", "keep": "publish", "ask": "publish",
    "model_to_ask": "publish", "hub_token": "publish", "RunResult": "tracking", "export_store": "tracking",
    "download_store": "tracking", "open_store": "tracking", "ui_command": "tracking", "show_ui": "tracking",
    "run_capacity": "capacity",
}
__all__ = ["advise", "compare", *_WHERE]


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'dsnb' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
