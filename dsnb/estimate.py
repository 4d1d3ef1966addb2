"""Peak memory (GPU and host RAM) estimated before a run loads anything, logged beside what the run measures.

    config = model_config(cfg.model)                                   # no weight loaded
    est = estimate_memory(cfg, config, trainable_params(cfg, config), tokens_per_micro_batch(cfg, data), world,
                          row_length(cfg, data), on_gpu=True)
    est["est_peak_gpu_mb"], est["est_peak_host_mb"]        # on_gpu False: the host holds what the GPU would

Unlike DeepSpeed's estimators this knows that LoRA trains only the adapters, that 8-bit and 4-bit weights
are stored in 1 and ~0.5 bytes, that activations and the 128k-vocab logits often dominate, and that a step's peak
comes at one of three moments: a backward (activations alive, gradients arriving), the optimizer's step (activations
gone, the step's transient copies made) or, under ZeRO-1/2, the start. benchmarks/advise_vs_measured.py checks the
whole against every committed GPU run (median error 0.5%, 95th percentile 2.9% over 120 runs). The terms (bytes):
  weights      N x 2 or 4 (dtype); quantized: linear weights x 1 (8bit) or 0.53 (4bit NF4 + scales), the rest x 2
  trainable T  LoRA adapters are fp32 (peft) and add their own T x 4; full fine-tuning trains the loaded dtype
  gradients    T x bytes(trainable); DDP (baseline on several GPUs) keeps a second copy in its buckets;
               ZeRO-2/3 split them across GPUs (ZeRO-1 too by its step), and with the optimizer offloaded none
               stay on the GPU; ZeRO-3 adds one 5e8-element bucket for contiguous gradients whatever trains
               (measured: LoRA under ZeRO-3 + offload peaked ~1 GB above the other terms on the 1B and 8B shapes)
  optimizer    states: torch AdamW's 2 in the parameter dtype; DeepSpeed with bf16/fp16: fp32 master + 2 fp32
               moments = 12 T, split from stage 1, on the CPU if offloaded. The step's transient copies
               (step_transients): torch's foreach AdamW (the HF Trainer's) one temporary of the states' size,
               fused AdamW (dsnb's compiled loop) none; DeepSpeed's fp32 gradient copy (4 T; ZeRO-3 one
               1e9-element sub-group at a time), and DeepSpeed's own ZeRO-1/2 step first flattens the 16-bit
               partition (2 T). Measured for 3B full fine-tuning on the H200, bytes a weight: 10 under the
               Trainer without DeepSpeed, 12 with DDP on two GPUs, 24 under ZeRO-1/2 on one GPU and 2 + 22 / 2 on
               two, 22 compiled with DeepSpeed's step and 20 with dsnb's flat one; ZeRO-3 and 8B's within 0.5%
  activations  per token and layer (layer_activations), in the compute dtype: both norms' inputs, queries, keys and
               values after RoPE, the attention's output, SwiGLU's gate, up, activation and product (3 h + q +
               2 kv + 4 i), each LoRA adapter's dropped-out input, full fine-tuning's projection inputs (2 h),
               and 3.4 h more in the eager loop, 2 (q - kv) less with flex attention where transformers copied
               grouped key/value heads when the count was fitted (kv_copies); with 8-bit weights (1.6 h + i)
               half-precision elements that bitsandbytes keeps. Logits: V x (2 + 4 + 4) bytes per token (logits,
               their fp32 upcast for the loss, its gradient), V x (2 + 2) compiled (inductor fuses the upcast into
               the log-softmax), less three copies of the logits in the compute dtype (two without CUDA graphs)
               in dsnb's compiled loop without DeepSpeed, whose graph no longer outputs them (logits_outputs: the
               fits were made with them; the logits' term goes below zero there, the layers' term holding the rest).
               Measured: compiled LoRA with 12,288 tokens a micro-batch, within 0.4% with dropout and without.
               With loss_chunk, less what chunking frees, one chunk's and the hidden states' gradient (logits_bytes)
               Eager attention (Gemma 2, GPT-OSS, ...: no SDPA in transformers): each layer's rows x length x length
               weights per query head, at the bytes measured on a small copy (eager_weights: 2-8 in bf16)
  ZeRO-2       from a backward's first gradient to its end, DeepSpeed's reduce buckets: 5e8 elements in the
               compute dtype whatever trains, two under overlap_comm (several GPUs, or the optimizer
               offloaded; dsnb/zero.py). By then the logits' memory is gone, so they raise the peak only
               where they outweigh it (measured: notebook 01's 8-bit LoRA with offload, per-batch padding,
               1.7 GB above the sum of the other terms; padded to 512 tokens, 0.4 GB); full fine-tuning adds
               the largest weight's whole gradient waiting for its bucket (twice for tied embeddings: likely
               the output layer's and the input's, measured 1B + offload 0.8 GB above the rest), and with the
               optimizer offloaded DeepSpeed's GPU staging buffer of the largest weight's size
  ZeRO-3       parameters split across GPUs; a forward or backward holds the gathered weights, counted as
               DeepSpeed's stage3_max_live_parameters (1e9 elements), and with the parameters on the GPU the
               largest weight beside them (measured 1.6-2.1 GB with parameters in CPU RAM, 2.7-3.2 GB with 8B's
               on the GPU: not understood, a margin that covers them); full fine-tuning also holds the largest
               weight's whole gradient (the 128k-vocab embedding) before it is reduce-scattered. DeepCompile:
               2 bytes a trained weight more (measured once, 3B full: not understood, a margin)
  ZeRO-1/2     at start DeepSpeed copies the trainable weights into one flat buffer before it frees them,
               on the GPU where NVML reports room for it (else on the CPU, and the start-up peak is the
               weights alone: on a GPU smaller than twice the weights this term overstates), so the peak is
               at least the weights plus that copy; with the optimizer offloaded it is the peak (measured:
               exactly twice the bf16 weights for 3B full fine-tuning on one H200 and 8B on one and on two)
  the rest     64 MB the allocator holds whatever the model (cuBLAS workspaces; measured on a 0.4M-weight model)
est_peak_gpu_mb is the largest moment; the est_*_mb terms are what a GPU holds through a step, and need not add up
to it. Tokens per micro-batch are the worst case: batch x max_length with max_length or filled padding, the most
rows a packed batch took, batch x the longest sample otherwise. The CUDA context and what NCCL and compiled kernels
take (0.75-2.2 GB measured beyond the allocator's reserve) are outside the allocator and not counted.

Host RAM (the process's resident memory), measured on the H200 runs of the 1B, 3B and 8B shapes: the larger of
loading and training. Loading: about 1.1 GB of libraries and CUDA, plus the weights file as stored (it is read
through memory maps: every page read counts in the resident size, though the kernel can drop those pages, so the
check before loading refuses only on the rest, and warns on the whole), 0.5 GB for ZeRO-3 or DeepSpeed on several
GPUs. Training: 1.9 GB for a GPU process (a CPU one: CPU_PROCESS_MB), plus the offloaded optimizer
(offloaded_optimizer_bytes: Adam's moments, and page-locked buffers rounded up to powers of two) and 1.6 times the
weights' bytes for ZeRO-3's parameters kept in CPU RAM (measured 1.1-1.6: the largest). Per process; ranks on one
machine add up.
"""
from __future__ import annotations

