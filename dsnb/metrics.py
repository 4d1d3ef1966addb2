"""What a run costs, measured: peak memory (allocator, NVML, RSS), throughput in samples and real tokens, MFU.

    with PeakMemory(device) as mem:       # NVML and RSS sampled in a thread at 20 Hz
        trainer.train()
    mem.summary()                         # peak_gpu_allocated_mb, peak_gpu_reserved_mb, peak_gpu_nvml_mb, ...
    timer = StepTimer(device, untimed_steps=1)   # marks after each step; timer.throughput(...) after training

MFU convention: model FLOPs per real (non-padding) token = 6 N for full fine-tuning and 4 N + 6 N_trainable
with LoRA (forward 2 N, input gradients 2 N, weight gradients only for trained weights), where N counts
the weights of every matrix multiply (attention and MLP projections and the LM head; attention scores
and embedding lookups left out), divided by the device's dense bf16/fp16 peak from its datasheet (on the CPU, its
nominal fp32 peak: cpu_peak_flops).
"""
from __future__ import annotations

import os
import resource
import threading
import time
from dataclasses import dataclass

MB = 2**20
# Dense (no sparsity) bf16/fp16 tensor-core peaks from the vendors' datasheets, FLOP/s.
GPU_PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "L40": 181e12, "L4": 121e12,
                  "A10G": 70e12, "A10": 125e12, "T4": 65e12, "V100": 125e12, "RTX 4090": 165e12, "A6000": 155e12}


class PeakMemory:
    """Peak GPU memory (allocator and NVML) and host memory of this process over a `with` block: resident (RSS) and
    its anonymous part, which leaves out the pages of memory-mapped weight files that the kernel can drop."""

    def __init__(self, device: str, interval: float = 0.05):
        self.device, self.interval = device, interval
        self.cuda = device.startswith("cuda")
        self.nvml_peak = self.nvml_start = 0
        self.rss_peak = self.anon_peak = 0
        self._stop = threading.Event()
        self._handle = None

    def __enter__(self):
        import psutil

        self._proc = psutil.Process()
        if self.cuda:
            import pynvml
            import torch

            index = torch.device(self.device).index or 0
            self._handle = nvml_handle(index)
            # Device-wide use before this run touched the GPU; the run's share (its context included)
            # is the rise above it.
            self.nvml_start = pynvml.nvmlDeviceGetMemoryInfo(self._handle).used
            torch.cuda.set_device(index)
            torch.zeros(1, device=self.device)  # the context and allocator exist from here on
            torch.cuda.reset_peak_memory_stats(index)
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def sample(self):
        self.rss_peak = max(self.rss_peak, self._proc.memory_info().rss)
        self.anon_peak = max(self.anon_peak, anonymous_bytes())
        if self._handle is not None:
            import pynvml

            self.nvml_peak = max(self.nvml_peak, pynvml.nvmlDeviceGetMemoryInfo(self._handle).used)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.sample()
        return False

    def summary(self) -> dict:
        """Peaks so far in MB; the GPU figures only on a GPU (a CPU run measured none, so it records none)."""
        out = {}
        if self.cuda:
            import torch

            out["peak_gpu_allocated_mb"] = torch.cuda.max_memory_allocated(self.device) / MB
            out["peak_gpu_reserved_mb"] = torch.cuda.max_memory_reserved(self.device) / MB
            out["peak_gpu_nvml_mb"] = max(0, self.nvml_peak - self.nvml_start) / MB
        # ru_maxrss is the kernel's exact high-water mark (KiB on Linux); the sampler may miss a spike.
        out["peak_cpu_rss_mb"] = max(self.rss_peak / MB, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
        if self.anon_peak:
            out["peak_cpu_anon_mb"] = self.anon_peak / MB
        return out


def anonymous_bytes() -> int:
    """This process's anonymous resident memory (Linux's RssAnon), 0 where the kernel does not report it."""
    try:
        with open("/proc/self/status") as f:
            line = next((x for x in f if x.startswith("RssAnon:")), "")
    except OSError:
        return 0
    return int(line.split()[1]) * 1024 if line else 0


def oom_kills() -> int | None:
    """How many processes of this process's memory cgroup the kernel's out-of-memory killer has killed so far (cgroup
    v2's memory.events, v1's memory.oom_control; a child started from here is in the same cgroup), or None where no
    counter can be read (not Linux, no memory controller). The killer counts on the victim's own cgroup, for a cgroup's
    limit and for the whole machine's RAM alike."""
    found = oom_counter()
    return found[1] if found else None


def oom_counter() -> tuple[str, int] | None:
    """(the file that counts this process's memory cgroup's out-of-memory kills, its count now), or None (oom_kills)."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2
            files = [f"/sys/fs/cgroup{path}/memory.events", "/sys/fs/cgroup/memory.events"]
        elif "memory" in controllers.split(","):  # v1; a container may mount its own cgroup as the root
            files = [f"/sys/fs/cgroup/memory{path}/memory.oom_control", "/sys/fs/cgroup/memory/memory.oom_control"]
        else:
            continue
        for name in files:
            if (count := read_oom_count(name)) is not None:
                return name, count
    return None


def read_oom_count(name: str) -> int | None:
    """The oom_kill count in a cgroup's memory.events or memory.oom_control file; None where it cannot be read."""
    try:
        with open(name) as f:
            return int(dict(x.split() for x in f if x.strip())["oom_kill"])
    except (OSError, ValueError, KeyError):
        return None


def gather_ranks(summary: dict) -> dict:
    """Every rank's peaks as <metric>_rank<r>, each peak as its largest over the ranks (the GPU that must fit), and,
    over several nodes, each node's host memory as peak_cpu_rss_mb_node<n>: its ranks' resident memory added up (what
    that machine's RAM must hold). A rank's node is its launcher's node rank (torchrun's GROUP_RANK, DeepSpeed's
    CROSS_RANK), else its host name."""
    import socket

    import torch.distributed as dist

    node = os.environ.get("GROUP_RANK") or os.environ.get("CROSS_RANK") or socket.gethostname()
    ranks: list = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, (node, summary))
    out = {f"{k}_rank{r}": v for r, (_, peaks) in enumerate(ranks) for k, v in peaks.items()}
    out.update({k: max(peaks[k] for _, peaks in ranks) for k in summary})
    nodes = list(dict.fromkeys(n for n, _ in ranks))
    if len(nodes) > 1:
        for i, name in enumerate(nodes):
            out[f"peak_cpu_rss_mb_node{i}"] = sum(peaks["peak_cpu_rss_mb"] for n, peaks in ranks if n == name)
    return out


