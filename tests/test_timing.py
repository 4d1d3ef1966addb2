"""dsnb/timing.py's estimate of a run's time: the tutorial's own T4 runs, the committed H200 runs (each held out by
path, through benchmarks/time_vs_measured.py, whose fit gives the rates), the "rough" label where one run or none
measured the path, the faster settings the plan offers, and that more work never estimates less time. The model shape
is the synthetic Llama-3.2-3B's (the tutorial's Bllossom 3B has the same dimensions), without building it."""
import json
import os
import statistics

import pytest

from dsnb.config import RunConfig
from dsnb.estimate import trainable_params
from dsnb.model import SHAPES, synthetic_config
from dsnb.timing import (FASTER, GPUS, HELD_OUT, RATES, describe_time, faster_settings, minutes, pair_estimate,
                         time_estimate)

from conftest import BENCHMARKS, benchmark_module

B3 = synthetic_config(SHAPES["llama-3.2-3b"], 0, 1)
B8 = synthetic_config(SHAPES["llama-3.1-8b"], 0, 1)
LENGTHS = [44, 37, 39, 35, 43, 40, 36, 55, 54, 45] * 100  # the synthetic set's first ten closed-book samples


def estimate(gpu: str = "H200", world: int = 1, config=B3, **fields) -> dict:
    cfg = RunConfig.layered(fields)
    return time_estimate(cfg, LENGTHS, config, trainable_params(cfg, config), world, gpu)


def test_the_tutorials_t4_recipe_lands_near_the_tutorials_own_t4_times():
    """The tutorial measured 625 steps of 8-bit LoRA (pad 512, 2 x 4, fp16) on Colab's T4: 2,424.7 s without
    DeepSpeed and 2,680.7 s with ZeRO-2 + CPU optimizer offload. Its 1,000 samples over 5 epochs make the 625 steps."""
    tutorial = dict(num_samples=1000, epochs=5, max_steps=0, quantization="8bit", dtype="fp16", padding="max_length",
                    max_length=512, batch_size=2, grad_accum=4, lora_r=RunConfig().lora_r)
    for fields, measured in ((dict(strategy="baseline"), 2424.7),
                             (dict(strategy="zero2", offload_optimizer="cpu"), 2680.7)):
        est = estimate("T4", **tutorial, **fields)
        assert est["steps"] == 625
        assert abs(est["train_seconds"] / measured - 1) <= 0.15, (fields, est["train_seconds"], measured)
        assert not est["rough"], est["rough"]  # the one T4 path that is measured says so without a caveat


@pytest.fixture(scope="module")
def comparison():
    module = benchmark_module("time_vs_measured")
    rows, fitted, _ = module.compare()
    return module, rows, fitted


# The committed runs still more than 25% off when held out, each with why (time_vs_measured_h200.md says more): a
# change that puts another run outside 25% fails; one that brings a run inside may drop it from here.
MISSES = {
    ("zero_flat_full.jsonl", "full_flat"): "full fine-tuning's update rate rests on five runs that differ by 3x",
    ("multi_gpu.jsonl", "llama-3.2-3b zero2_1gpu"): "the same; fp32-master bytes fit it but not ZeRO-3's runs",
    ("capacity.jsonl", "llama-3.2-1b lora_bf16"): "the 1B cells' host work a layer is 1.3-1.4x the 3B's",
    ("graphscheck.jsonl", "plain_ga2_nographs"): "without graphs the plain step is 1.25x the flat ZeRO-2 step's in one "
                                                 "call (graphscheck_2.jsonl); one rate a layer cannot fit both",
    ("scale_8b.jsonl", "llama-3.1-8b zero3_1gpu"): "ZeRO-3's fetch took 17 ms a layer on 8B, 27-31 on 3B",
    ("scale_8b_b16.jsonl", "llama-3.1-8b zero3_1gpu"): "the same",
    ("speed.jsonl", "full_zero3_compiled"): "the same, from the 3B side",
    ("scale_8b.jsonl", "llama-3.1-8b zero3_offload_1gpu"): "6.66 s on one GPU where two took 4.43 s each",
    ("big.jsonl", "8b_lora_zero3_offload_15gb"): "the same work took 2.09-2.60 s in its session, 1.20-1.38 s in "
                                                 "another (big_2.jsonl): no figure is within 25% of both",
    ("big_2.jsonl", "8b_lora_zero3_offload_15gb"): "the same",
    ("t4pad.jsonl", "pad_longest_b8"): "8-bit, one micro-batch of 8 padded per batch paid 1.9 ms a layer for its own "
                                       "lengths where 2 x 4 paid 5.5 per micro-batch: not per step, nor per new length",
}