import math
import random

from .config import RunConfig
from .data import BUCKET, best_fit, packed_rows
from .model import eager_attention, eager_weight_bytes, grouped_flex, lora_matches, matmul_weights, weight_shapes
from .zero import overlap_comm

MB = 2**20
PACK_SHUFFLES = 8
PROCESS_BASE_MB = 1150  # a training process's RSS beyond its weights (measured: 1,118-1,150 MB, 1B to 8B shapes)
# The estimate's error over every committed GPU run of today's code (benchmarks/advise_vs_measured.py;
# tests/test_advise.py holds these to its figures): runs, median and 95th-percentile absolute error
GPU_ERROR, HOST_ERROR = (136, 0.005, 0.028), (129, 0.007, 0.032)
CPU_HOST_ERROR = (8, 0.071, 0.295)  # on the CPU: runs, median and largest absolute error (benchmarks/host_cpu.py)
CPU_PROCESS_MB = 800  # the same without CUDA, on the CPU (measured: 746-784 MB, synthetic:tiny; host_cpu.md)
HOST_FLOOR_MB = 1900  # a GPU training process's RSS without weights (measured: the 0.4M-parameter quality model; CUDA's
#                       host memory: a CPU process took 0.75 GB)
DEEPSPEED_HOST_MB = 530  # ZeRO-3 or DeepSpeed on several GPUs (measured: 320-530 MB beyond the rest, 3B and 8B)
OFFLOADED_PARAM_FACTOR = 1.6  # host bytes per byte of weights ZeRO-3 keeps in CPU RAM (measured 1.1-1.6: 1B, 3B, 8B;
#                               the largest, so 1B and 8B come out 15-23% high)
SUB_GROUP = 1e9  # elements: DeepSpeed's ZeRO-3 sub_group_size default
REDUCE_BUCKET = 5e8  # elements: DeepSpeed's reduce_bucket_size (and allgather_bucket_size) default
EIGHT_BIT_EXTRA = 1.6  # and, with 8-bit weights, (this x hidden + the MLP's width) half-precision elements more
#                         (fitted: the tutorial's recipe, 3B, 2 x 512 tokens)
EAGER_EXTRA = 3.4  # elements per token and layer, in units of the hidden size, the eager loop keeps beyond the
#                     compiled one (fitted: the fast recipe under the Trainer, 3B shape)
ALLOCATOR_FLOOR_MB = 64  # what the allocator holds whatever the model: cuBLAS workspaces, rotary tables (measured: the
#                          0.4M-parameter quality model peaked at 123 MB allocated, its tensors counting 58)
LIVE_PARAMETERS = 1e9  # elements: DeepSpeed's stage3_max_live_parameters default
# Chunking the loss (loss_chunk) of a compiled half-precision step, fitted to the H100's runs (chunkloss_h100.md; in
# sample: no other run checks them): it frees 8 bytes a token and vocabulary entry, where the whole-logits term above
# counts 2 x 2 (the layers' term, fitted beside it, holds the rest; which tensors inductor keeps is not measured);
# those runs' whole logits were a graph output, whose 3 x 2 dsnb's loop no longer holds (LOGITS_OUTPUT_COPIES). From
# the bf16 pairs at 12,288 tokens (1B and 3B shapes: 10.6 GB each, 7.9 a token and entry with a chunk's 10) and 12
# against 24 rows chunked (3B: 8.0, the estimate's own per-token terms for the rest). A chunk holds 10 (the 3B pair:
# 9-11, as the whole-logits peak is taken measured or estimated). In fp16 the chunked loss makes a chunk's gradients in
# the backward, from its logits made again there: a chunk holds 6, fitted to call 5's compiled fast-recipe pair (one
# chunk of 1,024 tokens: 249.5 MB less than whole logits, where 8 freed less 6 held counts 250.5 less the hidden
# states' 6 MB gradient, 244.5; its fp16 logits and their fp32 upcast would count 6, not measured). In sample, and the
# only fp16 pair: what fp16 frees over several chunks is taken as bf16's, unmeasured.
COMPILED_LOGITS_FREED = 8
COMPILED_CHUNK = 10
COMPILED_CHUNK_FP16 = 6
# dsnb's compiled loop without DeepSpeed compiles a model that returns only its loss (loop.loss_only). Before, the
# logits were a graph output: the output itself, a zero gradient for it each step and, under CUDA graphs, that
# gradient's copy into the graphs' own buffer, each a token and vocabulary entry in the compute dtype, which the fits
# above were made with. Measured on an H100 (the 3B throughput mode, 12,288 tokens: 44,409 MB with the logits an output,
# 35,495 without, 5.93 bytes a token and entry; benchmarks/results/loss_only_h100.md): 3 copies with CUDA graphs; 2
# without them (the third is the graphs' copy), not measured.
LOGITS_OUTPUT_COPIES = 3
MASK_BYTES = 10  # per element of a row's length x length attention mask (measured 9 on the CPU: synthetic:tiny, fp32)


