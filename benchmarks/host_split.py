"""Where the host's time goes in a step of dsnb's compiled loop, without the profiler's own cost.

    python benchmarks/host_split.py [variant] [--steps N] [--out FILE]    # on the GPU machine; default fast_compiled

Runs one bench variant in this process with perf_counter marks around each phase of each step: the next batch
(data loader, collation, copy), the forward call, the backward call, the rest of the step (clipping, optimizer,
schedule, zeroing) and the loop's own bookkeeping (loss sums, logging, progress). Nothing here waits for the GPU,
so a phase's time is the host's, unless it blocks on the GPU (then it shows up large). The GPU's time for the
same steps comes from CUDA events. A step whose host time exceeds its GPU time is host-bound.
"""
import argparse
import json
import statistics
import sys
import time
from collections import defaultdict


class Split:
    """Wraps dsnb's compiled loop (step_batches, PlainStep.step) with a clock read at each phase's end."""

    def __init__(self):
        import torch

        from dsnb import loop

        self.phases: dict[str, list[float]] = defaultdict(list)
        self.gpu: list = []  # CUDA events at each step's start and end
        self.last = None
        self.cuda = torch.cuda.is_available()
        self.batches, self.plain_step = loop.step_batches, loop.PlainStep.step
        loop.step_batches, loop.PlainStep.step = self.timed_batches, self.step_method()

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        if self.last is not None:
            self.phases[name].append(now - self.last)
        self.last = now

    def timed_batches(self, *args, **kw):
        items = self.batches(*args, **kw)
        while True:
            self.mark("loop bookkeeping")  # since the end of the last step
            item = next(items, None)
            if item is None:
                return
            self.mark("next batch")
            yield item

    def step_method(self):
        import torch

        split = self

        def backward(tensor, *args, **kw):
            split.mark("loss, scaling")
            split.tensor_backward(tensor, *args, **kw)
            split.mark("backward")

        def step(stepper, micro, items, timer):
            events = [torch.cuda.Event(enable_timing=True) for _ in range(2)] if split.cuda else []
            if events:
                events[0].record()
            forward, split.tensor_backward = stepper.forward, torch.Tensor.backward
            stepper.forward = lambda *x, **k: (split.mark("before forward"), forward(*x, **k), split.mark("forward"))[1]
            torch.Tensor.backward = backward
            try:
                out = split.plain_step(stepper, micro, items, timer)
            finally:
                stepper.forward, torch.Tensor.backward = forward, split.tensor_backward
            split.mark("clip, optimizer, schedule")
            if events:
                events[1].record()
                split.gpu.append(events)
            return out
        return step

    def report(self, skip: int) -> dict:
        """Medians over the steps after the first `skip`, in ms."""
        import torch

        if self.gpu:
            torch.cuda.synchronize()
        rows = {name: 1000 * statistics.median(v[skip:]) for name, v in self.phases.items() if len(v) > skip}
        gpu = statistics.median(s.elapsed_time(e) for s, e in self.gpu[skip:]) if self.gpu else None
        return {"host_ms_median": rows, "host_ms_sum": sum(rows.values()), "gpu_step_span_ms_median": gpu}


def main() -> None:
    from dsnb import train
    from dsnb.bench import bench_configs

    p = argparse.ArgumentParser()
    p.add_argument("variant", nargs="?", default="fast_compiled")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--untimed", type=int, default=10)
    p.add_argument("--out", default=None)
    p.add_argument("--offline", action="store_true", help="the CPU's offline variant (a check of this script)")
    a = p.parse_args()
    cfg = bench_configs(a.offline, a.untimed, a.steps, "sqlite:////tmp/host_split.db")[a.variant]
    if not cfg.torch_compile or cfg.zero_stage is not None or cfg.grad_accum != 1:
        p.error(f"{a.variant}: this split times the compiled loop without DeepSpeed, one micro-batch a step")
    split = Split()
    train.train(cfg)
    text = json.dumps({"variant": a.variant, "steps": a.steps, **split.report(a.untimed + 1)}, indent=1)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
