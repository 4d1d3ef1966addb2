"""The H200 tables and pictures in benchmarks/results/, rebuilt from the run listings the GPU stages printed.

    python benchmarks/tables_from_runs.py        # reads benchmarks/results/h200_runs/*.txt

benchmarks/gpu_runs.sh ends every stage with benchmarks/dump_runs.py: one line per MLflow run (name, status,
failure, seconds, metrics, per-rank peaks). The device's 10-minute limit cut the bench and capacity stages
short this session, so their JSON/Markdown were not written there; these listings are what the runs
logged, and this script applies dsnb's own summaries (bench.summarize, capacity.capacity_table) to them.
"""
import ast
import json
import os
import re

from dsnb.bench import markdown as bench_markdown
from dsnb.bench import summarize
from dsnb.capacity import capacity_table, fastest_fitting, load_capacity, plot_capacity
from dsnb.capacity import markdown as capacity_markdown

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
RUNS = os.path.join(HERE, "h200_runs")
LINE = re.compile(r"^(?P<name>.+?) (?P<status>FINISHED|FAILED|KILLED|RUNNING) (?P<failure>\S*) *(?P<secs>-?\d+)s "
                  r"(?P<metrics>\{.*?\}) ?(?P<ranks>\{.*\})?\s*$")


def read_runs(name: str) -> list[dict]:
    runs = []
    for line in open(os.path.join(RUNS, name)):
        m = LINE.match(line.strip())
        if not m:
            raise ValueError(f"{name}: cannot read {line!r}")
        metrics = ast.literal_eval(m["metrics"])
        metrics.update(ast.literal_eval(m["ranks"]) if m["ranks"] else {})
        runs.append({"name": m["name"], "status": m["status"], "wall_seconds": float(m["secs"]), "metrics": metrics,
                     "run_id": ""})
    return runs


def bench() -> None:
    # The throughput mode: only its own invocation on one GPU (bench.txt's recompiled for each batch shape;
    # another ran under DataParallel: h200_runs/throughput_dataparallel.txt).
    runs = [r for r in read_runs("bench.txt") if r["name"] != "throughput_compiled"] + read_runs("throughput.txt")
    names = list(dict.fromkeys(r["name"] for r in runs))
    rows = [summarize(name, [r for r in runs if r["name"] == name]) for name in names]
    base = next(r for r in rows if r["name"] == "tutorial")
    for row in rows:
        row["ratio_to_tutorial"] = row["samples_per_second"] / base["samples_per_second"] if row["name"] != \
            "throughput_compiled" else None
    result = {"gpu": "NVIDIA H200", "command": "OUT=out bash benchmarks/gpu_runs.sh bench throughput",
              "warmup_steps": 3, "timed_steps": 6, "gpus_side_by_side": 2,
              "mfu_convention": "model FLOPs per real token (6N full, 4N + 6N_trainable LoRA; N = matmul weights) "
                                "/ dense bf16 datasheet peak (989 TFLOP/s)",
              "variants": rows}
    with open(os.path.join(HERE, "nvidia_h200.json"), "w") as f:
        json.dump(result, f, indent=2)
    with open(os.path.join(HERE, "nvidia_h200.md"), "w") as f:
        f.write(bench_markdown(result) + NOTES)


