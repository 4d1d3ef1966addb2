"""How many rows the throughput mode's packed batches take, over many shuffles of its data (runs on the CPU).

    python benchmarks/packed_rows.py [shuffles]

A row count that warm-up has not seen compiles again inside the timed steps; one count means one shape.
"""
import collections
import random
import sys

from dsnb.bench import bench_configs
from dsnb.data import build_dataset, first_fit, packed_rows
from dsnb.model import load_tokenizer


def main(shuffles: int = 60) -> None:
    cfg = bench_configs(False, 8, 12, "sqlite:///unused.db")["throughput_compiled"]
    lengths = [len(ids) for ids in build_dataset(cfg, load_tokenizer(cfg))["input_ids"]]
    counts = collections.Counter()
    for seed in range(shuffles):
        random.Random(seed).shuffle(lengths)
        counts.update(packed_rows(first_fit(lengths[i:i + cfg.batch_size], cfg.max_length)[1])
                      for i in range(0, len(lengths), cfg.batch_size))
    print(f"{cfg.batch_size} samples a batch, rows of {cfg.max_length} tokens, {shuffles} shuffles of "
          f"{len(lengths)} samples: " + ", ".join(f"{rows} rows in {n} batches" for rows, n in sorted(counts.items())))


if __name__ == "__main__":
    main(*map(int, sys.argv[1:]))
