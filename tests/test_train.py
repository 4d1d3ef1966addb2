"""Real DeepSpeed on synthetic:tiny on the CPU: ZeRO must not change the math."""
import contextlib
import json
import os

import mlflow
import pytest

from dsnb.config import OFFLINE, RunConfig
from dsnb.data import build_dataset, fill_rows, load_records
from dsnb.launch import child_env, run_all
from dsnb.model import load_tokenizer

from conftest import train_here

pytestmark = pytest.mark.integration

# fp32 full fine-tuning, a loss record every step and a learning rate large enough to move the loss.
BASE = dict(OFFLINE, quantization="none", lora_r=0, max_steps=5, logging_steps=1, learning_rate=1e-3, eval_samples=0,
            save_model=False)
STAGES = {"zero1": dict(strategy="zero1"), "zero2": dict(strategy="zero2"),
          "zero2_offload": dict(strategy="zero2", offload_optimizer="cpu"), "zero3": dict(strategy="zero3")}


def loss_curve(uri, run_id):
    return [m.value for m in sorted(mlflow.MlflowClient(uri).get_metric_history(run_id, "loss"), key=lambda m: m.step)]


def test_every_zero_stage_matches_the_baseline_loss(tmp_path):
    """One test, so its five runs happen once (a module fixture is set up again on each xdist worker)."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfgs = [RunConfig(**BASE, tracking_uri=uri, run_name="baseline")]
    cfgs += [RunConfig(**BASE, **changes, tracking_uri=uri, run_name=name) for name, changes in STAGES.items()]
    runs = train_here(cfgs, tmp_path)
    base = runs["baseline"].curve
    assert len(base) == 5 and base[-1] < base[0] - 0.05  # training moved the loss, so agreement is not trivial
    for stage in STAGES:
        assert runs[stage].curve == pytest.approx(base, rel=1e-4, abs=1e-4), stage


def test_tutorial_8bit_lora_zero2_offload_runs_on_cpu(workdir):
    cfg = RunConfig(**dict(OFFLINE, max_steps=3), strategy="zero2", offload_optimizer="cpu",
                    tracking_uri=f"sqlite:///{workdir}/mlflow.db")
    assert cfg.quantization == "8bit" and cfg.lora_r == 16
    result = run_all([cfg], progress=False)[0]
    assert result.status == "FINISHED", result
    client = mlflow.MlflowClient(cfg.tracking_uri)
    run = client.get_run(result.run_id)
    assert int(run.data.params["trainable_params"]) < int(run.data.params["total_params"]) / 5
    artifacts = {a.path for a in client.list_artifacts(result.run_id)}
    assert {"deepspeed_config.json", "environment.json", "model", "train.log"} <= artifacts


def test_a_run_on_the_cpu_records_no_gpu_memory(tmp_path):
    """Without a GPU nothing measured GPU memory: a finished run and a failed one log none of its figures (no 0 MB
    claiming a measurement), only the host's peak."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    done = RunConfig(**dict(OFFLINE, quantization="none", max_steps=2, eval_samples=0, save_model=False),
                     tracking_uri=uri, output_dir=str(tmp_path / "runs"), run_name="done")
    broken = done.replace(lora_targets="no_such_module", run_name="broken")  # fails as the model is set up
    results = run_all([done, broken], progress=False)
    assert [r.status for r in results] == ["FINISHED", "FAILED"], results
    gpu = {"gpu_memory_used_mb", "est_error_gpu"}
    for result in results:
        logged = mlflow.MlflowClient(uri).get_run(result.run_id).data.metrics
        assert not [k for k in logged if k.startswith("peak_gpu_") or k in gpu], (result.name, sorted(logged))
        assert logged["peak_cpu_rss_mb"] > 100  # what it measured, failed or not


def test_fast_recipe_keeps_the_math(tmp_path):
    """Per-batch padding and one micro-batch of 8 train exactly what padding to max_length and 2 x 4 do."""
    from dsnb.bench import bench_variants

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    # One step's worth of samples (8), so every step sees the same ones and the loss must fall as LoRA learns.
    common = dict(OFFLINE, quantization="none", max_steps=4, logging_steps=1, learning_rate=1e-3, num_samples=8,
                  eval_samples=0, lora_dropout=0.0, save_model=False,
                  tracking_uri=uri)  # no dropout: masks differ by batch layout
    plain = RunConfig(**common, run_name="plain")
    fast = RunConfig(**{**common, **bench_variants()[1]["fast"], "dtype": "fp32"}, run_name="fast")
    assert (fast.padding, fast.batch_size * fast.grad_accum) == ("longest", plain.batch_size * plain.grad_accum)
    results = list(train_here([plain, fast], tmp_path).values())
    plain_curve, fast_curve = (r.curve for r in results)
    assert len(plain_curve) == 4 and plain_curve[-1] < plain_curve[0]
    # Equal up to fp32 summation order (one batch of 8 vs four of 2), which Adam's normalised steps carry on.
    assert fast_curve == pytest.approx(plain_curve, rel=1e-3)
    real = [r.metrics["real_tokens_per_sample"] for r in results]
    assert real[0] == pytest.approx(real[1])  # the same real tokens, only the padding differs


