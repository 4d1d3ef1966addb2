"""Training one variant in this process: plan (planning.py), set up, fit, measure, record.

    metrics = train(cfg)                                       # one MLflow run (rank 0 logs it)
    metrics = train(cfg, run_id, checkpoint)                   # resume into that run (tracking.resumable_run)

A failure is recorded on the run (FAILED, KILLED if interrupted, with what was measured so far and the
error) and re-raised; ConfigError means the user must change something. launch.run_variant calls this in a
child process, so no run's memory is counted in another's.
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import socket
import time
from dataclasses import dataclass, field

from transformers import Trainer, TrainerCallback

from . import preflight, tracking
from .card import write_card
from .config import RunConfig
from .data import BatchLog, collator, eval_task, held_out_warning, question_key
from .estimate import largest_weight
from .evaluate import answer_and_score, probe_logit_norm
from .loop import train_compiled
from .metrics import PeakMemory, StepTimer, flops_per_token, gather_ranks, gputil_used_mb, peak_flops, sync
from .model import count_parameters, fetch, load_model, model_config
from .planning import Plan, Reporter, Silent, describe_plan, plan
from .zero import run_config

MFU_CONVENTION = ("6N full / 4N+6N_trainable LoRA per real token, N=matmul weights, over the peak_flops param (a "
                  "GPU's dense bf16 datasheet peak, the CPU's nominal fp32 peak; fp8 weights: bf16-equivalent, fp8's "
                  "own peak being 2x)")


@dataclass
class Quality:
    """Greedy answers before and after training, scored (evaluate.py): the held-out questions ("eval"), and with a
    closed-book prompt as many trained ones ("recall": what the run learned, where held-out answers can show only
    what the model knew)."""

    sets: dict  # "eval" / "recall" -> rows
    synced: bool  # ZeRO-3 over several processes: every rank generates together
    reporter: Reporter
    scores: dict = field(default_factory=dict)  # (set, "before" / "after") -> exact_match, f1, per_question, seconds..
    answers: dict = field(default_factory=dict)  # (set, "before" / "after") -> the answers, in row order

    LABELS = {"eval": "held-out questions", "recall": "trained questions (recall)"}

    def score(self, when: str, model, tokenizer, cfg: RunConfig) -> None:
        """Answer and score every set; the "before" answers are recorded on the run at once (rank 0), so a run
        resumed in another process keeps them (load_before)."""
        for name, rows in self.sets.items():
            if rows:
                scores, self.answers[name, when] = answer_and_score(model, tokenizer, cfg, rows, self.synced)
                self.scores[name, when] = scores
                self.reporter.say(f"{when} training: exact match {scores['exact_match']:.2f}, F1 {scores['f1']:.2f} "
                                  f"on {len(rows)} {self.LABELS[name]}")
        import mlflow

        if when == "before" and mlflow.active_run() is not None and self.scores:
            mlflow.log_metrics({k: v for k, v in self.metrics().items() if k.endswith("_before")})
            tracking.log_json({name: {"scores": self.scores[name, "before"], "answers": self.answers[name, "before"]}
                               for name, _ in self.scores}, BEFORE)

    def load_before(self, client, run_id: str) -> None:
        """The "before" answers and scores the run's first process recorded (a resumed run asks them once); their
        time is not this process's, so it counts 0 here."""
        try:
            with open(client.download_artifacts(run_id, BEFORE)) as f:
                before = json.load(f)
        except Exception:  # none recorded: eval_samples 0, or a run of an older dsnb
            return
        for name, part in before.items():
            self.scores[name, "before"] = {**part["scores"], "seconds": 0.0}
            self.answers[name, "before"] = part["answers"]

    def seconds(self, when: str) -> float:
        return sum(v["seconds"] for (_, w), v in self.scores.items() if w == when)

    def metrics(self) -> dict:
        out = {}
        for (name, when), scores in self.scores.items():
            keys = ("exact_match", "f1") if when == "before" else ("exact_match", "f1", "tokens_per_second", "seconds")
            out.update({f"{name}_{k}{'_before' if when == 'before' else ''}": scores[k] for k in keys})
            out[f"{name}_questions"] = len(self.sets[name])
        return out

    def table(self) -> list[dict]:
        """Every question asked, with its set, id, gold answers, and each answer with its exact match and F1."""
        rows = []
        for name, questions in self.sets.items():
            for i, r in enumerate(questions):
                row = {"set": name, "key": question_key(r), "id": str(r.get("id", "")), "question": r["question"],
                       "gold": r["answers"]["text"]}
                for when in ("before", "after"):
                    if (name, when) in self.scores:
                        em, f = self.scores[name, when]["per_question"][i]
                        row.update({when: self.answers[name, when][i], f"{when}_em": em, f"{when}_f1": f})
                rows.append(row)
        return rows