def estimate_memory(cfg: RunConfig, config, trainable: int, tokens_per_micro_batch: int,
                    world_size: int = 1, row_length: int = 0, on_gpu: bool = True, logits_output: bool = False) -> dict:
    """The terms above for one process; row_length: the longest row's tokens (its attention mask grows with its
    square); on_gpu False: a CPU-only run, whose host RAM holds everything the GPU estimate counts too;
    logits_output: as the compiled loop was before it returned only the loss (the committed GPU runs were measured so;
    logits_outputs). The peak is
    the largest of three moments: a backward (activations alive, gradients arriving), the optimizer's step (the
    activations gone, its transient copies made) and, under ZeRO-1/2, the start (the weights copied flat)."""
    h, layers, inter = config.hidden_size, config.num_hidden_layers, config.intermediate_size
    act_bytes = activation_bytes(cfg)
    weights, load_bytes = weight_bytes(cfg, config, trainable)
    held = held_bytes(cfg, config, trainable, world_size, weights, load_bytes, on_gpu)
    per_token_layer = layer_activations(cfg, config) * act_bytes + (
        (EIGHT_BIT_EXTRA * h + inter) * 2 if cfg.quantization == "8bit" else 0)
    logits = logits_bytes(cfg, config, tokens_per_micro_batch, act_bytes, on_gpu, logits_output)
    # The attention mask of a padded (or packed) row is rows x length x length: nothing at 512 tokens, the whole machine
    # at 100,000 (measured on the CPU: 9 bytes per element of it, fp32, SDPA).
    activations = tokens_per_micro_batch * (layers * per_token_layer + MASK_BYTES * row_length) + logits + \
        eager_weights(cfg, config, tokens_per_micro_batch, row_length)
    backward = held["weights"] + held["live"] + held["backward_grads"] + held["states"] + activations
    if cfg.zero_stage == 2:
        backward = zero2_peak(cfg, config, backward, logits, world_size, act_bytes, load_bytes, on_gpu)
    step = held["weights"] + held["grads"] + held["states"] + step_transients(cfg, trainable, world_size, load_bytes,
                                                                              on_gpu)
    if cfg.deepcompile and cfg.torch_compile and cfg.zero_stage == 3:
        backward += trainable * 2  # DeepCompile: measured once (3B full, 6.6 GB above this count), not understood
    gpu = max(backward, step) + (ALLOCATOR_FLOOR_MB * MB if on_gpu else 0)  # the CUDA allocator's own
    if cfg.quantization == "fp8":  # loaded whole in bf16, then each Linear turned to fp8 (dsnb/fp8.py)
        gpu = max(gpu, total_params(config) * 2)
    if cfg.zero_stage in (1, 2):  # at start, ZeRO-1/2 copies the trainable weights into one flat buffer while they
        gpu = max(gpu, weights + trainable * trainable_bytes(cfg, load_bytes))  # exist (before any matmul's workspace)
    host = host_ram_mb(cfg, config, trainable, world_size, on_gpu=on_gpu) + (0 if on_gpu else gpu / MB)
    return {"est_peak_gpu_mb": gpu / MB, "est_peak_host_mb": host,
            "est_peak_cpu_offload_mb": held["offloaded"] / MB, "est_nvme_mb": held["on_nvme"] / MB,
            "est_weights_mb": held["weights"] / MB,
            "est_grads_mb": held["backward_grads"] / MB,
            "est_optimizer_mb": (step - held["weights"] - held["grads"]) / MB,
            "est_optimizer_states_mb": held["all_states"] / MB, "est_activations_mb": activations / MB}


