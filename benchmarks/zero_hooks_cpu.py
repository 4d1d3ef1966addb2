"""What DeepSpeed's per-parameter gradient hooks cost a compiled LoRA step, on the CPU (synthetic:tiny, fp32).

    python benchmarks/zero_hooks_cpu.py      # prints a table; about 4 minutes on 2 cores
    python benchmarks/zero_hooks_cpu.py --gpu-configs /tmp/ds   # only the 3B shape's DeepSpeed configs of the
                                                                # variants below, for gpu_runs.sh zero1lora/zerographs

benchmarks/results/zero_hooks_cpu.md holds one run's table and what two runs showed.

The compiled LoRA step under ZeRO-2 is host-bound on the H200 (profile_lora_h200.md). DeepSpeed's ZeRO-1/2
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


def no_hooks_config(zero1, path: str) -> None:
    """Write zero1's DeepSpeed config with contiguous_gradients and overlap_comm off: no gradient hooks."""
    config = deepspeed_config(zero1, 1, 0)
    config["zero_optimization"].update(contiguous_gradients=False, overlap_comm=False)
    with open(path, "w") as f:
        json.dump(config, f)


def gpu_configs(zero2, zero1, folder: str) -> None:
    """The GPU variants' DeepSpeed configs (bf16, one GPU): ZeRO-1 without hooks, with and without bf16's
    per-step overflow check (it reads a flag back to the host); ZeRO-2 with that check and overlap_comm (which
    synchronizes the device after backward) on, as dsnb built it before, and off, as dsnb builds it now."""
    os.makedirs(folder, exist_ok=True)
    for name, cfg, zero, check in (
            ("z1_nohooks", zero1, dict(contiguous_gradients=False, overlap_comm=False), True),
            ("z1_nohooks_nocheck", zero1, dict(contiguous_gradients=False, overlap_comm=False), False),
            ("z2_syncs", zero2, dict(overlap_comm=True), True),
            ("z2_nosync", zero2, dict(overlap_comm=False), False)):
        config = deepspeed_config(cfg, 1, 0)
        config["zero_optimization"].update(zero)
        config["bf16"]["check_grad_overflow"] = check
        with open(os.path.join(folder, f"{name}.json"), "w") as f:
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
        return gpu_configs(zero2, zero1, sys.argv[2])
    path = os.path.join(tmp, "zero1_no_hooks.json")
    no_hooks_config(zero1, path)
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
