"""The H200 tables and pictures in benchmarks/results/, rebuilt from the run listings the GPU stages wrote.

    python benchmarks/tables_from_runs.py        # reads benchmarks/results/h200_runs/*.jsonl

benchmarks/gpu_runs.sh ends every stage with benchmarks/dump_runs.py: one JSON line per MLflow run. The
device's 10-minute limit can cut a stage short before dsnb writes its own tables, so these listings are
the record, and this script applies dsnb's own summaries (bench.summarize, capacity.capacity_table) to
them. How each was measured, in words, lives in benchmarks/results/notes/, appended to each table. Superseded tables
are rebuilt the same way inside benchmarks/results/archive/ (its own h200_runs/ and notes/); benchmarks/README.md
says which table is current.
"""
import json
import os

from dsnb.bench import markdown as bench_markdown
from dsnb.bench import summarize
from dsnb.capacity import capacity_table, fastest_fitting, load_capacity, plot_capacity
from dsnb.capacity import markdown as capacity_markdown
from dsnb.tracking import RunResult

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
RUNS = os.path.join(HERE, "h200_runs")
ARCHIVE = os.path.join(HERE, "archive")  # superseded results, laid out as results/ is


def read_runs(name: str, root: str = HERE) -> list[RunResult]:
    """A listing of dump_runs.py (JSON lines) in root's h200_runs/ as RunResults."""
    with open(os.path.join(root, "h200_runs", name)) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [RunResult(r["run_id"], r["name"], r["status"], "", r["metrics"], wall_seconds=r["wall_seconds"])
            for r in rows]


def notes(name: str, root: str = HERE) -> str:
    with open(os.path.join(root, "notes", name)) as f:
        return "\n" + f.read()


def bench() -> None:
    # The throughput mode: only its own invocation on one GPU (bench.jsonl's recompiled for each batch shape;
    # another ran under DataParallel: archive/h200_runs/throughput_dataparallel.jsonl).
    runs = [r for r in read_runs("bench.jsonl") if r.name != "throughput_compiled"] + read_runs("throughput.jsonl")
    names = list(dict.fromkeys(r.name for r in runs))
    rows = [summarize(name, [r for r in runs if r.name == name]) for name in names]
    base = next(r for r in rows if r["name"] == "tutorial")
    for row in rows:
        row["ratio_to_tutorial"] = row["samples_per_second"] / base["samples_per_second"] if row["name"] != \
            "throughput_compiled" else None
    result = {"gpu": "NVIDIA H200", "command": "OUT=out bash benchmarks/gpu_runs.sh bench throughput",
              "untimed_steps": 3, "timed_steps": 6, "gpus_side_by_side": 2,
              "mfu_convention": "model FLOPs per real token (6N full, 4N + 6N_trainable LoRA; N = matmul weights) "
                                "/ dense bf16 datasheet peak (989 TFLOP/s)",
              "variants": rows}
    with open(os.path.join(HERE, "nvidia_h200.json"), "w") as f:
        json.dump(result, f, indent=2)
    with open(os.path.join(HERE, "nvidia_h200.md"), "w") as f:
        f.write(bench_markdown(result) + notes("nvidia_h200.md"))






def table(listing: str, names: list[str], stem: str, command: str, untimed: int, steps: int, side_by_side: int,
          base: str, repeats: bool = False, root: str = HERE) -> None:
    """A bench-shaped table of some runs of a listing, ratios to `base`: each name's last run (a retry replaces a
    failed attempt), or with `repeats` the median and spread over all of its runs. root: results/ or its archive/."""
    listed = read_runs(listing, root)
    last = {r.name: r for r in listed}
    rows = [summarize(name, [r for r in listed if r.name == name] if repeats else [last[name]])
            for name in names if name in last]
    ref = next(r for r in rows if r["name"] == base)
    for row in rows:
        row["ratio_to_tutorial"] = row["samples_per_second"] / ref["samples_per_second"] \
            if row["samples_per_second"] else None
    result = {"gpu": "NVIDIA H200", "command": command, "untimed_steps": untimed, "timed_steps": steps,
              "gpus_side_by_side": side_by_side, "mfu_convention": "model FLOPs per real token (6N full, 4N + "
              "6N_trainable LoRA; N = matmul weights) / dense bf16 datasheet peak (989 TFLOP/s)", "variants": rows}
    with open(os.path.join(root, f"{stem}.json"), "w") as f:
        json.dump(result, f, indent=2)
    with open(os.path.join(root, f"{stem}.md"), "w") as f:
        f.write(bench_markdown(result).replace("| vs tutorial |", f"| vs {base} |") + notes(f"{stem}.md", root))