def eager_weights(cfg: RunConfig, config, tokens: int, row_length: int) -> float:
    """What a model that attends eagerly (model.eager_attention: under attention sdpa, Gemma 2, GPT-OSS, VaultGemma and
    the others transformers gives no SDPA attention) keeps of its attention weights for the backward: rows x length x
    length per layer and query head (tokens x row_length), at the bytes a weight measured on a small copy of its
    architecture (model.eager_weight_bytes: 8 in bf16 for Gemma 2's, 2 for GPT-OSS's). 0 where attention runs through
    SDPA or flex, which keep none. Only what the layers keep is counted: the backward's own length x length gradients
    of one layer at a time are not (not measured on a GPU)."""
    if not row_length or not eager_attention(cfg, config):
        return 0.0
    return tokens * row_length * config.num_hidden_layers * config.num_attention_heads * \
        eager_weight_bytes(config, cfg.dtype)[0]


def activation_bytes(cfg: RunConfig) -> int:
    """Bytes of one element of an activation (the compute dtype)."""
    return 4 if cfg.dtype == "fp32" else 2


def logits_bytes(cfg: RunConfig, config, tokens: int, act_bytes: int, on_gpu: bool = True,
                 logits_output: bool = False) -> float:
    """What the loss holds through a micro-batch's backward: the whole logits (the fitted terms above), or with
    loss_chunk (dsnb/loss.py) that less what chunking was measured to free, plus one chunk's logits and gradient and
    what the chunks leave for the backward: the hidden states' gradient and, where the head trains, its weight's in
    fp32."""
    vocab = config.vocab_size
    whole = 2 * act_bytes if cfg.torch_compile else act_bytes + 8
    if not cfg.loss_chunk:
        # Below zero in dsnb's compiled loop (2 x 2 - 3 x 2 in bf16): the layers' fitted term holds the rest
        return tokens * vocab * whole - (0 if logits_output else logits_outputs(cfg, config, tokens, on_gpu))
    freed, chunk = whole, 4 + (act_bytes if act_bytes < 4 else 0)  # eager: the terms above (bf16 or fp16 logits,
    # their fp32 upcast and its gradient); a chunk's fp32 logits, their gradient in place, and it in the compute dtype
    if cfg.torch_compile and act_bytes == 2:
        freed, chunk = COMPILED_LOGITS_FREED, COMPILED_CHUNK_FP16 if cfg.dtype == "fp16" else COMPILED_CHUNK
    head_grad = vocab * config.hidden_size * 4 if cfg.lora_r == 0 else 0
    return (tokens * vocab * (whole - freed) + min(tokens, cfg.loss_chunk) * vocab * chunk
            + tokens * config.hidden_size * act_bytes + head_grad)


