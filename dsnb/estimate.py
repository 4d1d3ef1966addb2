"""Peak memory estimated before a run, logged beside what the run then measures.

    est = estimate_memory(cfg, model.config, trainable, tokens_per_micro_batch, world_size)
    est["est_peak_gpu_mb"], est["est_peak_cpu_mb"]

Unlike DeepSpeed's estimators this knows that LoRA trains only the adapters, that 8-bit and 4-bit weights
are stored in 1 and ~0.5 bytes, and that activations and the 128k-vocab logits often dominate. The
terms (bytes):
  weights      N x 2 or 4 (dtype); quantized: linear weights x 1 (8bit) or 0.53 (4bit NF4 + scales), the rest x 2
  trainable T  LoRA adapters are fp32 (peft) and add their own T x 4; full fine-tuning trains the loaded dtype
  gradients    T x bytes(trainable); DDP (baseline on several GPUs) keeps a second copy in its buckets;
               ZeRO-2/3 split them across GPUs; with optimizer offload only ZeRO-2's reduce buckets
               (2 x 5e8 elements x 2 bytes, DeepSpeed's default) stay on the GPU; ZeRO-3 adds one
               5e8-element bucket for contiguous gradients whatever trains (measured: LoRA under ZeRO-3 +
               offload peaked ~1 GB above the other terms on the 1B and 8B shapes)
  optimizer    torch AdamW: 2 states in the parameter dtype plus one parameter-sized temporary (foreach);
               DeepSpeed with bf16/fp16: fp32 master + 2 fp32 states = 12 T, and an fp32 gradient copy 4 T
               (measured on the H200: 71.9 GB for 3B full fine-tuning under ZeRO-1 on one GPU), split from
               stage 1, on the CPU if offloaded
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
Tokens per micro-batch are the worst case: batch x max_length with max_length padding, batch x the
longest sample otherwise. The CUDA context (~0.5 GB) is outside the allocator and not counted.
"""
from __future__ import annotations

import math
import random

from .config import RunConfig

MB = 2**20
PACK_SHUFFLES = 8
REDUCE_BUCKET = 5e8  # elements: DeepSpeed's reduce_bucket_size (and allgather_bucket_size) default
BUCKET_BYTES = 2 * REDUCE_BUCKET * 2  # ZeRO-1/2's reduce and allgather buckets, half precision


def estimate_memory(cfg: RunConfig, config, trainable: int, tokens_per_micro_batch: int,
                    world_size: int = 1) -> dict:
    h, layers, inter, vocab = config.hidden_size, config.num_hidden_layers, config.intermediate_size, config.vocab_size
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or h // heads
    linear = layers * (2 * h * heads * head_dim + 2 * h * kv * head_dim + 3 * h * inter)
    embeddings = vocab * h * (1 if getattr(config, "tie_word_embeddings", False) else 2)
    total = linear + embeddings + layers * 2 * h + h
    full = cfg.lora_r == 0
    load_bytes = 4 if cfg.dtype == "fp32" or (full and cfg.dtype == "fp16") else 2
    act_bytes = 4 if cfg.dtype == "fp32" else 2  # one element of an activation (the compute dtype)
    per_linear = {"none": load_bytes, "8bit": 1.0, "4bit": 0.53}[cfg.quantization]
    weights = linear * per_linear + (total - linear) * (load_bytes if cfg.quantization == "none" else 2)
    trainable_bytes = load_bytes if full else 4
    if not full:
        weights += trainable * trainable_bytes  # the adapters themselves
    grads = trainable * trainable_bytes
    stage = cfg.zero_stage
    mixed = stage is not None and cfg.dtype != "fp32"
    states = 12 * trainable if mixed else 2 * trainable * trainable_bytes
    # DeepSpeed adds its fp32 gradient copy; torch's foreach AdamW makes a parameter-sized temporary.
    optimizer = states + 4 * trainable if mixed else states + grads

    gpu_weights, cpu_weights = weights, 0.0
    gpu_grads = grads
    gpu_opt, cpu_opt = optimizer, 0.0
    if stage is None and world_size > 1:
        gpu_grads = 2 * grads  # DDP's gradient buckets hold a second copy of every gradient
    if stage is not None and stage >= 1:
        gpu_opt = optimizer / world_size
    if stage is not None and stage >= 2:
        gpu_grads = grads / world_size
    if stage == 3:
        gpu_weights = weights / world_size
    if cfg.offload_optimizer != "none":
        cpu_opt, gpu_opt = optimizer / world_size, 0.0  # the fp32 gradient copy moves with it
        gpu_grads = min(gpu_grads, BUCKET_BYTES) if stage != 3 else 0.0
    if stage == 3:  # contiguous gradients: one reduce bucket, allocated up front however few weights train
        gpu_grads += REDUCE_BUCKET * act_bytes
        if full:  # a gathered weight's gradient is whole until reduce-scattered; the largest sets the peak
            gpu_grads += largest_weight(config) * load_bytes
    if cfg.offload_param != "none":  # the GPU holds what ZeRO-3 keeps live: stage3_max_live_parameters (1e9)
        cpu_weights, gpu_weights = weights / world_size, min(weights, 1e9 * load_bytes)

    per_token_layer = (8 * h + 4 * inter) * act_bytes + ((5 * h + inter) * 2 if cfg.quantization == "8bit" else 0)
    logits = vocab * 2 * act_bytes if cfg.torch_compile else vocab * (act_bytes + 8)
    activations = tokens_per_micro_batch * (layers * per_token_layer + logits)
    gpu = gpu_weights + gpu_grads + gpu_opt + activations
    cpu = cpu_weights + cpu_opt
    return {"est_peak_gpu_mb": gpu / MB, "est_peak_cpu_offload_mb": cpu / MB, "est_weights_mb": gpu_weights / MB,
            "est_grads_mb": gpu_grads / MB, "est_optimizer_mb": gpu_opt / MB, "est_optimizer_states_mb": states / MB,
            "est_activations_mb": activations / MB}


def largest_weight(config) -> int:
    """Elements in a Llama-like model's largest weight: the embedding (or output layer) or an MLP matrix."""
    return max(config.vocab_size, config.intermediate_size) * config.hidden_size


def tokens_per_micro_batch(cfg: RunConfig, dataset) -> int:
    """The largest micro-batch in tokens: padded rows, or the longest real rows (rounded as collated)."""
    from .data import BUCKET, first_fit, packed_rows

    if cfg.padding == "max_length":
        return cfg.batch_size * cfg.max_length
    lengths = [sum(mask) for mask in dataset["attention_mask"]]
    longest = max(lengths)
    if cfg.padding == "bucket":
        return cfg.batch_size * math.ceil(longest / BUCKET) * BUCKET
    if cfg.padding == "packed":  # the most rows any batch took when packed, over a few shuffles of the data
        rows = 0
        for seed in range(PACK_SHUFFLES):
            random.Random(seed).shuffle(lengths)
            rows = max(rows, *(packed_rows(first_fit(lengths[i:i + cfg.batch_size], cfg.max_length)[1])
                               for i in range(0, len(lengths), cfg.batch_size)))
        return rows * cfg.max_length
    return cfg.batch_size * longest
