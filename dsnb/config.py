"""RunConfig: the one description of a training variant.

The notebook's parameters cell, the CLI's ``--<field>`` flags and the YAML variant files all build a
RunConfig through one layering, ``RunConfig.layered``; it validates itself on creation and is logged to
MLflow whole.

    cfg = RunConfig(strategy="zero2", offload_optimizer="cpu")
    cfg = RunConfig.layered(read_yaml("variants/tutorial_deepspeed.yaml"), {"lora_r": 0}, offline=True)
    cfg.name, cfg.samples_per_step(world_size=2)
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import typing
from dataclasses import dataclass

import yaml

STRATEGIES = ("baseline", "zero0", "zero1", "zero2", "zero3")
OFFLOADS = ("none", "cpu", "nvme")
QUANTIZATIONS = ("none", "8bit", "4bit", "fp8")
FP8_FAST_ACCUMS = ("both", "forward", "none")
DTYPES = ("fp32", "bf16", "fp16")
PADDINGS = ("max_length", "longest", "bucket", "packed", "filled")
ATTENTIONS = ("sdpa", "flex")
PROMPTS = ("passage", "eos", "tutorial", "chat")
RAM_CHECKS = ("refuse", "warn")
SCORINGS = ("auto", "squad", "korquad")
PRESETS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "presets")

# The offline default (no GPU, no hub): a few-MB Llama, the synthetic SQuAD-format set and a short
# run, so the tutorial's comparison finishes in minutes on 2 CPU cores. fp16 needs a GPU, so fp32.
OFFLINE = dict(model="synthetic:tiny", dataset="synthetic", num_samples=64, dtype="fp32",
               max_length=128, max_steps=8, logging_steps=2)
OFFLINE_ENV = "DSNB_OFFLINE"  # DSNB_OFFLINE=1 applies OFFLINE under any explicit setting
# The environment variables dsnb reads (none changes what is trained or measured: those are fields), and the ones it
# no longer reads, refused with the field that replaced them rather than ignored.
ENVIRONMENT = {OFFLINE_ENV: "the offline default, as --offline",
               "DSNB_SOURCE": "where a notebook's setup cell installs dsnb from",
               "DSNB_CACHE": "the synthetic models' folder", "DSNB_SWEEP_RUN_ID": "set by dsnb's sweeps",
               "DSNB_SWEEP_RESUME": "set by dsnb's sweeps: the checkpoint a sweep's interrupted run resumes from",
               "DSNB_PARENT_PID": "set for a training process: the dsnb that started it (preflight.orphans)"}
RETIRED_ENV = {"DSNB_CUDAGRAPHS": "cuda_graphs", "DSNB_FLAT_STEP": "zero_flat_step", "DSNB_DEEPCOMPILE": "deepcompile",
               "DSNB_LOSS_SCALE": "loss_scale", "DSNB_PROFILE": "profile"}
# Fields that were renamed: the old name is refused with a message naming the new one.
RENAMED = {
    "warmup_steps": "warmup_steps is now untimed_steps (steps left out of the throughput); "
                    "for a learning-rate warm-up use lr_warmup_steps",
    "ds_config": "ds_config is now ds_config_path (the path of your own DeepSpeed JSON)",
}
INT_MAX = 2**31 - 1  # torch and the tokenizers take sizes and counts as 32-bit integers
SEED_MAX = 2**32 - 1  # numpy's seed range, which transformers' set_seed goes through


# The fields that do not change what is trained or asked: how it is run (DeepSpeed, compiling, attention kernels),
# measured, kept and named. Every other field sets the work, and same_work compares it (a new field does, by default).
NOT_WORK = ("preset", "strategy", "offload_optimizer", "offload_param", "nvme_path", "ds_config_path", "torch_compile",
            "cuda_graphs", "zero_flat_step", "deepcompile", "loss_scale", "attention", "dropout_kernel",
            "loss_chunk", "logging_steps", "phase_times", "checkpoint_steps", "checkpoint_minutes", "untimed_steps",
            "profile", "memory_budget_gb", "ram_budget_gb", "host_ram_check", "repeats", "repeat", "results_folder",
            "tracking_uri", "experiment", "run_name", "save_model", "output_dir")
# Where a run is kept, not what it is: a comparison or sweep finds its runs again under another spelling or place of
# these (results_folder "dsnb/" or "./dsnb", a store moved with its folder), and a run resumes from any of them.
PLACES = ("results_folder", "tracking_uri", "output_dir")


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the field and what to change (credentials in a URI masked).

    A notebook shows it as its one line (IPython asks an exception for _render_traceback_), not as a traceback."""

    def __init__(self, message: str):
        super().__init__(redact(str(message)))

    def _render_traceback_(self) -> list[str]:
        return [f"dsnb: error: {self}"]


# A URI's user and password: everything from its scheme to the last "@" before its path, query or fragment, as a URI
# parser reads it (an unencoded "@" or quote in a password included), and the value of each query parameter named like
# a secret (?token=, access_token, password, api_key, sig, X-Amz-Credential, ...).
CREDENTIALS = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^/?#\s]*@")
SECRET_PARAMETERS = re.compile(r"(?i)(?P<name>[?&;][\w.~-]*(?:token|passw|pwd|secret|key|sig|credential|auth)[\w.~-]*=)"
                               r"[^&;#\s]*")


def sqlite_path(uri: str) -> str | None:
    """The database file of a sqlite:/// URI, else None (preflight.check_scheme refuses the URIs whose path
    SQLAlchemy and MLflow would read differently)."""
    return uri[len("sqlite:///"):] if uri.startswith("sqlite:///") else None


def redact(text: str) -> str:
    """text with every URI's user and password, and the values of its query parameters named like secrets, masked
    (http://user:TOKEN@host -> http://***@host, https://host/x?token=T -> https://host/x?token=***)."""
    text = CREDENTIALS.sub(lambda m: m.group("scheme") + "***@", text)
    return SECRET_PARAMETERS.sub(lambda m: m.group("name") + "***", text)