def logits_outputs(cfg: RunConfig, config, tokens: int, on_gpu: bool = True) -> float:
    """Bytes the fitted terms hold for the logits as a compiled graph's output (LOGITS_OUTPUT_COPIES), which dsnb's
    compiled loop without DeepSpeed no longer makes (loop.loss_only); 0 where the logits still are one (the eager
    Trainer, DeepSpeed's engine) or are never made whole (loss_chunk). Without CUDA graphs (cuda_graphs false, or the
    CPU) one copy fewer. loop.loss_only also keeps the logits an output under label smoothing or a compute_loss_func,
    which dsnb never sets. The runs measured before are estimated with them (estimate_memory's logits_output)."""
    if not cfg.torch_compile or cfg.zero_stage is not None or cfg.loss_chunk:
        return 0.0
    copies = LOGITS_OUTPUT_COPIES if cfg.cuda_graphs and on_gpu else LOGITS_OUTPUT_COPIES - 1
    return tokens * config.vocab_size * copies * activation_bytes(cfg)


def layer_activations(cfg: RunConfig, config) -> float:
    """Elements one token keeps per layer for the backward, in the compute dtype: both norms' inputs, the queries, keys
    and values after RoPE and the attention's output, SwiGLU's gate, up, activation and product; each LoRA adapter's
    dropped-out input (peft draws one per adapter); under full fine-tuning the inputs of the projections besides;
    and the eager loop's own (the norms' fp32 upcasts, dropout masks). Fitted: compiled LoRA on q/v of the 3B shape
    (the throughput mode, 12,288 tokens a micro-batch: 47,104 counted against 47,072 measured without dropout, and the
    dropout's 2 x 3,072 against 6,028), and the eager extra on the fast recipe under the Trainer; less kv_copies."""
    h, inter = config.hidden_size, config.intermediate_size
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or h // heads
    q, kv = heads * head_dim, kv * head_dim
    core = 3 * h + q + 2 * kv + 4 * inter - kv_copies(cfg, config)
    if cfg.lora_r == 0:
        core += 2 * h  # the normed inputs of q/k/v and of gate/up (o's and down's are counted: attention, product)
    elif cfg.lora_dropout > 0:
        inputs = {"q_proj": h, "k_proj": h, "v_proj": h, "o_proj": q, "gate_proj": h, "up_proj": h, "down_proj": inter}
        targets = inputs if cfg.lora_targets == "all-linear" else [t.strip() for t in cfg.lora_targets.split(",")]
        core += sum(inputs.get(t, 0) for t in targets)
    return core + (0 if cfg.torch_compile else EAGER_EXTRA * h)