NOTES = """
How these were measured: `python -m dsnb bench --gpus 2 --repeats 3 --warmup 3 --steps 6` on two H200s of
one host, two variants at a time, each on its own GPU and in its own process (listing:
`h200_runs/bench.txt`). The device's 10-minute limit stopped the invocation during the last repeat of
throughput_compiled, before it wrote this file; `benchmarks/tables_from_runs.py` rebuilt it from the
runs it had logged. Runs beside a compiling process are slower (inductor's compile workers take the
host's cores): the first `fast` repeat ran beside fast_compiled's first compile (10.6 samples/s against
33.7 and 35.8).

- fast_compiled (bf16, each batch padded to 64 tokens, one micro-batch of 8, dsnb's compiled loop with
  CUDA graphs) is the fast recipe: 252 samples/s median (243-271), 31.7x the tutorial's recipe measured in
  the same invocation, at 7,914 MB allocated against the tutorial's 9,271.
- throughput_compiled (packed rows of 512 tokens, first fit, longest sample first; 256 samples a step, static
  shapes) ran alone on one H200 (`OUT=out bash benchmarks/gpu_runs.sh throughput`: `--only throughput_compiled
  --repeats 3 --warmup 8 --steps 12`; listing `h200_runs/throughput.txt`): 855 samples/s and 42.2% MFU
  median, 299 ms a step. The first repeat, the machine's first process, compiled with a cold inductor cache
  and then stepped at 407 ms (31.0%); the two after it found the cache warm and stepped at 299 and 298 ms
  (42.2%, 42.4%). The previous invocation's first process showed the same 404 ms; the cause is not
  isolated (its kernels are the ones profiled below).
- Where a step's time goes (`profile_throughput_compiled_h200.txt`, the last warm-up step of the third
  repeat, under the profiler: 554 ms wall): 270 ms of GPU kernels, two thirds cuBLAS matmuls, 10% cuDNN
  flash attention; the compiled forward and backward cost 11 ms and 3 ms of host time, i.e. they replay as
  CUDA graphs. Unprofiled, a step takes 299 ms, so about 30 ms a step is outside the kernels (optimizer
  step, clipping, data). The attention stays an inductor fallback to cuDNN (perf hints).
- Before first-fit packing (`h200_runs/throughput_before_first_fit.txt`), packed batches took row counts
  that warm-up had not compiled, and the timed steps recompiled: 223 samples/s, 11.0% MFU median.
  `python benchmarks/packed_rows.py` checks the fix on the CPU: 20 rows in all 240 batches of 60 shuffles.
- An earlier invocation (`h200_runs/throughput_dataparallel.txt`) reported 34.9% MFU: both GPUs were
  visible to it, so HF's DataParallel ran 256 samples on each and the MFU counted both against one GPU's
  peak (about 17% per GPU). dsnb now gives a one-process run exactly one GPU.
"""


CAPACITY_NOTES = """
How these were measured: each cell once, uncapped, two at a time on two H200s, one warm-up step and three
timed steps of 8 samples (so samples/s is rough; peaks are what matter here). The 10-minute device limit
cut the stage before the 8B cells; lora_bf16, qlora_4bit and lora_8bit of the 8B shape and full_zero3_offload
of the 3B shape were run next with the same fields (`h200_runs/capacity.txt` lists every run).

- The ZeRO-3 + CPU offload cells were run again after dsnb began loading ZeRO-3 models straight into
  their partitions (one H200: `OUT=out bash benchmarks/gpu_runs.sh zero3` for 1B and 3B, `... big` for 8B;
  listings `h200_runs/capacity_zero3.txt` and `big.txt`, which replace those cells' earlier runs here).
  1B peaks were unchanged (4,313 and 4,423 MB). 3B with LoRA fell from 6,137 to 5,287 MB: the earlier
  runs had held the whole bf16 model on the GPU before partitioning. 3B full fine-tuning stayed at 6,120
  MB (its 128k x 3072 embedding's whole gradient is on the GPU before it is reduce-scattered) and its NVML
  peak fell from 16.8 to 14.6 GB, so it now fits 15 GB. 8B with LoRA trains at 6,479 MB allocated,
  10,161 MB NVML.
- The 15 GB cells marked tight for 3B full fine-tuning were settled by capped runs
  (`capacity_15gb_h200.md`): without DeepSpeed out of memory at 14.9 GB; ZeRO-2 + CPU offload trains at
  12.3 GB allocated, ZeRO-3 + CPU offload at 6.4 GB (before the loading fix; 6.1 GB after it, above).
- 8B with LoRA under ZeRO-3 + CPU offload capped at 15 GB failed out of memory at 14.3 GB before that fix
  (`h200_runs/budget_15gb_8b.txt` and `.log`) and trains with it: 7,374 MB allocated, 11,058 MB NVML,
  3.1 samples/s (`capacity_15gb_h200.md`).
"""
MULTI_NOTES = """
How these were measured: one-GPU cells two at a time (one per GPU), two-GPU cells alone through torchrun;
one warm-up and three timed steps of a micro-batch of 8 per GPU, so two GPUs train 16 samples a step and
throughput is rough. per_gpu_allocated_gb lists rank 0 and rank 1; multi_gpu_memory_h200.png draws the peaks.

- ZeRO-1 and ZeRO-2 on one GPU peak at 71.9 GB: DeepSpeed's bf16 training keeps fp32 master weights, fp32
  gradients and two fp32 Adam states (16 bytes a parameter, 51 GB for 3.2B) beside the bf16 weights.
  On two GPUs each holds half of the optimizer state (stage 1) and of the gradients (stage 2): 39.0 GB.
- ZeRO-3 also splits the parameters: 56.4 GB on one GPU, 32.4 GB on each of two.
- Plain PyTorch (30.0 GB) keeps AdamW's states in bf16; DDP on two GPUs replicates it (36.0 GB each).
- DeepSpeed's own launcher (`deepspeed --num_gpus 2 --module dsnb run ...`) failed there on `--local_rank`,
  which it passes before the command; dsnb's CLI now accepts it, and `tests/test_cli.py` runs that launcher
  with two CPU processes.
"""