@dataclass
class RunConfig:
    """One training variant. Defaults are the tutorial's values."""

    preset: str = ""
    """A named set of fields applied under your own: colab_t4 (Colab's free T4: fp16, padding to multiples of 64, a
    14.7 GB GPU cap, 12.7 GB RAM, a checkpoint every 10 minutes), kaggle_t4x2 (Kaggle's two T4s: the same on both GPUs,
    29 GB RAM) or quality (the offline check that training teaches); empty for none (dsnb/presets/ lists them)."""
    model: str = "Bllossom/llama-3.2-Korean-Bllossom-3B"
    """Hub id, local directory, or synthetic:<shape> (tiny, llama-3.2-1b, llama-3.2-3b, llama-3.1-8b)."""
    quantization: str = "8bit"
    """Base-weight storage: none | 8bit | 4bit (bitsandbytes; 4bit is QLoRA's NF4) | fp8: LoRA's frozen Linear weights
    in float8 (e4m3, a scale per output row; dsnb/fp8.py), their matmuls in fp8 forward and backward; fp8 needs LoRA,
    dtype bf16, a GPU of compute capability 8.9 or more (L4, RTX 40xx, H100, H200) and no ZeRO-3."""
    fp8_fast_accum: str = "both"
    """With quantization fp8, which passes' fp8 matmuls take Hopper's fast accumulation (torch._scaled_mm's
    use_fast_accum): both (dsnb's default: 1.30x bf16's throughput mode on an H200, against 1.23x with none, the mean
    loss within 0.03%; benchmarks/results/fp8_accum_h200.md; not measured on Ada GPUs), forward (torchao's float8
    choice), or none (fp32 accumulation, as every fp8 run before dsnb took this field)."""
    fp8_head: bool = True
    """With quantization fp8, the frozen LM head's forward (the logits) in fp8 too, from an fp8 copy of its weight
    (a byte a weight more: 376 MB on Llama 3.2 3B); its input gradient stays bf16 (dsnb/fp8.py Fp8Head). On an H100
    the 3B throughput mode ran 1.335x bf16's real tokens/s with it, 1.297-1.306x without, the loss 0.36% above bf16's
    either way; on the small quality task its loss was 1.02% above bf16's against 0.50% without, exact match within
    noise (benchmarks/results/fp8_head_h100.md). false: the head wholly in bf16, as every fp8 run before this field."""
    dtype: str = "fp16"
    """Compute precision: fp32 | bf16 | fp16 (fp16 needs a GPU)."""
    lora_r: int = 16
    """LoRA rank; 0 trains every weight (full fine-tuning)."""
    lora_alpha: int = 16
    """LoRA scaling numerator."""
    lora_dropout: float = 0.05
    """Dropout on the LoRA branch."""
    lora_targets: str = "q_proj,v_proj"
    """Comma-separated module names that get adapters, or all-linear."""
    strategy: str = "baseline"
    """baseline (plain PyTorch, no DeepSpeed) | zero0 | zero1 | zero2 | zero3."""
    offload_optimizer: str = "none"
    """Where ZeRO keeps optimizer state: none | cpu | nvme (nvme needs zero3)."""
    offload_param: str = "none"
    """Where ZeRO-3 keeps parameters: none | cpu | nvme."""
    nvme_path: str = "/local_nvme"
    """Writable directory on a fast disk for NVMe offload."""
    ds_config_path: str = ""
    """Path to your own DeepSpeed JSON; replaces the built one. Its batch sizes, precision, ZeRO stage and offload must
    agree with the run's fields (`strategy`, `dtype`, `offload_optimizer`, `offload_param`, `nvme_path`), which are
    logged and checked with the run: a JSON whose offload or NVMe folder differs from the fields is refused, saying
    what to set."""
    dataset: str = "squad"
    """squad (SQuAD 1.1 from the hub), korquad (KorQuAD 1.0, its Korean counterpart, from the hub), synthetic (offline),
    or a .json/.jsonl/.csv/.parquet file with SQuAD's fields (the official nested SQuAD/KorQuAD JSON too)."""
    num_samples: int = 1000
    """Samples taken from the start of the train split."""
    padding: str = "max_length"
    """max_length pads every sample to max_length; longest pads each batch to its longest sample; bucket pads it to
    the next multiple of 64 tokens (few shapes, for torch_compile); packed puts batch_size samples end to end in rows
    of max_length tokens (no padding between them); filled fills rows of max_length tokens before training with as
    many samples as fit (best fit, longest first), and batch_size then counts rows: the samples a step vary."""
    prompt: str = "passage"
    """Training and question text. passage: reading comprehension, SQuAD's task: "본문: <the passage>\\n질문:
    ...\\n답변: ..." and the end-of-sequence token, so held-out scores measure what training can teach (dsnb's
    default; the passage's end is cut where a sample would exceed max_length). Closed-book, as the tutorial trains (its
    held-out scores measure the model's prior knowledge; a recall score on trained questions shows what it learned):
    eos, the tutorial's "질문: ...\\n답변: ..." and the end token; tutorial, that text exactly (no end token: answers
    do not stop); chat, the model's own chat template."""
    max_length: int = 512
    """Truncation length in tokens (also the padded length when padding is max_length, and the row length when it is
    packed or filled)."""
    batch_size: int = 2
    """Micro-batch per device: samples, or rows of max_length tokens with padding filled."""
    grad_accum: int = 4
    """Micro-batches accumulated per optimizer step."""
    torch_compile: bool = False
    """Train with dsnb's own loop under torch.compile (CUDA graphs on a GPU) instead of the HF Trainer's step, with or
    without DeepSpeed (its engine compiled); needs quantization none or fp8 and padding bucket, packed, filled or
    max_length."""
    cuda_graphs: bool = True
    """Compiled steps on a GPU replay as CUDA graphs where that is safe (see dsnb/loop.py); false compiles them without
    (to compare, or to rule graphs out). Needs torch_compile true."""
    zero_flat_step: bool = True
    """dsnb's flat ZeRO-1/2 step where it applies (compiled, one process, bf16, no offload): DeepSpeed's updates without
    its per-gradient hooks and host reads (dsnb/flat_step.py); false keeps DeepSpeed's own step. Needs torch_compile
    true and strategy zero1 or zero2."""
    deepcompile: bool = False
    """DeepSpeed's DeepCompile compiles the ZeRO engine (its passes put ZeRO's fetches and reductions in the graph);
    needs torch_compile true, a zero strategy, a CUDA GPU and offload_param none."""
    loss_scale: bool = False
    """The fp16 loss scaler (torch's GradScaler) also on an fp32 or bf16 compiled run without DeepSpeed, to check the
    fp16 path's math where fp16 cannot run (the CPU); fp16 always scales. Needs torch_compile true and strategy
    baseline."""
    attention: str = "sdpa"
    """sdpa (PyTorch's scaled-dot-product attention) | flex: flex attention, whose block mask skips the blocks of
    packed rows where no sample meets another (needs padding packed or filled, torch_compile true, strategy baseline
    and a GPU; measured on an H200)."""
    dropout_kernel: bool = True
    """In dsnb's compiled loop on a GPU without DeepSpeed, LoRA's dropout masks come from dsnb's Triton kernel, four
    elements a Philox call (dsnb/dropout.py), where inductor draws one call an element inside its fused kernels: the
    same keep probability and scale, another random stream. False keeps inductor's. Needs torch_compile true and
    strategy baseline (under ZeRO it has not been measured on a GPU, and inductor's masks stay)."""
    loss_chunk: int = 0
    """Tokens at a time of the training loss: the LM head and cross-entropy run chunk by chunk, each chunk's gradients
    made at once, so a step never holds the logits of its whole micro-batch (measured on an H100: 10.6 GB less for
    12,288 tokens of Llama 3's 128k vocabulary, speed within 0.5% in bf16; benchmarks/results/chunkloss_h100.md,
    against a compiled loop whose graph output the logits: dsnb's returns only the loss since, which the estimate puts
    at 1.7 GB more than chunked there, not measured; loss_only_h100.md). In
    the compiled loop a micro-batch of one chunk gains little (fp16, 1,024 tokens: 250 MB less at the same speed). The
    loss and gradients are the model's own within rounding (dsnb/loss.py; in fp16 each chunk's logits are made twice).
    0 keeps the model's own loss over whole logits. Needs a Llama, Mistral or Qwen 2/3 model, a strategy other than
    zero3 (which partitions the head's weight) and no LoRA adapter on lm_head."""
    eval_samples: int = 64
    """Held-out questions answered greedily before and after training and scored (exact match, F1): drawn with a fixed
    seed from the whole validation split (offline: synthetic questions no training row holds; a file: its rows after
    the training ones), the same for every variant; a question that cannot be answered (its answer not in its passage,
    or cut off by max_length's window) or whose passage a training row shares is left out and the next of the draw
    asked instead (the run's params count them); with a closed-book prompt as many trained questions too (recall); 0
    skips it."""
    scoring: str = "auto"
    """How answers are scored: squad (SQuAD v1.1's normalization, F1 over words), korquad (KorQuAD 1.0's: brackets and
    quotes dropped, F1 over characters, so 서울에 against 서울 earns partial credit), or auto: one of them for the whole
    run, by the data set: korquad for KorQuAD, squad for SQuAD, and for a file or the synthetic set korquad where at
    least half its rows hold Hangul in the passage or question (the run's scoring_mode param says which)."""
    learning_rate: float = 2e-4
    """Peak learning rate (linear decay after lr_warmup_steps)."""
    lr_warmup_steps: int = 0
    """Optimizer steps over which the learning rate rises linearly from 0 to learning_rate (the tutorial: 0)."""
    epochs: float = 5.0
    """Passes over the data; ignored when max_steps > 0."""
    max_steps: int = 0
    """Optimizer steps to run; 0 runs `epochs` full passes."""
    logging_steps: int = 50
    """Optimizer steps between loss records."""
    checkpoint_steps: int = 0
    """Save a checkpoint (weights, optimizer, DeepSpeed engine, data position) every N steps for --resume; 0 means
    none (checkpoint_minutes still applies)."""
    checkpoint_minutes: float = 10.0
    """Also save a checkpoint after every N minutes of training, so a run stopped part way (a Colab disconnect) can
    resume; runs shorter than that keep none; 0 turns it off. The HF Trainer's loop only: dsnb's compiled loop keeps no
    checkpoints, so with torch_compile true another value than 0 or this default is refused (the default is then
    unused); the time saving takes is left out of the throughput."""
    untimed_steps: int = 1
    """First optimizer steps left out of the steady-state throughput (they pay for start-up and compiling)."""
    profile: str = ""
    """A file the compiled loop writes its last untimed step's profile to (top kernels, host against GPU time), logged
    with the run; empty for none. Needs torch_compile true."""
    phase_times: bool = False
    """Time each optimizer step's phases with DeepSpeed's own timers (forward, backward, the gradient reduction left
    after the backward: with overlap_comm, as dsnb sets it on several GPUs and at ZeRO-3, most of it runs during the
    backward; the optimizer step, offload included), logged as medians over the timed steps (phase_*_ms): where a
    multi-GPU run's time goes. They synchronize the device at each phase, so they cost a little speed, and DeepSpeed
    prints them at every step (in the run's log): off unless asked. Needs a zero strategy."""
    memory_budget_gb: float = 0.0
    """Cap on this run's GPU memory in GB (15 for a T4, 22 for an L4); 0 means the whole GPU."""
    ram_budget_gb: float = 0.0
    """Host RAM this run may take in GB (12.7 on Colab's free tier); 0 means what the machine has available."""
    host_ram_check: str = "refuse"
    """What happens before loading when the host-RAM estimate exceeds ram_budget_gb (or the available RAM):
    refuse (stop with what to change) or warn (try anyway)."""
    num_gpus: int = 1
    """Processes, one per GPU, started with torchrun; under deepspeed or torchrun yourself, the launcher decides
    (without GPUs, CPU processes)."""
    repeats: int = 0
    """Runs of each variant that compare (and notebook 01) make, interleaved, for medians and their run-to-run
    spread; 0 means 3 where runs are short (max_steps of 100 or fewer), else 1."""
    seed: int = 42
    """Seed for model init, data order and dropout."""
    repeat: int = 0
    """Which repeat of a variant this run is (compare and notebook 01 set it: 0, 1, 2 ...): LoRA's initial adapters,
    data order and dropout are seeded with seed + repeat, so a variant's repeats differ where runs can, while every
    variant's repeat r draws the same (a synthetic model's own weights never change)."""
    results_folder: str = ""
    """A folder that holds the MLflow store and the runs' checkpoints and models (tracking_uri and output_dir inside it,
    unless set): on Colab, a Google Drive folder such as /content/drive/MyDrive/dsnb (mounted by the first dsnb cell),
    so that a disconnect loses nothing and running the notebook again resumes; empty keeps both where they are."""
    tracking_uri: str = "sqlite:///mlflow.db"
    """MLflow store; the default is a SQLite file in the working directory (or in results_folder)."""
    experiment: str = "DeepSpeed_Comparison"
    """MLflow experiment name."""
    run_name: str = ""
    """MLflow run name; empty derives one from the variant."""
    save_model: bool = True
    """Save the trained adapter (or model) and log it to MLflow; off for benchmarks."""
    output_dir: str = "runs"
    """Where each run's checkpoints and trained adapter/model are kept until logged, in a folder named by its MLflow run
    id (in results_folder, unless set)."""

    def __post_init__(self):
        self._coerce_types()
        self._expand_home()
        if isinstance(self.lora_targets, str):  # "q_proj, v_proj" is "q_proj,v_proj": peft took " v_proj" for no layer
            self.lora_targets = ",".join(t.strip() for t in self.lora_targets.split(","))
        for name, allowed in (("strategy", STRATEGIES), ("offload_optimizer", OFFLOADS),
                              ("offload_param", OFFLOADS), ("quantization", QUANTIZATIONS),
                              ("dtype", DTYPES), ("padding", PADDINGS), ("prompt", PROMPTS),
                              ("host_ram_check", RAM_CHECKS), ("attention", ATTENTIONS), ("scoring", SCORINGS),
                              ("fp8_fast_accum", FP8_FAST_ACCUMS)):
            if getattr(self, name) not in allowed:
                fail(name, f"is {getattr(self, name)!r}; use one of {', '.join(allowed)}")
        self._check_ranges()
        self._check_combination()

    def _expand_home(self):
        """~ in every field that names a place (as a shell would): "~/f.json" is the home's, never a folder named "~"
        made in the working folder (a SQLite store's path too)."""
        for name in ("model", "dataset", "ds_config_path", "nvme_path", "profile", "output_dir", "results_folder"):
            value = getattr(self, name)
            if isinstance(value, str) and value.startswith("~"):
                setattr(self, name, os.path.expanduser(value))
        if isinstance(self.tracking_uri, str) and self.tracking_uri.startswith("sqlite:///~"):
            literal = self.tracking_uri[len("sqlite:///"):]
            home = os.path.expanduser(literal)
            if os.path.isfile(literal) and not os.path.exists(home):  # an earlier dsnb's "./~" store: never left behind
                fail("tracking_uri", f"is {self.tracking_uri!r}: the store is now {home}, but an earlier dsnb made it "
                                     f"in a folder named '~' here ({os.path.abspath(literal)}); move it there")
            self.tracking_uri = "sqlite:///" + home

    def _coerce_types(self):
        """Accept strings for numbers and booleans (CLI, YAML), but never round or guess: 2.5 is no integer."""
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            setattr(self, f.name, coerce(f.name, getattr(self, f.name), hints[f.name]))

    def _check_ranges(self):
        self._check_counts()
        self._check_rates()
        self._check_texts()

    def _check_counts(self):
        for name in ("num_samples", "max_length", "batch_size", "grad_accum", "lora_alpha",
                     "logging_steps", "num_gpus"):
            if getattr(self, name) <= 0:
                fail(name, f"is {getattr(self, name)}; it must be a positive number")
        for name in ("lora_r", "max_steps", "untimed_steps", "checkpoint_steps", "lr_warmup_steps", "eval_samples",
                     "repeats", "repeat", "loss_chunk"):
            if getattr(self, name) < 0:
                fail(name, f"is {getattr(self, name)}; it must be 0 or more")
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if type(value) is int and f.name != "seed" and value > INT_MAX:
                fail(f.name, f"is {value}; it must be at most {INT_MAX}")
        if not 0 <= self.seed <= SEED_MAX:
            fail("seed", f"is {self.seed}; use a seed from 0 to {SEED_MAX}")
        if self.run_seed > SEED_MAX:
            fail("repeat", f"is {self.repeat}, which takes seed + repeat past {SEED_MAX}; lower seed or repeat")

    def _check_rates(self):
        for name in ("memory_budget_gb", "ram_budget_gb"):
            if getattr(self, name) < 0:
                fail(name, f"is {getattr(self, name)}; use 0 (no cap) or a size in GB")
        if self.learning_rate <= 0 or self.epochs <= 0:
            fail("learning_rate" if self.learning_rate <= 0 else "epochs", "must be positive")
        if not 0 <= self.lora_dropout < 1:
            fail("lora_dropout", f"is {self.lora_dropout}; use a value in [0, 1)")
        if self.checkpoint_minutes < 0:
            fail("checkpoint_minutes", f"is {self.checkpoint_minutes}; use 0 (none) or a number of minutes")

    def _check_texts(self):
        for name, hint in (("model", "a hub id, a local directory or synthetic:tiny"),
                           ("dataset", "squad, korquad, synthetic or a data file"), ("tracking_uri", "sqlite:///mlflow.db"),
                           ("experiment", "a name such as DeepSpeed_Comparison"),
                           ("output_dir", "a folder such as runs")):
            if not getattr(self, name).strip():
                fail(name, f"is empty; give {hint}")
        targets = self.lora_targets.split(",")
        if self.lora_targets != "all-linear" and not all(t.strip().replace("_", "").replace(".", "").isalnum()
                                                          for t in targets):
            fail("lora_targets", f"is {self.lora_targets!r}; give comma-separated module names such as "
                                 "q_proj,v_proj, or all-linear")
        for name in ("run_name", "experiment"):
            value = getattr(self, name)
            if len(value) > 250:
                fail(name, f"must be at most 250 characters (MLflow's limit; it has {len(value)})")
            odd = next((c for c in value if not c.isprintable()), None)
            if odd is not None:
                fail(name, f"holds a character that cannot be printed ({odd!r}); use printable characters only")

    def _check_combination(self):
        """Reject what DeepSpeed cannot do, or silently does differently, before any model loads."""
        stage = self.zero_stage
        offloading = self.offload_optimizer != "none" or self.offload_param != "none"
        if self.ds_config_path and stage is None:
            fail("ds_config_path", "is set but strategy is baseline; pick a zero strategy")
        if stage is None and offloading:
            fail("strategy", "baseline cannot offload; use zero1-3 for offload_optimizer, zero3 for offload_param")
        if self.offload_param != "none" and stage != 3:
            fail("offload_param", f"needs strategy zero3 (got {self.strategy}); "
                                  "set offload_param none or strategy zero3")
        if stage == 0 and offloading:
            fail("offload_optimizer", "needs ZeRO stage 1 or more; use strategy zero1, zero2 or zero3")
        if self.offload_optimizer == "nvme" and stage != 3:
            fail("offload_optimizer", "nvme needs strategy zero3 (below it DeepSpeed quietly uses the CPU); "
                                      "use cpu or zero3")
        self._check_quantization()
        if self.torch_compile:
            self._check_compile()
        self._check_switches()
        if self.attention == "flex":
            self._check_flex()
        if self.loss_chunk:
            self._check_loss_chunk()
        if self.quantization != "none" and self.lora_r == 0:
            fail("quantization", f"{self.quantization} weights cannot be trained directly; "
                                 "set lora_r > 0 (LoRA) or quantization none")

    def _check_loss_chunk(self):
        if self.lora_r and "lm_head" in [t.strip() for t in self.lora_targets.split(",")]:
            fail("loss_chunk", "computes the LM head from its own weight, so a LoRA adapter on lm_head would be left "
                               "out of the loss; leave lm_head out of lora_targets or set loss_chunk 0")
        if self.zero_stage == 3:
            fail("loss_chunk", "needs the LM head's whole weight, which ZeRO-3 partitions; set loss_chunk 0 or use "
                               "strategy zero2 (or zero1, zero0, baseline)")

    def _check_quantization(self):
        if self.quantization == "8bit" and self.zero_stage == 3:
            fail("quantization", "8bit cannot be partitioned by ZeRO-3; use 4bit, none, or strategy zero2")
        if self.quantization != "fp8":
            if self.fp8_fast_accum != RunConfig.__dataclass_fields__["fp8_fast_accum"].default:
                fail("fp8_fast_accum", f"is {self.fp8_fast_accum!r} but applies only with quantization fp8; set "
                                       "quantization fp8 or leave fp8_fast_accum at its default")
            if not self.fp8_head:
                fail("fp8_head", "is false but applies only with quantization fp8; set quantization fp8 or leave "
                                 "fp8_head at its default")
            return
        if self.zero_stage == 3:  # ZeRO-3 loads each weight into its partition; fp8 layers are made of whole weights
            fail("quantization", "fp8 weights are not partitioned by ZeRO-3; use strategy zero2 (or zero1), or "
                                 "quantization none")
        if self.dtype != "bf16":
            fail("quantization", f"fp8 computes in bf16 (its matmuls give bf16), not {self.dtype}; set dtype bf16 "
                                 "(on a GPU without FP8, such as a T4: quantization 8bit, 4bit or none)")

    def _check_flex(self):
        if self.padding not in ("packed", "filled") or not self.torch_compile:
            fail("attention", "flex is for packed rows in the compiled loop; set padding packed or filled and "
                              "torch_compile true, or attention sdpa")
        if self.zero_stage is not None:
            fail("attention", "flex has been measured without DeepSpeed only; set strategy baseline or attention "
                              "sdpa")

    def _check_switches(self):
        """The switches of dsnb's compiled loop and DeepSpeed's timers, each set away from its default only where it
        applies."""
        stage = self.zero_stage
        for name, applies, needs in (
                ("cuda_graphs", self.torch_compile, "torch_compile true"),
                ("zero_flat_step", self.torch_compile and stage in (1, 2), "torch_compile true and strategy zero1 or "
                                                                           "zero2"),
                ("deepcompile", self.torch_compile and stage is not None, "torch_compile true and a zero strategy"),
                ("loss_scale", self.torch_compile and stage is None, "torch_compile true and strategy baseline"),
                ("profile", self.torch_compile, "torch_compile true"),
                ("dropout_kernel", self.torch_compile and stage is None, "torch_compile true and strategy baseline"),
                ("phase_times", stage is not None, "a zero strategy (DeepSpeed's timers; zero0 is DeepSpeed without "
                                                   "partitioning)")):
            if getattr(self, name) != RunConfig.__dataclass_fields__[name].default and not applies:
                fail(name, f"is {getattr(self, name)!r} but applies only with {needs}; change those or leave {name} "
                           "at its default")

    def _check_compile(self):
        fixed = ("bucket", "packed", "filled", "max_length")
        for name, ok, hint in (
                ("quantization", self.quantization in ("none", "fp8"), "none or fp8 (bitsandbytes kernels break the "
                                                                       "graph)"),
                ("padding", self.padding in fixed, "bucket, packed, filled or max_length (fixed shapes)"),
                ("checkpoint_steps", not self.checkpoint_steps, "0 (the compiled loop keeps no checkpoints)"),
                # its default (which the colab_t4 preset repeats) is left unused rather than refused: a preset's
                # compiled run, as its header shows, needs no field turned off
                ("checkpoint_minutes", self.checkpoint_minutes in (0, RunConfig.checkpoint_minutes),
                 "0 (the compiled loop keeps no checkpoints; its default of "
                 f"{RunConfig.checkpoint_minutes:g} is left unused)"),
                ("num_gpus", self.num_gpus == 1 or self.zero_stage is not None,
                 "1 without DeepSpeed (a zero strategy runs the compiled loop on several GPUs)")):
            if not ok:
                fail(name, f"is {getattr(self, name)!r} but torch_compile needs {hint}; "
                           "change it or set torch_compile false")

    @property
    def zero_stage(self) -> int | None:
        """The ZeRO stage as a number, None for the baseline."""
        return None if self.strategy == "baseline" else int(self.strategy[-1])

    @property
    def run_seed(self) -> int:
        """The seed this run trains with: seed + repeat (config.repeat)."""
        return self.seed + self.repeat

    @property
    def uses_nvme(self) -> bool:
        return "nvme" in (self.offload_optimizer, self.offload_param)

    @property
    def name(self) -> str:
        """The MLflow run name: run_name, or one derived from the variant."""
        return self.run_name or self.derived_name()

    @property
    def runs_each(self) -> int:
        """How many times compare runs each variant: repeats, or 3 for short runs and 1 for long ones."""
        return self.repeats or (3 if 0 < self.max_steps <= 100 else 1)

    def samples_per_step(self, world_size: int = 1) -> int:
        """Samples (rows, with padding filled) in one optimizer step over every process."""
        return self.batch_size * self.grad_accum * world_size

    def derived_name(self) -> str:
        """A readable run name: the strategy, offload and training kind."""
        parts = [self.strategy]
        if self.offload_optimizer != "none":
            parts.append(f"opt-{self.offload_optimizer}")
        if self.offload_param != "none":
            parts.append(f"param-{self.offload_param}")
        parts.append("full" if self.lora_r == 0 else f"lora{self.lora_r}")
        if self.quantization != "none":
            parts.append(self.quantization)
        if self.fp8_fast_accum != "both":
            parts.append({"none": "exactaccum", "forward": "fastaccumfwd"}[self.fp8_fast_accum])
        parts.append(self.dtype)
        if self.torch_compile:
            parts.append("compiled")
        if self.attention != "sdpa":
            parts.append(self.attention)
        for name, part in (("cuda_graphs", "nographs"), ("zero_flat_step", "dsstep"), ("deepcompile", "deepcompile"),
                           ("loss_scale", "lossscale"), ("dropout_kernel", "inddrop"), ("fp8_head", "bf16head")):
            if getattr(self, name) != RunConfig.__dataclass_fields__[name].default:
                parts.append(part)
        if self.loss_chunk:
            parts.append(f"chunkloss{self.loss_chunk}")
        return "_".join(parts)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def replace(self, **changes) -> "RunConfig":
        return dataclasses.replace(self, **changes)

    @classmethod
    def layered(cls, *layers: dict, offline: bool = False) -> "RunConfig":
        """The one way a config is put together: defaults < the offline default < the preset < each layer in order.

        Layers are mappings of fields (a YAML file, a sweep's base and variant, flags, a notebook's
        parameters); a value in a later layer wins, even where it equals the default. The preset the layers
        name (a file of fields in dsnb/presets/) comes under all of them. Unknown and renamed fields are
        errors, not ignored.
        """
        merged: dict = {}
        for layer in layers:
            check_names(layer)
            merged.update(layer)
        values = dict(OFFLINE) if offline else {}
        values.update(preset_fields(merged.get("preset", "")))
        values = {**values, **merged}
        folder = values.get("results_folder")
        if folder and isinstance(folder, str):  # the store and the runs' folders inside it, unless set
            values["results_folder"] = folder = os.path.expanduser(folder)  # "~/dsnb": the home's, not a "~" folder
            if os.path.isfile(folder):  # else its store's path would be blamed on tracking_uri
                fail("results_folder", f"is {folder!r}, a file, not a folder; give a folder (made if missing)")
            values.setdefault("tracking_uri", f"sqlite:///{os.path.join(folder, 'mlflow.db')}")
            values.setdefault("output_dir", os.path.join(folder, "runs"))
        return cls(**values)

    @classmethod
    def from_dict(cls, values: dict) -> "RunConfig":
        """Build from one mapping of fields (see layered)."""
        return cls.layered(values)

    @classmethod
    def from_yaml(cls, path: str, **overrides) -> "RunConfig":
        """Build from a YAML file of field: value pairs, then apply overrides."""
        return cls.layered(read_fields(path), overrides)