def kv_copies(cfg: RunConfig, config) -> int:
    """Elements a token and layer that layer_activations' fitted count holds beyond flex attention over grouped heads.

    The count was fitted on the 3B shape's flex runs while transformers copied each key and value head to its group's
    query heads (its flex path does where the query heads are not a power of two: 24 over 8); dsnb hands flex the
    grouped heads since (model.attend_to_grouped_heads). The 3B's throughput mode held 2,686 MB less on an H100
    (gqa_h100.md): within 2 MB of these copies, 2 (q - kv) elements a token and layer. Other paths keep the count as
    fitted (the 1B's flex runs, 32 heads, never had copies and measured 1.7% above it), and so do the rows dsnb leaves
    to transformers' copies (model.grouped_flex: short rows whose groups are not a power of two)."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if cfg.attention != "flex" or not heads & (heads - 1) or not grouped_flex(heads, kv_heads, cfg.max_length):
        return 0
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return 2 * (heads - kv_heads) * head_dim


def trainable_bytes(cfg: RunConfig, load_bytes: int) -> int:
    """Bytes of one trained weight: full fine-tuning trains the loaded dtype, peft keeps LoRA adapters in fp32."""
    return load_bytes if cfg.lora_r == 0 else 4


def held_bytes(cfg: RunConfig, config, trainable: int, world: int, weights: float, load_bytes: int,
               on_gpu: bool = True) -> dict:
    """What one GPU holds through a step, in bytes: its weights (ZeRO-3: its partition, and the gathered weights a
    forward or backward keeps live), gradients as a backward leaves them and as the step finds them, the optimizer's
    states; and what optimizer offload keeps in CPU RAM (or on disk) instead. on_gpu False: what a CPU process's
    resident memory holds of them (a buffer allocated whole counts only where it is written)."""
    stage, full = cfg.zero_stage, cfg.lora_r == 0
    grads = trainable * trainable_bytes(cfg, load_bytes)
    mixed = stage is not None and cfg.dtype != "fp32"
    states = 12 * trainable if mixed else 2 * grads  # DeepSpeed: fp32 master and two fp32 moments; torch: two moments
    parts = 1 if stage is None or stage == 0 else world  # what ZeRO splits from stage 1
    out = {"weights": weights, "live": 0.0, "grads": grads / parts, "backward_grads": grads, "states": states / parts,
           "all_states": states, "offloaded": 0.0, "on_nvme": 0.0}
    if stage is None and world > 1:
        out["grads"] = out["backward_grads"] = 2 * grads  # DDP's gradient buckets hold a second copy of every gradient
    if stage == 0 and mixed:
        out["states"] += 4 * trainable  # ZeRO-0's fp32 gradient copy lives beside the weights
    if stage is not None and stage >= 2:
        out["backward_grads"] = grads / world
    if stage == 3:
        out["weights"] = 0.0 if cfg.offload_param != "none" else weights / world
        # Gathered for a forward or backward: up to stage3_max_live_parameters, and with the parameters on the GPU the
        # largest weight beside them (measured: 1.6-2.1 GB beyond the other terms with the parameters in CPU RAM, 1B
        # to 8B; 2.7 and 3.2 GB with the 8B's on one and two GPUs; not understood, this covers them)
        out["live"] = min(weights, LIVE_PARAMETERS * load_bytes) + (
            largest_weight(config) * load_bytes if cfg.offload_param == "none" else 0.0)
        bucket = REDUCE_BUCKET * (4 if cfg.dtype == "fp32" else 2)  # contiguous gradients, allocated up front
        if not on_gpu:  # in host memory only the pages the gradients fill are resident
            bucket = min(bucket, grads)
        whole = largest_weight(config) * load_bytes if full else 0.0  # a gathered weight's gradient, whole until
        out["grads"] += bucket  # reduce-scattered: the largest sets the peak
        out["backward_grads"] += bucket + whole
    if cfg.offload_optimizer != "none":  # states and the fp32 gradient copy move to the host, gradients with them
        out["offloaded"] = (states + 4 * trainable * mixed) / world
        out["on_nvme"] = out["offloaded"] if cfg.offload_optimizer == "nvme" else 0.0
        out["states"] = 0.0
        out["grads"] -= grads / parts
        out["backward_grads"] -= grads / world
    if cfg.offload_param != "none":
        out["offloaded"] += weights / world
        out["on_nvme"] += weights / world if cfg.offload_param == "nvme" else 0.0
    return out


def step_transients(cfg: RunConfig, trainable: int, world: int, load_bytes: int, on_gpu: bool) -> float:
    """Bytes the optimizer's step makes on the GPU beyond what it holds. Torch's foreach AdamW (the HF Trainer's
    adamw_torch) makes one temporary of its states' size, fused AdamW (dsnb's compiled loop on a GPU) none. DeepSpeed
    in bf16/fp16 makes an fp32 copy of its gradient partition (ZeRO-3: of one sub-group at a time), and its own
    ZeRO-1/2 step first flattens the 16-bit partition (dsnb's flat step does not). Measured on the H200 for 3B full
    fine-tuning, bytes a weight on one GPU: ZeRO-2 under the Trainer 24, compiled with DeepSpeed's step 22, with dsnb's
    flat step 20; ZeRO-3 under the Trainer on one and two GPUs and for 8B, within 0.4%."""
    stage = cfg.zero_stage
    foreach = not (cfg.torch_compile and on_gpu)
    if cfg.offload_optimizer != "none":
        return 0.0  # the step runs on the host
    if stage is None or stage == 0 or cfg.dtype == "fp32":
        parts = 1 if stage is None or stage == 0 else world
        return trainable * trainable_bytes(cfg, load_bytes) / parts if foreach else 0.0
    if stage == 3:
        return (8 if foreach else 4) * min(trainable / world, SUB_GROUP)
    own = 0 if cfg.torch_compile and cfg.zero_flat_step and world == 1 and cfg.dtype == "bf16" else 2
    return (4 + max(own, 4 if foreach else 0)) * trainable / world


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
    if full and getattr(config, "tie_word_embeddings", False):  # the shared embedding's gradient, made twice (output
        largest *= 2  # layer and input) before its hook moves it: likely; measured 1B ZeRO-2 + offload 0.8 GB above
    if not on_gpu or cfg.torch_compile:  # compiled, the hooks that fill them fire after the backward has freed its
        return gpu  # activations, or not at all (dsnb's flat step): zero_flat*.jsonl peak level with no DeepSpeed
    buckets = (2 if overlap_comm(cfg, world_size) else 1) * REDUCE_BUCKET * act_bytes
    return max(gpu, gpu - logits + buckets + largest)


def total_params(config) -> int:
    """Every weight of the model built on the meta device, tied ones once (model.weight_shapes)."""
    return weight_shapes(config)["total"]


def weight_bytes(cfg: RunConfig, config, trainable: int) -> tuple[float, int]:
    """(bytes of the weights as loaded, LoRA adapters included; bytes per loaded parameter)."""
    full = cfg.lora_r == 0
    load_bytes = 4 if cfg.dtype == "fp32" or (full and cfg.dtype == "fp16") else 2
    linear, total = matmul_weights(config, head=False), total_params(config)  # the head stays 16-bit
    # fp8: a byte a weight and 4 bytes a row of scales (dsnb/fp8.py; 3 MB on the 3B shape, left out); fp8_head: the
    # head's fp8 copy beside its bf16 weight, a byte a weight more
    per_linear = {"none": load_bytes, "8bit": 1.0, "4bit": 0.53, "fp8": 1.0}[cfg.quantization]
    weights = linear * per_linear + (total - linear) * (load_bytes if cfg.quantization == "none" else 2)
    if cfg.quantization == "fp8" and cfg.fp8_head:
        weights += config.vocab_size * config.hidden_size
    return (weights if full else weights + trainable * 4), load_bytes


def host_ram_mb(cfg: RunConfig, config, trainable: int, world_size: int = 1, mapped: bool = True,
                on_gpu: bool = True) -> float:
    """One process's peak resident host memory: the larger of loading (the process, the weights file as it is read,
    DeepSpeed's own) and training (the process and what offload keeps in CPU RAM; the file's pages are gone by then).
    See the module's docstring for the fitted terms. Without `mapped`, what the kernel can take back is left out: the
    weights file's memory-mapped pages; and the process counts at the least measured beside its weights
    (PROCESS_BASE_MB), as it does without a GPU (on_gpu False), not at a GPU process's floor."""
    weights, _ = weight_bytes(cfg, config, trainable)
    # on a GPU the offloaded parameters sit in page-locked buffers beside their copies; on the CPU, their only home
    params = (OFFLOADED_PARAM_FACTOR if on_gpu else 1.0) * weights / world_size if cfg.offload_param != "none" else 0.0
    deepspeed = DEEPSPEED_HOST_MB * MB if on_gpu and (cfg.zero_stage == 3 or cfg.zero_stage is not None and
                                                      world_size > 1) else 0.0  # its CUDA-side host buffers
    base = (PROCESS_BASE_MB if on_gpu else CPU_PROCESS_MB) * MB
    load = base + (total_params(config) * stored_bytes(config) if mapped else 0) + deepspeed + params
    train = (HOST_FLOOR_MB * MB if mapped and on_gpu else base) + params + offloaded_optimizer_bytes(
        cfg, trainable / world_size)
    return max(load, train) / MB


