"""What DeepSpeed's ZeRO-2 step costs the host, and what dsnb's flat step leaves of it, on the CPU.

    python benchmarks/zero_flat_cpu.py      # prints a table; about 30 s on this 2-core machine

A compiled LoRA step on a GPU is host-bound once DeepSpeed's step takes longer on the host than the GPU's arithmetic
(3B LoRA on the H200: 16.5 ms of GPU work; benchmarks/results/zero_flat_h200.md). This measures that host time
alone: a model shaped like 3B LoRA's trained tensors (112: 56 pairs A, B) around tiny frozen layers, in bf16, so
the arithmetic is small and the step time is mostly Python and dispatch. One process (one thread), the variants
interleaved, `ROUNDS` rounds of `STEPS` steps each (the first `WARM` of each round dropped); medians and [min-max]
of the rounds' median step times:
- no DeepSpeed: backward, clipping, fused AdamW (dsnb's compiled step without DeepSpeed, uncompiled here);
- ZeRO-2 as dsnb builds it on one GPU (`dsnb/zero.py`: bf16, no overflow check, no overlap_comm), DeepSpeed's
  throughput timer on (its default) and off (dsnb's configs), with DeepSpeed's own step;
- the same with dsnb's flat step (`dsnb/flat_step.py::take_over`), as compiled runs take it.
"""
import statistics
import sys
import time

import torch

ROUNDS, STEPS, WARM = 3, 40, 8
LAYERS, WIDTH, RANK = 56, 32, 4


class Lora(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.base = torch.nn.Linear(WIDTH, WIDTH, bias=False).requires_grad_(False)
        self.A = torch.nn.Parameter(torch.randn(RANK, WIDTH) * 0.1)
        self.B = torch.nn.Parameter(torch.randn(WIDTH, RANK) * 0.1)

    def forward(self, x):
        return x + 0.3 * torch.tanh(self.base(x) + x @ self.A.t() @ self.B.t())


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(*[Lora() for _ in range(LAYERS)]).to(torch.bfloat16)


def plain():
    """One step without DeepSpeed."""
    m = model()
    params = [p for p in m.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3, fused=True)

    def step(x):
        m(x).float().pow(2).mean().backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def zero2(timer: bool, flat: bool):
    """One step of a ZeRO-2 engine configured as dsnb builds it on one GPU in bf16."""
    import deepspeed

    from dsnb.flat_step import take_over

    config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
              "bf16": {"enabled": True, "check_grad_overflow": False}, "steps_per_print": 10**6,
              "timers": {"throughput": {"enabled": timer}},
              "zero_optimization": {"stage": 2, "contiguous_gradients": True, "overlap_comm": False}}
    m = model()
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-3, fused=True)
    e, *_ = deepspeed.initialize(model=m, optimizer=opt, config=config)
    if flat and not take_over(e):
        sys.exit("dsnb's flat step did not take this engine over")

    def step(x):
        e.backward(e(x).float().pow(2).mean())
        e.step()
    return step


def main() -> None:
    from dsnb.train import deepspeed_env

    deepspeed_env("cpu")
    torch.set_num_threads(1)
    variants = {"no DeepSpeed": plain(),
                "ZeRO-2, DeepSpeed's step, its timer on": zero2(True, False),
                "ZeRO-2, DeepSpeed's step, timer off": zero2(False, False),
                "ZeRO-2, dsnb's flat step, timer off": zero2(False, True)}
    x = torch.randn(4, WIDTH).to(torch.bfloat16)
    rounds: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(ROUNDS):
        for name, step in variants.items():
            times = []
            for _ in range(STEPS):
                began = time.perf_counter()
                step(x)
                times.append(1000 * (time.perf_counter() - began))
            rounds[name].append(statistics.median(times[WARM:]))
    base = statistics.median(rounds["no DeepSpeed"])
    print(f"# DeepSpeed's ZeRO-2 step on the host: {LAYERS * 2} LoRA-shaped tensors in bf16, one CPU thread\n\n"
          f"    python benchmarks/zero_flat_cpu.py   ({ROUNDS} rounds interleaved, {STEPS - WARM} timed steps each)\n\n"
          "| variant | step ms, median [min-max] of the rounds | vs no DeepSpeed |\n|---|---|---|")
    for name, values in rounds.items():
        mid = statistics.median(values)
        print(f"| {name} | {mid:.2f} [{min(values):.2f}-{max(values):.2f}] | {mid / base:.2f}x |")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