def curve_gaps(listing: str, pairs: list[tuple[str, str]], stem: str) -> None:
    """Append to stem.md, per pair of runs, how far apart their loss curves are (logged at every step)."""
    with open(os.path.join(RUNS, listing)) as f:
        curves = {r["name"]: dict(r["loss_curve"]) for r in map(json.loads, f) if r.get("loss_curve")}
    lines = ["", "| runs | steps | max abs difference | mean loss difference |", "|---|---|---|---|"]
    for a, b in pairs:
        steps = sorted(set(curves[a]) & set(curves[b]))
        gap = max(abs(curves[a][s] - curves[b][s]) for s in steps)
        mean = sum(curves[a][s] - curves[b][s] for s in steps) / len(steps)
        lines.append(f"| {a} vs {b} | {len(steps)} | {gap:.4f} | {mean:+.4f} |")
    with open(os.path.join(HERE, f"{stem}.md"), "a") as f:
        f.write("\n".join(lines) + "\n")


def levers() -> None:
    """throughput_levers_h200.md: each lever's runs (benchmarks/throughput_levers.py, one JSON line a run)."""
    with open(os.path.join(RUNS, "throughput_levers.jsonl")) as f:
        runs = [json.loads(line) for line in f if line.strip()]
    lines = ["# The throughput mode's levers on one H200", "",
             "`python benchmarks/throughput_levers.py LEVER --out levers.jsonl` for base, flex, rows256 and cdt in one "
             "call, then flex and base in a second; filled, flex, nodrop, filled, flex, nodrop in a third, a later "
             "session; inddrop in a fourth, after three cold repeats of the throughput mode (listing: "
             "h200_runs/throughput_levers.jsonl; 8 untimed and 12 timed steps)", "",
             "| call | lever | run | samples/s | real tokens/s | MFU | step ms | mean loss |",
             "|---|---|---|---|---|---|---|---|"]
    seen: dict[str, int] = {}
    for r in runs:
        seen[r["lever"]] = seen.get(r["lever"], 0) + 1
        lines.append(f"| {r.get('call', '')} | {r['lever']} | {seen[r['lever']]} | {r['samples_per_second']:.0f} | "
                     f"{r['tokens_per_second']:,.0f} | {100 * r['mfu']:.1f}% | {r['step_time_ms']:.0f} | "
                     f"{r['train_loss']:.3f} |")
    with open(os.path.join(HERE, "throughput_levers_h200.md"), "w") as f:
        f.write("\n".join(lines) + "\n" + notes("throughput_levers_h200.md"))


