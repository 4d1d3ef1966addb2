"""Several variants, one fresh process each, a failure never stopping the rest.

    results = run_all(tutorial_pair(RunConfig(**OFFLINE)))   # Without_DeepSpeed, With_DeepSpeed
"""
from __future__ import annotations

from .config import RunConfig
from .run import run_variant


def tutorial_pair(cfg: RunConfig) -> list[RunConfig]:
    """The tutorial's two runs on cfg's model and data: no DeepSpeed, then ZeRO-2 with CPU optimizer offload."""
    return [cfg.replace(strategy="baseline", offload_optimizer="none", offload_param="none",
                        run_name="Without_DeepSpeed"),
            cfg.replace(strategy="zero2", offload_optimizer="cpu", offload_param="none", run_name="With_DeepSpeed")]


def run_all(cfgs: list[RunConfig], progress: bool = True) -> list[dict]:
    """Run each config with run_variant, in order, with a bar over the variants; return every result."""
    from tqdm.auto import tqdm

    results = []
    for cfg in tqdm(cfgs, desc="variants", unit="variant", disable=not progress or len(cfgs) < 2):
        results.append(run_variant(cfg, progress=progress))
    return results