def eval_set_id(rows: list[dict]) -> str:
    """A short fingerprint of the questions a run was asked, by content (each question with its passage and id, and
    its gold answers), in order: the same for every variant of a comparison."""
    return fingerprint([[question_key(r), r["answers"]["text"]] for r in rows])


def fingerprint(value) -> str:
    """A short hash of a JSON-serialisable value's content."""
    import hashlib

    return hashlib.sha1(json.dumps(value, sort_keys=True, ensure_ascii=False, default=str).encode()).hexdigest()[:12]


def data_fingerprint(train_set) -> str:
    """What a run trained on, by content: every training sample's tokens and labels, in order (a data file changed at
    the same path, another tokenizer or prompt text all change it)."""
    return fingerprint([train_set["input_ids"], train_set["labels"]])


def training_math(args, deepspeed: dict | None) -> dict:
    """The optimizer, learning-rate schedule and clipping a run trains with, in one vocabulary for every path: the
    Trainer's own, or the DeepSpeed config's sections where it sets them ("auto" takes the Trainer's value). A user's
    DeepSpeed JSON with its own optimizer, scheduler or clipping changes it; ZeRO and offload do not."""
    ds = deepspeed or {}
    optimizer = ds.get("optimizer") or {}
    params = optimizer.get("params") or {}
    own = {"lr": args.learning_rate, "betas": [args.adam_beta1, args.adam_beta2], "eps": args.adam_epsilon,
           "weight_decay": args.weight_decay}
    kind = str(optimizer.get("type") or getattr(args.optim, "value", args.optim)).lower()
    math = {"optimizer": "adamw" if kind in ("adamw", "adamw_torch", "adamw_torch_fused") else kind,
            **{k: own[k] if params.get(k, "auto") == "auto" else params[k] for k in own},
            **{k: v for k, v in params.items() if k not in own}}
    scheduler = ds.get("scheduler")
    math["scheduler"] = scheduler or {"type": getattr(args.lr_scheduler_type, "value", str(args.lr_scheduler_type)),
                                      "warmup": args.warmup_steps}
    clip = ds.get("gradient_clipping", "auto")
    math["gradient_clipping"] = args.max_grad_norm if clip == "auto" else clip
    return json.loads(json.dumps(math, default=str))


STAGING = ".partial"  # a checkpoint is written here, then renamed into place whole
BEFORE = "answers_before.json"  # the "before" answers and scores, recorded as soon as they are measured
PROGRESS = "dsnb_progress.json"  # in each checkpoint: training time, samples and tokens up to it, for a resumed record


