"""The command-line flags of one bench variant on the GPU (the 3B shape), to run it alone with `python -m dsnb run`.

    python -m dsnb run $(python benchmarks/bench_flags.py full_zero3_compiled 4 8) --tracking_uri ...
"""
import sys

from dsnb.bench import bench_configs
from dsnb.config import RunConfig

name, untimed, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
cfg = bench_configs(False, untimed, steps, "sqlite:///unused.db")[name]
defaults = RunConfig().to_dict()
print(" ".join(f"--{k}={v}" for k, v in cfg.to_dict().items() if v != defaults[k] and k != "tracking_uri"))