def gpu_uuid(index: int) -> str:
    """NVML's id of torch's cuda:index; NVML and nvidia-smi ignore CUDA_VISIBLE_DEVICES, so indices differ."""
    import torch

    return f"GPU-{torch.cuda.get_device_properties(index).uuid}"


def nvml_handle(index: int):
    import pynvml

    pynvml.nvmlInit()
    return pynvml.nvmlDeviceGetHandleByUUID(gpu_uuid(index))


def gputil_used_mb(index: int = 0) -> float:
    """GPU memory in use as GPUtil (nvidia-smi) reports it: the tutorial's before/after reading."""
    import GPUtil
    import torch

    if not torch.cuda.is_available():
        return 0.0
    uuid = gpu_uuid(index)
    return next((float(g.memoryUsed) for g in GPUtil.getGPUs() if g.uuid == uuid), 0.0)


def matmul_params(config) -> int:
    """N: weights in matrix multiplies of a decoder, LM head included (model.matmul_weights)."""
    from .model import matmul_weights  # deferred: metrics loads nothing of transformers at import

    return matmul_weights(config)


def flops_per_token(config, trainable: int, full: bool) -> float:
    n = matmul_params(config)
    return 6.0 * n if full else 4.0 * n + 6.0 * trainable


def peak_flops(device: str) -> tuple[float, str]:
    """(FLOP/s, source): a known GPU's datasheet peak, the CPU's nominal peak, else an unknown GPU's measured matmul
    rate. Every run on one machine divides by the same figure, so MFU's ratios follow the speed's: a rate measured
    per run on a CPU swung 3x with what else the machine ran."""
    import torch

    if not device.startswith("cuda"):
        return cpu_peak_flops(torch.get_num_threads())
    name = torch.cuda.get_device_name(device)
    for key, flops in GPU_PEAK_FLOPS.items():
        if key in name:
            return flops, f"datasheet dense bf16 ({name})"
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    a @ b
    sync(device)
    start, reps = time.perf_counter(), 0
    while time.perf_counter() - start < 0.5:
        a @ b
        reps += 1
        sync(device)
    rate = 2 * 8192**3 * reps / (time.perf_counter() - start)
    return rate, f"measured bfloat16 matmul 8192x8192 on {device}"


