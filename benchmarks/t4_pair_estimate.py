"""The predicted time of the tutorial's full pair (625 steps a variant, Without_DeepSpeed and With_DeepSpeed) on a
free Colab T4, under the tutorial's recipe (fp16, every sample padded to 512), under the colab_t4 preset (each batch
padded to a multiple of 64 tokens) and under the preset as it was before gpu_runs.sh t4pad (each batch padded to its
longest sample), from dsnb/timing.py and the synthetic set's lengths in both prompts (runs on the CPU).

    python benchmarks/t4_pair_estimate.py > benchmarks/results/t4_pair_estimate.md
"""
from dsnb.config import RunConfig
from dsnb.data import build_dataset, load_records
from dsnb.estimate import trainable_params
from dsnb.model import load_tokenizer, model_config
from dsnb.timing import HOST_FACTOR, RATES, faster_settings, pair_estimate, time_estimate

print("# The tutorial's pair on a T4, predicted\n\n" + __doc__.split("\n\n")[0] + "\n")
print("    python benchmarks/t4_pair_estimate.py > benchmarks/results/t4_pair_estimate.md\n")
print("| prompt | real tokens a sample | recipe | s a step | a run | the pair | rough |")
print("|---|---:|---|---:|---:|---:|---|")
for prompt in ("eos", "passage"):
    fields = dict(model="synthetic:llama-3.2-3b", dataset="synthetic", num_samples=1000, prompt=prompt)
    base = RunConfig(**fields)
    preset = RunConfig.layered({"preset": "colab_t4", **fields})
    lengths = [sum(m) for m in build_dataset(base, load_tokenizer(base), load_records(base))["attention_mask"]]
    config = model_config(base.model)
    for name, cfg in (("the tutorial's (padded to 512)", base),
                      (f"colab_t4 (padding {preset.padding})", preset),
                      ("colab_t4 before t4pad (padding longest)", preset.replace(padding="longest"))):
        trainable = trainable_params(cfg, config)
        est = time_estimate(cfg, lengths, config, trainable, 1, "T4")
        pair = pair_estimate(cfg, lengths, config, trainable, 1, "T4")
        print(f"| {prompt} | {sum(lengths) / len(lengths):.0f} | {name} | {est['step_seconds']:.2f} | "
              f"{est['seconds'] / 60:.0f} min | {pair / 60:.0f} min | {'; '.join(est['rough']) or 'no'} |")
floor, varying = 1e3 * RATES["trainer_layer_8bit"], 1e3 * RATES["eight_bit_varying"]
print(f"""
The tutorial's own T4 runs took 2,424.7 s and 2,680.7 s (the pair: 85 min), which the rows padded to 512 reproduce (in
sample: the T4's 8-bit rate and offload are fitted to them). The colab_t4 rows are rough: no T4 was reachable from
where dsnb is built, and their per-layer host work is the H200's x{HOST_FACTOR['T4']} (assumed). On the H200, 8-bit
weights take {floor:.1f} ms of host work a layer of a micro-batch at few lengths (512 or bucket) and {varying:.1f} ms
more where each batch has its own length (time_vs_measured_h200.md); gpu_runs.sh t4pad measured the preset's recipe
padded to bucket at 0.89 s a step, to 512 at 1.15 s and to each batch's longest sample at 1.48 s, so the preset pads
to bucket. On a T4 the 8-bit matmuls' FLOPs set more of a step than on the H200, so bucket's fewer tokens against
512 count for more there; no T4 run measured it. With SQuAD's real passages (longer than the synthetic set's) the
passage prompt's steps are longer too.
""")
fields = dict(model="synthetic:llama-3.2-3b", dataset="synthetic", num_samples=1000)
cfg = RunConfig.layered({"preset": "colab_t4", **fields})
lengths = [sum(m) for m in build_dataset(cfg, load_tokenizer(cfg), load_records(cfg))["attention_mask"]]
config = model_config(cfg.model)
print("Settings that shorten colab_t4's pair on a T4 by the estimate (passage prompt; the plan offers them where the "
      "pair takes over an hour):\n")
for line in faster_settings(cfg, lengths, config, trainable_params(cfg, config), 1, "T4"):
    print(f"- {line}")
