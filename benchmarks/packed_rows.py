"""Rows and real tokens of the throughput mode's batches, packed a batch at a time against filled before training
(runs on the CPU, on the synthetic set the H200 runs used).

    python benchmarks/packed_rows.py [shuffles]

padding packed: 256 samples a batch packed into the rows they need, over many shuffles (a row count that warm-up
has not seen compiles again inside the timed steps; one count means one shape). padding filled (the bench's
throughput mode as nvidia_h200.md measured it: the closed-book prompt, 24 rows of 512 tokens): every sample placed
once in rows of 512 tokens, then batch_size rows a step.
"""
import collections
import random
import sys

from dsnb.bench import bench_configs
from dsnb.data import build_dataset, fill_rows, best_fit, packed_rows
from dsnb.model import load_tokenizer


def main(shuffles: int = 60) -> None:
    cfg = bench_configs(False, 8, 12, "sqlite:///unused.db")["throughput_compiled"].replace(
        max_length=512, batch_size=24, prompt="eos")  # as nvidia_h200.md's run (the bench now: 12 x 1024, passage)
    tokenizer = load_tokenizer(cfg)
    samples = build_dataset(cfg.replace(num_samples=1024), tokenizer)
    lengths = [len(ids) for ids in samples["input_ids"]]
    counts: collections.Counter = collections.Counter()
    for seed in range(shuffles):
        random.Random(seed).shuffle(lengths)
        counts.update(packed_rows(best_fit(lengths[i:i + 256], cfg.max_length)[1])
                      for i in range(0, len(lengths), 256))
    batches = sum(counts.values())
    real = sum(lengths) * shuffles / (sum(rows * n for rows, n in counts.items()) * cfg.max_length)
    print(f"packed: 256 samples a batch, rows of {cfg.max_length} tokens, {shuffles} shuffles of {len(lengths)} "
          "samples: " + ", ".join(f"{rows} rows in {n} batches" for rows, n in sorted(counts.items()))
          + f" of {batches}; {real:.1%} real tokens")
    samples = build_dataset(cfg, tokenizer)
    rows = fill_rows(samples, cfg.max_length)
    real = sum(sum(m) for m in samples["attention_mask"]) / (len(rows) * cfg.max_length)
    print(f"filled: {len(samples)} samples in {len(rows)} rows of {cfg.max_length} tokens, {real:.1%} real tokens; "
          f"{cfg.batch_size} rows a step hold about {cfg.batch_size * len(samples) / len(rows):.0f} samples")


if __name__ == "__main__":
    main(*map(int, sys.argv[1:]))
