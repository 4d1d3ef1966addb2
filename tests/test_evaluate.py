"""Held-out evaluation: SQuAD's official metric definitions, and a quality run whose score rises with training."""
import pytest

from dsnb.evaluate import exact_match, f1, normalize_answer, squad_scores


@pytest.mark.parametrize("text, normalized", [
    ("The Eiffel Tower!", "eiffel tower"),            # case, the article, punctuation
    ("  an   apple,  a pear ", "apple pear"),         # articles anywhere, whitespace collapsed
    ("Denver Broncos", "denver broncos"),
    ("Saint-Denis", "saintdenis"),                    # SQuAD drops punctuation inside words too
    ("1636년", "1636년"),                              # Korean is left as it is
])
def test_normalization_is_squads(text, normalized):
    assert normalize_answer(text) == normalized


def test_exact_match_and_f1_follow_squads_script():
    # Examples worked by SQuAD v1.1's evaluate-v1.1.py definitions.
    assert exact_match("the Denver Broncos", "Denver Broncos") == 1.0
    assert exact_match("Broncos", "Denver Broncos") == 0.0
    assert f1("Broncos", "Denver Broncos") == pytest.approx(2 / 3)  # precision 1, recall 1/2
    assert f1("the Denver Broncos won", "Denver Broncos") == pytest.approx(0.8)  # precision 2/3, recall 1
    assert f1("Carolina Panthers", "Denver Broncos") == 0.0
    assert f1("", "Denver Broncos") == 0.0


def test_scores_take_the_best_gold_and_no_answer_expects_the_marker():
    em, f1_score = squad_scores(["Santa Clara", "정답 없음", "Paris"],
                                [["Levi's Stadium", "Santa Clara"], [], ["Rome"]])
    assert em == pytest.approx(2 / 3) and f1_score == pytest.approx(2 / 3)


@pytest.mark.integration
def test_the_quality_run_learns_the_held_out_facts(workdir):
    """The quality preset (variants/quality.yaml's command): exact match on held-out paraphrases rises from about 0
    to well above 0.5 on the CPU, with the scores, answers and timings logged to the run."""
    import json

    import mlflow

    from dsnb.config import RunConfig
    from dsnb.launch import run_variant
    from dsnb.report import quality_verdict

    result = run_variant(RunConfig.layered({"preset": "quality", "save_model": False}), progress=False)
    assert result.status == "FINISHED", result
    m = result.metrics
    assert m["eval_questions"] == 72
    assert m["eval_exact_match_before"] < 0.1 and m["eval_exact_match"] > 0.6, m
    assert m["eval_f1"] >= m["eval_exact_match"] and m["eval_tokens_per_second"] > 0
    assert quality_verdict(result).startswith("Training taught the model (held-out exact match rose by more than "
                                              "0.5): yes")
    client = mlflow.MlflowClient(result.tracking_uri.replace("sqlite:///", f"sqlite:///{workdir}/"))
    rows = json.load(open(client.download_artifacts(result.run_id, "answers.json", str(workdir))))
    assert len(rows) == 72 and {"question", "gold", "before", "after"} <= set(rows[0])
    assert sum(r["after"] in r["gold"] for r in rows) == round(72 * m["eval_exact_match"])