class CheckpointTrainer(Trainer):
    """The HF Trainer, writing each checkpoint whole or not at all: into a staging folder, then renamed into place, so
    that a run killed while writing leaves its last complete checkpoint the newest one (a resume never meets half of
    one). Just before the rename, each `before_publish` hook runs with the staged checkpoint's folder (the loss curve is
    written to MLflow, so no checkpoint holds a step the curve lacks; dsnb's progress is written into it); the previous
    checkpoint is removed after it (save_total_limit)."""

    before_publish: tuple = ()
    _staged: str | None = None

    def _get_output_dir(self, trial) -> str:
        return self._staged or super()._get_output_dir(trial)

    def _save_checkpoint(self, model, trial) -> None:
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints

        run_dir = super()._get_output_dir(trial)
        staged, name = os.path.join(run_dir, STAGING), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        if self.args.should_save:
            shutil.rmtree(staged, ignore_errors=True)  # left by a run killed mid-write
        self.accelerator.wait_for_everyone()
        self._staged = staged
        try:
            super()._save_checkpoint(model, trial)  # every rank writes its part (DeepSpeed's shards) under staged
        finally:
            self._staged = None
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            for hook in self.before_publish:
                hook(os.path.join(staged, name))
            tracking.list_files(os.path.join(staged, name))  # last: what a resume checks the checkpoint against
            sync_tree(os.path.join(staged, name))
            shutil.rmtree(os.path.join(run_dir, name), ignore_errors=True)  # a checkpoint of this step from before
            os.replace(os.path.join(staged, name), os.path.join(run_dir, name))
            rotate_checkpoints(output_dir=run_dir, save_total_limit=self.args.save_total_limit,
                               best_model_checkpoint=None, use_mtime=False)
        self.accelerator.wait_for_everyone()


def sync_tree(folder: str) -> None:
    """Flush a folder's files to disk, so the rename that publishes it never points at data still in the cache."""
    for root, _, files in os.walk(folder):
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                os.fsync(f.fileno())


@dataclass
class Session:
    """What set_up builds for one run; fit, measure and record read it."""

    cfg: RunConfig
    device: str
    world: int
    log: bool  # this process records the MLflow run (rank 0)
    run_dir: str  # checkpoints and the saved model, until they are logged
    trainer: object
    plan: Plan
    timer: object
    deepspeed: dict | None
    counts: dict  # trainable_params and total_params, at full size
    quality: Quality
    gputil_before: float
    reporter: Reporter
    prior: dict  # the training time, samples and tokens of the processes before this one (a resumed run; PROGRESS)
    math: dict  # training_math: what same_work compares of the optimizer, schedule and clipping

    @property
    def index(self) -> int:
        return int(self.device.split(":")[1]) if ":" in self.device else 0


def train(cfg: RunConfig, run_id: str | None = None, checkpoint: str | None = None,
          reporter: Reporter | None = None) -> dict:
    """Train cfg's variant here and log it to MLflow; return its metrics."""

    device = preflight.pick_device()
    preflight.check(cfg, device)
    if cfg.zero_stage is not None:
        deepspeed_env(device)
    log = preflight.is_rank0()
    reporter = (reporter or Reporter()) if log else Silent()
    # Under a multi-process launcher only rank 0 records the run.
    session = None
    with (tracking.tracked_run(cfg, run_id) if log else contextlib.nullcontext()) as run, PeakMemory(device) as mem, \
            tracking.heartbeat(run.info.run_id if run else None, cfg.tracking_uri):
        try:
            if run is not None and checkpoint:
                tracking.mark_resumed(run.info.run_id, cfg.tracking_uri, checkpoint)
            session = set_up(cfg, device, run.info.run_id if run else run_id, reporter, checkpoint, log)
            if log:
                record_start(session, checkpoint)
            raw = fit(session, checkpoint)
            mem.sample()
            metrics, params = measure(session, raw, mem.summary())
            if log:
                record_end(session, metrics, params)
            save(session, metrics)
            if run is not None:
                reporter.finishing(run.info.run_id)
        except BaseException as e:
            if run is not None:  # what it measured so far: peaks, and the throughput of the steps it finished
                so_far = session.timer.throughput(gather=False) if session else {}
                tracking.record_failure(e, {**mem.summary(), **so_far})
            raise
    return metrics


def deepspeed_env(device: str) -> None:
    """What DeepSpeed's launcher would set, for a single process started without it."""
    if device == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(rendezvous_port()))


EPHEMERAL_PORTS = "/proc/sys/net/ipv4/ip_local_port_range"


