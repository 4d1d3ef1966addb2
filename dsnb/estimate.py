"""Peak memory (GPU and host RAM) estimated before a run loads anything, logged beside what the run measures.

    config = model_config(cfg.model)                                   # no weight loaded
    est = estimate_memory(cfg, config, trainable_params(cfg, config), tokens_per_micro_batch(cfg, data), world,
                          row_length(cfg, data), on_gpu=True)
    est["est_peak_gpu_mb"], est["est_peak_host_mb"]        # on_gpu False: the host holds what the GPU would

Unlike DeepSpeed's estimators this knows that LoRA trains only the adapters, that 8-bit and 4-bit weights
are stored in 1 and ~0.5 bytes, and that activations and the 128k-vocab logits often dominate. The
terms (bytes):
  weights      N x 2 or 4 (dtype); quantized: linear weights x 1 (8bit) or 0.53 (4bit NF4 + scales), the rest x 2
  trainable T  LoRA adapters are fp32 (peft) and add their own T x 4; full fine-tuning trains the loaded dtype
  gradients    T x bytes(trainable); DDP (baseline on several GPUs) keeps a second copy in its buckets;
               ZeRO-2/3 split them across GPUs, and with the optimizer offloaded none stay on the GPU;
               ZeRO-3 adds one 5e8-element bucket for contiguous gradients whatever trains (measured: LoRA
               under ZeRO-3 + offload peaked ~1 GB above the other terms on the 1B and 8B shapes)
  ZeRO-2       from a backward's first gradient to its end, DeepSpeed's reduce buckets: 5e8 elements in the
               compute dtype whatever trains, two under overlap_comm (several GPUs, or the optimizer
               offloaded; dsnb/zero.py). By then the logits' memory is gone, so they raise the peak only
               where they outweigh it (measured: notebook 01's 8-bit LoRA with offload, per-batch padding,
               1.7 GB above the sum of the other terms; padded to 512 tokens, 0.4 GB); full fine-tuning adds
               the largest weight's whole gradient waiting for its bucket, and with the optimizer offloaded
               DeepSpeed's GPU staging buffer of the largest weight's size
  optimizer    torch AdamW: 2 states in the parameter dtype plus one parameter-sized temporary (foreach);
               DeepSpeed with bf16/fp16: fp32 master + 2 fp32 states = 12 T, and an fp32 gradient copy 4 T
               (measured on the H200: 71.9 GB for 3B full fine-tuning under ZeRO-1 on one GPU), split from
               stage 1, on the CPU if offloaded; ZeRO-3 on the GPU makes that copy one sub-group at a time
               during the step (sub_group_size, 1e9 elements), so it counts at most 4 x 1e9 (measured: 8B full
               fine-tuning under ZeRO-3 on one H200, 128.5 GB against 154.7 GB counted whole)
  activations  per token and layer (8 h + 4 i) elements in the compute dtype (attention and MLP inputs,
               SwiGLU's gate, up and product), plus (5 h + i) half-precision elements that bitsandbytes'
               8-bit matmuls keep for backward; logits: V x (2 + 4 + 4) bytes per token (logits, their
               fp32 upcast for the loss, its gradient), V x (2 + 2) compiled (inductor fuses the upcast
               into the log-softmax and writes the gradient in the compute dtype: measured 40.3 GB on the
               H200 at 10,240 packed tokens, where the eager count gives 50.1)
  ZeRO-3       parameters split across GPUs; with parameter offload the GPU holds up to DeepSpeed's
               stage3_max_live_parameters (1e9 elements) at a time; full fine-tuning also holds the
               largest weight's whole gradient (the 128k-vocab embedding) before it is reduce-scattered
               (measured: 3B full under ZeRO-3 + offload peaked 0.8 GB above LoRA)
  ZeRO-1/2     at start DeepSpeed copies the trainable weights into one flat buffer before it frees them,
               on the GPU where NVML reports room for it (else on the CPU, and the start-up peak is the
               weights alone: on a GPU smaller than twice the weights this term overstates), so the peak is
               at least the weights plus that copy; with the optimizer offloaded it is the peak (measured:
               exactly twice the bf16 weights for 3B full fine-tuning on one H200 and 8B on one and on two),
               and est_peak_gpu_mb is then more than the sum of the est_*_mb terms
Tokens per micro-batch are the worst case: batch x max_length with max_length or filled padding, the most
rows a packed batch took, batch x the longest sample otherwise. The CUDA context (~0.5 GB) is outside the
allocator and not counted.

Host RAM (the process's resident memory), fitted to the H200 runs of the 1B, 3B and 8B shapes
(benchmarks/estimate_vs_measured.py): about 1.1 GB of libraries and CUDA, plus the weights file as stored
(it is read through memory maps: every page read counts in the resident size, though the kernel can drop
those pages, so the check before loading refuses only on the rest, and warns on the whole), plus, offloaded,
22 bytes per trainable parameter
(DeepSpeed's fp32 master weights, Adam moments and gradients, and its pinned buffers) and 1.5 times the
weights' bytes for ZeRO-3's parameters kept in CPU RAM. Per process; ranks on one machine add up.
"""
from __future__ import annotations

