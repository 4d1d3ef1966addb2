"""DeepSpeed configs: pure functions of a RunConfig, checked against golden JSON files, and the reader of your own.

    zero_section(2, offload_optimizer="cpu")
    # -> {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    deepspeed_config(cfg, world_size=1)        # the whole config dsnb builds
    run_config(cfg, world_size=1)              # what a run hands to TrainingArguments(deepspeed=...): ds_config_path's
                                               # JSON (read and checked) or the built one, DeepCompile on where asked

Values the HF Trainer owns (learning rate, betas, clipping) stay "auto" here; the Trainer fills them
in at run time and dsnb logs that resolved config with the run.
"""
from __future__ import annotations

import os

from .config import ConfigError, RunConfig, read_json_file


def zero_section(stage: int, offload_optimizer: str = "none", offload_param: str = "none",
                 nvme_path: str = "/local_nvme") -> dict:
    """The minimal `zero_optimization` block, as the tutorial writes it."""
    zero: dict = {"stage": stage}
    for key, device in (("offload_optimizer", offload_optimizer), ("offload_param", offload_param)):
        if device != "none":
            zero[key] = {"device": device, **({"nvme_path": nvme_path} if device == "nvme" else {})}
    return {"zero_optimization": zero}


def overlap_comm(cfg: RunConfig, world_size: int) -> bool:
    """Whether dsnb's config overlaps the gradient reduction with backward (ZeRO-2/3; two reduce buckets, not one)."""
    return cfg.zero_stage == 3 or world_size > 1 or cfg.offload_optimizer != "none"


