"""Running one variant: `train(cfg)` in this process, or `run_variant(cfg)` in a fresh child process.

    result = run_variant(RunConfig(**OFFLINE, strategy="zero2", offload_optimizer="cpu"))
    result["status"], result["metrics"]["peak_gpu_allocated_mb"]

Each variant runs in its own process, so no run's memory is counted in another's. The parent opens the
MLflow run, the child trains and logs into it, and the parent closes it FAILED/KILLED if the child dies.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback

from .config import ConfigError, RunConfig, describe
from .tracking import mlflow_client

PROGRESS_ENV = "DSNB_PROGRESS"  # set by run_variant: the child prints step lines for the parent's bar
STEP_PREFIX = "@@dsnb-step "
SWEEP_RUN_ENV = "DSNB_SWEEP_RUN_ID"


def pick_device() -> str:
    import torch

    if torch.cuda.is_available():
        return f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
    return "cpu"


def gpu_ids(visible: str | None, count: int) -> list[str]:
    """The first `count` GPUs of a CUDA_VISIBLE_DEVICES value (unset: 0, 1, ...), as its entries."""
    ids = [g.strip() for g in visible.split(",") if g.strip()] if visible else [str(i) for i in range(count)]
    return ids[:count]


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", 1))


def check_environment(cfg: RunConfig, device: str) -> None:
    """Checks that need this machine (GPU, files, disks); raise ConfigError before any model loads."""
    import torch

    if device == "cpu" and cfg.dtype == "fp16":
        raise ConfigError("dtype fp16 needs a GPU and this machine has none; use dtype bf16 or fp32 "
                          "(or DSNB_OFFLINE=1 for the offline default)")
    if device.startswith("cuda") and cfg.dtype == "bf16" and not torch.cuda.is_bf16_supported():
        raise ConfigError(f"dtype bf16 is not supported on {torch.cuda.get_device_name(device)}; use fp16")
    if device.startswith("cuda") and cfg.num_gpus > torch.cuda.device_count():
        raise ConfigError(f"num_gpus is {cfg.num_gpus} but this machine has {torch.cuda.device_count()} GPU(s); "
                          f"set num_gpus <= {torch.cuda.device_count()}")
    if cfg.memory_budget_gb:
        if device == "cpu":
            raise ConfigError("memory_budget_gb caps GPU memory and this machine has no GPU; set it to 0")
        total = torch.cuda.get_device_properties(device).total_memory / 2**30
        if cfg.memory_budget_gb > total:
            raise ConfigError(f"memory_budget_gb is {cfg.memory_budget_gb} but {torch.cuda.get_device_name(device)} "
                              f"has {total:.1f} GB; set at most {total:.0f}")
    if cfg.dataset not in ("squad", "synthetic") and not os.path.isfile(cfg.dataset):
        raise ConfigError(f"dataset file {cfg.dataset!r} does not exist; check the path or use dataset=synthetic")
    if cfg.uses_nvme:
        check_nvme_path(cfg.nvme_path)
    if cfg.ds_config:
        user_ds_config(cfg)
    from .model import resolve_model

    if not cfg.model.startswith("synthetic:"):
        resolve_model(cfg.model)  # a missing local folder fails here; synthetic builds wait for the run


STALE_BUILD_S = 1800  # a JIT build lock older than this is left from a killed build (one takes ~7 min on 2 cores)


def check_nvme_path(path: str) -> None:
    """The NVMe folder exists and is writable, and DeepSpeed's async I/O (libaio) can be built."""
    if not os.path.isdir(path):
        raise ConfigError(f"nvme_path {path!r} does not exist; create it on a fast local disk or set nvme_path")
    try:
        with tempfile.NamedTemporaryFile(dir=path):
            pass
    except OSError:
        raise ConfigError(f"nvme_path {path!r} is not writable; pick a folder you can write to") from None
    from deepspeed.ops.op_builder import AsyncIOBuilder

    if not AsyncIOBuilder().is_compatible(verbose=False):
        raise ConfigError("NVMe offload needs libaio for DeepSpeed's async I/O: run `apt-get install libaio-dev` "
                          "(or use offload cpu)")
    # A build killed part way leaves its lock behind, and every later run waits on it without a word.
    from torch.utils.cpp_extension import _get_build_directory

    lock = os.path.join(_get_build_directory(AsyncIOBuilder().name, False), "lock")
    if os.path.exists(lock) and time.time() - os.path.getmtime(lock) > STALE_BUILD_S:
        raise ConfigError(f"{lock} is left from an interrupted build of DeepSpeed's async I/O op, and the run would "
                          "wait on it for ever; delete that file and run again")
    # DeepSpeed builds its async I/O op at run time and reads each architecture as digits ("9.0", "8.6+PTX");
    # an entry such as "9.0a" makes that build fail with a bare ValueError (seen on an H200 image).
    arch = os.environ.get("TORCH_CUDA_ARCH_LIST", "")
    bad = [a for a in re.split(r"[;\s]+", arch) if a and not re.fullmatch(r"\d+\.\d+(\+PTX)?", a)]
    if bad:
        raise ConfigError(f"TORCH_CUDA_ARCH_LIST holds {bad[0]!r}, which DeepSpeed cannot build its NVMe I/O op for; "
                          "set it to your GPU's compute capability, e.g. TORCH_CUDA_ARCH_LIST=9.0, or unset it")


