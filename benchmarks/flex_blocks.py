"""The throughput mode's attention alone: flex attention's forward and backward on its filled rows, block by block.

    python benchmarks/flex_blocks.py SETTING [--out FILE]      # on the GPU machine, one setting a process
    python benchmarks/flex_blocks.py 128 --offline             # a check of this script on the CPU (forward only)

Issue 38 lists "the attention of filled rows" among the levers toward 60% MFU: flex attention took 23 ms of a 315 ms
step (profile_throughput_gqa_h100.txt), about 4x the time its reads and writes need. The rows are the bench's own
(bench.yaml throughput_compiled: 12 rows of 1,024 tokens filled with the passage prompt's samples by best fit, as
dsnb.data.fill_rows makes them); each sample attends to itself, causally, as transformers' mask for restarting position
ids says. The 3B shape's heads: 24 query heads over 8 key/value heads (enable_gqa), 128 wide, bf16.

SETTING is one of:
  128      the BlockMask dsnb builds today (128 x 128 blocks) and inductor's default kernel configs
  128auto  the same mask, inductor autotuning flex's kernel configs (max_autotune: its list of configs, timed)
  64auto   64 x 64 blocks (more of each row's blocks skipped: the samples average ~81 tokens), configs autotuned
           (inductor's default backward config on sm90 takes 128-wide blocks and so refuses a 64-token mask)
  64       64 x 64 blocks with the default configs: on sm90 it is expected to fail, and the failure is recorded

Prints (and with --out appends) one JSON line: the setting, the mask's block sparsity, the median forward and
forward + backward times of 20 calls (CUDA events), the GPU, and any error.
"""
import argparse
import json
import statistics
import sys


def rows(offline: bool):
    """The bench's throughput rows: position ids (rows x max_length) and the rows' count, from dsnb's own data."""
    import random

    from dsnb.bench import bench_configs
    from dsnb.data import FilledCollator, build_dataset, fill_rows
    from dsnb.model import load_tokenizer

    cfg = bench_configs(offline, 2, 4, "sqlite:////tmp/flex_blocks.db")["throughput_compiled"]
    tokenizer = load_tokenizer(cfg)
    filled = fill_rows(build_dataset(cfg, tokenizer), cfg.max_length)
    take = random.Random(0).sample(range(len(filled)), min(cfg.batch_size, len(filled)))
    batch = FilledCollator(tokenizer.pad_token_id, cfg.max_length, cfg.batch_size)([filled[i] for i in take])
    return batch["position_ids"], cfg


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("setting", choices=("128", "128auto", "64", "64auto"))
    p.add_argument("--out", default=None)
    p.add_argument("--offline", action="store_true")
    a = p.parse_args()
    import torch
    import torch._inductor.config as inductor
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    positions, cfg = rows(a.offline)
    device = "cuda" if torch.cuda.is_available() and not a.offline else "cpu"
    docs = (positions == 0).cumsum(1).to(device)  # a sample (or a row's padding tail) per restart of the positions
    batch, length = docs.shape
    heads, kv_heads, width = (24, 8, 128) if not a.offline else (4, 2, 16)
    block = 64 if a.setting.startswith("64") else 128
    inductor.max_autotune = a.setting.endswith("auto")

    def same_sample_causal(b, h, q, kv):
        return (docs[b, q] == docs[b, kv]) & (q >= kv)

    mask = create_block_mask(same_sample_causal, batch, None, length, length, device=device, BLOCK_SIZE=block)
    attend = torch.compile(flex_attention)
    g = torch.Generator(device=device).manual_seed(0)
    dtype = torch.bfloat16

    def tensor(h):
        made = torch.randn(batch, h, length, width, device=device, dtype=dtype, generator=g)
        return made.requires_grad_(device != "cpu")  # flex has no backward on the CPU

    q, k, v = tensor(heads), tensor(kv_heads), tensor(kv_heads)
    grad = torch.randn(batch, heads, length, width, device=device, dtype=dtype, generator=g)
    line = {"setting": a.setting, "block": block, "sparsity_pct": round(float(mask.sparsity()), 2),
            "gpu": torch.cuda.get_device_name() if device == "cuda" else "cpu",
            "runs_a_row": round(float(docs.max(1).values.float().mean()), 1)}  # samples, and a padding tail
    try:
        line.update(timed(attend, mask, q, k, v, grad, device))
    except Exception as e:  # a setting inductor refuses is a result too
        line["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    text = json.dumps(line)
    print(text)
    if a.out:
        with open(a.out, "a") as f:
            f.write(text + "\n")


def timed(attend, mask, q, k, v, grad, device: str) -> dict:
    """Median milliseconds of 20 forward calls and 20 forward + backward calls, after 3 untimed of each."""
    import torch

    def forward():
        with torch.no_grad():
            attend(q, k, v, block_mask=mask, enable_gqa=True)

    def both():
        attend(q, k, v, block_mask=mask, enable_gqa=True).backward(grad)

    out = {}
    for name, call in (("forward_ms", forward), ("forward_backward_ms", both)):
        if device == "cpu":  # flex has no backward on the CPU: the check runs the forward once
            if name == "forward_ms":
                call()
            continue
        for _ in range(3):
            call()
        times = []
        for _ in range(20):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        out[name] = round(statistics.median(times), 3)
    return out


if __name__ == "__main__":
    sys.exit(main())