import math
import random

from .config import RunConfig
from .data import BUCKET, best_fit, packed_rows
from .zero import overlap_comm

MB = 2**20
PACK_SHUFFLES = 8
PROCESS_BASE_MB = 1150  # a training process's RSS beyond its weights (measured: 1,118-1,150 MB, 1B to 8B shapes)
OFFLOADED_BYTES_PER_TRAINABLE = 22  # host bytes per offloaded trainable parameter (fitted: 1B and 3B, ZeRO-2/3)
OFFLOADED_PARAM_FACTOR = 1.5  # host bytes per byte of weights ZeRO-3 keeps in CPU RAM (fitted: 1B, 3B, 8B LoRA)
SUB_GROUP = 1e9  # elements: DeepSpeed's ZeRO-3 sub_group_size default
REDUCE_BUCKET = 5e8  # elements: DeepSpeed's reduce_bucket_size (and allgather_bucket_size) default
MASK_BYTES = 10  # per element of a row's length x length attention mask (measured 9 on the CPU: synthetic:tiny, fp32)


def estimate_memory(cfg: RunConfig, config, trainable: int, tokens_per_micro_batch: int,
                    world_size: int = 1, row_length: int = 0, on_gpu: bool = True) -> dict:
    """The terms above for one process; row_length: the longest row's tokens (its attention mask grows with its
    square); on_gpu False: a CPU-only run, whose host RAM holds everything the GPU estimate counts too."""
    h, layers, inter, vocab = config.hidden_size, config.num_hidden_layers, config.intermediate_size, config.vocab_size
    full = cfg.lora_r == 0
    act_bytes = 4 if cfg.dtype == "fp32" else 2  # one element of an activation (the compute dtype)
    weights, load_bytes = weight_bytes(cfg, config, trainable)
    trainable_bytes = load_bytes if full else 4  # peft keeps LoRA adapters in fp32
    grads = trainable * trainable_bytes
    stage = cfg.zero_stage
    mixed = stage is not None and cfg.dtype != "fp32"
    states = 12 * trainable if mixed else 2 * trainable * trainable_bytes
    # DeepSpeed adds its fp32 gradient copy; torch's foreach AdamW makes a parameter-sized temporary.
    optimizer = states + 4 * trainable if mixed else states + grads

    gpu_weights, cpu_weights = weights, 0.0
    gpu_grads = grads
    gpu_opt, cpu_opt = gpu_optimizer(stage, mixed, states, optimizer, trainable, world_size), 0.0
    if stage is None and world_size > 1:
        gpu_grads = 2 * grads  # DDP's gradient buckets hold a second copy of every gradient
    if stage is not None and stage >= 2:
        gpu_grads = grads / world_size
    if stage == 3:
        gpu_weights = weights / world_size
    if cfg.offload_optimizer != "none":
        cpu_opt, gpu_opt = optimizer / world_size, 0.0  # the fp32 gradient copy moves with it
        gpu_grads = 0.0
    if stage == 3:  # contiguous gradients: one reduce bucket, allocated up front however few weights train
        gpu_grads += REDUCE_BUCKET * act_bytes
        if full:  # a gathered weight's gradient is whole until reduce-scattered; the largest sets the peak
            gpu_grads += largest_weight(config) * load_bytes
    if cfg.offload_param != "none":  # the GPU holds what ZeRO-3 keeps live: stage3_max_live_parameters (1e9)
        cpu_weights, gpu_weights = weights / world_size, min(weights, 1e9 * load_bytes)

    per_token_layer = (8 * h + 4 * inter) * act_bytes + ((5 * h + inter) * 2 if cfg.quantization == "8bit" else 0)
    logits = vocab * 2 * act_bytes if cfg.torch_compile else vocab * (act_bytes + 8)
    # The attention mask of a padded (or packed) row is rows x length x length: nothing at 512 tokens, the whole machine
    # at 100,000 (measured on the CPU: 9 bytes per element of it, fp32, SDPA).
    activations = tokens_per_micro_batch * (layers * per_token_layer + logits + MASK_BYTES * row_length)
    gpu = gpu_weights + gpu_grads + gpu_opt + activations
    if stage == 2:
        gpu = zero2_peak(cfg, config, gpu, tokens_per_micro_batch * logits, world_size, act_bytes, load_bytes, on_gpu)
    if stage in (1, 2):  # at start, ZeRO-1/2 copies the trainable weights into one flat buffer while they still exist
        gpu = max(gpu, weights + trainable * trainable_bytes)
    cpu = cpu_weights + cpu_opt
    host = host_ram_mb(cfg, config, trainable, world_size) + (0 if on_gpu else gpu / MB)
    return {"est_peak_gpu_mb": gpu / MB, "est_peak_host_mb": host,
            "est_peak_cpu_offload_mb": cpu / MB,
            "est_weights_mb": gpu_weights / MB,
            "est_grads_mb": gpu_grads / MB, "est_optimizer_mb": gpu_opt / MB, "est_optimizer_states_mb": states / MB,
            "est_activations_mb": activations / MB}