def rendezvous_port(ephemeral: str = EPHEMERAL_PORTS) -> int:
    """A free port for a single process's rendezvous (torch's store listens on it when the group starts), below the
    kernel's ephemeral range where it names one (Linux). A port bind(0) hands out is ephemeral: until the store
    listens, another process's outgoing connection can take it, and two sweeps at once failed a variant so
    (EADDRINUSE). Random, so processes starting together seldom pick the same; free when picked."""
    try:
        with open(ephemeral) as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    pick = random.SystemRandom()
    for _ in range(100 if low > 2048 else 0):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", pick.randrange(max(1024, low - 8192), low)))
            except OSError:
                continue
            return s.getsockname()[1]
    with socket.socket() as s:  # no ephemeral range known, or none of the ports below it free: any free port
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def set_up(cfg: RunConfig, device: str, run_id: str | None, reporter: Reporter,
           checkpoint: str | None = None, log: bool = True) -> Session:
    """Memory cap, DeepSpeed config, the Trainer's arguments, the plan (data, estimate), the model and the Trainer;
    resuming from checkpoint, what the earlier processes trained and answered. run_id: the run, as every rank that
    knows it names its folder (each rank writes its DeepSpeed shards into one checkpoint there); log: this process
    records it (rank 0)."""

    world = preflight.world_size()
    cap_memory(cfg, device)
    index = int(device.split(":")[1]) if ":" in device else 0
    gputil_before = gputil_used_mb(index)
    deepspeed = None
    if cfg.zero_stage is not None:  # the model's largest weight sizes NVMe swap buffers only
        largest = largest_weight(model_config(cfg.model)) if cfg.offload_param == "nvme" else 0
        deepspeed = run_config(cfg, world, largest)
    run_dir = os.path.join(cfg.output_dir, run_id or "rank")
    # The arguments come before the model: with ZeRO-3 they make transformers load each weight straight
    # into its partition (on the CPU with parameter offload), across every rank. Loaded whole, the model
    # would first be moved to one GPU by DeepSpeed: the 8B shape failed that way under a 15 GB budget.
    args = training_arguments(cfg, device, deepspeed, run_dir, quiet=type(reporter) is not Reporter)
    if cfg.zero_stage == 3:  # ZeRO-3's loading partitions over every rank, so the group must exist first
        from deepspeed import init_distributed

        init_distributed(dist_backend="gloo" if device == "cpu" else "nccl")
    the_plan = plan(cfg, world)  # the data is read and checked before the model downloads
    reporter.say(describe_plan(cfg, the_plan))
    # Seeded before the model is built: LoRA's adapters are drawn at random when peft wraps it, before the Trainer
    # seeds anything; unseeded, every run (and variant) started from adapters of its own.
    from transformers import set_seed


    set_seed(cfg.run_seed)
    fetch(cfg.model, reporter.say)  # a hub model's download, with its progress, before it loads
    started = time.perf_counter()
    reporter.say(f"loading {cfg.model} ({cfg.quantization if cfg.quantization != 'none' else cfg.dtype} weights) ...")
    model, tokenizer = load_model(cfg, device, the_plan.tokenizer)
    reporter.say(f"model loaded in {time.perf_counter() - started:.0f} s")
    trainable, total = count_parameters(model)
    batches = BatchLog(collator(tokenizer, cfg))
    phases = None
    if cfg.phase_times:  # DeepSpeed's per-phase timers of the engine the loop drives (made once training starts)
        def phases():
            engine = getattr(trainer, "deepspeed", None)
            return engine.get_wall_clock_timers() if engine is not None else {}
    timer = StepTimer(device, cfg.untimed_steps, batches, phases)
    quality = Quality({"eval": the_plan.eval_rows, "recall": the_plan.recall_rows}, cfg.zero_stage == 3 and world > 1,
                      reporter)
    trainer = CheckpointTrainer(model=model, args=args, train_dataset=the_plan.train_set, data_collator=batches,
                                processing_class=tokenizer)
    # The "before" answers come once the model is placed (under ZeRO-3, once the engine's hooks can fetch it).
    curve = tracking.Curve(run_id, cfg.tracking_uri) if run_id and log else None  # rank 0 records the run
    callback = StepCallback(timer, Progress(timer, reporter), curve,
                            lambda: quality.score("before", trainer.model, tokenizer, cfg), cfg.checkpoint_minutes)
    trainer.add_callback(callback)
    prior = tracking.read_json(os.path.join(checkpoint, PROGRESS)) if checkpoint else {}
    prior = {"train_seconds": float(prior.get("train_seconds", 0.0)), "samples": float(prior.get("samples", 0.0)),
             "tokens": float(prior.get("tokens", 0.0))}
    if checkpoint and curve:
        quality.load_before(curve.client, run_id)

    def progress(folder: str) -> None:  # into each checkpoint: what a resumed run adds its own time and samples to
        samples, tokens = timer.batches.totals(timer.consumed)
        seconds = time.perf_counter() - callback.began
        with open(os.path.join(folder, PROGRESS), "w") as f:
            json.dump({"train_seconds": prior["train_seconds"] + seconds,
                       "samples": prior["samples"] + samples * world, "tokens": prior["tokens"] + tokens * world}, f)

    trainer.before_publish = [progress, *([lambda folder: curve.write()] if curve else [])]
    counts = {"trainable_params": trainable, "total_params": total, "truncated_samples": the_plan.truncated}
    return Session(cfg, device, world, log and run_id is not None, run_dir, trainer, the_plan, timer, deepspeed, counts,
                   quality, gputil_before, reporter, prior, training_math(args, deepspeed))