def test_every_committed_gpu_run_is_predicted_held_out_by_path(comparison):
    """Each committed H200 run of today's code predicted with the rates fitted without it (its path's rate from the
    path's other runs, every other rate from the other paths'): the median within 10%, every run within 25% but the
    listed misses; none dropped quietly (superseded and slowed runs are listed apart, with why)."""
    module, rows, _ = comparison
    target = module.held_out(rows)
    assert len(rows) >= 100 and len(target) >= HELD_OUT[0], (len(rows), len(target))
    errors = {(r["source"], r["variant"]): module.error(r) for r in target}
    # the error the plan and advise print beside each time (timing.HELD_OUT) is this one
    assert (len(errors), sum(abs(e) <= 0.25 for e in errors.values()),
            round(statistics.median(abs(e) for e in errors.values()), 3)) == HELD_OUT
    outside = {key: f"{e:+.0%}" for key, e in errors.items() if abs(e) > 0.25}
    assert set(outside) <= set(MISSES), {k: v for k, v in outside.items() if k not in MISSES}
    # the Colab user's path and the tutorial's own recipe, held out, within 25%
    for key in (("notebook01.jsonl", "Without_DeepSpeed"), ("notebook01.jsonl", "With_DeepSpeed"),
                ("colab.jsonl", "Without_DeepSpeed"), ("colab.jsonl", "With_DeepSpeed"), ("bench.jsonl", "tutorial")):
        assert abs(errors[key]) <= 0.25, (key, errors[key])
    # the H100's runs, fitted to nothing: the H200's rates and the H100's datasheet. Compiled bf16 LoRA (the path
    # timing.py's H100 line calls not rough) from 11% under to 2% over (over since flex attention takes grouped
    # heads: 1.7-1.8% faster, gqa_h100.md), fp8 weights on it within 5% (fp8_head's head at the rate its matmul alone
    # measured), the colab_t4 preset's fp16 recipes within 25% (rough there)
    h100 = {(r["source"], r["variant"]): (module.error(r), r["cfg"].dtype == "bf16" and r["cfg"].torch_compile,
                                          r["cfg"].quantization) for r in rows if r["gpu"] == "H100" and
            not r["superseded"]}
    assert sum(path for _, path, _ in h100.values()) >= 15 and len(h100) >= 31, h100
    assert sum(weights == "fp8" for _, _, weights in h100.values()) >= 7, h100
    assert all(abs(e) <= 0.05 if weights == "fp8" else -0.12 <= e <= 0.02 if path else -0.25 <= e <= 0
               for e, path, weights in h100.values()), h100
    assert not any(r["gpu"] == "H100" for rs in comparison[2][1].values() for r in rs)
    slowed = {(r["source"], r["variant"]) for r in rows if r["slowed"]}
    assert slowed == {("speed.jsonl", "tutorial"), ("speed.jsonl", "full"), ("multi_gpu.jsonl", "llama-3.2-3b "
                      "baseline_1gpu"), ("multi_gpu.jsonl", "llama-3.2-3b zero1_1gpu"),
                      ("capacity_zero3.jsonl", "llama-3.2-1b lora_zero3_offload"),
                      ("capacity.jsonl", "llama-3.2-1b lora_8bit"),
                      ("capacity.jsonl", "llama-3.2-1b qlora_4bit")}, slowed


def test_the_first_two_cells_of_a_side_by_side_call_count_only_where_a_replicate_measured_them(comparison):
    """A call that runs one-GPU cells two at a time starts its first two together, each one's timed steps in the
    other's start-up: in every such listing, those two are left out with why, unless the same work measured in
    another listing decides (the 1.3x rule); every later cell, and every cell of a listing run one at a time, stands
    on its own measurement."""
    module, rows, _ = comparison
    for name in module.SIDE_BY_SIDE:
        cells = [r for r in rows if r["source"] == name and r["gpus"] == 1]
        assert len(cells) >= 4, name
        for row in cells[:2]:
            replicated = module.twins(row, rows)
            assert row["slowed"] and ("the same work's" if replicated else "started with") in row["slowed"], \
                row["slowed"]
            assert row not in module.held_out(rows)
        assert not any(r["slowed"] and "started with" in r["slowed"] for r in cells[2:]), name
    assert not any(r["slowed"] and "started with" in r["slowed"] for r in rows if r["source"] not in
                   module.SIDE_BY_SIDE)