def zero2_peak(cfg: RunConfig, config, gpu: float, logits: float, world_size: int, act_bytes: int, load_bytes: int,
               on_gpu: bool) -> float:
    """The peak under ZeRO-2 given the other terms' sum `gpu` and the logits' bytes in it: with the optimizer offloaded
    and every weight trained, DeepSpeed's GPU staging buffer of the largest weight's size; from a backward's first
    gradient to its end the reduce buckets (the logits' memory gone by then), and under full fine-tuning the largest
    weight's whole gradient waiting for its bucket. On the CPU the buckets' pages are resident only as far as
    gradients fill them: a few MB. ZeRO-1 allocates one bucket too; no run here measures it, and it is left out."""
    full = cfg.lora_r == 0
    largest = largest_weight(config) * load_bytes if full else 0.0
    if cfg.offload_optimizer != "none":
        gpu += largest
    if not on_gpu or cfg.torch_compile:  # compiled, the hooks that fill them fire after the backward has freed its
        return gpu  # activations, or not at all (dsnb's flat step): zero_flat*.jsonl peak level with no DeepSpeed
    buckets = (2 if overlap_comm(cfg, world_size) else 1) * REDUCE_BUCKET * act_bytes
    return max(gpu, gpu - logits + buckets + largest)


def gpu_optimizer(stage: int | None, mixed: bool, states: float, optimizer: float, trainable: int,
                  world_size: int) -> float:
    """The optimizer's bytes on each GPU: whole without ZeRO, split from stage 1; ZeRO-3 makes its fp32
    gradient copy one sub-group at a time."""
    if stage is None or stage < 1:
        return optimizer
    if stage == 3 and mixed:
        return states / world_size + 4 * min(trainable / world_size, SUB_GROUP)
    return optimizer / world_size


def linear_params(config) -> int:
    """Weights in the attention and MLP projections of a Llama-like config."""
    h, heads = config.hidden_size, config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or h // heads
    attention = 2 * h * heads * head_dim + 2 * h * kv * head_dim
    return config.num_hidden_layers * (attention + 3 * h * config.intermediate_size)


def total_params(config) -> int:
    h = config.hidden_size
    embeddings = config.vocab_size * h * (1 if getattr(config, "tie_word_embeddings", False) else 2)
    return linear_params(config) + embeddings + config.num_hidden_layers * 2 * h + h


def weight_bytes(cfg: RunConfig, config, trainable: int) -> tuple[float, int]:
    """(bytes of the weights as loaded, LoRA adapters included; bytes per loaded parameter)."""
    full = cfg.lora_r == 0
    load_bytes = 4 if cfg.dtype == "fp32" or (full and cfg.dtype == "fp16") else 2
    linear, total = linear_params(config), total_params(config)
    per_linear = {"none": load_bytes, "8bit": 1.0, "4bit": 0.53}[cfg.quantization]
    weights = linear * per_linear + (total - linear) * (load_bytes if cfg.quantization == "none" else 2)
    return (weights if full else weights + trainable * 4), load_bytes