def check_nvme_space(path: str, needed_mb: float) -> None:
    free_mb = shutil.disk_usage(path).free / 2**20
    if free_mb < needed_mb:
        raise ConfigError(f"nvme_path {path} has {free_mb / 1024:.1f} GB free but this run offloads about "
                          f"{needed_mb / 1024:.1f} GB; free space there or set nvme_path to a larger disk")


def user_ds_config(cfg: RunConfig) -> dict:
    from .zero import check_batch_sizes

    if not os.path.isfile(cfg.ds_config):
        raise ConfigError(f"ds_config {cfg.ds_config!r} does not exist; give a DeepSpeed JSON file or leave it empty")
    try:
        with open(cfg.ds_config) as f:
            config = json.load(f)
    except json.JSONDecodeError as e:
        raise ConfigError(f"ds_config {cfg.ds_config} is not valid JSON ({e})") from None
    check_batch_sizes(config, cfg, world_size())
    return config


def deepspeed_env(device: str) -> None:
    """What DeepSpeed's launcher would set, for a single process started without it."""
    if device == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if "RANK" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port))


def train(cfg: RunConfig, run_id: str | None = None, resume: bool = False) -> dict:
    """Train cfg's variant in this process, log it to MLflow, return its metrics.

    With resume, continue the newest unfinished run of cfg's name from its last checkpoint, into that run.
    Raises ConfigError for what the user must change; any other failure is recorded as a FAILED run
    (with the memory measured so far and the error as an artifact) and re-raised.
    """
    device = pick_device()
    check_environment(cfg, device)
    if cfg.zero_stage is not None:
        deepspeed_env(device)
    from . import tracking
    from .metrics import PeakMemory

    run_id = run_id or os.environ.get("MLFLOW_RUN_ID")
    checkpoint = None
    if resume:
        run_id, checkpoint = resumable_run(cfg)
    main = int(os.environ.get("RANK", 0)) == 0
    # Under a multi-process launcher only rank 0 records the run.
    with (tracking.tracked_run(cfg, run_id) if main else contextlib.nullcontext()) as run, PeakMemory(device) as mem:
        try:
            metrics = _train(cfg, device, mem, run is not None, checkpoint)
        except BaseException as e:
            if run is not None:
                _record_failure(e, mem)
            raise
    return metrics


def resumable_run(cfg: RunConfig) -> tuple[str, str]:
    """(run id, last checkpoint) of the newest FAILED or KILLED run named like cfg's that left a checkpoint."""
    from transformers.trainer_utils import get_last_checkpoint

    from . import tracking

    experiment = tracking.experiment_id(cfg)
    client = mlflow_client(cfg.tracking_uri)
    name = cfg.run_name or cfg.derived_name()
    tracking.mark_stale_runs(client)
    runs = client.search_runs([experiment], f"attributes.run_name = '{name}' and "
                              "attributes.status != 'FINISHED' and attributes.status != 'RUNNING'",
                              order_by=["attributes.start_time DESC"])
    for run in runs:
        folder = os.path.join(cfg.output_dir, run.info.run_id)
        checkpoint = get_last_checkpoint(folder) if os.path.isdir(folder) else None
        if checkpoint:
            if not tracking.same_config(run, cfg):
                raise ConfigError(f"run {name} ({run.info.run_id}) was started with another config; resume it "
                                  "with the same fields, or drop --resume to start afresh")
            return run.info.run_id, checkpoint
    raise ConfigError(f"nothing to resume: no failed or killed run named {name} with a checkpoint under "
                      f"{cfg.output_dir}/ (set checkpoint_steps to save them); run without --resume")


def _record_failure(error: BaseException, mem) -> None:
    import mlflow
    import torch

    mlflow.log_metrics(mem.summary())
    oom = isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error).lower()
    mlflow.set_tags({"failure": "oom" if oom else type(error).__name__,
                     "error": describe(error, 500)})
    mlflow.log_text("".join(traceback.format_exception(error)), "error.txt")


