"""A capacity map: which variant lets each model train within each GPU memory budget, and how fast.

    python -m dsnb capacity -f variants/capacity_map.yaml --gpus 2     # on GPUs: table, PNG, fastest per budget
    python -m dsnb capacity -f variants/capacity_map.yaml --offline    # synthetic:tiny on the CPU

    table, fastest, png = dsnb.run_capacity("variants/capacity_map.yaml")   # in a notebook;
    IPython.display.Image(png)                                            # the picture

Each (model, variant) runs once, without a cap, in its own process, and is then judged against every
budget (RULES). One run per cell rather than one per budget keeps the map to minutes. A capacity file
(YAML, headed by its command) holds models, budgets_gb, base (fields every run shares), variants
(name: fields) and skip (["model variant", ...] pairs not run).
"""
from __future__ import annotations

import io
import math
import os

from . import tracking
from .config import ConfigError, RunConfig, read_variants
from .compare import continue_jobs, mark_written
from .metrics import RULES, STATES, Budget, busy_host, fit
from .preflight import check_output_folder, this_machine, write_new
from .tracking import RunResult, mlflow_client

def budgets_of(value, path: str) -> list[Budget]:
    """budgets_gb: a list of GPU sizes in GB, or {name, gpu_gb, ram_gb} mappings for a whole machine."""
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{path}: budgets_gb must be a non-empty list of GPU sizes in GB "
                          "(or {name, gpu_gb, ram_gb} mappings)")
    budgets = []
    for item in value:
        fields = item if isinstance(item, dict) else {"gpu_gb": item}
        gpu, ram, name = fields.get("gpu_gb"), fields.get("ram_gb", 0.0), fields.get("name", "")
        if set(fields) - {"gpu_gb", "ram_gb", "name"} or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
                for v in (gpu, ram)) or not gpu or not isinstance(name, str):
            raise ConfigError(f"{path}: budget {item!r} must be a size in GB above 0, or a mapping of name, gpu_gb "
                              "and ram_gb")
        budgets.append(Budget(float(gpu), float(ram), name))
    return budgets


def load_capacity(path: str, offline: bool = False, overrides: dict | None = None, only: str = ""):
    """(budgets, [(model, variant name, RunConfig)]) of a capacity file; every config validated first.

    only: comma-separated variant names and/or models (synthetic:llama-3.2-1b or llama-3.2-1b) to keep.
    """
    base, variants, spec = read_variants(path, ("models", "budgets_gb", "skip"), "capacity file")
    models, skip = spec.get("models"), spec.get("skip") or []
    if not isinstance(models, list) or not models or not all(isinstance(m, str) for m in models) or \
            not isinstance(skip, list):
        raise ConfigError(f"{path}: needs models (a non-empty list of names), and skip, if given, a list")
    twice = next((m for i, m in enumerate(models) if m in models[:i]), None)
    if twice is not None:
        raise ConfigError(f"{path}: models entry {twice!r} is given twice; list each model once")
    budgets = budgets_of(spec.get("budgets_gb"), path)
    check_skip(path, skip, models, variants)
    models = ["synthetic:tiny"] if offline else models
    wanted = {w.strip() for w in only.split(",") if w.strip()}
    known = set(variants) | set(models) | {m.split(":")[-1] for m in models}
    if wanted - known:
        raise ConfigError(f"--only {sorted(wanted - known)[0]!r} is neither a variant nor a model of {path}; "
                          f"pick from {', '.join(sorted(known))}")
    wanted_variants, wanted_models = wanted & set(variants), wanted - set(variants)
    cells = []
    for model in models:
        for name, fields in variants.items():
            if f"{model} {name}" in skip or wanted_variants and name not in wanted_variants or \
                    wanted_models and not {model, model.split(":")[-1]} & wanted_models:
                continue
            cells.append((model, name, cell_config(path, model, name, [base, fields, overrides or {}], offline)))
    return budgets, cells


def check_skip(path: str, skip: list, models: list[str], variants: dict) -> None:
    """Each skip entry names a cell of the file ("<model> <variant>"): a typo would run the cell it meant to skip (on
    a GPU, the 8B full fine-tuning that needs 100 GB of host RAM)."""
    import difflib

    cells = [f"{m} {v}" for m in models for v in variants]
    for entry in skip:
        if entry not in cells:
            close = difflib.get_close_matches(str(entry), cells, n=1)
            raise ConfigError(f"{path}: skip entry {entry!r} names no cell (\"<model> <variant>\" of its models and "
                              f"variants)" + (f"; did you mean {close[0]!r}?" if close else ""))


