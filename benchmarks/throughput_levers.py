"""The throughput mode with one lever changed, in this process: what each lever buys toward 50% MFU.

    python benchmarks/throughput_levers.py LEVER [--untimed 8] [--steps 12] [--out FILE]   # on the GPU machine

LEVER is one of:
  base     the throughput mode with SDPA: packed rows of 512 tokens, attention through the block-diagonal mask
           transformers builds from the restarting position ids (the bench's throughput_compiled before flex)
  flex     attention flex, as the bench's throughput_compiled runs now: transformers' packed-sequence BlockMask,
           built inside the compiled graph, so the 128 x 128 blocks where no sample meets another are skipped
  cdt      base with inductor's coordinate-descent tuning of its Triton kernels (norms, rotary, SiLU)
  rows256  base with rows of 256 tokens (attention per token halves; more of each row is tail padding)
  --offline: the CPU's offline variant (a check of this script; flex has no backward on the CPU)

Prints (and with --out appends) one JSON line: the lever, samples/s, real tokens/s, MFU, step time and mean loss.
"""
import argparse
import json
import sys


def main() -> None:
    from dsnb import train
    from dsnb.bench import bench_configs

    p = argparse.ArgumentParser()
    p.add_argument("lever", choices=("base", "flex", "cdt", "rows256"))
    p.add_argument("--untimed", type=int, default=8)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--out", default=None)
    p.add_argument("--tracking_uri", default="sqlite:////tmp/throughput_levers.db")
    p.add_argument("--offline", action="store_true")
    a = p.parse_args()
    cfg = bench_configs(a.offline, a.untimed, a.steps, a.tracking_uri)["throughput_compiled"]
    cfg = cfg.replace(run_name=f"throughput_{a.lever}", experiment="dsnb_throughput_levers",
                      attention="flex" if a.lever == "flex" else "sdpa")
    if a.lever == "cdt":
        import torch._inductor.config

        torch._inductor.config.coordinate_descent_tuning = True
    elif a.lever == "rows256":
        cfg = cfg.replace(max_length=256)
    metrics = train.train(cfg)
    keys = ("samples_per_second", "tokens_per_second", "mfu", "step_time_ms", "train_loss", "peak_gpu_allocated_mb")
    line = json.dumps({"lever": a.lever, **{k: metrics.get(k) for k in keys}})
    print(line)
    if a.out:
        with open(a.out, "a") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    sys.exit(main())