def tutorial_pair(cfg: RunConfig) -> list[RunConfig]:
    """The tutorial's two runs on cfg's model and data: no DeepSpeed, then ZeRO-2 with CPU optimizer offload."""
    return [cfg.replace(strategy="baseline", offload_optimizer="none", offload_param="none",
                        run_name="Without_DeepSpeed"),
            cfg.replace(strategy="zero2", offload_optimizer="cpu", offload_param="none", run_name="With_DeepSpeed")]


def coerce(name: str, value, kind):
    """value as `kind` (bool, int, float or str), or a ConfigError naming the field; 2.5 is never rounded."""
    expected = {bool: "true or false", int: "an integer", float: "a number", str: "text"}[kind]
    if isinstance(value, str) and kind is not str:
        text = value.strip().lower()
        if kind is bool:
            value = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}.get(text, value)
        else:
            try:
                value = int(text) if kind is int and text.lstrip("+-").isdigit() else float(text)
            except ValueError:
                fail(name, f"is {value!r}; expected {expected}")
    if kind in (bool, str):
        if not isinstance(value, kind):
            fail(name, f"is {value!r}; expected {expected}" + yaml_hint(name, value, kind))
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        fail(name, f"is {value!r}; expected {expected}")
    if not math.isfinite(value):
        fail(name, f"is {value!r}; expected a finite number")
    if kind is float:
        return float(value)
    if isinstance(value, float) and not value.is_integer():
        fail(name, f"is {value!r}; expected {expected}")
    return int(value)


