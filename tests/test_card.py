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
    (0.0, 0.2, "; timed on a busy machine (other processes used 0.0 of its 2 cores, the hypervisor took 20%)"),
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
