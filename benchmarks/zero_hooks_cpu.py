"""What DeepSpeed's per-parameter gradient hooks cost a compiled LoRA step, on the CPU (synthetic:tiny, fp32).

    python benchmarks/zero_hooks_cpu.py      # prints a table; about 4 minutes on 2 cores
    python benchmarks/zero_hooks_cpu.py --gpu-configs /tmp/ds   # only the 3B shape's DeepSpeed configs of the
                                                                # variants in GPU_CONFIGS, for gpu_runs.sh

benchmarks/results/archive/zero_hooks_cpu.md holds one run's table and what two runs showed.

The compiled LoRA step under ZeRO-2 is host-bound on the H200 (archive/profile_lora_h200.md). DeepSpeed's ZeRO-1/2
optimizer hooks every trainable parameter when gradients are partitioned (stage 2), overlapped with backward
(overlap_comm) or copied into one buffer (contiguous_gradients, which dsnb turns on from stage 1); ZeRO-1 with
both off hooks none and reduces after backward. Four variants, interleaved, `REPEATS` times each: no DeepSpeed,
ZeRO-2, ZeRO-1, ZeRO-1 without hooks; medians and [min-max] of the step time, ratios to no DeepSpeed.
"""
import json
import os
import sys
import tempfile

from dsnb.bench import bench_configs, markdown, summarize
from dsnb.launch import run_all
from dsnb.zero import deepspeed_config

REPEATS = 3


NO_HOOKS = dict(contiguous_gradients=False, overlap_comm=False)
# The GPU variants (bf16, one GPU): name -> (strategy, zero_optimization changes, bf16's per-step overflow check).
# ZeRO-2 "syncs" is how dsnb built it before (the check reads a flag back to the host; overlap_comm synchronizes the
# device after backward), "nosync" how it builds it now.
GPU_CONFIGS = {"z1_nohooks": ("zero1", NO_HOOKS, True), "z1_nohooks_nocheck": ("zero1", NO_HOOKS, False),
               "z2_syncs": ("zero2", dict(overlap_comm=True), True),
               "z2_nocheck": ("zero2", dict(overlap_comm=True), False),
               "z2_nosync": ("zero2", dict(overlap_comm=False), False)}


def write_config(cfg, path: str, zero: dict, check: bool | None = None) -> None:
    """cfg's DeepSpeed config on one device with `zero` changed in its zero_optimization block and, where given,
    bf16's overflow check set."""
    config = deepspeed_config(cfg, 1, 0)
    config["zero_optimization"].update(zero)
    if check is not None:
        config["bf16"]["check_grad_overflow"] = check
    with open(path, "w") as f:
        json.dump(config, f)


def main() -> None:
    if sys.argv[1:] and (sys.argv[1] != "--gpu-configs" or len(sys.argv) != 3):
        sys.exit("usage: python benchmarks/zero_hooks_cpu.py [--gpu-configs FOLDER]")
    tmp = tempfile.mkdtemp(prefix="zero_hooks_")
    offline = not sys.argv[1:]
    cfgs = bench_configs(offline, 5, 30, f"sqlite:///{tmp}/mlflow.db")
    zero2 = cfgs["fast_zero2_compiled"]
    zero1 = zero2.replace(strategy="zero1", run_name="fast_zero1_compiled")
    if not offline:
        os.makedirs(sys.argv[2], exist_ok=True)
        for name, (strategy, zero, check) in GPU_CONFIGS.items():
            write_config(zero2.replace(strategy=strategy), os.path.join(sys.argv[2], f"{name}.json"), zero, check)
        return
    path = os.path.join(tmp, "zero1_no_hooks.json")
    write_config(zero1, path, NO_HOOKS)
    variants = [cfgs["fast_compiled"], zero2, zero1, zero1.replace(ds_config_path=path,
                                                                   run_name="fast_zero1_no_hooks_compiled")]
    jobs = [v for _ in range(REPEATS) for v in variants]
    results = run_all(jobs, progress=False)
    rows = [summarize(v.run_name, [r for c, r in zip(jobs, results, strict=True) if c.run_name == v.run_name])
            for v in variants]
    for row in rows:
        row["ratio_to_tutorial"] = rows[0]["samples_per_second"] / row["samples_per_second"]
    table = markdown({"gpu": "cpu", "command": "python benchmarks/zero_hooks_cpu.py", "untimed_steps": 5,
                      "timed_steps": 30, "variants": rows,
                      "mfu_convention": "as dsnb bench (fp32 on the CPU: not a GPU figure)"})
    sys.stdout.write(table.replace("| vs tutorial |", "| step time vs no DeepSpeed |"))


if __name__ == "__main__":
    main()
