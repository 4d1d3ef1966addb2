"""RunConfig: the one description of a training variant.

The notebook's parameters cell, the CLI's ``--<field>`` flags and the YAML variant files all build a
RunConfig; it validates itself on creation and is logged to MLflow whole.

    cfg = RunConfig(strategy="zero2", offload_optimizer="cpu")
    cfg = RunConfig.from_yaml("variants/tutorial_deepspeed.yaml", lora_r=0)
    cfg = RunConfig(**OFFLINE)          # the offline default: synthetic model and data
"""
from __future__ import annotations

import dataclasses
import os
import typing
from dataclasses import dataclass

import yaml

STRATEGIES = ("baseline", "zero0", "zero1", "zero2", "zero3")
OFFLOADS = ("none", "cpu", "nvme")
QUANTIZATIONS = ("none", "8bit", "4bit")
DTYPES = ("fp32", "bf16", "fp16")
PADDINGS = ("max_length", "longest", "bucket", "packed")

# The offline default (no GPU, no hub): a few-MB Llama, the synthetic SQuAD-format set and a short
# run, so the tutorial's comparison finishes in minutes on 2 CPU cores. fp16 needs a GPU, so fp32.
OFFLINE = dict(model="synthetic:tiny", dataset="synthetic", num_samples=64, dtype="fp32",
               max_length=128, max_steps=8, logging_steps=2)