def test_compiled_loop_keeps_the_trainers_math(tmp_path, monkeypatch):
    """dsnb's compiled loop (bucket or packed batches, 2 x 2 accumulation) logs the Trainer's loss curve, and so do
    filled rows in both loops; the profile field writes one step's profile."""
    profile = tmp_path / "step.txt"
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    # every step sees the same 4 samples: the loss must fall. The closed-book prompt keeps them short enough for two
    # filled rows of 128 tokens (passages would need a row each, and a step of 2 rows would see half of them).
    common = dict(OFFLINE, quantization="none", max_steps=4, logging_steps=1, learning_rate=1e-3, batch_size=2,
                  grad_accum=2, num_samples=4, eval_samples=0, lora_dropout=0.0, padding="bucket", save_model=False,
                  prompt="tutorial", tracking_uri=uri)
    trainer = RunConfig(**common, run_name="trainer")
    compiled = trainer.replace(torch_compile=True, run_name="compiled", profile=str(profile))
    packed = compiled.replace(padding="packed", run_name="packed", profile="")
    # filled: the 4 samples in 2 rows made before training, a row a micro-batch, in the Trainer and compiled (a
    # batch completed by padding rows: tests/test_data.py, with the padded batch's loss)
    filled = trainer.replace(padding="filled", batch_size=1, run_name="filled")
    filled_compiled = filled.replace(torch_compile=True, run_name="filled_compiled")
    tokenizer = load_tokenizer(filled)
    assert len(fill_rows(build_dataset(filled, tokenizer, load_records(filled)), filled.max_length)) == 2
    results = list(train_here([trainer, compiled, packed, filled, filled_compiled], tmp_path).values())
    curves = [r.curve for r in results]
    assert len(curves[0]) == 4 and curves[0][-1] < curves[0][0]
    # Step 1 (same weights, same samples a step, same loss normalisation) agrees to rounding; later steps carry
    # the compiled kernels' other summation order through Adam's normalised updates.
    for curve in curves[1:]:
        assert curve[0] == pytest.approx(curves[0][0], rel=1e-5)
        assert curve == pytest.approx(curves[0], rel=1e-3)
    real = [r.metrics["real_tokens_per_sample"] for r in results]
    assert real[1:] == pytest.approx(real[:1] * 4)
    for r in results:  # 4 steps of the 4 samples in every loop: samples counted, not rows (the Trainer counts rows)
        assert r.metrics["train_samples_per_second"] * r.metrics["train_runtime"] == pytest.approx(16, rel=1e-3), r
    assert all(r.metrics["tokens_per_second"] > 0 for r in results)
    text = profile.read_text()
    assert text.startswith("step 1: wall ") and "By host time:" in text and "aten::" in text