def _train(cfg: RunConfig, device: str, mem, log: bool, checkpoint: str | None = None) -> dict:
    import mlflow
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from . import tracking
    from .data import build_dataset, collator
    from .estimate import estimate_memory, tokens_per_micro_batch
    from .metrics import StepTimer, flops_per_token, gather_ranks, gputil_used_mb, peak_flops
    from .model import count_parameters, largest_param, load_model
    from .zero import ds_config

    index = int(device.split(":")[1]) if ":" in device else 0
    if cfg.memory_budget_gb:
        import torch

        # The allocator refuses to grow past the budget, so a run that needs more ends in an OOM error,
        # as it would on the smaller GPU (the CUDA context, ~0.5 GB, sits outside the cap).
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(cfg.memory_budget_gb * 2**30 / total, index)
    gputil_before = gputil_used_mb(index)
    deepspeed = None
    if cfg.zero_stage is not None:
        largest = largest_param(cfg) if cfg.offload_param == "nvme" else 0  # sizes NVMe swap buffers only
        deepspeed = user_ds_config(cfg) if cfg.ds_config else ds_config(cfg, world_size(), largest)
    # The arguments come before the model: with ZeRO-3 they make transformers load each weight straight
    # into its partition (on the CPU with parameter offload), across every rank. Loaded whole, the model
    # would first be moved to one GPU by DeepSpeed: the 8B shape failed that way under a 15 GB budget.
    run_dir = os.path.join(cfg.output_dir, mlflow.active_run().info.run_id if log else "rank")
    args = TrainingArguments(
        output_dir=run_dir, per_device_train_batch_size=cfg.batch_size, gradient_accumulation_steps=cfg.grad_accum,
        learning_rate=cfg.learning_rate, num_train_epochs=cfg.epochs, max_steps=cfg.max_steps or -1,
        lr_scheduler_type="linear", warmup_steps=0, seed=cfg.seed, data_seed=cfg.seed,
        optim="adamw_torch_fused" if cfg.torch_compile and device.startswith("cuda") else "adamw_torch",
        fp16=cfg.dtype == "fp16", bf16=cfg.dtype == "bf16", use_cpu=device == "cpu",
        logging_steps=cfg.logging_steps, logging_first_step=True, report_to="none",
        save_strategy="steps" if cfg.checkpoint_steps else "no", save_steps=cfg.checkpoint_steps or 500,
        deepspeed=deepspeed, ddp_backend="gloo" if device == "cpu" and deepspeed else None,
        include_num_input_tokens_seen="non_padding", disable_tqdm=bool(os.environ.get(PROGRESS_ENV)),
        dataloader_num_workers=0)
    if cfg.zero_stage == 3:  # ZeRO-3's loading partitions over every rank, so the group must exist first
        from deepspeed import init_distributed

        init_distributed(dist_backend="gloo" if device == "cpu" else "nccl")
    model, tokenizer = load_model(cfg, device)
    train_set = build_dataset(cfg, tokenizer)
    trainable, total = count_parameters(model)
    estimate = estimate_memory(cfg, model.config, trainable, tokens_per_micro_batch(cfg, train_set), world_size())
    if cfg.uses_nvme:
        check_nvme_space(cfg.nvme_path, estimate["est_peak_cpu_offload_mb"])
    timer = StepTimer(device, cfg.warmup_steps)

    def report_step(step: int, max_steps: int) -> None:
        if log and os.environ.get(PROGRESS_ENV):
            print(f"{STEP_PREFIX}{step} {max_steps}", flush=True)

    def log_curve(step: int, logs: dict) -> None:
        curve = {k: float(v) for k, v in logs.items() if k in ("loss", "grad_norm", "learning_rate")}
        if log and curve:
            mlflow.log_metrics(curve, step=step)

    class Callback(TrainerCallback):
        """Times steps, logs the loss curve to MLflow and reports progress to a parent process."""

        def on_train_begin(self, args, state, control, **kw):
            timer.mark(state.global_step, state.num_input_tokens_seen)  # a resumed run starts mid-way

        def on_step_end(self, args, state, control, **kw):
            timer.mark(state.global_step, state.num_input_tokens_seen)
            report_step(state.global_step, state.max_steps)

        def on_log(self, args, state, control, logs=None, **kw):
            log_curve(state.global_step, logs or {})

    trainer = Trainer(model=model, args=args, train_dataset=train_set, data_collator=collator(tokenizer, cfg),
                      processing_class=tokenizer, callbacks=[Callback()])
    if log:
        mlflow.log_metrics(estimate)  # before training, so a run that dies still has its estimate
        mlflow.log_params({"trainable_params": trainable, "total_params": total, "device": device,
                           "mfu_convention": "6N full / 4N+6N_trainable LoRA per real token, N=matmul weights"})
        tracking.log_json(tracking.environment(device), "environment.json")
        if checkpoint:
            mlflow.set_tag("resumed_from", checkpoint)
    if cfg.torch_compile:
        from .loop import PROFILE_ENV, train_compiled

        raw = train_compiled(trainer, cfg, timer, report_step, log_curve)
        if log and os.path.isfile(os.environ.get(PROFILE_ENV, "")):
            mlflow.log_artifact(os.environ[PROFILE_ENV])
    else:
        raw = trainer.train(resume_from_checkpoint=checkpoint).metrics
    mem.sample()
    samples_per_step = cfg.batch_size * cfg.grad_accum * world_size()
    metrics = {k: float(v) for k, v in raw.items() if isinstance(v, (int, float))}
    metrics["train_runtime_sec"] = metrics["train_runtime"]
    metrics["gpu_memory_used_mb"] = gputil_used_mb(index) - gputil_before
    metrics.update(mem.summary() if world_size() == 1 else gather_ranks(mem.summary()))
    measured = metrics["peak_gpu_allocated_mb"]
    if measured:
        metrics["est_error_gpu"] = estimate["est_peak_gpu_mb"] / measured - 1
    metrics.update(timer.throughput(samples_per_step))
    flops, source = peak_flops(device)
    per_token = flops_per_token(model.config, trainable, full=cfg.lora_r == 0)
    if "tokens_per_second" in metrics:
        metrics["mfu"] = metrics["tokens_per_second"] * per_token / (flops * world_size())
    metrics["real_tokens_per_sample"] = trainer.state.num_input_tokens_seen / max(1, timer.marks[-1][1] * samples_per_step)
    if log:
        mlflow.log_metrics(metrics)
        mlflow.log_params({"peak_flops": f"{flops:.4g}", "peak_flops_source": source,
                           "flops_per_token": f"{per_token:.4g}"})
        if deepspeed is not None:
            tracking.log_json(trainer.accelerator.state.deepspeed_plugin.hf_ds_config.config, "deepspeed_config.json")
    if cfg.save_model:
        trainer.save_model(os.path.join(run_dir, "model"))
        if log:
            mlflow.log_artifacts(os.path.join(run_dir, "model"), "model")
    if log:
        shutil.rmtree(run_dir, ignore_errors=True)  # the artifacts now hold it; the store is the one copy
    return metrics