def test_the_rates_are_what_the_committed_runs_fit(comparison):
    """dsnb/timing.py's RATES are the fit over the committed runs (to 3 significant figures): a new run or a changed
    model refits them (benchmarks/time_vs_measured.py's first table gives them); every rate but the fused update's
    has a run of today's code."""
    _, _, (rates, used) = comparison
    assert set(rates) == set(RATES)
    off = {k: (RATES[k], f"{v:.3g}") for k, v in rates.items() if abs(v / RATES[k] - 1) > 0.005}
    assert not off, off
    assert all(used[k] for k in RATES if k != "update_fused"), [k for k in RATES if not used[k]]


def test_a_path_of_one_run_says_rough(comparison):
    """A rate fitted to one run cannot be held out: the estimate of that run's path says rough (but for the tutorial's
    own T4 recipe, the T4's only measured path, which is that run itself)."""
    _, rows, (_, used) = comparison
    alone = [rs[0] for rs in used.values() if len(rs) == 1]
    assert len(alone) >= 4
    for row in alone:
        assert bool(row["estimate"]["rough"]) == (row["gpu"] != "T4"), (row["variant"], row["estimate"]["rough"])


def test_the_committed_comparison_states_the_current_figures(comparison):
    """benchmarks/results/time_vs_measured_h200.md says what the model does now: rerun
    python benchmarks/time_vs_measured.py > benchmarks/results/time_vs_measured_h200.md after changing the model."""
    module, rows, _ = comparison
    text = open(os.path.join(BENCHMARKS, "results", "time_vs_measured_h200.md")).read()
    assert module.stats(module.HELD_OUT, module.held_out(rows)) in text


def test_faster_settings_are_faster_by_the_estimate_and_by_the_committed_runs(comparison):
    """Where the pair takes over an hour, the plan offers settings with the pair's time under each (here colab_t4's on
    a T4): each one the estimate puts below the pair's time now, and each borne out by its two committed runs (one
    path, the setting changed: the step with it shorter for the same samples a step, or as long whatever the count of
    steps)."""
    module, rows, _ = comparison
    cfg = RunConfig.layered({"preset": "colab_t4", "max_steps": 0, "epochs": 5, "num_samples": 1000})
    trainable = trainable_params(cfg, B3)
    now = pair_estimate(cfg, LENGTHS, B3, trainable, 1, "T4")
    offered = faster_settings(cfg, LENGTHS, B3, trainable, 1, "T4")
    assert len(offered) == len(FASTER), offered
    step = {(r["source"], r["variant"]): r for r in rows}
    for (changes, _, with_it, without), line in zip(FASTER, offered, strict=True):
        seconds = pair_estimate(cfg.replace(**changes), LENGTHS, B3, trainable, 1, "T4")
        assert seconds < now and line.endswith(f"about {minutes(seconds)}"), (line, seconds, now)
        faster, slower = step[with_it], step[without]
        assert not (faster["slowed"] or slower["slowed"] or faster["superseded"] or slower["superseded"])
        assert faster["calibrates"] == slower["calibrates"], (with_it, without)  # one path
        if "max_steps" in changes:
            assert faster["cfg"].max_steps < slower["cfg"].max_steps and faster["step"] < 1.1 * slower["step"]
        else:
            assert faster["cfg"].samples_per_step() == slower["cfg"].samples_per_step()
            assert faster["step"] < slower["step"], (faster["step"], slower["step"])
    # no padding is offered: padding changes the memory the pair compares (per-batch padding also measured slower a
    # step than 512 with 8-bit weights)
    tutorial = cfg.replace(padding="max_length")
    assert not any(line.startswith("padding") for line in faster_settings(tutorial, LENGTHS, B3, trainable, 1, "T4"))