def cap_memory(cfg: RunConfig, device: str) -> None:
    """The allocator refuses to grow past memory_budget_gb, so a run that needs more ends in an OOM error, as it
    would on the smaller GPU (the CUDA context, ~0.5 GB, sits outside the cap)."""
    if not cfg.memory_budget_gb:
        return
    import torch

    total = torch.cuda.get_device_properties(device).total_memory
    index = int(device.split(":")[1]) if ":" in device else 0
    torch.cuda.set_per_process_memory_fraction(min(1.0, cfg.memory_budget_gb * 2**30 / total), index)


def training_arguments(cfg: RunConfig, device: str, deepspeed: dict | None, run_dir: str, quiet: bool):
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=run_dir, per_device_train_batch_size=cfg.batch_size, gradient_accumulation_steps=cfg.grad_accum,
        learning_rate=cfg.learning_rate, num_train_epochs=cfg.epochs, max_steps=cfg.max_steps or -1,
        lr_scheduler_type="linear", warmup_steps=cfg.lr_warmup_steps, seed=cfg.run_seed, data_seed=cfg.run_seed,
        optim="adamw_torch_fused" if cfg.torch_compile and device.startswith("cuda") else "adamw_torch",
        fp16=cfg.dtype == "fp16", bf16=cfg.dtype == "bf16", use_cpu=device == "cpu",
        logging_steps=cfg.logging_steps, logging_first_step=True, report_to="none",
        # Steps, or the callback's clock (checkpoint_minutes); one checkpoint kept, written whole (CheckpointTrainer).
        save_strategy="steps" if cfg.checkpoint_steps or cfg.checkpoint_minutes else "no",
        save_steps=cfg.checkpoint_steps or 10**9, save_total_limit=1,
        deepspeed=deepspeed, ddp_backend="gloo" if device == "cpu" and deepspeed else None,
        disable_tqdm=quiet, dataloader_num_workers=0,
        # Batches copied from pinned memory without blocking: the host prepares the next step while the GPU works.
        dataloader_pin_memory=device.startswith("cuda"), accelerator_config={"non_blocking": device.startswith("cuda")})