def offloaded_optimizer_bytes(cfg: RunConfig, trainable: float) -> float:
    """Host bytes of DeepSpeed's offloaded optimizer for `trainable` weights (one process's partition), as DeepSpeed
    0.19's ZeRO-1/2 allocates them: Adam's two fp32 moments, and in page-locked memory, which PyTorch's host allocator
    rounds up to a power of two, the fp32 master weights, their fp32 gradients and a copy in the compute dtype
    (measured for full fine-tuning, 1B, 3B and 8B on one GPU, 8B on two: 1-3% under). NVMe offload is counted alike
    (measured once, 1B: 35.8 GB of host RAM, DeepSpeed's swap buffers beside what the disk holds)."""
    if cfg.offload_optimizer == "none" or not trainable:
        return 0.0
    compute = 4 if cfg.dtype == "fp32" else 2
    return 8 * trainable + 2 * power_of_two(4 * trainable) + power_of_two(compute * trainable)


def power_of_two(n: float) -> float:
    return 2.0 ** math.ceil(math.log2(n)) if n > 1 else n


def disk_mb(cfg: RunConfig, config, trainable: int) -> tuple[float, float]:
    """(MB the run writes under output_dir at its peak, MB its model takes in the store's artifacts): the saved adapter
    (fp32) or model (its dtype); a checkpoint also holds the optimizer's state (DeepSpeed's fp32 master and moments:
    12 bytes a trained weight, which covers torch AdamW's 8), and two exist while a new one is written."""
    weights, load_bytes = weight_bytes(cfg, config, trainable)
    model = trainable * 4 if cfg.lora_r else total_params(config) * load_bytes
    # the compiled loop keeps no checkpoints (checkpoint_minutes' default is left unused there)
    checkpointing = (cfg.checkpoint_steps or cfg.checkpoint_minutes) and not cfg.torch_compile
    checkpoint = model + 12 * trainable if checkpointing else 0
    return (max(2 * checkpoint, model) + 50 * MB) / MB, (model + 50 * MB) / MB