def capacity(listings: list[str], spec: str, stem: str, command: str, notes: str) -> None:
    """The capacity file's cells in its order, each with the last run of its name in the listings (a cell
    measured again replaces its earlier run); cells with no run are left out."""
    runs = {r["name"]: r for listing in listings for r in read_runs(listing)}
    budgets, cells = load_capacity(spec)
    cells = [c for c in cells if c[2].run_name in runs]
    runs = [runs[c[2].run_name] for c in cells]
    table = capacity_table(cells, runs, budgets)
    ranks = [{k: v for k, v in r["metrics"].items() if k.startswith("peak_gpu_allocated_mb_rank")} for r in runs]
    if any(ranks):
        table["per_gpu_allocated_gb"] = [" / ".join(f"{v / 1024:.1f}" for v in r.values()) or "" for r in ranks]
    fastest = fastest_fitting(table, budgets)
    with open(os.path.join(HERE, f"{stem}.md"), "w") as f:
        f.write(capacity_markdown(table, fastest, command) + notes)
    with open(os.path.join(HERE, f"{stem}.png"), "wb") as f:
        f.write(plot_capacity(table, budgets))


def multi_gpu_bars() -> None:
    """Per-GPU allocator peak of each stage on one GPU and on two: multi_gpu_memory_h200.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    peaks = {r["name"].split()[1]: r["metrics"]["peak_gpu_allocated_mb"] / 1024 for r in read_runs("multi_gpu.txt")}
    stages = [("plain / DDP", "baseline_1gpu", "ddp_2gpu")] + [(f"ZeRO-{s}", f"zero{s}_1gpu", f"zero{s}_2gpu")
                                                               for s in (1, 2, 3)]
    fig, ax = plt.subplots(figsize=(7, 4))
    x = range(len(stages))
    ax.bar([i - 0.2 for i in x], [peaks[one] for _, one, _ in stages], 0.4, label="1 GPU")
    ax.bar([i + 0.2 for i in x], [peaks[two] for _, _, two in stages], 0.4, label="2 GPUs (each)")
    ax.set(xticks=list(x), xticklabels=[name for name, _, _ in stages], ylabel="peak allocated per GPU (GB)",
           title="full fine-tuning of the 3B shape, bf16, H200")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(HERE, "multi_gpu_memory_h200.png"), dpi=100)


if __name__ == "__main__":
    bench()
    capacity(["capacity.txt", "capacity_zero3.txt", "big.txt"], "variants/capacity_map.yaml", "capacity_map_h200",
             "python -m dsnb capacity -f variants/capacity_map.yaml --gpus 2   (listings: h200_runs/capacity.txt, "
             "then capacity_zero3.txt and big.txt)",
             CAPACITY_NOTES)
    capacity(["multi_gpu.txt"], "variants/multi_gpu_zero.yaml", "multi_gpu_h200",
             "python -m dsnb capacity -f variants/multi_gpu_zero.yaml --gpus 2   (listing: h200_runs/multi_gpu.txt)",
             MULTI_NOTES)
    multi_gpu_bars()