def yaml_hint(name: str, value, kind) -> str:
    """Why a text field may hold no text: in YAML an unquoted yes/no is a boolean, a date a date, 5 a number."""
    if kind is not str or isinstance(value, (dict, list)) or value is None:
        return ""
    if isinstance(value, bool):
        return " (in YAML an unquoted yes/no, on/off or true/false is a boolean, not text: quote the text you meant)"
    read = "a date" if hasattr(value, "year") else "a number" if isinstance(value, (int, float)) else None
    return f" (in YAML an unquoted {value!s} is {read}, not text: quote it, {name}: '{value!s}')" if read else ""


def presets() -> list[str]:
    return sorted(f[:-5] for f in os.listdir(PRESETS_DIR) if f.endswith(".yaml"))


def preset_fields(name) -> dict:
    """The fields of a named preset (none for ""); a name that is not text is left to the field's own check."""
    if not name or not isinstance(name, str):
        return {}
    if name not in presets():
        fail("preset", f"is {name!r}; use one of {', '.join(presets())} (or leave it empty)")
    fields = read_yaml(os.path.join(PRESETS_DIR, f"{name}.yaml"))
    check_names(fields)
    return fields


def check_names(values: dict) -> None:
    """Every key is a run-config field; a renamed field says its new name."""
    for key in values:
        if key in RENAMED:
            raise ConfigError(RENAMED[key])
    unknown = sorted(set(values) - set(field_names()), key=str)
    if unknown:
        import difflib

        close = difflib.get_close_matches(str(unknown[0]), field_names(), n=3)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        fail(str(unknown[0]), f"is not a run-config field; {hint}(python -m dsnb run --help lists every field)")


