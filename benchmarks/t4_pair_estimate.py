"""The predicted time of the tutorial's full pair (625 steps a variant, Without_DeepSpeed and With_DeepSpeed) on a
free Colab T4, under the tutorial's recipe (fp16, every sample padded to 512) and under the colab_t4 preset (per-batch
padding), from dsnb/timing.py and the synthetic set's lengths in both prompts (runs on the CPU).

    python benchmarks/t4_pair_estimate.py > benchmarks/results/t4_pair_estimate.md
"""
from dsnb.config import RunConfig
from dsnb.data import build_dataset, load_records
from dsnb.estimate import trainable_params
from dsnb.model import load_tokenizer, model_config
from dsnb.timing import faster_settings, pair_estimate, time_estimate

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
The tutorial's own T4 runs took 2,424.7 s and 2,680.7 s (the pair: 85 min), which the first rows reproduce (in sample:
the T4's 8-bit rate and offload are fitted to them). The colab_t4 rows are rough: no T4 was reachable from where dsnb is
built; their per-layer host work is the H200's x1.5 (assumed), and on the H200 8-bit weights padded per batch took 13.3
ms of host work a layer of a micro-batch against 5.9 ms padded to 512 (eight_bit_varying, fitted to notebook 01 under
colab_t4 and the capacity map's 8-bit cells; time_vs_measured_h200.md predicts notebook 01's steps +12% and +24% held
out), which these rows now count: before, they said 33-37 min. On the T4 the fewer tokens of per-batch padding still
outweigh it, since there the 8-bit matmuls' FLOPs, not the host, set most of a step; no T4 run measured it. The pair is
over an hour under colab_t4, so the plan offers faster settings (below: each the estimate and the committed H200 runs
put faster). With SQuAD's real passages (longer than the synthetic set's) the passage prompt's steps are longer too.
""")
fields = dict(model="synthetic:llama-3.2-3b", dataset="synthetic", num_samples=1000)
cfg = RunConfig.layered({"preset": "colab_t4", **fields})
lengths = [sum(m) for m in build_dataset(cfg, load_tokenizer(cfg), load_records(cfg))["attention_mask"]]
config = model_config(cfg.model)
print("Faster settings the plan offers for colab_t4's pair on a T4 (passage prompt):\n")
for line in faster_settings(cfg, lengths, config, trainable_params(cfg, config), 1, "T4"):
    print(f"- {line}")