def keepmask() -> None:
    """throughput_keepmask_h200.md: the throughput mode's cold repeats with dsnb's dropout kernel, by call."""
    with open(os.path.join(RUNS, "throughput_keepmask.jsonl")) as f:
        runs = [json.loads(line) for line in f if line.strip()]
    lines = ["# The throughput mode from a cold compile cache, LoRA's dropout masks from dsnb's kernel (one H200)", "",
             "    REPEATS=3 HINTS=0 PROFILE=1 OUT=out bash benchmarks/gpu_runs.sh throughput   (listing: "
             "h200_runs/throughput_keepmask.jsonl; profile: profile_throughput_keepmask_h200.txt)", "",
             "| variant | MLflow run | status | samples/s | real tokens/s | MFU | step ms | peak alloc MB | wall s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        m = r["metrics"]
        variant = f"call{r['call']}_" + r["name"].removeprefix("throughput_compiled_")  # MLflow names repeat by call
        lines.append(f"| {variant} | {r['name']} | {r['status']} | {m['samples_per_second']:.1f} | "
                     f"{m['tokens_per_second']:,.0f} | {100 * m['mfu']:.2f}% | {m['step_time_ms']:.1f} | "
                     f"{m['peak_gpu_allocated_mb']:,.0f} | {r['wall_seconds']:.0f} |")
    with open(os.path.join(HERE, "throughput_keepmask_h200.md"), "w") as f:
        f.write("\n".join(lines) + "\n" + notes("throughput_keepmask_h200.md"))


def fp8() -> None:
    """fp8_h200.md: fp8 base weights against bf16, a pair of runs a call (bf16 first), each from a cold compile cache;
    per pair the fp8 run's tokens/s over the bf16 run's and how far apart their loss curves are (every step logged)."""
    with open(os.path.join(RUNS, "fp8.jsonl")) as f:
        runs = [json.loads(line) for line in f if line.strip()]
    lines = ["# fp8 base weights against bf16 through dsnb's run (one H200)", "",
             "    PARTS=throughput REPEATS=1 OUT=out bash benchmarks/gpu_runs.sh fp8   # calls 1-3, one after another",
             "    PARTS=fast OUT=out bash benchmarks/gpu_runs.sh fp8                   # call 4", "",
             "Listing: h200_runs/fp8.jsonl (MLflow names repeat by call; `call` numbers them). MFU: model FLOPs per "
             "real token over the dense bf16 datasheet peak (989 TFLOP/s), for fp8 runs too: bf16-equivalent, as fp8's "
             "own peak is twice that.", "",
             "| call | run | weights | status | samples/s | real tokens/s | MFU (of bf16's peak) | step ms | "
             "peak alloc MB | mean loss |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        m = r["metrics"]
        lines.append(f"| {r['call']} | {r['name']} | {'fp8' if 'fp8' in r['name'] else 'bf16'} | {r['status']} | "
                     f"{m['samples_per_second']:.1f} | {m['tokens_per_second']:,.0f} | {100 * m['mfu']:.2f}% | "
                     f"{m['step_time_ms']:.1f} | {m['peak_gpu_allocated_mb']:,.0f} | {m['train_loss']:.4f} |")
    lines += ["", "| call | pair | fp8 tokens/s / bf16's | steps | loss, largest gap (fp8 / bf16 - 1) | mean gap |",
              "|---|---|---|---|---|---|"]
    for call in sorted({r["call"] for r in runs}):
        bf16, f8 = (next(r for r in runs if r["call"] == call and kind in r["name"]) for kind in ("bf16", "fp8"))
        a, b = dict(bf16["loss_curve"]), dict(f8["loss_curve"])
        gaps = [b[s] / a[s] - 1 for s in sorted(set(a) & set(b))]
        ratio = f8["metrics"]["tokens_per_second"] / bf16["metrics"]["tokens_per_second"]
        lines.append(f"| {call} | {bf16['name']} / {f8['name']} | {ratio:.3f}x | {len(gaps)} | "
                     f"{max(gaps, key=abs):+.2%} | {sum(gaps) / len(gaps):+.2%} |")
    with open(os.path.join(HERE, "fp8_h200.md"), "w") as f:
        f.write("\n".join(lines) + "\n" + notes("fp8_h200.md"))


def capacity(listings: list[str], spec: str, stem: str, command: str) -> None:
    """The capacity file's cells in its order, each with the last run of its name in the listings (a cell
    measured again replaces its earlier run); cells with no run are left out."""
    runs = {r.name: r for listing in listings for r in read_runs(listing)}
    budgets, cells = load_capacity(spec)
    cells = [c for c in cells if c[2].run_name in runs]
    runs = [runs[c[2].run_name] for c in cells]
    table = capacity_table(cells, runs, budgets)
    ranks = [{k: v for k, v in r.metrics.items() if k.startswith("peak_gpu_allocated_mb_rank")} for r in runs]
    if any(ranks):
        table["per_gpu_allocated_gb"] = [" / ".join(f"{v / 1024:.1f}" for v in r.values()) or "" for r in ranks]
    fastest = fastest_fitting(table, budgets)
    with open(os.path.join(HERE, f"{stem}.md"), "w") as f:
        f.write(capacity_markdown(table, fastest, command) + notes(f"{stem}.md"))
    with open(os.path.join(HERE, f"{stem}.png"), "wb") as f:
        f.write(plot_capacity(table, budgets))


def multi_gpu_bars() -> None:
    """Per-GPU allocator peak of each stage on one GPU and on two: multi_gpu_memory_h200.png."""
    from matplotlib.figure import Figure

    peaks = {r.name.split()[1]: r.metrics["peak_gpu_allocated_mb"] / 1024 for r in read_runs("multi_gpu.jsonl")}
    stages = [("plain / DDP", "baseline_1gpu", "ddp_2gpu")] + [(f"ZeRO-{s}", f"zero{s}_1gpu", f"zero{s}_2gpu")
                                                               for s in (1, 2, 3)]
    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()
    x = range(len(stages))
    ax.bar([i - 0.2 for i in x], [peaks[one] for _, one, _ in stages], 0.4, label="1 GPU")
    ax.bar([i + 0.2 for i in x], [peaks[two] for _, _, two in stages], 0.4, label="2 GPUs (each)")
    ax.set(xticks=list(x), xticklabels=[name for name, _, _ in stages], ylabel="peak allocated per GPU (GB)",
           title="full fine-tuning of the 3B shape, bf16, H200")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(HERE, "multi_gpu_memory_h200.png"), dpi=100)


def scaling() -> None:
    """The 8B shape's capacity table (micro-batch 8 per GPU), then each stage's speed-up from one GPU to two at a
    micro-batch of 8 and, for ZeRO-3, 16 per GPU: scale_8b_h200.md and .png, and scale_8b_scaling_h200.png."""
    capacity(["scale_8b.jsonl"], "variants/scale_8b.yaml", "scale_8b_h200",
             "python -m dsnb capacity -f variants/scale_8b.yaml --gpus 1 --only ...   (OUT=out bash "
             "benchmarks/gpu_runs.sh scale8b, in two calls by ONLY; listing: h200_runs/scale_8b.jsonl)")
    rows = []  # (label, micro-batch, 1-GPU metrics or None, 2-GPU metrics)
    for listing, batch in (("scale_8b.jsonl", 8), ("scale_8b_b16.jsonl", 16)):
        runs = {r.name.split()[1]: r.metrics for r in read_runs(listing)}
        for stage in ("zero2", "zero2_offload", "zero3", "zero3_offload"):
            if f"{stage}_2gpu" in runs:
                label = stage.replace("zero", "ZeRO-").replace("_offload", " + CPU offload (optimizer)")
                rows.append((label, batch, runs.get(f"{stage}_1gpu"), runs[f"{stage}_2gpu"]))
    lines = ["", "## From one GPU to two", "",
             "Efficiency: samples/s on two GPUs over twice the samples/s on one, at the same micro-batch per GPU "
             "(scale_8b_scaling_h200.png).", "",
             "| stage | micro-batch per GPU | 1 GPU samples/s | 2 GPUs samples/s | speed-up | efficiency | "
             "peak allocated per GPU, 1 -> 2 GPUs |", "|---|---|---|---|---|---|---|"]
    for label, batch, one, two in rows:
        gb = f"{one['peak_gpu_allocated_mb'] / 1024:.1f}" if one else "-"
        speed = f"{one['samples_per_second']:.2f}" if one else "not run (estimated over the GPU)"
        up = two["samples_per_second"] / one["samples_per_second"] if one else None
        lines.append(f"| {label} | {batch} | {speed} | {two['samples_per_second']:.2f} | "
                     f"{f'{up:.2f}x' if up else '-'} | {f'{50 * up:.0f}%' if up else '-'} | "
                     f"{gb} -> {two['peak_gpu_allocated_mb'] / 1024:.1f} GB |")
    path = os.path.join(HERE, "scale_8b_h200.md")
    with open(path) as f:
        text = f.read()
    table, note = text.split("\nHow these were measured", 1)
    with open(path, "w") as f:
        f.write(table + "\n".join(lines) + "\n\nHow these were measured" + note)
    scaling_bars(rows)


def scaling_bars(rows) -> None:
    """samples/s on one GPU and on two for each stage, labelled with the efficiency."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    fig = Figure(figsize=(8, 4))
    ax = fig.subplots()
    for i, (_, _, one, two) in enumerate(rows):
        if one:
            ax.bar(i - 0.2, one["samples_per_second"], 0.4, color="#90caf9")
        ax.bar(i + 0.2, two["samples_per_second"], 0.4, color="#1565c0")
        note = f"{50 * two['samples_per_second'] / one['samples_per_second']:.0f}%" if one else "not on 1"
        ax.annotate(note, (i, two["samples_per_second"]), ha="center", va="bottom", fontsize=9)
    ax.set(xticks=range(len(rows)), ylabel="samples/s",
           xticklabels=[f"{label.replace(' (optimizer)', '')}\nmicro-batch {batch}" for label, batch, _, _ in rows],
           title="8B full fine-tuning, one H200 vs two: samples/s and scaling efficiency")
    ax.tick_params(axis="x", labelsize=8)
    ax.legend(handles=[Patch(color="#90caf9", label="1 GPU"), Patch(color="#1565c0", label="2 GPUs")])
    fig.tight_layout()
    fig.savefig(os.path.join(HERE, "scale_8b_scaling_h200.png"), dpi=100)


if __name__ == "__main__":
    bench()
    table("speed.jsonl", ["full", "full_compiled", "full_zero2_compiled", "full_zero2_compiled_2gpu",
                          "full_zero3_compiled", "full_zero3_offload_15gb", "fast_zero2_compiled", "tutorial"],
          "deepspeed_compiled_h200", "OUT=out bash benchmarks/gpu_runs.sh last   (and the speed stage before it: "
          "h200_runs/speed.jsonl)", 4, 8, 2, "full")
    table("colab.jsonl", ["t4_fp16_trainer", "t4_fp16_compiled", "fast_compiled"], "colab_t4_h200",
          "OUT=out bash benchmarks/gpu_runs.sh colab   (h200_runs/colab.jsonl)", 10, 30, 2, "t4_fp16_trainer")
    table("profile.jsonl", ["profile_fast_compiled", "profile_fast_zero2_compiled"], "profile_lora_h200",
          "OUT=out bash benchmarks/gpu_runs.sh profile   (h200_runs/profile.jsonl)", 8, 24, 1, "profile_fast_compiled",
          root=ARCHIVE)
    table("fast.jsonl", ["fast", "fast_compiled", "fast_zero2_compiled"], "fast_recipe_h200",
          "OUT=out bash benchmarks/gpu_runs.sh fast   (h200_runs/fast.jsonl)", 8, 24, 1, "fast", repeats=True)
    table("zero_graphs.jsonl", ["lora_fast_compiled", "lora_fast_compiled_2", "lora_zero2_graphs",
                                "lora_zero2_nosync_graphs", "lora_zero2_nosync_graphs_2",
                                "lora_zero1_nohooks_nocheck_graphs"], "zero_graphs_h200",
          "OUT=out PROFILE=zero2_nosync_graphs_2 bash benchmarks/gpu_runs.sh zerographs   "
          "(h200_runs/zero_graphs.jsonl)",
          8, 24, 1, "lora_fast_compiled", root=ARCHIVE)
    table("graphscheck.jsonl", ["plain_ga2", "plain_ga2_nographs", "z2_ga2", "z2_ga2_nographs", "z2_fp16",
                                "z2_fp16_nographs", "z2_ga2_flat", "z2_ga2_flat_nographs"], "graphs_check_h200",
          "OUT=out bash benchmarks/gpu_runs.sh graphscheck, then VARIANTS=\"z2_fp16 z2_fp16_nographs\" in a "
          "second call; the _flat pair in a later session's call, with VARIANTS=\"z2_ga2 z2_ga2_nographs\" "
          "(h200_runs/graphscheck.jsonl)", 8, 24, 1, "plain_ga2_nographs")
    curve_gaps("graphscheck.jsonl", [("plain_ga2", "plain_ga2_nographs"), ("z2_ga2", "z2_ga2_nographs"),
                                     ("plain_ga2", "z2_ga2"), ("plain_ga2_nographs", "z2_ga2_nographs"),
                                     ("z2_fp16", "z2_fp16_nographs"), ("z2_ga2_flat", "z2_ga2_flat_nographs")],
               "graphs_check_h200")
    table("zero_flat.jsonl", ["lora_fast_compiled", "lora_fast_compiled_2", "lora_zero2_flat", "lora_zero2_flat_2",
                              "lora_zero2_stock", "lora_zero2_stock_2"], "zero_flat_h200",
          "VARIANTS=\"fast_compiled zero2_flat zero2_stock fast_compiled_2 zero2_flat_2 zero2_stock_2\" OUT=out bash "
          "benchmarks/gpu_runs.sh zerographs   (h200_runs/zero_flat.jsonl)", 8, 24, 1, "lora_fast_compiled")
    plain, flat, stock = (["lora_" + name, f"lora_{name}_2"] for name in ("fast_compiled", "zero2_flat", "zero2_stock"))
    curve_gaps("zero_flat.jsonl", [tuple(plain), tuple(flat), tuple(stock), *zip(flat, plain, strict=True),
                                   *zip(flat, stock, strict=True)], "zero_flat_h200")
    table("zero_flat_full.jsonl", ["full_flat", "full_flat_2", "full_stock", "full_stock_2"], "zero_flat_full_h200",
          "VARIANTS=\"full_flat full_stock full_flat_2 full_stock_2\" LIMIT=150 OUT=out bash benchmarks/gpu_runs.sh "
          "zerographs   (h200_runs/zero_flat_full.jsonl)", 8, 24, 1, "full_stock")
    curve_gaps("zero_flat_full.jsonl", [("full_flat_2", "full_stock_2"), ("full_flat", "full_stock"),
                                        ("full_flat", "full_flat_2"), ("full_stock", "full_stock_2")],
               "zero_flat_full_h200")
    table("deepcompile.jsonl", ["zero3", "zero3_dc"], "deepcompile_h200",
          "VARIANTS=\"zero3_dc zero3\" LIMIT=430 OUT=out bash benchmarks/gpu_runs.sh deepcompile   "
          "(h200_runs/deepcompile.jsonl)", 8, 16, 1, "zero3")
    curve_gaps("deepcompile.jsonl", [("zero3_dc", "zero3")], "deepcompile_h200")
    levers()
    keepmask()
    fp8()
    table("t4_passage.jsonl", ["t4_inddrop", "t4_keepmask", "t4_fp16_compiled_keepmask"], "t4_passage_h200",
          "OUT=out bash benchmarks/gpu_runs.sh t4drop   (h200_runs/t4_passage.jsonl; t4_fp16_compiled_keepmask: the "
          "colab stage's t4_fp16_compiled command, a call before)", 10, 30, 1, "t4_inddrop")
    curve_gaps("t4_passage.jsonl", [("t4_keepmask", "t4_inddrop"), ("t4_keepmask", "t4_fp16_compiled_keepmask")],
               "t4_passage_h200")
    capacity(["capacity.jsonl", "capacity_zero3.jsonl", "big.jsonl"], "variants/capacity_map.yaml", "capacity_map_h200",
             "python -m dsnb capacity -f variants/capacity_map.yaml --gpus 2   (listings: h200_runs/capacity.jsonl, "
             "then capacity_zero3.jsonl and big.jsonl)")
    capacity(["multi_gpu.jsonl"], "variants/multi_gpu_zero.yaml", "multi_gpu_h200",
             "python -m dsnb capacity -f variants/multi_gpu_zero.yaml --gpus 2   (listing: h200_runs/multi_gpu.jsonl)")
    multi_gpu_bars()
    scaling()