class StrictLoader(yaml.SafeLoader):
    """YAML's safe loader, but a key given twice in one mapping is an error (plain YAML keeps the last, silently).
    Merge keys (`<<: *common`) are YAML's own way to share fields and stay allowed: a key the mapping sets beside them
    overrides the merged one, as YAML defines, and is not a key given twice."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            merge = key_node.tag == "tag:yaml.org,2002:merge"  # folded in by SafeLoader's own call below
            key = "<<" if merge else self.construct_object(key_node, deep=True)
            if not isinstance(key, typing.Hashable):  # `? [a, b]`: YAML's own error for it, where the key is
                raise yaml.constructor.ConstructorError(None, None, f"a key is {type(key).__name__} {key!r}; a "
                                                        "run-config key is a field's name", key_node.start_mark)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"{key!r} is given twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def unique_keys(what: str):
    """A json.load object_pairs_hook that refuses an object giving a key twice, naming it (after `what`)."""
    def unique(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise ConfigError(f"{what}: the key {key!r} is given twice in one object; keep one")
            seen.add(key)
        return dict(pairs)

    return unique


def read_json_file(path: str, what: str, expected: str):
    """The JSON value in a file a user gives (their DeepSpeed config, a bench baseline), or a ConfigError that begins
    with `what` (the field or flag and the file) and says it should be `expected`: not JSON, nested deeper than
    Python's reader goes, or an object that gives a key twice (JSON readers keep the last silently; dsnb's YAML files
    refuse it too)."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f, object_pairs_hook=unique_keys(what))
    except ConfigError:
        raise
    except RecursionError:
        raise ConfigError(f"{what} is nested too deeply to read; give {expected}") from None
    except (ValueError, UnicodeDecodeError) as e:  # not JSON, not UTF-8 text, a number too long to convert
        raise ConfigError(f"{what} is not {expected} ({describe(e)})") from None