OFFLINE_ENV = "DSNB_OFFLINE"  # DSNB_OFFLINE=1 applies OFFLINE under any explicit setting


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the field and what to change."""


@dataclass
class RunConfig:
    """One training variant. Defaults are the tutorial's values."""

    model: str = "Bllossom/llama-3.2-Korean-Bllossom-3B"
    """Hub id, local directory, or synthetic:<shape> (tiny, llama-3.2-1b, llama-3.2-3b, llama-3.1-8b)."""
    quantization: str = "8bit"
    """Base-weight storage: none | 8bit | 4bit (bitsandbytes; 4bit is QLoRA's NF4)."""
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
    ds_config: str = ""
    """Path to your own DeepSpeed JSON; replaces the built one (its batch sizes must agree)."""
    dataset: str = "squad"
    """squad (hub), synthetic (offline), or a .json/.jsonl/.csv/.parquet file with SQuAD's fields."""
    num_samples: int = 1000
    """Rows taken from the start of the train split."""
    padding: str = "max_length"
    """max_length pads every sample to max_length; longest pads each batch to its longest sample; bucket pads it to the next multiple of 64 tokens (few shapes, for torch_compile); packed puts samples end to end in rows of max_length tokens (no padding between them)."""
    max_length: int = 512
    """Truncation length in tokens (also the padded length when padding is max_length)."""
    batch_size: int = 2
    """Micro-batch per device."""
    grad_accum: int = 4
    """Micro-batches accumulated per optimizer step."""
    torch_compile: bool = False
    """Train with dsnb's own loop under torch.compile (CUDA graphs on a GPU) instead of the HF Trainer's step; needs strategy baseline, quantization none, dtype bf16 or fp32, padding bucket, packed or max_length."""
    learning_rate: float = 2e-4
    """Peak learning rate (linear decay, no warm-up)."""
    epochs: float = 5.0
    """Passes over the data; ignored when max_steps > 0."""
    max_steps: int = 0
    """Optimizer steps to run; 0 runs `epochs` full passes."""
    logging_steps: int = 50
    """Optimizer steps between loss records."""
    checkpoint_steps: int = 0
    """Save a checkpoint (weights, optimizer, DeepSpeed engine, data position) every N steps for --resume; 0 means none."""
    warmup_steps: int = 1
    """Steps left out of the steady-state throughput (the first steps pay for start-up)."""
    memory_budget_gb: float = 0.0
    """Cap on this run's GPU memory in GB (15 for a T4, 22 for an L4); 0 means the whole GPU."""
    num_gpus: int = 1
    """Processes, one per GPU, started with torchrun; under deepspeed or torchrun yourself, the launcher decides (without GPUs, CPU processes)."""
    seed: int = 42
    """Seed for model init, data order and dropout."""
    tracking_uri: str = "sqlite:///mlflow.db"
    """MLflow store; the default is a SQLite file in the working directory."""
    experiment: str = "DeepSpeed_Comparison"
    """MLflow experiment name."""
    run_name: str = ""
    """MLflow run name; empty derives one from the variant."""
    save_model: bool = True
    """Save the trained adapter (or model) and log it to MLflow; off for benchmarks."""
    output_dir: str = "runs"
    """Where each run's trained adapter/model is saved, in a folder named by its MLflow run id."""

    def __post_init__(self):
        self._coerce_types()
        for name, allowed in (("strategy", STRATEGIES), ("offload_optimizer", OFFLOADS),
                              ("offload_param", OFFLOADS), ("quantization", QUANTIZATIONS),
                              ("dtype", DTYPES), ("padding", PADDINGS)):
            if getattr(self, name) not in allowed:
                fail(name, f"is {getattr(self, name)!r}; use one of {', '.join(allowed)}")
        for name in ("num_samples", "max_length", "batch_size", "grad_accum", "lora_alpha",
                     "logging_steps", "num_gpus"):
            if getattr(self, name) <= 0:
                fail(name, f"is {getattr(self, name)}; it must be a positive number")
        for name in ("lora_r", "max_steps", "warmup_steps", "checkpoint_steps"):
            if getattr(self, name) < 0:
                fail(name, f"is {getattr(self, name)}; it must be 0 or more")
        if self.memory_budget_gb < 0:
            fail("memory_budget_gb", f"is {self.memory_budget_gb}; use 0 (no cap) or a size in GB")
        if self.learning_rate <= 0 or self.epochs <= 0:
            fail("learning_rate" if self.learning_rate <= 0 else "epochs", "must be positive")
        if not 0 <= self.lora_dropout < 1:
            fail("lora_dropout", f"is {self.lora_dropout}; use a value in [0, 1)")
        if not self.model:
            fail("model", "is empty; give a hub id, a local directory or synthetic:tiny")
        self._check_combination()

    def _coerce_types(self):
        """Accept strings for numbers (CLI, env) but reject values of the wrong kind."""
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            value, kind = getattr(self, f.name), hints[f.name]
            if isinstance(value, bool) != (kind is bool) and not (kind is bool and isinstance(value, str)):
                fail(f.name, f"is {value!r}; expected {kind.__name__}")
            try:
                if kind is bool and isinstance(value, str):
                    value = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}[value.lower()]
                elif kind is int and not isinstance(value, int):
                    if isinstance(value, float) and not value.is_integer():
                        raise ValueError
                    value = int(float(value)) if isinstance(value, str) else int(value)
                elif kind is float and not isinstance(value, float):
                    value = float(value)
                elif kind is str and not isinstance(value, str):
                    raise ValueError
            except (TypeError, ValueError, KeyError):
                fail(f.name, f"is {value!r}; expected {kind.__name__}")
            setattr(self, f.name, value)

    def _check_combination(self):
        """Reject what DeepSpeed cannot do, or silently does differently, before any model loads."""
        stage = self.zero_stage
        offloading = self.offload_optimizer != "none" or self.offload_param != "none"
        if self.ds_config and stage is None:
            fail("ds_config", "is set but strategy is baseline; pick a zero strategy")
        if stage is None and offloading:
            fail("strategy", "baseline cannot offload; use zero1-3 for offload_optimizer, zero3 for offload_param")
        if self.offload_param != "none" and stage != 3:
            fail("offload_param", f"needs strategy zero3 (got {self.strategy}); set offload_param none or strategy zero3")
        if stage == 0 and offloading:
            fail("offload_optimizer", "needs ZeRO stage 1 or more; use strategy zero1, zero2 or zero3")
        if self.offload_optimizer == "nvme" and stage != 3:
            fail("offload_optimizer", "nvme needs strategy zero3 (below it DeepSpeed quietly uses the CPU); use cpu or zero3")
        if self.quantization == "8bit" and stage == 3:
            fail("quantization", "8bit cannot be partitioned by ZeRO-3; use 4bit, none, or strategy zero2")
        if self.torch_compile:
            fixed = ("bucket", "packed", "max_length")
            for name, ok, hint in (("strategy", stage is None, "baseline (DeepSpeed runs its own engine)"),
                                   ("quantization", self.quantization == "none", "none (bitsandbytes kernels break the graph)"),
                                   ("dtype", self.dtype != "fp16", "bf16 or fp32 (fp16 needs a loss scaler)"),
                                   ("padding", self.padding in fixed, "bucket, packed or max_length (fixed shapes)"),
                                   ("checkpoint_steps", not self.checkpoint_steps, "0 (the compiled loop keeps no checkpoints)"),
                                   ("num_gpus", self.num_gpus == 1, "1 (the compiled loop runs one process)")):
                if not ok:
                    fail(name, f"is {getattr(self, name)!r} but torch_compile needs {hint}; change it or set torch_compile false")
        if self.quantization != "none" and self.lora_r == 0:
            fail("quantization", f"{self.quantization} weights cannot be trained directly; set lora_r > 0 (LoRA) or quantization none")

    @property
    def zero_stage(self) -> int | None:
        """The ZeRO stage as a number, None for the baseline."""
        return None if self.strategy == "baseline" else int(self.strategy[-1])

    @property
    def uses_nvme(self) -> bool:
        return "nvme" in (self.offload_optimizer, self.offload_param)

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
        parts.append(self.dtype)
        if self.torch_compile:
            parts.append("compiled")
        return "_".join(parts)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def replace(self, **changes) -> "RunConfig":
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, values: dict) -> "RunConfig":
        """Build from a mapping; unknown keys are an error, not ignored."""
        unknown = sorted(set(values) - set(field_names()))
        if unknown:
            fail(unknown[0], f"is not a run-config field; known fields: {', '.join(field_names())}")
        return cls(**values)

    @classmethod
    def from_yaml(cls, path: str, **overrides) -> "RunConfig":
        """Build from a YAML file of field: value pairs, then apply overrides."""
        return cls.from_dict({**read_yaml(path), **overrides})