def cell_config(path: str, model: str, name: str, layers: list[dict], offline: bool) -> RunConfig:
    cell = {"model": model, "run_name": f"{model.split(':')[-1]} {name}"}
    if offline and {k: v for layer in layers for k, v in layer.items()}.get("dtype") == "bf16":
        cell["dtype"] = "fp32"  # bf16 is emulated on the CPU
    try:
        return RunConfig.layered(*layers, cell, offline=offline)
    except ConfigError as e:
        raise ConfigError(f"{path}: {model} {name}: {e}") from None


def capacity_table(cells, results: list[RunResult], budgets: list[Budget]):
    """One row per (model, variant): throughput, GPU and host peaks, and fits/tight/no/no RAM/failed per budget."""
    import pandas as pd

    rows = []
    for (model, name, cfg), result in zip(cells, results, strict=True):
        m = result.metrics
        row = {"model": model, "variant": name, "training": "full" if cfg.lora_r == 0 else "LoRA",
               "dtype": cfg.dtype,  # offline, a bf16 variant trains in fp32 (cell_config): the row says so
               "status": result.status,
               "samples_per_second": m.get("samples_per_second"),
               "peak_allocated_gb": gb(m.get("peak_gpu_allocated_mb")),  # None on the CPU: no GPU was measured
               "peak_nvml_gb": gb(m.get("peak_gpu_nvml_mb")),
               "peak_host_gb": gb(m.get("peak_cpu_rss_mb")), "run_id": result.run_id}
        row.update({b.label: fit(result.status, m, b) for b in budgets})
        row["note"] = (busy := busy_host(m)) and f"timed on a busy machine: {busy}"
        rows.append(row)
    return pd.DataFrame(rows)


def gb(mb: float | None) -> float | None:
    return None if mb is None else mb / 1024


def fastest_fitting(table, budgets: list[Budget]):
    """Per model, kind of training (LoRA or full) and budget: the fastest variant that fits (None if none). Where no
    cell measured a GPU (the map ran on the CPU), one row per kind, budget "no GPU": the fastest that finished here.
    Each cell is one run, so no spread is measured; a pick among cells timed on a busy machine says UNRELIABLE."""
    import pandas as pd

    rows, labels = [], [b.label for b in budgets]
    for (model, training), group in table.groupby(["model", "training"], sort=False):
        states = set(group[labels].to_numpy().ravel())
        if "no GPU" in states and not states & {"fits", "tight", "no"}:  # on the CPU: those that fit every host RAM
            picks = [("no GPU", group[(group[labels] == "no GPU").all(axis=1)])]
        else:
            picks = [(label, group[group[label] == "fits"]) for label in labels]
        for label, fits in picks:
            fits = fits.sort_values("samples_per_second", ascending=False)
            best = fits.iloc[0] if len(fits) else None
            busy = int((fits["note"] != "").sum())
            rows.append({"model": model, "training": training, "budget": label,
                         "fastest_variant": None if best is None else best["variant"],
                         "samples_per_second": None if best is None else best["samples_per_second"],
                         "note": f"UNRELIABLE: {busy} of the {len(fits)} cells it was chosen among were timed on a "
                                 "busy machine" if busy else ""})
    return pd.DataFrame(rows)