@pytest.mark.parametrize("gpu, fields, why", [
    ("H200", dict(strategy="zero3", offload_optimizer="nvme", offload_param="nvme", quantization="none",
                  dtype="bf16"), "NVMe offload is measured once"),
    ("H200", dict(strategy="zero3", offload_optimizer="cpu", offload_param="cpu", quantization="none",
                  dtype="bf16"), "parameters in CPU RAM move at the host's speed"),
    ("L4", dict(quantization="none", dtype="bf16"), "the L4 is not measured"),
    ("A100", dict(), "the A100 is not measured"),
    ("H100", dict(quantization="none", dtype="bf16"), "an H100 is measured only on dsnb's compiled bf16 LoRA"),
    ("T4", dict(quantization="none", padding="longest"), "a T4 is measured only on the tutorial's recipe"),
    ("H200", dict(quantization="none", dtype="bf16", torch_compile=True, strategy="zero3", deepcompile=True,
                  padding="bucket"), "DeepCompile is measured once"),
    ("H200", dict(quantization="none", dtype="fp16", torch_compile=True, strategy="zero2", padding="bucket"),
     "DeepSpeed's own compiled ZeRO-1/2 step is measured once"),
])
def test_a_path_no_run_calibrates_is_labelled_rough_in_the_line_the_user_reads(gpu, fields, why):
    line = describe_time(estimate(gpu, **fields))
    assert line.startswith(f"time on {gpu} (rough: ") and why in line, line
    assert describe_time(estimate("H200", quantization="none", dtype="bf16")).startswith("time on H200: about ")
    assert describe_time(estimate("H200")).startswith("time on H200: about ")  # the tutorial's 8-bit recipe, pad 512
    # the one path measured on an H100 (h100_runs/, held out there): not rough
    assert describe_time(estimate("H100", quantization="none", dtype="bf16", torch_compile=True,
                                  padding="bucket")).startswith("time on H100: about ")
    for padding in ("bucket", "longest"):  # colab_t4's recipe padded as it is now (t4pad) and as it was (notebook 01)
        assert describe_time(estimate("H200", preset="colab_t4", padding=padding)).startswith("time on H200: about ")


def test_the_colab_t4_preset_pads_as_its_recipe_measured_fastest():
    """gpu_runs.sh t4pad trained colab_t4's 8-bit recipe (fp16, 2 x 4) padded three ways, the same samples and steps
    in one session: the preset pads the way whose step was the shortest, the loss is the same in all (padding is
    masked), and the time model ranks the three paddings as they measured."""
    with open(os.path.join(BENCHMARKS, "results", "h200_runs", "t4pad.jsonl")) as f:
        runs = {r["name"]: r["metrics"] for r in map(json.loads, f)}
    measured = {p: runs[f"pad_{p}"]["step_time_ms"] for p in ("max_length", "longest", "bucket")}
    assert RunConfig.layered({"preset": "colab_t4"}).padding == min(measured, key=measured.get), measured
    assert len({m["train_loss"] for m in runs.values()}) == 1, runs
    estimated = {p: estimate("H200", preset="colab_t4", padding=p)["step_seconds"] for p in measured}
    assert sorted(measured, key=measured.get) == sorted(estimated, key=estimated.get), (measured, estimated)


CONFIGS = [dict(quantization="8bit"), dict(quantization="none", dtype="bf16", lora_r=0),
           dict(quantization="4bit", dtype="bf16"),
           dict(quantization="none", dtype="bf16", torch_compile=True, padding="max_length"),
           dict(quantization="none", dtype="bf16", lora_r=0, torch_compile=True, cuda_graphs=False)]


@pytest.mark.parametrize("config, world", [(B3, 1), (B3, 2), (B8, 1), (B8, 2)])
@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("fields", CONFIGS)
def test_more_work_never_estimates_less_time(fields, gpu, config, world):
    """More steps, longer padding, and offloading the optimizer (or the parameters too) never make a run shorter:
    on every GPU class, on one GPU and two, for the 3B and 8B shapes."""
    def seconds(**more):
        return estimate(gpu, world, config, **{**fields, **more})

    assert seconds(max_steps=20)["seconds"] > seconds(max_steps=10)["seconds"]
    longer = seconds(max_steps=10, padding="max_length", max_length=512)["seconds"]
    shorter = seconds(max_steps=10, padding="max_length", max_length=256)["seconds"]
    assert longer > shorter or (fields.get("torch_compile") and longer == shorter)  # compiled: floor-bound
    for stage in ("zero1", "zero2") + (("zero3",) if fields["quantization"] != "8bit" else ()):
        base = seconds(max_steps=10, strategy=stage)
        offloaded = seconds(max_steps=10, strategy=stage, offload_optimizer="cpu")
        assert offloaded["step_seconds"] > base["step_seconds"], stage
        assert offloaded["seconds"] > base["seconds"], stage
        if stage == "zero3":
            both = seconds(max_steps=10, strategy=stage, offload_optimizer="cpu", offload_param="cpu")
            assert both["step_seconds"] > offloaded["step_seconds"]