class Progress:
    """Passes each step to the reporter, and once the untimed steps are over, says how long the rest will take.

    The step time is read after waiting for the device, once: a compiled loop's host runs ahead of the GPU, and its
    clock alone said 0.0177 s a step where the steps took 0.32 s (an H200, the throughput mode). That one wait falls
    in the timed steps and leaves the GPU idle while the host queues the next step (invisible at 0.32 s a step: 24 x
    512 rows measured 47.80% MFU with it, 47.64-47.90% without; throughput_rows_h200.md), so it is made only where
    at least TELL_LEFT steps remain: a shorter run ends before the line would help, and a longer one spreads the
    wait over enough steps (at most one step's host work among 100)."""

    TELL_LEFT = 100

    def __init__(self, timer, reporter: Reporter):
        self.timer, self.reporter, self.told = timer, reporter, False

    def __call__(self, step: int, total: int, loss: float | None) -> None:
        self.reporter.step(step, total, loss)
        start = next((m for m in self.timer.marks if m[1] == self.timer.timed_from), None)
        if not self.told and start and step > start[1] and total - step >= self.TELL_LEFT:
            sync(self.timer.device)
            per_step = (time.perf_counter() - start[0]) / (step - start[1])
            left = per_step * (total - step)
            self.told = True
            self.reporter.say(f"{per_step:.3g} s a step after {start[1]} untimed step(s): the {total - step} steps "
                              f"left take about {f'{left / 60:.1f} min' if left >= 60 else f'{left:.0f} s'}")


class StepCallback(TrainerCallback):
    """Counts micro-batches, times steps, passes the loss records to the curve, reports progress with the last logged
    loss, and asks for checkpoints by the clock.

    The last step always logs its loss, as dsnb's compiled loop does, so a run's final loss means the same in both
    loops whatever logging_steps is; it is never checkpointed (the run saves its model next, and a checkpoint of the
    last step would leave a resume nothing to train). A checkpoint writes the curve held so far (CheckpointTrainer): a
    run killed after it and resumed from it has every step's loss in MLflow. The time a checkpoint takes is left out
    of the throughput.

    A checkpoint's step is always a logged step: checkpoint_steps' steps log their loss too (as they do in an
    uninterrupted run of the same config), and the clock's checkpoints wait for the next step that logs. The
    Trainer's first record after a resume covers the steps since the checkpoint; so every record's window is the same
    as in a run never interrupted, and the curve and train_loss of a resumed run are an uninterrupted run's.
    """

    def __init__(self, timer, report, curve, begin, checkpoint_minutes: float = 0.0):
        self.timer, self.report, self.curve, self.begin, self.loss = timer, report, curve, begin, None
        self.every_s, self.saved_at, self.saving = checkpoint_minutes * 60, time.monotonic(), None
        self.losses: dict[int, float] = {}  # every logged step's loss (a resumed run's earlier ones too)
        self.began = time.perf_counter()  # training's start in this process, after the "before" answers

    def on_train_begin(self, args, state, control, **kw):
        if not state.global_step:  # a resumed run starts mid-way, past "before"
            self.begin()
        self.began = time.perf_counter()
        self.timer.mark(state.global_step)
        self.saved_at = time.monotonic()

    def on_substep_end(self, args, state, control, **kw):
        self.timer.consume()

    def on_step_end(self, args, state, control, **kw):
        self.timer.consume()
        self.timer.mark(state.global_step)
        self.report(state.global_step, state.max_steps, self.loss)
        if self.every_s and state.global_step % args.logging_steps == 0 and \
                agreed(time.monotonic() - self.saved_at >= self.every_s, args.device):
            control.should_save = True
        if state.global_step >= state.max_steps:
            control.should_log, control.should_save = True, False
        if control.should_save:
            control.should_log = True
        if control.should_save:
            self.saving = time.perf_counter()

    def on_log(self, args, state, control, logs=None, **kw):
        self.loss = (logs or {}).get("loss", self.loss)
        if "loss" in (logs or {}):
            self.losses[state.global_step] = logs["loss"]
        if self.curve:
            self.curve(state.global_step, logs or {})

    def on_save(self, args, state, control, **kw):
        if self.saving is not None:
            self.timer.exclude(time.perf_counter() - self.saving)
            self.saving = None
        self.saved_at = time.monotonic()