def run_variant(cfg: RunConfig, progress: bool = True, tags: dict | None = None, env: dict | None = None) -> dict:
    """Run cfg in a fresh Python process as one MLflow run; return {run_id, status, returncode, metrics}.

    env adds variables to the child's environment (CUDA_VISIBLE_DEVICES, say).

    A child that fails or dies leaves a FAILED (or KILLED) run with its log attached; it never raises.
    """
    from tqdm.auto import tqdm

    from . import tracking

    check_environment(cfg, pick_device())
    # A sweep opens the run before it starts the notebook that calls this; then log into that run.
    run_id = tracking.create_run(cfg, tags, os.environ.pop(SWEEP_RUN_ENV, None))
    name = cfg.run_name or cfg.derived_name()
    with tempfile.TemporaryDirectory() as tmp:
        config_file, log_file = os.path.join(tmp, "config.json"), os.path.join(tmp, "train.log")
        with open(config_file, "w") as f:
            json.dump(cfg.to_dict(), f)
        env = {**os.environ, **(env or {}), "MLFLOW_RUN_ID": run_id, PROGRESS_ENV: "1", "PYTHONUNBUFFERED": "1"}
        # Several GPUs: torchrun starts one process per GPU; each rank trains, rank 0 logs into run_id.
        launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={cfg.num_gpus}"]
        command = [sys.executable, *(launcher if cfg.num_gpus > 1 else []), "-m", "dsnb", "run", "-f", config_file]
        bar = tqdm(desc=name, unit="step", disable=not progress, leave=True)
        started = time.perf_counter()
        with open(log_file, "w") as log, subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                          env=env, text=True) as child:
            try:
                for line in child.stdout:
                    if line.startswith(STEP_PREFIX):
                        step, total = map(int, line[len(STEP_PREFIX):].split())
                        bar.total = total
                        bar.update(step - bar.n)
                    else:
                        log.write(line)
                child.wait()
            except KeyboardInterrupt:
                child.kill()
                child.wait()
                tracking.finish(run_id, cfg.tracking_uri, "KILLED")
                raise
            finally:
                bar.close()
        client = mlflow_client(cfg.tracking_uri)
        client.log_artifact(run_id, log_file)
        if child.returncode != 0:
            tracking.finish(run_id, cfg.tracking_uri, "FAILED" if child.returncode > 0 else "KILLED")
            if progress:
                print(f"{name}: failed (exit {child.returncode}); last lines of its log:\n" + _tail(log_file))
    run = client.get_run(run_id)
    return {"run_id": run_id, "name": name, "status": run.info.status, "returncode": child.returncode,
            "metrics": dict(run.data.metrics), "wall_seconds": time.perf_counter() - started}


def _tail(path: str, lines: int = 15) -> str:
    with open(path) as f:
        return "".join(f.readlines()[-lines:])