def yaml_error(e) -> str:
    """A YAML error where it is: the line and column, the parser's words, and for a tab, what to do instead."""
    mark, problem = getattr(e, "problem_mark", None), getattr(e, "problem", None)
    if mark is None or not problem:
        return describe(e)
    tab = " (a tab cannot indent or separate YAML; use spaces)" if "'\\t'" in problem else ""
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}{tab}"


def read_yaml(path: str) -> dict:
    """Read a YAML mapping, with a clear error for a missing, unreadable or malformed file, a key given twice, or a
    file that holds something other than field: value pairs (an empty file is an empty mapping)."""
    if os.path.isdir(path):
        raise ConfigError(f"file {path!r} is a folder, not a file; give the path to a YAML file")
    if not os.path.isfile(path):
        raise ConfigError(f"file {path!r} does not exist; give the path to a YAML file")
    try:
        with open(path, encoding="utf-8") as f:
            values = yaml.load(f, Loader=StrictLoader)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML: {yaml_error(e)}") from None
    except RecursionError:  # PyYAML composes nested collections recursively
        raise ConfigError(f"{path} is nested too deeply to read; give field: value pairs") from None
    except (UnicodeDecodeError, OSError) as e:
        raise ConfigError(f"{path} could not be read as UTF-8 text ({describe(e)})") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ConfigError(f"{path} must hold field: value pairs, not {type(values).__name__} {values!r:.40}")
    return values