def agreed(due: bool, device) -> bool:
    """Whether any rank found a checkpoint due by its clock (each rank's clock runs on its own, and every rank must
    save together, or the one that saves waits in DeepSpeed's barriers while the others step on); one small all-reduce,
    made by every rank at the same steps. Alone, due itself."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return due
    flag = torch.tensor([float(due)], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def checkpoint_step(checkpoint: str) -> int:
    """The optimizer step a checkpoint folder holds (its trainer_state.json)."""
    import json

    with open(os.path.join(checkpoint, "trainer_state.json")) as f:
        return int(json.load(f)["global_step"])


def mean_loss(losses: dict[int, float]) -> float:
    """The mean loss over every step from the logged records: each is its window's mean (the steps since the record
    before), so the records weighted by their windows add up to every step's loss, as the Trainer's train_loss does."""
    steps, total, last = sorted(losses), 0.0, 0
    for step in steps:
        total += losses[step] * (step - last)
        last = step
    return total / last if last else float("nan")


def record_start(s: Session, checkpoint: str | None) -> None:
    """Before training, so a run that dies still has its estimate and environment."""
    import mlflow

    # on the CPU the tensors' estimate is part of the host's (estimate_memory): no GPU figure is recorded without a GPU
    mlflow.log_metrics({k: v for k, v in s.plan.estimate.items() if s.device != "cpu" or k != "est_peak_gpu_mb"})

    mlflow.log_params({**s.counts, **s.plan.data, "device": s.device, "mfu_convention": MFU_CONVENTION,
                       "attention_used": getattr(s.trainer.model.config, "_attn_implementation", None) or "?",
                       "eval_task": eval_task(s.cfg), "eval_set": eval_set_id(s.plan.eval_rows),
                       "scoring_mode": s.plan.scoring, "data_fingerprint": data_fingerprint(s.plan.train_set),
                       "train_math": json.dumps(s.math, sort_keys=True)})
    cut = s.counts["truncated_samples"]
    warnings = [f"max_length {s.cfg.max_length} cuts the answer of {cut} samples" if cut else "",
                held_out_warning(s.cfg, s.plan.data, len(s.plan.eval_rows))]
    if any(warnings):
        mlflow.set_tag("data_warning", "; ".join(w for w in warnings if w))
    tracking.log_json(tracking.environment(s.device), "environment.json")


def fit(s: Session, checkpoint: str | None) -> dict:
    """Train, then answer the held-out questions; the Trainer's train() metrics (runtime, loss, samples/s),
    whichever loop runs, without the time the "before" answers took."""
    callback = s.trainer.callback_handler.callbacks[-1]
    with callback.curve or contextlib.nullcontext():  # the curve is in MLflow once training ends, or fails
        if s.cfg.torch_compile:

            raw = train_compiled(s.trainer, s.cfg, s.timer, callback.report,
                                 callback.curve or (lambda step, logs: None), callback.begin)
        else:
            if checkpoint and callback.curve:  # the steps the store holds (those after the checkpoint: of the process
                # that was stopped, the same steps this one trains again from the checkpoint), written once
                callback.losses.update(callback.curve.resume(checkpoint_step(checkpoint)))
            raw = s.trainer.train(resume_from_checkpoint=checkpoint).metrics
            if checkpoint:  # the Trainer's own train_loss covers only the steps this process trained
                raw["train_loss"] = mean_loss(callback.losses)
        # The Trainer's clock ran through the "before" answers (this process's: a resumed run's were the first's; the
        # compiled loop starts its clock after them): out of its time; the processes before this one (PROGRESS) in.
        # Samples are those the loops consumed (the Trainer's own figure counts steps x batch_size x grad_accum: rows
        # with padding filled, a short last batch as a full one); steps are the run's (the Trainer's figure divides
        # all of them by this process's time).
        samples, _ = s.timer.batches.totals(s.timer.consumed)
        before = 0.0 if checkpoint or s.cfg.torch_compile else s.quality.seconds("before")
        runtime = raw["train_runtime"] - before + s.prior["train_seconds"]
        raw.update(train_runtime=runtime, train_samples_per_second=(samples * s.world + s.prior["samples"]) / runtime,
                   train_steps_per_second=s.trainer.state.global_step / runtime)
    s.quality.score("after", s.trainer.model, s.trainer.processing_class, s.cfg)
    return raw


def measure(s: Session, raw: dict, peaks: dict) -> tuple[dict, dict]:
    """(metrics, params): the Trainer's numbers, memory peaks (every rank's), throughput, MFU, the estimate's error,
    the held-out scores."""

    metrics = {k: float(v) for k, v in raw.items() if isinstance(v, (int, float))}
    metrics["train_runtime_sec"] = metrics["train_runtime"]
    if s.device.startswith("cuda"):  # without a GPU nothing was read: no figure, rather than 0
        metrics["gpu_memory_used_mb"] = gputil_used_mb(s.index) - s.gputil_before
    metrics.update(peaks if s.world == 1 else gather_ranks(peaks))
    if metrics.get("peak_gpu_allocated_mb"):
        metrics["est_error_gpu"] = s.plan.estimate["est_peak_gpu_mb"] / metrics["peak_gpu_allocated_mb"] - 1
    metrics["est_error_host"] = s.plan.estimate["est_peak_host_mb"] / metrics["peak_cpu_rss_mb"] - 1
    # a resumed run: the whole run's tokens a sample (a checkpoint an older dsnb wrote has no tokens: this process's)
    prior = (s.prior["samples"], s.prior["tokens"]) if s.prior["tokens"] else (0.0, 0.0)
    metrics.update(s.timer.throughput(prior=prior))
    metrics.update(s.quality.metrics())
    flops, source = peak_flops(s.device)
    per_token = flops_per_token(s.plan.config, s.counts["trainable_params"], full=s.cfg.lora_r == 0)
    if "tokens_per_second" in metrics:
        metrics["mfu"] = metrics["tokens_per_second"] * per_token / (flops * s.world)
    params = {"peak_flops": f"{flops:.4g}", "peak_flops_source": source, "flops_per_token": f"{per_token:.4g}"}
    return metrics, params


def record_end(s: Session, metrics: dict, params: dict) -> None:
    import mlflow

    mlflow.log_metrics(metrics)
    mlflow.log_params(params)
    if s.quality.scores:
        tracking.log_json(s.quality.table(), "answers.json")
    if s.deepspeed is not None:
        tracking.log_json(s.trainer.accelerator.state.deepspeed_plugin.hf_ds_config.config, "deepspeed_config.json")
    if s.cfg.profile and os.path.isfile(s.cfg.profile):
        mlflow.log_artifact(s.cfg.profile)


def save(s: Session, metrics: dict) -> None:
    """The trained adapter (or model) to the run's artifacts, with its model card and a fingerprint of its logits
    (publish.py checks a reloaded copy against it); the store is then its one copy."""
    if s.cfg.save_model:

        probe = probe_logit_norm(s.trainer.model, s.trainer.processing_class)  # every rank: ZeRO-3 gathers
        folder = os.path.join(s.run_dir, "model")
        s.trainer.save_model(folder)
        if s.log:
            import mlflow

            write_card(folder, s.cfg, metrics, mlflow.active_run().info.run_id, "adapter" if s.cfg.lora_r else "full",
                       scoring=s.plan.scoring)
            with contextlib.suppress(FileNotFoundError):  # the Trainer's arguments: they hold this machine's paths
                os.remove(os.path.join(folder, "training_args.bin"))
            mlflow.log_metric("probe_logit_norm", probe)
            mlflow.log_artifacts(folder, "model")
    if s.log:
        shutil.rmtree(s.run_dir, ignore_errors=True)