def deepspeed_config(cfg: RunConfig, world_size: int = 1, largest_weight: int = 0) -> dict:
    """The full DeepSpeed config for a ZeRO variant of `cfg` on `world_size` devices.

    largest_weight: elements in the model's largest weight; parameters swapped to NVMe pass through
    buffers that must hold it (DeepSpeed's default of 1e8 is smaller than a 128k-token embedding).
    """
    stage = cfg.zero_stage
    if stage is None:
        raise ValueError("the baseline strategy runs without DeepSpeed; it has no DeepSpeed config")
    zero = zero_section(stage, cfg.offload_optimizer, cfg.offload_param, cfg.nvme_path)["zero_optimization"]
    if stage >= 1:
        # The tutorial's choice: gradients copied into one contiguous buffer as they are reduced.
        zero["contiguous_gradients"] = True
    if stage >= 2:
        # Overlap the gradient reduction (or its copy to the offloaded optimizer) with backward. One GPU training in
        # GPU memory under ZeRO-2 has neither to overlap, and DeepSpeed still synchronizes the device after each
        # backward for it (3B LoRA compiled on the H200, with bf16's check below off too: a step 1.7-1.9x the
        # plain compiled one against 2.5x; benchmarks/results/archive/zero_graphs_h200.md).
        zero["overlap_comm"] = overlap_comm(cfg, world_size)
    if stage == 3:
        # Saving the trained model needs the partitioned weights gathered back into one state dict.
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    config = {
        "train_batch_size": cfg.samples_per_step(world_size),
        "train_micro_batch_size_per_gpu": cfg.batch_size,
        "gradient_accumulation_steps": cfg.grad_accum,
        "gradient_clipping": "auto",
        "fp16": {"enabled": cfg.dtype == "fp16"},
        "bf16": {"enabled": cfg.dtype == "bf16"},
        "zero_optimization": zero,
        "steps_per_print": 1_000_000,
        "wall_clock_breakdown": cfg.phase_times,  # DeepSpeed's per-phase timers, read at each step (metrics.py)
        # DeepSpeed's throughput timer (on by default) synchronizes the device at every forward and every step to
        # time them; dsnb times steps itself, and those waits keep the host from queueing ahead of the GPU.
        "timers": {"throughput": {"enabled": False}},
    }
    if cfg.dtype == "bf16" and stage in (1, 2):
        # bf16 has no loss scale to adjust. ZeRO-1/2's overflow check (on by default; ZeRO-3 reads it only in fp16)
        # tests each gradient for inf/NaN and reads a flag back to the host every step, to skip a step with one.
        # Off, such a step is taken, as the Trainer's bf16 path without DeepSpeed takes it, and the host waits once
        # a step fewer (clipping still reads the norm's validity back).
        config["bf16"]["check_grad_overflow"] = False
    if cfg.offload_optimizer != "none":
        # Offloaded state needs DeepSpeed's own (CPU) Adam; a client torch optimizer is refused.
        config["optimizer"] = {"type": "AdamW", "params": {
            "lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}}
    if cfg.offload_param == "nvme":
        zero["offload_param"]["buffer_size"] = max(100_000_000, largest_weight)
        # A parameter ZeRO-3 keeps for reuse (by default anything reused within 1e9 elements: a whole small
        # model) keeps its swap buffer too; from step 2 the 5 buffers run out ("Not enough buffers 0 for
        # swapping 1", measured on the H200). Released after each use, a weight needs a buffer only in flight.
        zero["stage3_max_reuse_distance"] = 0
    if cfg.uses_nvme:
        # ZeRO-Infinity swaps through libaio; these are DeepSpeed's documented defaults, made explicit.
        config["aio"] = {"block_size": 1048576, "queue_depth": 8, "intra_op_parallelism": 1,
                         "single_submit": False, "overlap_events": True}
    return config


def check_batch_sizes(config: dict, cfg: RunConfig, world_size: int = 1) -> None:
    """Raise a ConfigError when a user-supplied DeepSpeed config disagrees with the run's batch sizes."""
    want = {"train_micro_batch_size_per_gpu": cfg.batch_size,
            "gradient_accumulation_steps": cfg.grad_accum,
            "train_batch_size": cfg.samples_per_step(world_size)}
    for key, value in want.items():
        got = config.get(key, "auto")
        if got != "auto" and got != value:
            quoted = " (a string: JSON's numbers take no quotes)" if isinstance(got, str) else ""
            raise ConfigError(
                f"{f'ds_config {cfg.ds_config_path}:' if cfg.ds_config_path else 'ds_config'} {key} is {got!r}"
                f"{quoted} but batch_size={cfg.batch_size}, grad_accum={cfg.grad_accum} on {world_size} device(s) "
                f"give {value}; set it to {value} or \"auto\"")


def run_config(cfg: RunConfig, world_size: int = 1, largest_weight: int = 0) -> dict:
    """The DeepSpeed config a ZeRO run uses: ds_config_path's JSON or the built one, with DeepCompile on where asked."""
    config = read_ds_config(cfg, world_size) if cfg.ds_config_path else deepspeed_config(cfg, world_size,
                                                                                          largest_weight)
    if deepcompile_asked(cfg, config):
        config["compile"] = {**config.get("compile", {}), "deepcompile": True}
    return config


def deepcompile_asked(cfg: RunConfig, config: dict) -> bool:
    """Whether a compiled ZeRO run goes through DeepCompile: the deepcompile field, or the DeepSpeed config says so."""
    return cfg.torch_compile and (cfg.deepcompile or bool((config.get("compile") or {}).get("deepcompile")))


def read_ds_config(cfg: RunConfig, world_size: int = 1) -> dict:
    """The user's own DeepSpeed JSON (ds_config_path), checked against the run's batch sizes and precision."""
    path = cfg.ds_config_path
    if os.path.isdir(path):
        raise ConfigError(f"ds_config {path!r} is a folder, not a file; give the DeepSpeed JSON file inside it")
    if not os.path.isfile(path):
        raise ConfigError(f"ds_config {path!r} does not exist; give a DeepSpeed JSON file or leave it empty")
    config = read_json_file(path, f"ds_config {path}", "a DeepSpeed config (a JSON object of its settings)")
    if not isinstance(config, dict):
        raise ConfigError(f"ds_config {path} must hold a JSON object of DeepSpeed settings, not a "
                          f"{type(config).__name__}")
    check_batch_sizes(config, cfg, world_size)
    check_trainer_values(config, cfg)
    for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size"):
        config.setdefault(key, "auto")  # DeepSpeed needs a batch size; "auto" is the run's, as a key left out means
    check_precision(config, cfg)
    zero = config.get("zero_optimization")
    if not isinstance(zero, dict):
        import difflib

        close = difflib.get_close_matches("zero_optimization", [str(k) for k in config], n=1, cutoff=0.8)
        said = (f"zero_optimization is {zero!r}, not a section of settings" if zero is not None else
                "no zero_optimization section" + (f" ({close[0]!r} is not its spelling)" if close else ""))
        raise ConfigError(f"ds_config {path}: {said}; strategy {cfg.strategy} needs one, e.g. "
                          f"{{\"zero_optimization\": {{\"stage\": {cfg.zero_stage}}}}}")
    stage = zero.get("stage", "auto")
    if stage != "auto" and stage != cfg.zero_stage:
        raise ConfigError(f"ds_config {path}: zero_optimization.stage is {stage!r} but strategy is {cfg.strategy}; "
                          f"set the stage to {cfg.zero_stage} or \"auto\", or change strategy")
    check_offload(zero, cfg)
    return config


def check_trainer_values(config: dict, cfg: RunConfig) -> None:
    """A user's optimizer, scheduler and clipping values that are not "auto" equal the Trainer's, which transformers
    checks only as the run starts (a traceback, minutes in): the learning rate and warm-up from the run's fields, the
    rest from TrainingArguments' defaults (dsnb sets no other)."""
    def node(path: str):
        part = config
        for key in path.split("."):
            part = part.get(key) if isinstance(part, dict) else None
        return part

    fields = {"optimizer.params.lr": ("learning_rate", cfg.learning_rate),
              "scheduler.params.warmup_max_lr": ("learning_rate", cfg.learning_rate),
              "scheduler.params.warmup_num_steps": ("lr_warmup_steps", max(1, cfg.lr_warmup_steps)),
              "scheduler.params.total_num_steps": ("max_steps", cfg.max_steps or None)}  # else counted from the data
    fixed = {"gradient_clipping": "max_grad_norm", "optimizer.params.betas": ("adam_beta1", "adam_beta2"),
             "optimizer.params.eps": "adam_epsilon", "optimizer.params.weight_decay": "weight_decay"}
    for path in [*fields, *fixed]:
        given = node(path)
        if given is None or given == "auto" or (path in fields and fields[path][1] is None):
            continue
        if path in fields:
            name, want = fields[path]
            to = (f"the run's {name} is {want!r}" if getattr(cfg, name) == want else
                  f"the Trainer's is {want!r} (lr_warmup_steps {getattr(cfg, name)}: transformers asks at least 1)")
        else:
            import dataclasses

            from transformers import TrainingArguments

            default = {f.name: f.default for f in dataclasses.fields(TrainingArguments)}
            want = [default[n] for n in fixed[path]] if isinstance(fixed[path], tuple) else default[fixed[path]]
            to = f"the Trainer's is {want!r} (dsnb sets no other)"
        if given != want:
            raise ConfigError(f"ds_config {cfg.ds_config_path}: {path} is {given!r} but {to}; the Trainer refuses a "
                              f"DeepSpeed value that differs from its own: set it to \"auto\" or {want!r}"
                              + (f", or set {fields[path][0]} {given}" if path in fields and given else ""))


def check_offload(zero: dict, cfg: RunConfig) -> None:
    """A user's offload sections (and DeepSpeed's older cpu_offload and cpu_offload_param switches, which it still
    reads) agree with the run's offload_optimizer, offload_param and nvme_path: the fields logged with the run and
    checked before it starts (parameter offload only under ZeRO-3, a folder that exists and is writable), which
    DeepSpeed would otherwise ignore (parameters offloaded under ZeRO-2) or meet only minutes in."""
    for key, old in (("offload_optimizer", "cpu_offload"), ("offload_param", "cpu_offload_param")):
        part = zero.get(key)
        if part or not zero.get(old):
            device = (part.get("device") if isinstance(part, dict) else part) or "none"
            said = f"zero_optimization.{key}.device is {device!r}"
        else:
            device, said = "cpu", f"zero_optimization.{old} is true"
        if device != getattr(cfg, key):
            raise ConfigError(f"ds_config {cfg.ds_config_path}: {said} but the run's {key} is {getattr(cfg, key)!r}; "
                              f"set {key} {device} in the run too (it is logged and checked with it), or change the "
                              "JSON")
        folder = part.get("nvme_path") if isinstance(part, dict) else None
        if device == "nvme" and not folder:
            raise ConfigError(f"ds_config {cfg.ds_config_path}: zero_optimization.{key}.nvme_path is missing "
                              f"(DeepSpeed has no default folder); give the run's nvme_path, {cfg.nvme_path!r}")
        if device == "nvme" and same_folder(str(folder)) != same_folder(cfg.nvme_path):
            raise ConfigError(f"ds_config {cfg.ds_config_path}: zero_optimization.{key}.nvme_path is {folder!r} but "
                              f"the run's nvme_path is {cfg.nvme_path!r}; give the same folder in both")


def same_folder(path: str) -> str:
    return os.path.realpath(os.path.expanduser(path))


def check_precision(config: dict, cfg: RunConfig) -> None:
    """A user's fp16/bf16 sections agree with the run's dtype ("auto" takes it from the run)."""
    for section, dtype in (("fp16", "fp16"), ("bf16", "bf16")):
        part = config.get(section, {})
        enabled = part.get("enabled", "auto") if isinstance(part, dict) else part
        if isinstance(enabled, str) and enabled != "auto":  # "false" would read as true
            raise ConfigError(f"ds_config {cfg.ds_config_path}: {section}.enabled is the string {enabled!r}; give "
                              f"JSON's {str(cfg.dtype == dtype).lower()} (no quotes) or \"auto\"")
        if enabled != "auto" and bool(enabled) != (cfg.dtype == dtype):
            raise ConfigError(f"ds_config {cfg.ds_config_path}: {section}.enabled is {enabled!r} but the run's dtype "
                              f"is {cfg.dtype}; set it to {cfg.dtype == dtype} or \"auto\", or change dtype")