def test_the_remaining_time_told_after_the_untimed_steps_is_the_steps_own_time(monkeypatch):
    """The line a long run says once its untimed steps are over ("0.32 s a step ... the 98 steps left take about
    31 s") reads the clock after waiting for the device, so it is each step's time, not the host's head start: on an
    H200 the compiled loop's host alone said 0.0177 s where the steps took 0.32 s. Here the host queues each step at
    once and the device finishes one every step_s; waiting for it is what this test's device does (no GPU here)."""
    import time

    import dsnb.train
    from dsnb.metrics import StepTimer
    from dsnb.planning import Reporter
    from dsnb.train import Progress

    said, step_s, queued = [], 0.25, []  # a loaded host wakes a sleep late: at 0.05 s, 10 ms fails 0.8x

    class Told(Reporter):
        def say(self, text):
            said.append(text)

    def device_sync(device):  # the device is done with every queued step step_s after the one before
        time.sleep(max(0.0, queued[0] + step_s * len(queued) - time.perf_counter()))

    monkeypatch.setattr(dsnb.train, "sync", device_sync)
    timer = StepTimer("cpu", untimed_steps=2, batches=None)
    progress = Progress(timer, Told())
    timer.mark(0)
    total = 2 + Progress.TELL_LEFT + 1
    for step in range(1, 6):
        queued.append(time.perf_counter())  # the host queues the step and goes on
        if step == timer.untimed_steps:
            device_sync("cpu")
            timer.mark(step)
        progress(step, total, None)
    assert len(said) == 1, said
    per_step, left = said[0].split(" s a step after 2 untimed step(s): the ")
    assert step_s * 0.8 <= float(per_step) < 3 * step_s and left.startswith(f"{total - 3} steps left"), said
    # A run with fewer steps left says nothing and never waits for the device in its timed steps
    said.clear()
    short = Progress(timer, Told())
    monkeypatch.setattr(dsnb.train, "sync", lambda device: said.append("waited"))
    for step in range(3, 10):
        short(step, step + Progress.TELL_LEFT - 1, None)
    assert said == [], said


def test_fp8_head_takes_the_heads_forward_flops_at_its_matmuls_measured_rate():
    """fp8_head (the default with fp8 weights): the step estimate less the LM head's forward FLOPs (2 V h a token)
    times what fp8 saved on that matmul alone with the run's accumulation in the forward (fp8_gemms_h100.jsonl:
    timing.FP8_HEAD_RATE); the rest as an fp8 step with a bf16 head."""
    from dsnb import timing
    from dsnb.metrics import GPU_PEAK_FLOPS
    from dsnb.model import model_config

    cfg = RunConfig(model="synthetic:llama-3.2-3b", quantization="fp8", dtype="bf16", torch_compile=True,
                    padding="filled", attention="flex", max_length=1024, batch_size=12)
    config = model_config(cfg.model)
    trainable, tokens = trainable_params(cfg, config), 12 * 1024
    for accum, rate in (("both", 7.30 / 14.09), ("forward", 7.30 / 14.09), ("none", 9.09 / 14.09)):
        fp8 = cfg.replace(fp8_fast_accum=accum)
        with_head, bf16_head = (timing.micro_batch_seconds(c, config, trainable, tokens, "H100", timing.RATES)
                                for c in (fp8, fp8.replace(fp8_head=False)))
        saved = 2 * config.vocab_size * config.hidden_size * tokens * (1 - rate) / (
            GPU_PEAK_FLOPS["H100"] * timing.RATES["mfu"])
        assert bf16_head - with_head == pytest.approx(saved, rel=2e-3) and 0.004 < saved < 0.01, accum
    assert "fp8_head" in " ".join(timing.rough_reasons(cfg, "H100", 1))
    assert "fp8_head" not in " ".join(timing.rough_reasons(cfg.replace(fp8_head=False), "H100", 1))