def plot_capacity(table, budgets: list[Budget]) -> bytes:
    """One panel per model: variants x budgets coloured by fit, each cell labelled with samples/s."""
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure

    colours = ListedColormap(["#4caf50", "#ffc107", "#e0e0e0", "#b39ddb", "#e57373", "#90caf9"])  # as STATES
    models = list(dict.fromkeys(table["model"]))
    heights = [max(2, len(table[table["model"] == m])) for m in models]
    fig = Figure(figsize=(3 + 1.6 * len(budgets), 1.2 + 0.45 * sum(heights)))
    axes = fig.subplots(len(models), 1, squeeze=False, gridspec_kw={"height_ratios": heights})
    for ax, model in zip(axes[:, 0], models, strict=True):
        group = table[table["model"] == model]
        grid = [[STATES.index(state) for state in group[b.label]] for b in budgets]
        ax.imshow(list(map(list, zip(*grid, strict=True))), cmap=colours, vmin=0, vmax=len(STATES) - 1, aspect="auto")
        for i, (_, row) in enumerate(group.iterrows()):
            for j, b in enumerate(budgets):
                state = row[b.label]
                label = f"{row['samples_per_second']:.3g}/s" if state in ("fits", "tight", "no GPU") else state
                ax.text(j, i, label, ha="center", va="center", fontsize=8)
        ax.set(title=model, xticks=range(len(budgets)), xticklabels=[b.label for b in budgets],
               yticks=range(len(group)), yticklabels=list(group["variant"]))
    fig.suptitle("green fits, amber tight, grey does not fit the GPU, purple not the host RAM, red failed, blue no GPU "
                 "measured (the CPU); samples/s in each cell (one run each)", fontsize=10)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


def markdown(table, fastest, command: str, continued: str = "") -> str:
    """The map as Markdown: the command, every run's cells, then the fastest fitting variant per budget."""
    return "\n".join(["# dsnb capacity map", "", f"    {command}", "", RULES, "",
                      *([f"Continued: {continued}.", ""] if continued else []),
                      md_table(table.drop(columns=["run_id"])), "", "## Fastest variant that fits", "",
                      "Each cell is one run: no run-to-run spread is measured, so speeds a few percent apart are not "
                      "told apart.", "",
                      md_table(fastest), ""])


def md_table(frame) -> str:
    def cell(value):
        if value is None or value != value:  # None or NaN: nothing fits there, or nothing was measured
            return "-"
        return f"{value:.3g}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines)


def run_capacity(path: str, offline: bool = False, gpus: int = 1, overrides: dict | None = None,
                 out_dir: str = "", progress: bool = True, only: str = ""):
    """Run every cell of a capacity file; return (table, fastest, PNG bytes). The PNG is logged to every run;
    with out_dir, capacity.md, capacity.csv and capacity.png are written there (never over existing files). One map
    at a time on a store: a second waits, then keeps what the first measured or finds its files."""
    budgets, cells = load_capacity(path, offline, overrides, only)
    if not cells:
        raise ConfigError(f"{path}: --only {only!r} leaves no cell to run (the file's skip list may hold them)")
    with tracking.one_at_a_time(cells[0][2].tracking_uri, "capacity map", progress):
        return _run_capacity(path, offline, gpus, out_dir, progress, only, budgets, cells)


def _run_capacity(path: str, offline: bool, gpus: int, out_dir: str, progress: bool, only: str, budgets, cells):
    if out_dir:
        check_output_folder(out_dir, "--out")
    outputs = {ext: os.path.join(out_dir, f"capacity.{ext}") for ext in ("md", "csv", "png")} if out_dir else {}
    taken = [p for p in outputs.values() if os.path.exists(p)]
    if taken:
        raise ConfigError(f"{taken[0]} exists; move it or pick another --out")
    results, continued = continue_jobs("capacity", [(f"{model}/{name}", cfg) for model, name, cfg in cells],
                                       this_machine(), progress=progress, gpus=gpus)
    table = capacity_table(cells, results, budgets)
    table.attrs["continued"] = continued  # where an interrupted map's runs were kept, it says so
    fastest = fastest_fitting(table, budgets)
    png = plot_capacity(table, budgets)
    client = mlflow_client(cells[0][2].tracking_uri)
    for result in results:
        client.log_image(result.run_id, _image(png), "capacity_map.png")
    if outputs:
        os.makedirs(out_dir, exist_ok=True)
        command = f"python -m dsnb capacity -f {path}" + (" --offline" if offline else "") + \
                  (f" --gpus {gpus}" if gpus > 1 else "") + (f" --only {only}" if only else "")
        # each file whole, none over another's
        written = [write_new(outputs["md"], markdown(table, fastest, command, continued)),
                   write_new(outputs["csv"], table.to_csv(index=False)), write_new(outputs["png"], png)]
        if written != list(outputs.values()):
            print(f"capacity files appeared in {out_dir} while this map ran; this one's: {', '.join(written)}")
    mark_written("capacity", results, written[0] if outputs else "returned")
    return table, fastest, png


def _image(png: bytes):
    from PIL import Image

    return Image.open(io.BytesIO(png))