def test_compiled_deepspeed_keeps_the_trainers_math(tmp_path, monkeypatch):
    """dsnb's loop driving the DeepSpeed engine, compiled, logs the Trainer's loss curve: ZeRO-2 LoRA with CPU
    optimizer offload, and ZeRO-3 full fine-tuning; the fp16 loss scaler (forced on an fp32 run) changes nothing."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    common = dict(OFFLINE, quantization="none", max_steps=4, logging_steps=1, learning_rate=1e-3, batch_size=2,
                  grad_accum=2, num_samples=4, eval_samples=0, lora_dropout=0.0, padding="bucket", save_model=False,
                  tracking_uri=uri)  # every step sees the same 4 samples: the loss must fall
    zero2 = RunConfig(**common, strategy="zero2", offload_optimizer="cpu", run_name="zero2")
    zero3 = RunConfig(**dict(common, lora_r=0), strategy="zero3", run_name="zero3")
    plain = RunConfig(**common, run_name="plain")
    cfgs = [zero2, zero2.replace(torch_compile=True, run_name="zero2_compiled"), zero3,
            zero3.replace(torch_compile=True, run_name="zero3_compiled"), plain]
    cfgs.append(plain.replace(torch_compile=True, loss_scale=True, run_name="scaled"))
    results = train_here(cfgs, tmp_path)
    curve = {name: r.curve for name, r in results.items()}
    for name in ("zero2", "zero3", "plain"):
        assert len(curve[name]) == 4 and curve[name][-1] < curve[name][0]
    assert curve["zero2_compiled"] == pytest.approx(curve["zero2"], rel=1e-3)
    assert curve["zero3_compiled"] == pytest.approx(curve["zero3"], rel=1e-3)
    assert curve["scaled"] == pytest.approx(curve["plain"], rel=1e-3)
    assert results["zero3_compiled"].metrics["samples_per_second"] > 0


def test_two_processes_record_each_ranks_peak(tmp_path):
    """num_gpus 2 starts two ranks with torchrun (CPU processes here, gloo); rank 0 logs every rank's peaks, and with
    phase_times the step's phases from DeepSpeed's timers (the gradients' reduction across the ranks among them).
    Checkpoints by the clock (kaggle_t4x2's path) are taken by both ranks together, into the run's own folder: each
    rank's clock decides alone no more (one saving while the other steps on hangs), and rank 1's shards no longer land
    in a folder of no run ("rank"), where a resume could not find them."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = RunConfig(**dict(BASE, max_steps=3), strategy="zero3", num_gpus=2, phase_times=True, tracking_uri=uri,
                    checkpoint_minutes=0.0001, output_dir=str(tmp_path / "runs"))
    result = run_all([cfg], progress=False)[0]
    assert result.status == "FINISHED", result
    metrics = result.metrics
    assert metrics["checkpoint_seconds"] > 0 and not (tmp_path / "runs" / "rank").exists()
    phases = [metrics[f"phase_{name}_ms"] for name in ("forward", "backward", "optimizer_step")]
    assert min(phases) > 0 and metrics["phase_gradient_reduce_ms"] > 0
    assert metrics["phase_backward_ms"] >= metrics["phase_backward_compute_ms"]
    # the phases are inside the step, and most of it (the rest: the loop's own host work)
    assert 0.1 * metrics["step_time_ms"] < sum(phases) <= 1.05 * metrics["step_time_ms"], metrics
    ranks = [metrics["peak_cpu_rss_mb_rank0"], metrics["peak_cpu_rss_mb_rank1"]]
    assert min(ranks) > 100 and metrics["peak_cpu_rss_mb"] == max(ranks)
    assert not [k for k in metrics if k.startswith("peak_gpu_")]  # no rank had a GPU: no rank's GPU figure
    client = mlflow.MlflowClient(uri)
    assert len(loss_curve(uri, result.run_id)) == 3  # one run, logged once, not once per rank
    # Each rank holds a partition of every weight; the counts are still the whole model's.
    from dsnb.model import count_parameters, load_model

    whole = count_parameters(load_model(cfg.replace(strategy="baseline", num_gpus=1, phase_times=False), "cpu")[0])
    params = client.get_run(result.run_id).data.params
    assert (int(params["trainable_params"]), int(params["total_params"])) == whole
    env = client.download_artifacts(result.run_id, "environment.json", str(tmp_path))
    env = json.load(open(env))
    assert env["world_size"] == 2
    # torchrun alone would give each rank one thread; the host's cores are shared out instead (or the user's value)
    share = str(max(1, len(os.sched_getaffinity(0)) // 2))
    assert env["omp_num_threads"] == (os.environ.get("OMP_NUM_THREADS") or share)


def test_ranks_share_the_hosts_cores():
    """Under torchrun each rank gets its share of the cores (DeepSpeed's CPU Adam runs on them), not torchrun's
    one thread, and so does each of the variants run side by side; a user's OMP_NUM_THREADS is kept, and one
    process alone is left alone."""
    assert child_env(2, {}, cpus=32)["OMP_NUM_THREADS"] == "16"
    assert child_env(4, {}, cpus=2)["OMP_NUM_THREADS"] == "1"
    assert child_env(2, {"OMP_NUM_THREADS": "3"}, cpus=32)["OMP_NUM_THREADS"] == "3"
    assert child_env(2, {"OMP_NUM_THREADS": ""}, cpus=32)["OMP_NUM_THREADS"] == "16"  # empty is unset
    assert "OMP_NUM_THREADS" not in child_env(1, {}, cpus=32)


@pytest.mark.slow  # the first run builds DeepSpeed's async I/O op: ~7 minutes on 2 cores, then cached
def test_zero_infinity_nvme_matches_baseline_loss(tmp_path):
    """ZeRO-3 with parameters and optimizer states swapped to disk through libaio: same loss curve.

    DeepSpeed swaps only tensors of at least its aio block (1 MB) and keeps weights under 1e5 elements on
    the device; synthetic:tiny's are smaller than both, so this trains tiny's shape made 512 wide, built
    into a local model folder: its 14 matmul weights (more than the 5 swap buffers) and its optimizer
    states go through the disk.
    """
    from transformers import AutoModelForCausalLM

    from dsnb.model import SHAPES, build_synthetic

    build_synthetic("wide", str(tmp_path / "wide"), dict(SHAPES["tiny"], hidden_size=512, intermediate_size=1024,
                                                         num_attention_heads=8, num_key_value_heads=8))
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "wide")
    swappable = [n for n, p in model.named_parameters() if p.numel() > 1e5 and p.numel() * 4 >= 2**20]
    assert len(swappable) == 14  # q, k, v, o, gate, up, down in each layer
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    base = RunConfig(**dict(BASE, model=str(tmp_path / "wide")), tracking_uri=uri, run_name="baseline")
    cfg = base.replace(strategy="zero3", offload_optimizer="nvme", offload_param="nvme", nvme_path=str(nvme),
                       run_name="zero3_nvme")
    baseline, result = run_all([base, cfg], progress=False)
    assert baseline.status == result.status == "FINISHED"
    assert {p.name for p in (nvme / "zero_stage_3").iterdir()} == {"optimizer", "float32params"}
    curve = loss_curve(uri, baseline.run_id)
    assert curve[-1] < curve[0] - 0.05
    assert loss_curve(uri, result.run_id) == pytest.approx(curve, rel=1e-4, abs=1e-4)


def test_an_interrupted_compiled_run_keeps_every_logged_step(workdir, monkeypatch):
    """The compiled loop holds up to LOG_FLUSH logged steps on the device. Interrupted at step 40, between its write
    at step 32 and the next at 64, it still sends steps 33-39 to MLflow, and the run ends KILLED."""
    from conftest import LONG

    from dsnb import loop, train

    real, calls = loop.PlainStep.step, []

    def step(self, *args):
        calls.append(1)
        if len(calls) == 40:  # Ctrl-C as the 40th step starts
            raise KeyboardInterrupt
        return real(self, *args)

    monkeypatch.setattr(loop.PlainStep, "step", step)
    uri = f"sqlite:///{workdir}/mlflow.db"
    cfg = RunConfig(**dict(LONG, torch_compile=True, padding="bucket", max_steps=100), tracking_uri=uri,
                    run_name="interrupted")
    with pytest.raises(KeyboardInterrupt):
        train.train(cfg)
    client = mlflow.MlflowClient(uri)
    [run] = client.search_runs([client.get_experiment_by_name(cfg.experiment).experiment_id])
    assert run.info.status == "KILLED" and run.data.tags["failure"] == "interrupted"
    assert [m.step for m in sorted(client.get_metric_history(run.info.run_id, "loss"), key=lambda m: m.step)] == \
        list(range(1, 40))


# Run in a process of its own (DeepSpeed initialises torch.distributed): after the first of two micro-batches, the
# names of the parameters whose gradient tensor, as autograd produced it, is still alive anywhere (.grad or
# DeepSpeed's own lists): under CUDA graphs that memory is the graph's, overwritten by the next micro-batch's replay.
GRAD_KEPT = """
import gc, json, sys
from dsnb.train import deepspeed_env
deepspeed_env("cpu")
import deepspeed, torch
from torch.multiprocessing.reductions import StorageWeakRef
stage, contiguous, bucket = int(sys.argv[1]), sys.argv[2] == "1", int(sys.argv[3])
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
produced = {}
for name, p in model.named_parameters():
    p.register_hook(lambda g, name=name: produced.__setitem__(name, StorageWeakRef(g.untyped_storage())))
config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "steps_per_print": 10**6,
          "zero_optimization": {"stage": stage, "contiguous_gradients": contiguous, "reduce_bucket_size": bucket}}
engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters()), config=config)
engine.backward(engine(torch.randn(2, 8)).sum())
gc.collect()
print(json.dumps([name for name, ref in produced.items() if not ref.expired()]))
torch.distributed.destroy_process_group()
"""
ALL = ["0.weight", "0.bias", "1.weight", "1.bias"]


@pytest.mark.parametrize("stage, contiguous, bucket, graphs, kept", [
    (2, True, 500_000_000, True, []),  # dsnb's ZeRO-2: every gradient copied into DeepSpeed's buffers
    # A weight larger than the bucket (an 8B embedding by default) is reduced as it is: usually by the backward's
    # end, but once (CI, under load) its gradient was still alive after it; no graphs, whichever happens.
    (2, True, 10, False, None),
    (2, False, 500_000_000, False, ALL),  # a user's ZeRO-2 without contiguous gradients keeps them in a list
    (1, True, 500_000_000, False, ALL)])  # ZeRO-1 leaves them in .grad until the step
def test_cuda_graphs_only_where_deepspeed_copies_gradients_out(monkeypatch, stage, contiguous, bucket, graphs, kept):
    """Under CUDA graphs a gradient tensor kept from the backward graph's output is overwritten by the next
    micro-batch's replay. Where DeepSpeed drops every such tensor during the backward, dsnb's compiled step may
    accumulate under graphs; where it keeps them, it may not (dsnb/loop.py::graphs_under_zero, checked here against
    DeepSpeed itself)."""
    import subprocess
    import sys

    from dsnb.loop import graphs_under_zero

    done = subprocess.run([sys.executable, "-c", GRAD_KEPT, str(stage), "1" if contiguous else "0", str(bucket)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    alive = json.loads(done.stdout.strip().splitlines()[-1])
    if kept is not None:
        assert sorted(alive) == sorted(kept)
    copied = contiguous and bucket >= 64  # the model's largest weight: 8 x 8
    assert graphs_under_zero(stage, 2, copied) is graphs and graphs_under_zero(stage, 1, copied)


# Run in a process of its own (DeepSpeed initialises torch.distributed): DeepSpeed's own one-process ZeRO-1/2 step in
# bf16 against dsnb's flat step on twin engines (a frozen base and 32 LoRA-like tensors in two parameter groups, as
# the Trainer groups them), 6 steps, the last with a NaN; per case, whether every weight, fp32 master weight, Adam
# moment and gradient norm matched bit for bit at every step, the host reads (aten._local_scalar_dense) of one
# step's backward and optimizer step on each engine, and, under the flat step, the gradient tensors the first
# micro-batch's backward left alive (a CUDA graph's next replay would overwrite them).
FLAT = """
import gc, json, sys
from dsnb.train import deepspeed_env
deepspeed_env("cpu")
import deepspeed, torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from dsnb import flat_step

class Reads(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = 0
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += func.overloadpacket.__name__ == "_local_scalar_dense"
        return func(*args, **(kwargs or {}))

class Lora(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.base = torch.nn.Linear(16, 16, bias=False).requires_grad_(False)
        self.A, self.B = torch.nn.Parameter(torch.randn(4, 16) * 0.3), torch.nn.Parameter(torch.randn(16, 4) * 0.3)
        self.c = torch.nn.Parameter(torch.zeros(3))  # an odd size: a flat group gets padding
    def forward(self, x):
        return x + torch.tanh(self.base(x) + x @ self.A.t() @ self.B.t()) + self.c.sum()

def engine(stage, accum, flat, extra=None, zero_extra=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[Lora() for _ in range(15)]).to(torch.bfloat16)
    groups = [{"params": [p for n, p in model.named_parameters() if n.endswith(end)], "weight_decay": wd}
              for end, wd in ((("A", "c"), 0.01), ("B", 0.0))]
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": accum, "gradient_clipping": 0.5,
              "bf16": {"enabled": True, "check_grad_overflow": False}, "steps_per_print": 10**6,
              "timers": {"throughput": {"enabled": False}},
              "zero_optimization": {"stage": stage, "contiguous_gradients": True, "overlap_comm": False,
                                    **(zero_extra or {})}, **(extra or {})}
    e, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(groups, lr=1e-2, fused=True),
                                 config=config)  # fused, as the Trainer builds it
    return e, flat and flat_step.take_over(e)

def step(e, micro, reads=None):
    for i, x in enumerate(micro):
        e.set_gradient_accumulation_boundary(i == len(micro) - 1)
        loss = e(x).float().pow(2).mean()
        with reads or Reads():
            e.backward(loss, scale_wrt_gas=False)
            if i == len(micro) - 1:
                e.step()

def state(e):
    o = e.optimizer
    moments = [t for g in o.single_partition_of_fp32_groups for t in o.optimizer.state[g].values() if t.dim()]
    return [t.detach().clone() for t in [*e.module.parameters(), *o.single_partition_of_fp32_groups, *moments,
                                        torch.as_tensor(e.get_global_grad_norm())]]

out = {}
for stage in (1, 2):
    for accum in (1, 2):
        flat_step.NORM_CHUNK = 100 if accum == 2 else 1 << 26  # the norm summed over several chunks, or one
        (ds, _), (own, took) = engine(stage, accum, False), engine(stage, accum, True)
        gen = torch.Generator().manual_seed(1)
        same = True
        for s in range(6):
            micro = [torch.randn(4, 16, generator=gen).to(torch.bfloat16) for _ in range(accum)]
            if s == 5:
                micro[0][0, 0] = float("nan")
            reads = [Reads(), Reads()] if s == 3 else [None, None]
            step(ds, micro, reads[0])
            step(own, micro, reads[1])
            same = same and all(torch.equal(a.nan_to_num(), b.nan_to_num()) and torch.equal(a.isnan(), b.isnan())
                                for a, b in zip(state(ds), state(own), strict=True))
            if s == 3:
                host_reads = [r.n for r in reads]
        made = {}
        for name, p in own.module.named_parameters():
            if p.requires_grad:
                p.register_hook(lambda g, name=name: made.__setitem__(name, StorageWeakRef(g.untyped_storage())))
        own.backward(own(torch.randn(4, 16).to(torch.bfloat16)).float().pow(2).mean())
        gc.collect()
        out[f"{stage}/{accum}"] = {"took": took, "same": same, "reads": host_reads,
                                   "pad": sum(own.optimizer.groups_padding),
                                   "alive": sum(not ref.expired() for ref in made.values())}
# a setting the flat step does not reproduce (DeepSpeed allows it without reduce_scatter only)
out["predivide"] = engine(2, 1, True, {"gradient_predivide_factor": 2.0}, {"reduce_scatter": False})[1]
out["deepcompile"] = engine(2, 1, True, {"compile": {"deepcompile": True}})[1]  # it takes the gradients itself
flat_step.FLAT_STEP_DEEPSPEED = ("0.0.0",)
out["other_version"] = engine(2, 1, True)[1]
print(json.dumps(out))
torch.distributed.destroy_process_group()
"""


def test_the_flat_zero_step_takes_deepspeeds_steps_without_a_host_read():
    """dsnb's flat ZeRO-1/2 step (one process, bf16) makes DeepSpeed's updates bit for bit, through accumulation and
    a NaN gradient, without reading anything back to the host, and, at ZeRO-2, leaves no gradient of a backward
    alive, so the compiled step may accumulate under CUDA graphs (dsnb/flat_step.py::take_over,
    dsnb/loop.py::graphs_under_zero)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", FLAT], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    cases = json.loads(done.stdout.strip().splitlines()[-1])
    for refused in ("predivide", "deepcompile", "other_version"):  # DeepSpeed's own step there
        assert cases.pop(refused) is False, refused
    assert set(cases) == {"1/1", "1/2", "2/1", "2/2"}
    for name, case in cases.items():
        assert case["took"] and case["same"], (name, case)
        assert case["reads"][0] >= 1 and case["reads"][1] == 0, (name, case)  # DeepSpeed's clipping reads its norm
        assert case["pad"] > 0  # DeepSpeed's flat layout with padding, which the flat buffer keeps at zero
    assert cases["2/1"]["alive"] == 0 and cases["2/2"]["alive"] == 0


def test_the_flat_step_runs_in_dsnbs_compiled_zero2_and_keeps_its_curve(tmp_path, monkeypatch):
    """Through dsnb's own run (LoRA, bf16, ZeRO-2 compiled, two micro-batches a step): the flat step is taken and
    recorded (metric zero_flat_step), zero_flat_step false keeps DeepSpeed's own, and the two loss curves agree."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = RunConfig(**dict(OFFLINE, quantization="none", dtype="bf16", strategy="zero2", torch_compile=True,
                           max_steps=4, logging_steps=1, learning_rate=1e-3, batch_size=2, grad_accum=2, num_samples=4,
                           eval_samples=0, lora_dropout=0.0, padding="bucket", save_model=False, tracking_uri=uri))
    runs = train_here([cfg.replace(run_name="flat"), cfg.replace(run_name="stock", zero_flat_step=False)], tmp_path)
    flat, stock = runs["flat"], runs["stock"]
    assert flat.metrics["zero_flat_step"] == 1 and stock.metrics["zero_flat_step"] == 0
    curve = {name: r.curve for name, r in runs.items()}
    assert len(curve["flat"]) == 4 and curve["flat"][-1] < curve["flat"][0]
    assert curve["flat"] == pytest.approx(curve["stock"], rel=1e-3)


def test_the_training_math_is_compared_by_what_trains_not_by_how_it_runs(tmp_path):
    """same_work's train_math: ZeRO and offload (dsnb's configs) leave the optimizer, schedule and clipping the
    Trainer's; a user's DeepSpeed JSON with its own optimizer, scheduler or clipping changes it; a data file changed
    at the same path changes data_fingerprint."""
    from transformers import TrainingArguments

    from dsnb.train import data_fingerprint, training_math
    from dsnb.zero import deepspeed_config

    args = TrainingArguments(output_dir=str(tmp_path), learning_rate=2e-4, report_to="none", use_cpu=True)
    cfg = RunConfig(**dict(OFFLINE, strategy="zero2", offload_optimizer="cpu", quantization="none"))
    baseline = training_math(args, None)
    assert training_math(args, deepspeed_config(cfg)) == baseline == training_math(args, deepspeed_config(
        cfg.replace(strategy="zero3", offload_optimizer="none")))
    own = deepspeed_config(cfg)
    for change in ({"optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}},
                   {"optimizer": {"type": "Adam", "params": {}}},
                   {"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}}},
                   {"gradient_clipping": 0.5}):
        assert training_math(args, {**own, **change}) != baseline, change

    tokenizer = load_tokenizer(RunConfig(**OFFLINE))
    path = tmp_path / "data.jsonl"
    prints = []
    for answer in ("Seoul", "Busan"):  # one file, its answers edited in place
        path.write_text("\n".join(json.dumps({"question": f"q{i}?", "context": f"{answer} is the city {i}.",
                                              "answers": {"text": [answer]}}) for i in range(8)))
        file_cfg = RunConfig(**dict(OFFLINE, dataset=str(path), num_samples=8))
        prints.append(data_fingerprint(build_dataset(file_cfg, tokenizer, load_records(file_cfg))))
    assert prints[0] != prints[1]


def test_the_rendezvous_port_is_free_and_below_the_kernels_ephemeral_range(tmp_path):
    """Two sweeps writing one store at once failed a variant (DistNetworkError, EADDRINUSE): its port came from
    bind(0), so was ephemeral, and another process's connection took it before torch's store listened. The port is
    now picked below the ephemeral range the kernel names, at random, and free; with no range known, any free port."""
    import socket

    from dsnb.train import rendezvous_port

    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("32768\t60999\n")
    ports = {rendezvous_port(str(ranges)) for _ in range(20)}
    assert all(32768 - 8192 <= port < 32768 for port in ports) and len(ports) > 1
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
    assert 0 < rendezvous_port(str(tmp_path / "missing")) < 65536


@pytest.mark.parametrize("rope", ["default", "llama3"])
def test_compiled_rotary_reads_a_table_with_the_modules_own_numbers(rope):
    """The compiled loop's rotary tables (loop.rotary_tables): a compiled step on packed rows (positions restarting)
    computes no cos or sin, and its loss and every gradient are the module's own bit for bit; rows longer than the
    table, and calls outside compile, take the module's forward; close() puts the module back as it was."""
    import re

    import torch
    from torch._inductor.utils import run_and_get_code
    from transformers import LlamaConfig, LlamaForCausalLM

    from dsnb.loop import rotary_tables

    scaling = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192} if rope == "llama3" else {"rope_type": "default"}
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=300,
                                         rope_parameters={"rope_theta": 500000.0, **scaling})).to(torch.bfloat16)
    ids = torch.randint(0, 300, (2, 48))
    positions = torch.cat([torch.arange(20), torch.arange(28)]).repeat(2, 1)

    def compiled_step(rows):
        torch._dynamo.reset()
        model.zero_grad(set_to_none=True)
        tables = rotary_tables(model, rows) if rows else contextlib.nullcontext()
        with tables:
            loss, code = run_and_get_code(torch.compile(
                lambda: (lambda out: (out.loss.backward(), out.loss)[1])(model(input_ids=ids, position_ids=positions,
                                                                               labels=ids))))
        trig = len(re.findall(r"\b(?:cos|sin)\(", "\n".join(code)))
        return loss.item(), [p.grad.clone() for p in model.parameters()], trig

    own_loss, own_grads, own_trig = compiled_step(0)
    assert own_trig > 0  # the compiled step computes rotary itself: the work the tables take away
    loss, grads, trig = compiled_step(64)
    assert trig == 0 and loss == own_loss
    assert all(torch.equal(a, b) for a, b in zip(grads, own_grads, strict=True))
    short = compiled_step(32)  # rows of 48 tokens past a 32-row table: the module's own forward
    assert short[2] > 0 and short[0] == own_loss
    rotary = model.model.rotary_emb
    x = torch.zeros(1, dtype=torch.bfloat16)
    with rotary_tables(model, 64):
        assert "forward" in vars(rotary) and rotary.cos_table.shape == (64, 32)
        eager = rotary(x, positions)  # outside compile: the module's own numbers, computed
    assert "forward" not in vars(rotary) and not hasattr(rotary, "cos_table")
    assert all(torch.equal(a, b) for a, b in zip(eager, rotary(x, positions), strict=True))


def test_the_compiled_step_returns_only_the_loss_and_no_logits_gradient_is_made(tmp_path):
    """loop.loss_only: the compiled model returns its loss alone, so the backward makes no zero gradient the size of
    the logits for an output the loss never used (on a GPU, CUDA graphs also copied it); the loss is the whole model's
    bit for bit, every gradient within fp32 rounding. With label smoothing the Trainer reads the logits, and the model
    stays whole."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    from dsnb.loop import loss_only

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=3000))
    ids = torch.randint(0, 3000, (2, 128))

    def step(forward, trainer):
        torch._dynamo.reset()
        model.zero_grad(set_to_none=True)
        compiled = torch.compile(forward)
        trainer.compute_loss(compiled, {"input_ids": ids, "labels": ids}).backward()  # compiled once
        model.zero_grad(set_to_none=True)
        with torch.profiler.profile(record_shapes=True) as profile:
            loss = trainer.compute_loss(compiled, {"input_ids": ids, "labels": ids})
            loss.backward()
        zeroed = [e.input_shapes[0] for e in profile.key_averages(group_by_input_shape=True)
                  if e.key in ("aten::zero_", "aten::fill_") and e.input_shapes and e.input_shapes[0]]
        return loss.item(), [p.grad.clone() for p in model.parameters()], [2, 128, 3000] in zeroed

    args = dict(output_dir=str(tmp_path), report_to=[], use_cpu=True)
    trainer = Trainer(model=model, args=TrainingArguments(**args))
    whole = step(model, trainer)
    assert whole[2]  # the whole model's compiled backward zeroes a logits-sized gradient: what loss_only removes
    alone = step(loss_only(trainer), trainer)
    assert not alone[2] and alone[0] == whole[0]
    for a, b in zip(alone[1], whole[1], strict=True):  # the backward's kernels fuse otherwise: fp32 rounding
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-8)
    smoothing = Trainer(model=model, args=TrainingArguments(**args, label_smoothing_factor=0.1))
    assert loss_only(smoothing) is model

    class TupleModel(torch.nn.Module):  # a model that returns a tuple, the loss first: the Trainer reads outputs[0]
        def forward(self, **inputs):
            return (model(**inputs).loss, None)

    tupled = Trainer(model=TupleModel(), args=TrainingArguments(**args))
    assert loss_only(tupled)(input_ids=ids, labels=ids)["loss"].item() == whole[0]


@pytest.mark.parametrize("arch", ["cohere", "olmo2"])
def test_a_rotary_that_is_not_llamas_keeps_its_own_forward(arch):
    """loop.rotary_tables gives a table only to a rotary whose own forward returns the table's numbers: Cohere lays its
    frequencies out interleaved and OLMo 2 returns fp32 whatever the input, with the same rope_type and inv_freq as
    Llama's, so a table would change what they train; their compiled step stays the module's own."""
    import torch
    import transformers

    from dsnb.loop import rotary_tables

    name = {"cohere": "Cohere", "olmo2": "Olmo2"}[arch]
    config = getattr(transformers, f"{name}Config")(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                                    num_attention_heads=4, num_key_value_heads=2, vocab_size=300)
    model = getattr(transformers, f"{name}ForCausalLM")(config).to(torch.bfloat16)
    rotary = model.model.rotary_emb
    assert rotary.rope_type == "default" and isinstance(rotary.inv_freq, torch.Tensor)  # what the table's check saw
    with rotary_tables(model, 32):
        assert "forward" not in vars(rotary) and not hasattr(rotary, "cos_table")
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=300)).to(torch.float16)
    with rotary_tables(llama, 32):  # Llama's own rotary in fp16 gets its table
        assert llama.model.rotary_emb.cos_table.shape == (32, 16)