def cpu_peak_flops(threads: int, cpuinfo: str = "/proc/cpuinfo",
                   clock: str = "/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq") -> tuple[float, str]:
    """The CPU's nominal fp32 peak for `threads` threads (at most the cores this process may use): each at the clock
    the kernel reports (its highest, else the first core's MHz), doing two fused multiply-adds a cycle as wide as the
    widest vector unit it names: AVX-512 64 FLOP a cycle (32 on AMD's, which runs it as two 256-bit halves), AVX2 with
    FMA 32, else 16 (SSE, Arm's NEON). A nominal figure, not this machine's measured best, the same for every run
    with as many threads here; what the kernel does not say is assumed, and its label says so."""
    flags, vendor, mhz = None, "", 0.0
    try:
        with open(cpuinfo) as f:
            for line in f:
                key, _, value = (part.strip() for part in line.partition(":"))
                if key in ("flags", "Features") and flags is None:  # x86 / Arm
                    flags = set(value.split())
                elif key == "vendor_id" and not vendor:
                    vendor = value
                elif key == "cpu MHz" and not mhz:
                    try:
                        mhz = float(value)
                    except ValueError:
                        pass
    except OSError:
        pass
    try:
        with open(clock) as f:
            mhz = int(f.read()) / 1000  # kHz
    except (OSError, ValueError):
        pass
    assumed = [what for what, missing in (("clock", not mhz), ("vector unit", flags is None)) if missing]
    flags = flags or set()
    if "avx512f" in flags:
        unit, per_cycle = ("AVX-512 as 2 x 256-bit", 32) if vendor == "AuthenticAMD" else ("AVX-512", 64)
    else:
        unit, per_cycle = ("AVX2 FMA", 32) if {"avx2", "fma"} <= flags else ("128-bit", 16)
    if hasattr(os, "sched_getaffinity"):
        threads = min(threads, len(os.sched_getaffinity(0)))
    mhz = mhz or 2000.0
    return (threads * mhz * 1e6 * per_cycle,
            f"nominal fp32: {threads} threads x {mhz / 1000:.2f} GHz x {per_cycle} FLOP a cycle ({unit})"
            + (f"; {' and '.join(assumed)} assumed, not reported" if assumed else ""))


def sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)


def host_snapshot() -> tuple[float, float, float, float]:
    """(busy CPU seconds of the whole machine, stolen CPU seconds, this process's CPU seconds, wall time) now; the
    machine's figures are 0 where the kernel does not report them (no /proc/stat)."""
    busy = steal = 0.0
    try:
        with open("/proc/stat") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
        tick = os.sysconf("SC_CLK_TCK")
        # user nice system idle iowait irq softirq steal (guest time is already in user)
        busy = (sum(fields[:3]) + sum(fields[5:8])) / tick
        steal = (fields[7] if len(fields) > 7 else 0.0) / tick
    except (OSError, ValueError, IndexError):
        pass
    own = sum(os.times()[:2])
    return busy, steal, own, time.perf_counter()


def host_load(start: tuple, end: tuple, own_share: float | None = None) -> dict:
    """What else the machine did between two host_snapshot()s: host_other_cores, the cores' worth of CPU time that
    processes other than this run's used on average (own_share: this run's CPU seconds over that time, every rank's,
    where several share the host), and host_steal_share, the share of CPU time the hypervisor took; with
    host_cores, the machine's. On several hosts own_share sums every host's ranks, and other processes on rank 0's
    host are undercounted."""
    wall = end[3] - start[3]
    if wall <= 0 or not end[0]:
        return {}
    own = own_share if own_share is not None else end[2] - start[2]
    busy, stolen = end[0] - start[0], end[1] - start[1]
    return {"host_other_cores": max(0.0, (busy - stolen - own) / wall),
            "host_steal_share": stolen / busy if busy else 0.0, "host_cores": float(os.cpu_count() or 1)}


BUSY_CORES, BUSY_SHARE, BUSY_STEAL = 0.5, 0.1, 0.05  # other processes' cores (at least, and share of the machine's)
# and the hypervisor's share above which a run's speed is called unreliable


def mfu_text(m: dict, quantization: str, digits: int = 2) -> str:
    """MFU as a person reads it: model FLOPs over the GPU's dense bf16 peak (MFU_CONVENTION). Under fp8 weights the
    frozen matmuls run at fp8's rate, whose peak is twice bf16's, so the same figure is bf16-equivalent: said beside it,
    as it cannot be set against a bf16 run's MFU target."""
    text = f"MFU {100 * m.get('mfu', 0):.{digits}f}%"
    if "peak_gpu_allocated_mb" not in m:  # trained on the CPU: cpu_peak_flops' nominal, assumed peak
        return text + " of the CPU's nominal fp32 peak (assumed from its model and clock)"
    return text + (" of bf16's peak (fp8 weights: bf16-equivalent, fp8's own peak is 2x)" if quantization == "fp8"
                   else "")


