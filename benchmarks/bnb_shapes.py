"""bitsandbytes' 8-bit matmul (LLM.int8: bnb.nn.Linear8bitLt, as the tutorial's 8-bit weights load) forward and
backward at the shapes one layer of the 3B shape sees in a run, micro-batch by micro-batch: every row padded to 512
tokens (max_length), each micro-batch to its longest sample (longest) or that rounded up to 64 (bucket). A shape's
first micro-batch is timed apart from its later ones (a new shape may need new kernels or matmul plans); each padding
runs in a fresh process (nothing cached from another); fp16 weights (torch's Linear) beside them.

    python benchmarks/bnb_shapes.py [--micro_batches 64] [--batch 2] [--outliers 0] [--weights 8bit,fp16] [--out FILE]
    python benchmarks/bnb_shapes.py --check        # a check of this script on the CPU: small layers, 4 micro-batches

The lengths are the synthetic set's on the passage prompt (dsnb's default), shuffled as a seeded sampler would,
--batch samples a micro-batch (the tutorial's 2). --outliers N sets N input columns to 20, above LLM.int8's threshold
of 6 (a trained model's outlier features), so bitsandbytes' mixed-precision decomposition runs. Prints one JSON line
per weights and padding (--out appends them): micro-batches, distinct shapes, tokens, the median host time of a
micro-batch's 7 matmuls forward and backward (first sight of its shape, and again), their mean GPU time, and how often
bitsandbytes fell back from its int8 kernel.
"""
import argparse
import json
import math
import multiprocessing
import random
import statistics
import sys
import time
import warnings

# in and out features of one layer's seven matmuls in the 3B shape (hidden 3072, 8 KV heads of 128, MLP 8192)
LAYER = {"q_proj": (3072, 3072), "k_proj": (3072, 1024), "v_proj": (3072, 1024), "o_proj": (3072, 3072),
         "gate_proj": (3072, 8192), "up_proj": (3072, 8192), "down_proj": (8192, 3072)}
PADDINGS = ("max_length", "longest", "bucket")


def sample_lengths(max_length: int = 512) -> list[int]:
    """The synthetic set's passage samples' real tokens, in a seeded shuffle (as a sampler takes them)."""
    from dsnb.config import RunConfig
    from dsnb.data import build_dataset
    from dsnb.model import load_tokenizer

    cfg = RunConfig(model="synthetic:llama-3.2-3b", dataset="synthetic", max_length=max_length)
    lengths = [sum(m) for m in build_dataset(cfg, load_tokenizer(cfg.replace(model="synthetic:tiny")))[
        "attention_mask"]]
    random.Random(0).shuffle(lengths)
    return lengths


def row_counts(lengths: list[int], padding: str, batch: int, count: int, max_length: int = 512) -> list[int]:
    """Rows (tokens) of each of `count` micro-batches of `batch` samples, padded as `padding` pads them."""
    from dsnb.data import BUCKET

    rows = []
    for i in range(count):
        longest = max(lengths[i * batch % len(lengths):][:batch])
        rows.append(batch * {"max_length": max_length, "bucket": math.ceil(longest / BUCKET) * BUCKET}.get(padding,
                                                                                                          longest))
    return rows


def measure(weights: str, padding: str, rows: list[int], outliers: int, scale: int, results) -> None:
    """Times one layer's matmuls over the micro-batches' row counts; puts a summary on `results`."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    layer = []
    for n_in, n_out in LAYER.values():
        n_in, n_out = n_in // scale, n_out // scale
        if weights == "8bit":
            import bitsandbytes as bnb

            layer.append(bnb.nn.Linear8bitLt(n_in, n_out, bias=False, has_fp16_weights=False, threshold=6.0))
        else:
            layer.append(torch.nn.Linear(n_in, n_out, bias=False).half().requires_grad_(False))
    layer = [m.to(device) for m in layer]  # 8-bit: quantized as it moves, as from_pretrained loads it
    seen, timings, fallbacks = set(), [], 0
    for count in rows:
        inputs = {}
        for n_in, _ in LAYER.values():
            x = torch.randn(count, n_in // scale, device=device, dtype=torch.float16)
            x[:, :outliers] = 20.0
            inputs[n_in] = x.requires_grad_()  # LoRA's adapters below need the input's gradient
        grads = [torch.randn(count, n_out // scale, device=device, dtype=torch.float16) for _, n_out in LAYER.values()]
        events = [torch.cuda.Event(enable_timing=True) for _ in range(2)] if device == "cuda" else []
        sync(device)
        start = time.perf_counter()
        if events:
            events[0].record()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for m, (n_in, _), grad in zip(layer, LAYER.values(), grads, strict=True):
                m(inputs[n_in]).backward(grad)
        if events:
            events[1].record()
        sync(device)
        host = time.perf_counter() - start
        fallbacks += sum("falling back" in str(w.message) for w in caught)
        timings.append((count, count in seen, host, events[0].elapsed_time(events[1]) / 1e3 if events else host))
        seen.add(count)
    first = [t[2] for t in timings if not t[1]]
    again = [t[2] for t in timings if t[1]]
    results.put({"weights": weights, "padding": padding, "outliers": outliers, "micro_batches": len(rows),
                 "shapes": len(seen), "tokens_mean": statistics.mean(rows),
                 "ms_first_median": 1e3 * statistics.median(first),
                 "ms_again_median": 1e3 * statistics.median(again) if again else None,
                 "ms_mean": 1e3 * statistics.mean(t[2] for t in timings),
                 "gpu_ms_mean": 1e3 * statistics.mean(t[3] for t in timings), "fallbacks": fallbacks,
                 "device": torch.cuda.get_device_name() if device == "cuda" else "cpu"})


def sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--micro_batches", type=int, default=64)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--outliers", type=int, default=0)
    p.add_argument("--weights", default="8bit,fp16")
    p.add_argument("--out", default=None)
    p.add_argument("--check", action="store_true")
    a = p.parse_args()
    count, scale = (4, 64) if a.check else (a.micro_batches, 1)
    spawn, lengths = multiprocessing.get_context("spawn"), sample_lengths()  # spawn: a fresh process, CUDA context
    for weights in a.weights.split(","):  # and bitsandbytes state for each padding
        for padding in PADDINGS:
            results = spawn.Queue()
            child = spawn.Process(target=measure, args=(weights, padding, row_counts(lengths, padding, a.batch, count),
                                                        a.outliers, scale, results))
            child.start()
            child.join()
            found = results.get() if child.exitcode == 0 else {"weights": weights, "padding": padding,
                                                                 "failed": f"exit {child.exitcode}"}
            line = json.dumps({**found, "batch": a.batch})
            print(line, flush=True)
            if a.out:
                with open(a.out, "a") as f:
                    f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