def read_yaml(path: str) -> dict:
    """Read a YAML mapping, with a clear error for a missing or malformed file."""
    if not os.path.isfile(path):
        raise ConfigError(f"file {path!r} does not exist; give the path to a YAML file")
    try:
        with open(path) as f:
            values = yaml.safe_load(f) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML: {describe(e)}") from None
    if not isinstance(values, dict):
        raise ConfigError(f"{path} must hold field: value pairs, not a {type(values).__name__}")
    return values


def field_names() -> list[str]:
    return [f.name for f in dataclasses.fields(RunConfig)]


def field_docs() -> dict[str, str]:
    """Each field's docstring (the string literal under it), for --help and the notebooks."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(RunConfig))
    body, docs = tree.body[0].body, {}
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
            docs[node.target.id] = nxt.value.value
    return docs


def from_notebook(namespace: dict) -> RunConfig:
    """A RunConfig from a notebook's parameters (the fields found in `namespace`).

    The parameters cell holds the defaults; a value that differs from its default was set on purpose
    (by hand or by papermill) and wins over the offline default that DSNB_OFFLINE=1 applies.
    """
    defaults = RunConfig().to_dict()
    explicit = {k: namespace[k] for k in field_names() if k in namespace and namespace[k] != defaults[k]}
    offline = offline_requested()
    cfg = RunConfig.from_dict({**(OFFLINE if offline else {}), **explicit})
    from .run import check_environment, pick_device

    check_environment(cfg, pick_device())  # a bad parameter fails here, in the notebook's first dsnb cell
    source = f"{OFFLINE_ENV}=1: the offline default" if offline else f"{OFFLINE_ENV} unset: the tutorial's defaults"
    print(f"{source}; model {cfg.model}, dataset {cfg.dataset}, {cfg.derived_name()}")
    return cfg


def offline_requested() -> bool:
    return os.environ.get(OFFLINE_ENV, "").lower() in ("1", "true", "yes")


def describe(error: BaseException, limit: int = 200) -> str:
    """An exception's type and first line, for one-line messages."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0][:limit]}" if lines else type(error).__name__


def fail(name: str, message: str):
    raise ConfigError(f"{name} {message}")