def stored_bytes(config) -> int:
    """Bytes per parameter in the model's files (its config's dtype; 2 where it names none)."""
    dtype = str(getattr(config, "dtype", None) or "bfloat16")
    return 4 if "float32" in dtype else 2


def trainable_params(cfg: RunConfig, config) -> int:
    """Trainable parameters from the config alone (the model built on the meta device, model.weight_shapes): every
    weight for full fine-tuning, r x (in + out) for each matrix a LoRA adapter is put on (peft's matching: a module's
    name or its last parts; all-linear: every linear layer but the LM head), r x (rows + width) for an embedding."""
    if cfg.lora_r == 0:
        return total_params(config)
    shapes = weight_shapes(config)
    if cfg.lora_targets == "all-linear":
        linear = [shape for name, shape in shapes["linear"].items() if name.rsplit(".", 1)[-1] != "lm_head"]
        return cfg.lora_r * sum(i + o for i, o in linear)
    targets = [t.strip() for t in cfg.lora_targets.split(",")]
    matched = [shape for kind in ("linear", "embedding") for name, shape in shapes[kind].items()
               if lora_matches(name, targets)]
    return cfg.lora_r * sum(i + o for i, o in matched)


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


def error_text(which: tuple = GPU_ERROR) -> str:
    """A memory estimate's measured error, in words (GPU_ERROR, HOST_ERROR, or CPU_HOST_ERROR)."""
    runs, median, top = which
    if which is CPU_HOST_ERROR:
        return f"on the CPU within {median:.0%} at the median and {top:.0%} at the most of {runs} runs measured"
    return f"within {median:.1%} at the median and {top:.1%} for 95% of {runs} committed GPU runs"
