"""The predicted time of the tutorial's full pair (625 steps a variant, Without_DeepSpeed and With_DeepSpeed) on a
free Colab T4, under the tutorial's recipe (fp16, every sample padded to 512) and under the colab_t4 preset (per-batch
padding), from dsnb/timing.py and the synthetic set's lengths in both prompts (runs on the CPU).

    python benchmarks/t4_pair_estimate.py > benchmarks/results/t4_pair_estimate.md
"""
from dsnb.config import RunConfig
from dsnb.data import build_dataset, load_records
from dsnb.estimate import trainable_params
from dsnb.model import load_tokenizer, model_config
from dsnb.timing import pair_estimate, time_estimate

print("# The tutorial's pair on a T4, predicted\n\n" + __doc__.split("\n\n")[0] + "\n")
print("    python benchmarks/t4_pair_estimate.py > benchmarks/results/t4_pair_estimate.md\n")
print("| prompt | real tokens a sample | recipe | s a step | a run | the pair | rough |")
print("|---|---:|---|---:|---:|---:|---|")
for prompt in ("eos", "passage"):
    fields = dict(model="synthetic:llama-3.2-3b", dataset="synthetic", num_samples=1000, prompt=prompt)
    base = RunConfig(**fields)
    lengths = [sum(m) for m in build_dataset(base, load_tokenizer(base), load_records(base))["attention_mask"]]
    config = model_config(base.model)
    for name, cfg in (("the tutorial's (padded to 512)", base),
                      ("colab_t4 (per-batch padding)", RunConfig.layered({"preset": "colab_t4", **fields}))):
        trainable = trainable_params(cfg, config)
        est = time_estimate(cfg, lengths, config, trainable, 1, "T4")
        pair = pair_estimate(cfg, lengths, config, trainable, 1, "T4")
        print(f"| {prompt} | {sum(lengths) / len(lengths):.0f} | {name} | {est['step_seconds']:.2f} | "
              f"{est['seconds'] / 60:.0f} min | {pair / 60:.0f} min | {'; '.join(est['rough']) or 'no'} |")
print("""
The tutorial's own T4 runs took 2,424.7 s and 2,680.7 s (the pair: 85 min), which the first rows reproduce (they are
in sample: the T4's 8-bit rate is fitted to them). The colab_t4 rows are rough: no T4 was reachable from where dsnb is
built, and their floor is the H200's host work x1.5 (assumed). On the H200 the same per-batch-padded recipe measured
1.59 s a step against 0.74 s estimated (notebook01_colab_t4_h200.md), so the T4 figures may be low by as much; with
SQuAD's real passages (longer than the synthetic set's) the passage prompt's steps are longer too.""")