def read_fields(path: str) -> dict:
    """A YAML file of run-config fields; an unknown or renamed field's error names the file."""
    values = read_yaml(path)
    try:
        check_names(values)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    return values


def read_variants(path: str, extra: tuple = (), kind: str = "variants file") -> tuple[dict, dict[str, dict], dict]:
    """A file of named variants (dsnb/bench.yaml; a capacity file, whose `extra` keys its reader checks): (base,
    {name: fields}, the whole file), every name's fields checked; a variant runs with base's fields, then its own."""
    spec = read_yaml(path)
    unknown = sorted(set(spec) - {"base", "variants", *extra}, key=str)
    if unknown:
        keys = ", ".join(["base", "variants", *extra])
        raise ConfigError(f"{path}: {unknown[0]} is not a key of a {kind}; use {keys}")
    base, variants = spec.get("base") or {}, spec.get("variants")
    if not isinstance(base, dict) or not isinstance(variants, dict) or not variants or not all(
            isinstance(name, str) and isinstance(fields or {}, dict) for name, fields in variants.items()):
        raise ConfigError(f"{path}: needs base (field: value) and variants (name: fields), with one variant at least")
    variants = {name: fields or {} for name, fields in variants.items()}
    for name, fields in [("base", base), *variants.items()]:
        try:
            check_names(fields)
        except ConfigError as e:
            raise ConfigError(f"{path}: {name}: {e}") from None
    return base, variants, spec