def host_ram_mb(cfg: RunConfig, config, trainable: int, world_size: int = 1, mapped: bool = True) -> float:
    """One process's peak resident host memory (see the module's docstring for the fitted terms); without `mapped`,
    the weights file's memory-mapped pages (which the kernel can drop under pressure) are left out."""
    weights, _ = weight_bytes(cfg, config, trainable)
    host = PROCESS_BASE_MB * MB + (total_params(config) * stored_bytes(config) if mapped else 0)
    if cfg.offload_optimizer != "none":
        host += OFFLOADED_BYTES_PER_TRAINABLE * trainable / world_size
    if cfg.offload_param != "none":
        host += OFFLOADED_PARAM_FACTOR * weights / world_size
    return host / MB


def disk_mb(cfg: RunConfig, config, trainable: int) -> tuple[float, float]:
    """(MB the run writes under output_dir at its peak, MB its model takes in the store's artifacts): the saved adapter
    (fp32) or model (its dtype); a checkpoint also holds the optimizer's state (DeepSpeed's fp32 master and moments:
    12 bytes a trained weight, which covers torch AdamW's 8), and two exist while a new one is written."""
    weights, load_bytes = weight_bytes(cfg, config, trainable)
    model = trainable * 4 if cfg.lora_r else total_params(config) * load_bytes
    checkpoint = model + 12 * trainable if cfg.checkpoint_steps or cfg.checkpoint_minutes else 0
    return (max(2 * checkpoint, model) + 50 * MB) / MB, (model + 50 * MB) / MB


def stored_bytes(config) -> int:
    """Bytes per parameter in the model's files (its config's dtype; 2 where it names none)."""
    dtype = str(getattr(config, "dtype", None) or "bfloat16")
    return 4 if "float32" in dtype else 2


def trainable_params(cfg: RunConfig, config) -> int:
    """Trainable parameters from the config alone: every weight for full fine-tuning, r x (in + out) for each
    matrix a LoRA adapter is put on (Llama-like projections)."""
    h, layers, inter = config.hidden_size, config.num_hidden_layers, config.intermediate_size
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or h // heads
    shapes = {"q_proj": (h, heads * head_dim), "k_proj": (h, kv * head_dim), "v_proj": (h, kv * head_dim),
              "o_proj": (heads * head_dim, h), "gate_proj": (h, inter), "up_proj": (h, inter),
              "down_proj": (inter, h)}
    if cfg.lora_r == 0:
        embeddings = config.vocab_size * h * (1 if getattr(config, "tie_word_embeddings", False) else 2)
        return layers * (sum(i * o for i, o in shapes.values()) + 2 * h) + embeddings + h
    targets = shapes if cfg.lora_targets == "all-linear" else [t.strip() for t in cfg.lora_targets.split(",")]
    return layers * cfg.lora_r * sum(sum(shapes[t]) for t in targets if t in shapes)


def largest_weight(config) -> int:
    """Elements in a Llama-like model's largest weight: the embedding (or output layer) or an MLP matrix."""
    return max(config.vocab_size, config.intermediate_size) * config.hidden_size


def row_length(cfg: RunConfig, dataset) -> int:
    """The longest row a micro-batch holds, in tokens (as collated)."""

    if cfg.padding in ("max_length", "filled", "packed"):
        return cfg.max_length
    longest = max(sum(mask) for mask in dataset["attention_mask"])
    return math.ceil(longest / BUCKET) * BUCKET if cfg.padding == "bucket" else longest


def tokens_per_micro_batch(cfg: RunConfig, dataset) -> int:
    """The largest micro-batch in tokens: padded rows, or the longest real rows (rounded as collated)."""

    if cfg.padding in ("max_length", "filled"):  # filled: batch_size rows of max_length tokens
        return cfg.batch_size * cfg.max_length
    lengths = [sum(mask) for mask in dataset["attention_mask"]]
    longest = max(lengths)
    if cfg.padding == "bucket":
        return cfg.batch_size * math.ceil(longest / BUCKET) * BUCKET
    if cfg.padding == "packed":  # the most rows any batch took when packed, over a few shuffles of the data
        rows = 0
        for seed in range(PACK_SHUFFLES):
            random.Random(seed).shuffle(lengths)
            rows = max(rows, *(packed_rows(best_fit(lengths[i:i + cfg.batch_size], cfg.max_length)[1])
                               for i in range(0, len(lengths), cfg.batch_size)))
        return rows * cfg.max_length
    return cfg.batch_size * longest
