"""The model card: what a saved folder tells whoever finds it, and nothing of the machine it was made on."""
import pytest

from dsnb.card import card, portable_config, write_card
from dsnb.config import OFFLINE, RunConfig

MEASURED = {"samples_per_second": 12.5, "tokens_per_second": 1000.0, "mfu": 0.01, "peak_cpu_rss_mb": 900.0,
            "eval_exact_match_before": 0.0, "eval_exact_match": 0.5, "eval_f1_before": 0.1, "eval_f1": 0.6,
            "eval_questions": 8.0, "host_cores": 2.0, "host_steal_share": 0.0}


@pytest.mark.parametrize("other, steal, caveat", [
    (0.1, 0.0, ""),
    (1.2, 0.0, "; timed on a busy machine (other processes used 1.2 of its 2 cores): not this run's speed alone"),
    (0.0, 0.2, "; timed on a busy machine (the hypervisor took 20% of its CPU time)"),  # no "used 0.0 of its cores"
    (0.9, 0.2, "; timed on a busy machine (other processes used 0.9 of its 2 cores, the hypervisor took 20% of its "
               "CPU time)"),
])
def test_the_speed_a_card_shows_carries_the_busy_machine_caveat_the_verdict_does(other, steal, caveat):
    text = card(RunConfig(**OFFLINE), {**MEASURED, "host_other_cores": other, "host_steal_share": steal}, "r1",
                "adapter", {}, "squad")
    speed = next(line for line in text.splitlines() if line.startswith("| speed |"))
    assert speed.endswith(" |") and (caveat in speed if caveat else "busy" not in speed), speed


def test_a_card_says_how_the_answers_were_scored(tmp_path):
    """The run's scoring_mode where it logged one, else the config's scoring."""
    cfg = RunConfig(**OFFLINE, scoring="korquad")
    write_card(str(tmp_path), cfg, MEASURED, "r", "adapter")
    assert "| scoring | korquad (KorQuAD 1.0's" in (tmp_path / "README.md").read_text()
    assert "| scoring | korquad (KorQuAD 1.0's, F1 over characters) |" in card(cfg, MEASURED, "r", "adapter", {},
                                                                               "korquad")
    assert "| scoring | squad (SQuAD v1.1's normalization, F1 over words) |" in card(cfg, MEASURED, "r", "adapter",
                                                                                       {}, "squad")
    unscored = {k: v for k, v in MEASURED.items() if not k.startswith("eval_")}
    assert "scoring" not in card(cfg, unscored, "r", "adapter", {}, "korquad")


def test_the_config_a_saved_folder_carries_names_no_place(tmp_path):
    data = tmp_path / "me" / "my_squad.jsonl"
    cfg = RunConfig.layered(OFFLINE, {"results_folder": str(tmp_path / "drive"), "dataset": str(data),
                                      "strategy": "zero2", "ds_config_path": str(tmp_path / "ds.json")})
    values = portable_config(cfg)
    assert str(tmp_path) not in repr(values) and values["dataset"] == "my_squad.jsonl"
    assert values["ds_config_path"] == "ds.json" and values["model"] == "synthetic:tiny"
    assert RunConfig.from_dict(values).strategy == "zero2"  # read back whole, the places at their defaults


def test_each_figure_on_a_card_says_what_it_can_mean():
    """A held-out score carries its 95% interval over its questions; MFU on the CPU names the peak it assumed; a
    synthetic model's scores say what they measure: nothing of a real model, or (the quality preset's model, trained to
    answer) the toy task, never "random weights" beside scores it learned."""
    import math

    from dsnb.metrics import scores_text

    def covers(p: float, n: int, lo: float, hi: float) -> bool:  # Wilson's interval: |p - x| = z sqrt(x(1-x)/n) at ends
        return all(abs(abs(p - x) - 1.96 * math.sqrt(x * (1 - x) / n)) < 0.006 for x in (lo, hi))

    text = scores_text({"eval_exact_match": 0.76, "eval_questions": 72.0}, "eval")
    lo, hi = map(float, text.split("95% interval ")[1].split(")")[0].split("-"))
    assert lo < 0.76 < hi and covers(0.76, 72, lo, hi) and 0.17 < hi - lo < 0.22, text
    assert "(95% interval 0.00-0.05)" in scores_text({"eval_exact_match": 0.0, "eval_questions": 72.0}, "eval")
    cpu = card(RunConfig(**OFFLINE), MEASURED, "r", "adapter", {}, "squad")
    assert "MFU 1.0% of the CPU's nominal fp32 peak (assumed" in cpu and "say nothing about a real model" in cpu
    assert "(95% interval" in cpu
    quality = card(RunConfig(**OFFLINE, preset="quality"), MEASURED, "r", "adapter", {}, "squad")
    assert "the scores measure that toy task" in quality and "say nothing" not in quality
    gpu = card(RunConfig(**OFFLINE), {**MEASURED, "peak_gpu_allocated_mb": 900.0, "peak_gpu_nvml_mb": 1000.0}, "r",
               "adapter", {}, "squad")
    assert "MFU 1.0%" in gpu and "CPU's nominal" not in gpu


def test_a_cards_recipe_names_the_seed_the_loop_and_the_device_the_run_trained_with():
    """A repeat trains with seed + repeat, and its card says that seed (the model reloads to its run's numbers only
    with it); the loop that trained it; GPUs only where it trained on GPUs; DeepSpeed among the tags only where used."""
    def recipe_line(text):
        return next(line for line in text.splitlines() if line.startswith("| recipe |"))

    repeat = card(RunConfig(**OFFLINE, repeat=1, strategy="zero2"), MEASURED, "r", "adapter", {}, "squad")
    assert "the HF Trainer;" in recipe_line(repeat) and recipe_line(repeat).endswith(", seed 43 (42 + repeat 1) |")
    assert "x 1 CPU process(es)" in recipe_line(repeat) and "GPU" not in recipe_line(repeat)
    assert "tags: [dsnb, deepspeed, lora, question-answering]" in repeat
    on_gpu = {**MEASURED, "peak_gpu_allocated_mb": 900.0, "peak_gpu_nvml_mb": 1000.0}
    gpu = card(RunConfig(**OFFLINE, torch_compile=True, quantization="none"), on_gpu, "r", "adapter", {}, "squad")
    assert "dsnb's compiled loop;" in recipe_line(gpu) and recipe_line(gpu).endswith("x 1 GPU(s), 8 steps, seed 42 |")
    assert "tags: [dsnb, lora, question-answering]" in gpu  # no DeepSpeed in this run
