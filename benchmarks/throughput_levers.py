"""The throughput mode with one lever changed, in this process: what each lever buys toward 50% MFU.

    python benchmarks/throughput_levers.py LEVER [--untimed 8] [--steps 12] [--out FILE] [--profile step.txt]   # GPU

LEVER is one of:
  base     the throughput mode as it first was: 256 samples a step packed into rows of 512 tokens (padding packed),
           attention with SDPA through the block-diagonal mask transformers builds from the restarting position ids
  flex     base with attention flex: transformers' packed-sequence BlockMask, built inside the compiled graph, so the
           128 x 128 blocks where no sample meets another are skipped
  filled   the bench's throughput_compiled as it was measured here: flex, and 24 rows of 512 tokens a step filled
           before training with as many samples as fit (padding filled), instead of 256 samples packed into the rows a
           batch needs (92% real tokens); the bench now fills 12 rows of 1024 (gpu_runs.sh rows measures row lengths)
  nodrop   filled with LoRA dropout 0 instead of the tutorial's 0.05 (its random masks are elementwise work)
  cdt      base with inductor's coordinate-descent tuning of its Triton kernels (norms, rotary, SiLU)
  rows256  base with rows of 256 tokens (attention per token halves; more of each row is tail padding)
  now      the bench's throughput_compiled as it is (12 rows of 1024 tokens, the passage prompt), LoRA's dropout masks
           drawn by dsnb's own kernel, four to a Philox call (dsnb/dropout.py)
  autotune now with inductor's max-autotune for the matmuls (max_autotune_gemm: Triton's templates, persistent with
           TMA on an H100 or H200, timed against cuBLAS shape by shape), so a template that wins can take the
           elementwise work after it (norms, SiLU, rotary, LoRA's add) into its own epilogue; the cold compile is longer
  inddrop  now with inductor's dropout instead, one Philox call an element inside the kernel that uses the mask
  repeatkv now with transformers' own flex attention, which copies each key/value head for its group of query heads
           where the query heads are not a power of two (the 3B's 24 over 8), as dsnb did before
           model.attend_to_grouped_heads
  fp8      now with the frozen weights in fp8 (quantization fp8: every Linear but the LM head, fp8_head false) as dsnb
           ran it before fp8_head: fast accumulation in both passes (fp8_fast_accum both; measured as fp8fast before it
           was the default). dsnb's default since makes the head's forward fp8 too (fp8_head; fp8_head_h100.md)
  fp8exact fp8 with fp32 accumulation (fp8_fast_accum none; dsnb's fp8 until a56cbce, the lever fp8 until then)
  fp8fastfwd  fp8 with fast accumulation in the forward's matmuls only (fp8_fast_accum forward: torchao's float8 choice)
  fp8head  fp8 with the LM head in fp8 too (issue 38's 1.3x: the head is ~12% of the step's matmul FLOPs, and its
           logits' matmul stays bf16 in fp8; Llama 3.2's head is its input embedding: the head gets an fp8 copy, the
           embedding lookup stays bf16). Its mean loss against fp8's says what fp8 logits cost (measured as
           fp8headfast at 129e5ba; fp8head until a56cbce accumulated in fp32)
  chunk    now with the loss chunked (loss_chunk 1024, dsnb/loss.py): the LM head and cross-entropy 1,024 tokens at a
           time, each chunk's gradient made in its forward, so the 12,288 tokens' whole logits are never held
  chunk24  chunk with 24 rows of 1024 tokens a micro-batch, twice the bench's (which whole logits leave no room for on
           an 80 GB GPU)
  ropecompute  now with rotary's cos and sin computed where they are used, as inductor compiled them before the
           compiled loop read them from a table of positions (dsnb.loop.rotary_tables)
  logitsout  now with the whole model compiled, its logits an output, as the compiled loop ran before it returned
           only the loss (dsnb.loop.loss_only): each step a zero gradient the size of the logits, copied by CUDA graphs
  multikernel  now with inductor's multi-kernel reductions (triton.multi_kernel 1): each reduction over a row of up to
           16,384 elements (the norms' 3,072) compiled persistent too, the row held in registers instead of read twice
           through an fp32 scratch buffer, and the faster of the two kept by timing both on the first call
  --offline: the CPU's offline variant (a check of this script; flex has no backward on the CPU)

Prints (and with --out appends) one JSON line: the lever, samples/s, real tokens/s, MFU, step time and mean loss
(h200_runs/throughput_levers.jsonl adds which GPU call each line came from, by hand).
"""
import argparse
import json
import sys