def wilson(share: float, n: float, z: float = 1.96) -> tuple[float, float]:
    """Wilson's 95% interval for a share of n questions answered right (72 questions leave about +-0.1)."""
    import math

    centre = (share + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(share * (1 - share) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def scores_text(m: dict, name: str) -> str:
    """A run's held-out (name "eval") or recall scores in words: exact match before -> after with the after score's
    95% interval over its questions (Wilson's, for a share of n questions: 72 questions leave about +-0.1), F1 before ->
    after, and how many questions."""
    n, after = m.get(f"{name}_questions", 0), m[f"{name}_exact_match"]
    interval = " (95% interval {:.2f}-{:.2f})".format(*wilson(after, n)) if n else ""
    return (f"exact match {m.get(f'{name}_exact_match_before', 0):.2f} -> {after:.2f}{interval}, F1 "
            f"{m.get(f'{name}_f1_before', 0):.2f} -> {m.get(f'{name}_f1', 0):.2f} on {n:.0f} questions")


def synthetic_note(model: str | None, preset: str | None = "") -> str:
    """Beside a score of a synthetic model: what it can mean (the quality preset's model is trained to answer)."""
    if not (model or "").startswith("synthetic:"):
        return ""
    if preset == "quality":
        return (f" ({model} trained from random weights on dsnb's synthetic passages: the scores measure that toy "
                "task, not a real model)")
    return f" ({model}: random weights, a few steps: these scores say nothing about a real model)"


def busy_host(m: dict, up_to: str = "") -> str:
    """In words, how busy the machine was while a run was timed (its host_load metrics), or "" where it was not
    busy: what every speed dsnb shows (the verdict, the model card) carries beside it. up_to "up to ": the most of
    several runs."""
    cores, other, steal = m.get("host_cores", 1.0), m.get("host_other_cores", 0.0), m.get("host_steal_share", 0.0)
    crowded = other > max(BUSY_CORES, BUSY_SHARE * cores)
    said = [f"other processes used {up_to}{other:.1f} of its {cores:.0f} cores"] if crowded else []
    return ", ".join(said + ([f"the hypervisor took {up_to}{steal:.0%} of its CPU time"] if steal > BUSY_STEAL else []))


PHASES = {"fwd": "forward", "bwd": "backward", "bwd_inner": "backward_compute", "bwd_allreduce": "gradient_reduce",
          "step": "optimizer_step"}  # DeepSpeed's timer names (deepspeed.utils.timer) -> dsnb's metric names


class StepTimer:
    """Times optimizer steps after the first `untimed_steps`, counting the samples and real tokens of the
    micro-batches the loop consumed (data.BatchLog), so a short batch counts short, in every loop."""

    def __init__(self, device: str, untimed_steps: int, batches, phases=None):
        self.device, self.untimed_steps, self.batches = device, untimed_steps, batches
        self.phases = phases  # a callable giving the last step's phase times in ms (DeepSpeed's timers), or None
        self.phase_marks: list[dict] = []  # phases() at each mark
        self.consumed = 0  # micro-batches the loop has trained on
        self.marks: list[tuple[float, int, int]] = []  # (time, step, micro-batches consumed)
        self.excluded: list[tuple[float, float]] = []  # (when, seconds) spent on what is not training (checkpoints)
        self.hosts: list[tuple] = []  # host_snapshot() at each mark: what else the machine did while steps were timed

    @property
    def timed_from(self) -> int:
        """The step whose mark starts the timed steps: untimed_steps after the first mark (step 0, or a resumed run's
        checkpoint)."""
        return (self.marks[0][1] if self.marks else 0) + self.untimed_steps

    def consume(self) -> None:
        self.consumed += 1

    def mark(self, step: int) -> None:
        sync(self.device)
        self.marks.append((time.perf_counter(), step, self.consumed))
        self.hosts.append(host_snapshot())
        if self.phases:
            self.phase_marks.append(dict(self.phases()))

    def exclude(self, seconds: float) -> None:
        """Time just spent on something other than training (a checkpoint), left out of the throughput."""
        self.excluded.append((time.perf_counter(), seconds))

    def throughput(self, gather: bool = True, prior: tuple[float, float] = (0.0, 0.0)) -> dict:
        """Steady-state samples/s and real tokens/s between the last untimed step's mark and the last step's, over
        every rank (gather: a collective, so every rank must call it), and real tokens per sample of the run (prior:
        the samples and tokens the processes before this one trained, where it resumed a run). Where the untimed steps
        leave no timed one, the figures cover every step, start-up included, and throughput_includes_startup says so
        (1)."""
        if len(self.marks) < 2:
            return {}
        first = next((m for m in self.marks if m[1] >= self.timed_from), None)
        startup = first is None or first is self.marks[-1]  # no step, or only the last, after the untimed ones
        if startup:
            first = self.marks[0]
        (t0, s0, b0), (t1, s1, b1) = first, self.marks[-1]
        host0, host1 = self.hosts[self.marks.index(first)], self.hosts[-1]
        counts = [*self.batches.totals(b1), *self.batches.totals(b0), *self.batches.totals(self.consumed),
                  host1[2] - host0[2]]
        samples1, tokens1, samples0, tokens0, samples, tokens, own = sum_over_ranks(counts) if gather else counts
        seconds = t1 - t0 - sum(s for when, s in self.excluded if t0 < when <= t1)
        return {**host_load(host0, host1, own), **self.phase_medians(self.marks.index(first)),
                "samples_per_second": (samples1 - samples0) / seconds,
                "tokens_per_second": (tokens1 - tokens0) / seconds,
                "step_time_ms": 1000 * seconds / (s1 - s0), "timed_steps": s1 - s0,
                "real_tokens_per_sample": (tokens + prior[1]) / max(1, samples + prior[0]),
                "throughput_includes_startup": float(startup),
                "checkpoint_seconds": sum(s for _, s in self.excluded)}

    def phase_medians(self, first: int) -> dict:
        """The median over the timed steps (the marks after index `first`) of each phase's ms, as phase_<name>_ms;
        this process's (rank 0's, as logged)."""
        import statistics

        timed = self.phase_marks[first + 1:]
        return {f"phase_{PHASES[name]}_ms": statistics.median(m[name] for m in timed)
                for name in PHASES if timed and all(name in m for m in timed)}


def sum_over_ranks(values: list) -> list:
    """Each value summed over every process (itself when there is one)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return values
    total = torch.tensor(values, dtype=torch.float64)
    if dist.get_backend() == "nccl":
        total = total.cuda()
    dist.all_reduce(total)
    return [int(v) if isinstance(x, int) else v for v, x in zip(total.tolist(), values, strict=True)]


# The one rule for whether a measured run fits a budget (the capacity map's cells, report.best_for_budget).
STATES = ("fits", "tight", "no", "no RAM", "failed", "no GPU")
RULES = """Against a budget of B GB a run:
- fits where its NVML peak (all it took from the GPU: CUDA context and allocator cache included; the allocator's
  peak where NVML was not read) is at most B;
- no where its tensors alone (the allocator's peak) exceed B;
- tight in between: it fits only if the caching allocator gives memory back. Settle it with
  `python -m dsnb run ... --memory_budget_gb B`, which ends FAILED (failure=oom) if it does not fit;
- no RAM where the budget names host RAM too (Colab's free tier: 12.7 GB) and the run's anonymous host memory
  (offloaded optimizer states and weights included; runs that did not record it: its whole resident memory,
  memory-mapped weight files included, so those cells err on the side of "no") exceeded it, whatever its GPU
  needed;
- failed where the run itself failed (see its MLflow run);
- no GPU where it trained on the CPU: it measured no GPU memory, so it says nothing about a GPU's budget."""


@dataclass(frozen=True)
class Budget:
    """A machine to fit: GPU memory, and host RAM where it is tight too (Colab's free tier: 15 GB and 12.7 GB)."""

    gpu_gb: float
    ram_gb: float = 0.0  # 0: not judged
    name: str = ""

    @property
    def label(self) -> str:
        return self.name or f"{self.gpu_gb:g} GB"


def fit(status: str, metrics: dict, budget: Budget) -> str:
    """fits | tight | no | no RAM | failed | no GPU for one run against one budget (see RULES)."""
    if status != "FINISHED":
        return "failed"
    host = metrics.get("peak_cpu_anon_mb", metrics.get("peak_cpu_rss_mb", 0))  # RSS where no anonymous peak was read
    if budget.ram_gb and host > budget.ram_gb * 1024:
        return "no RAM"
    taken = gpu_taken_mb(metrics)
    if taken is None:  # it trained on the CPU: nothing was measured against a GPU
        return "no GPU"
    if taken <= budget.gpu_gb * 1024:
        return "fits"
    return "no" if metrics.get("peak_gpu_allocated_mb", 0) > budget.gpu_gb * 1024 else "tight"


def gpu_taken_mb(metrics: dict) -> float | None:
    """What a run took from the GPU: its NVML peak where it was read, else the allocator's; None for a run without a
    GPU (it recorded no GPU figure)."""
    return metrics.get("peak_gpu_nvml_mb") or metrics.get("peak_gpu_allocated_mb")