def read_variant(path: str, name: str | None) -> dict:
    """The fields of one variant of a file: a plain file of fields as it is (no name given), or a variants file's
    base and the variant `name`."""
    if "variants" not in read_yaml(path):
        if name:
            raise ConfigError(f"--variant {name}: {path} holds one variant's fields, not named variants")
        return read_fields(path)
    base, variants, _ = read_variants(path)
    if name not in variants:
        raise ConfigError(f"{path} holds {'several variants' if len(variants) > 1 else 'named variants'}: pick one "
                          f"with --variant ({', '.join(variants)})"
                          if not name else f"--variant {name} is not in {path}; use {', '.join(variants)}")
    return {**base, **variants[name]}


def predated(values: dict) -> dict:
    """The fields a config logged or saved by an earlier dsnb lacks whose meaning then differs from today's default,
    with what they then were, for an fp8 run: fp8_fast_accum none (fp8 accumulated in fp32 before the field), fp8_head
    false (the LM head was bf16 before its field). Every other missing field reads as its default. As text, as MLflow
    logs a param (from_dict reads it so too)."""
    if values.get("quantization") != "fp8":
        return {}
    return {name: then for name, then in (("fp8_fast_accum", "none"), ("fp8_head", "False")) if name not in values}


def field_names() -> list[str]:
    return [f.name for f in dataclasses.fields(RunConfig)]


WORK_FIELDS = tuple(name for name in field_names() if name not in NOT_WORK)


def field_docs() -> dict[str, str]:
    """Each field's docstring (the string literal under it), for --help and the notebooks."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(RunConfig))
    body, docs = tree.body[0].body, {}
    for node, nxt in zip(body, body[1:], strict=False):
        if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
            docs[node.target.id] = " ".join(nxt.value.value.split())  # one line, however the source wraps it
    return docs


HUB_OFF = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")  # set by dsnb offline (unless the user set them)
SWITCHED_ON = ("1", "ON", "YES", "TRUE")  # huggingface_hub's own reading of such a switch


def stay_off_the_hub() -> None:
    """Offline (--offline or DSNB_OFFLINE=1), the hub is not tried: a model or dataset in the hub's cache still loads,
    and anything else fails at once, where huggingface_hub would retry a host it cannot reach for half a minute. A
    library imported before this read its switch then: it is set on its module too."""
    import sys

    for name in HUB_OFF:
        os.environ.setdefault(name, "1")
    on = {name: os.environ[name].strip().upper() in SWITCHED_ON for name in HUB_OFF}
    if "huggingface_hub.constants" in sys.modules:
        sys.modules["huggingface_hub.constants"].HF_HUB_OFFLINE = on["HF_HUB_OFFLINE"]
    if "datasets.config" in sys.modules:  # datasets is offline where either switch is on
        sys.modules["datasets.config"].HF_HUB_OFFLINE = on["HF_HUB_OFFLINE"] or on["HF_DATASETS_OFFLINE"]


def hub_offline_note() -> str:
    """Said beside a hub failure while the hub is off (stay_off_the_hub, or the user's HF_HUB_OFFLINE), as
    huggingface_hub itself reads it."""
    import sys

    constants = sys.modules.get("huggingface_hub.constants")
    off = constants.HF_HUB_OFFLINE if constants else os.environ.get(HUB_OFF[0], "").strip().upper() in SWITCHED_ON
    return " (offline: dsnb reads only the hub's cache)" if off else ""


OFFLINE_ON = ("1", "true", "yes")  # DSNB_OFFLINE's values that turn it on


def offline_requested() -> bool:
    """DSNB_OFFLINE as a switch: 1/true/yes or 0/false/no (or unset); any other value is an error, not a default."""
    value = os.environ.get(OFFLINE_ENV, "").strip().lower()
    if value not in ("", *OFFLINE_ON, "0", "false", "no"):
        raise ConfigError(f"{OFFLINE_ENV} is {os.environ[OFFLINE_ENV]!r}; set it to 1 (the offline default) or 0, or "
                          "unset it")
    return value in OFFLINE_ON


def check_environment() -> None:
    """Every DSNB_* variable set is one dsnb reads: an old switch names the field that replaced it, a misspelt one is
    named, neither is ignored."""
    for name in sorted(k for k in os.environ if k.startswith("DSNB_")):
        if name in RETIRED_ENV:
            raise ConfigError(f"{name} is no longer read: set the run-config field {RETIRED_ENV[name]} instead "
                              f"(--{RETIRED_ENV[name]}, a notebook parameter or a YAML key), and unset {name}")
        if name not in ENVIRONMENT:
            raise ConfigError(f"{name} is not a variable dsnb reads ({', '.join(ENVIRONMENT)}); unset it")
    offline_requested()


def describe(error: BaseException, limit: int = 200) -> str:
    """An exception's type and first line of words, for one-line messages (credentials in a URI masked); for a
    notebook cell's error (papermill's, whose own text opens with a rule of dashes) the cell's exception and text."""
    name, text = type(error).__name__, str(error)
    if getattr(error, "ename", None):
        name, text = error.ename, str(getattr(error, "evalue", ""))
    lines = [line for line in text.strip().splitlines() if line.strip(" -=_*#\t")]
    return redact(f"{name}: {lines[0].strip()[:limit]}" if lines else name)


def fail(name: str, message: str):
    raise ConfigError(f"{name} {message}")