def main() -> None:
    from dsnb import train
    from dsnb.bench import bench_configs

    p = argparse.ArgumentParser()
    p.add_argument("lever", choices=("base", "flex", "filled", "nodrop", "cdt", "rows256", "now", "autotune", "inddrop",
                                     "repeatkv", "fp8", "fp8exact", "fp8fastfwd", "fp8head", "chunk", "chunk24",
                                     "ropecompute", "multikernel", "logitsout"))
    p.add_argument("--untimed", type=int, default=8)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--out", default=None)
    p.add_argument("--tracking_uri", default="sqlite:////tmp/throughput_levers.db")
    p.add_argument("--offline", action="store_true")
    p.add_argument("--profile", default="", help="write the last untimed step's profile here (RunConfig.profile)")
    a = p.parse_args()
    cfg = bench_configs(a.offline, a.untimed, a.steps, a.tracking_uri)["throughput_compiled"]
    cfg = cfg.replace(run_name=f"throughput_{a.lever}", experiment="dsnb_throughput_levers", profile=a.profile)
    tune_inductor(a.lever)
    if a.lever in ("now", "autotune", "inddrop", "multikernel", "logitsout", "ropecompute", "repeatkv"):
        undo(a.lever)
        return record(a, train.train(cfg.replace(dropout_kernel=a.lever != "inddrop")))
    if a.lever in ("chunk", "chunk24"):
        rows = 2 * cfg.batch_size if a.lever == "chunk24" else cfg.batch_size
        return record(a, train.train(cfg.replace(loss_chunk=1024, batch_size=rows)))
    if a.lever in ("fp8", "fp8exact", "fp8fastfwd", "fp8head"):
        if a.lever == "fp8head":
            head_in_fp8()
        accum = {"fp8exact": "none", "fp8fastfwd": "forward"}.get(a.lever, "both")  # each with the head as measured
        return record(a, train.train(cfg.replace(quantization="fp8", fp8_fast_accum=accum, fp8_head=False)))
    cfg = cfg.replace(max_length=128 if a.offline else 512, batch_size=cfg.batch_size if a.offline else 24,
                      prompt="eos")  # as the first levers were measured: closed-book samples, rows of 512
    if a.lever in ("base", "flex", "cdt", "rows256"):  # 256 samples a step (offline 16), packed as a batch needs
        cfg = cfg.replace(padding="packed", batch_size=16 if a.offline else 256, num_samples=64 if a.offline else 1024,
                          attention="flex" if a.lever == "flex" else "sdpa")
    if a.lever == "nodrop":
        cfg = cfg.replace(lora_dropout=0.0)
    elif a.lever == "rows256":
        cfg = cfg.replace(max_length=256)
    record(a, train.train(cfg))


def tune_inductor(lever: str) -> None:
    """cdt, autotune and multikernel: inductor's own tuning, set before the loop compiles."""
    import torch._inductor.config as inductor

    if lever == "cdt":
        inductor.coordinate_descent_tuning = True
    elif lever == "multikernel":
        inductor.triton.multi_kernel = 1
    elif lever == "autotune":
        inductor.max_autotune_gemm = True
        inductor.triton.enable_persistent_tma_matmul = True


def undo(lever: str) -> None:
    """logitsout, ropecompute and repeatkv: one of dsnb's own levers put back as it was before it."""
    import contextlib

    from dsnb import loop, model

    if lever == "logitsout":
        loop.loss_only = lambda trainer: trainer.model  # the model compiled whole, its logits an output
    elif lever == "ropecompute":
        loop.rotary_tables = lambda model, rows: contextlib.ExitStack()  # the rotary module's own forward, compiled
    elif lever == "repeatkv":
        model.attend_to_grouped_heads = lambda: None  # transformers' flex_attention_forward stays registered


def head_in_fp8() -> None:
    """dsnb's fp8 quantization (dsnb.fp8.quantize_linears, which model.load_model calls) with the LM head made an
    Fp8Linear too, untied from the input embedding (which keeps its bf16 weight for the lookup)."""
    from dsnb import fp8

    every_linear_but_the_head = fp8.quantize_linears

    def with_head(model, fast_accum: str = "both", head: bool = False) -> int:  # head: dsnb's own (fp8_head), off here
        count = every_linear_but_the_head(model, fast_accum, head)
        model.config.tie_word_embeddings = False  # a later tie_weights() would put the bf16 embedding back in the head
        model.set_output_embeddings(fp8.Fp8Linear(model.get_output_embeddings(), fast_accum))
        return count + 1

    fp8.quantize_linears = with_head


def record(a, metrics: dict) -> None:
    keys = ("samples_per_second", "tokens_per_second", "mfu", "step_time_ms", "train_loss", "peak_gpu_allocated_mb",
            "peak_gpu_nvml_mb", "est_peak_gpu_mb")
    line = json.dumps({"lever": a.lever, **{k: metrics.get(k) for k in keys}})
    print(line)
    if a.out:
        with open(a.out, "a") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    sys.exit(main())
