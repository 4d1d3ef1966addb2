"""Held-out evaluation: SQuAD's and KorQuAD's official metric definitions, answers that stop where a turn ends, the
paired test that judges two variants' answers (its false-alarm rate at equal skill), and a quality run whose score
rises with training."""
import random

import pytest

from dsnb.config import OFFLINE, RunConfig
from dsnb.evaluate import (cut_at_stop, exact_match, f1, normalize_answer, question_scores, scoring_mode, squad_scores,
                           stop_tokens)


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


@pytest.mark.parametrize("prediction, gold, em, f1_char", [
    ("서울에", "서울", 0.0, 0.8),                   # a particle: partial credit over characters
    ("서울입니다.", "서울", 0.0, 4 / 7),            # the copula and the full stop (precision 2/5, recall 1)
    ("1398", "1398년", 0.0, 8 / 9),                 # the counter 년
    ("1398년", "1398", 0.0, 8 / 9),                 # KorQuAD's script: 0.889 (a gold without Hangul, as KorQuAD has)
    ("BTS는", "BTS", 0.0, 6 / 7),                   # KorQuAD's script: 0.857 (lower case, the particle 는)
    ("《토지》", "토지", 1.0, 1.0),                  # KorQuAD drops the title brackets
    ("세종대왕", "세종 대왕", 0.0, 1.0),            # the same characters: full F1, spacing aside
    ("서울", "서울", 1.0, 1.0),  # NFD Hangul (as macOS writes it) is NFC's text
])
def test_korean_answers_are_scored_as_korquad_does(prediction, gold, em, f1_char):
    """KorQuAD 1.0's official evaluate script (quotes and brackets to spaces, lower case, punctuation removed, F1 over
    the characters of the words), worked by hand; SQuAD's English normalization gives most of these F1 0."""
    assert exact_match(prediction, gold, "korquad") == em
    assert f1(prediction, gold, "korquad") == pytest.approx(f1_char)
    if gold != "서울" or prediction.isascii():
        return
    assert f1(prediction, gold, "squad") == 0.0 or prediction.startswith("\u1109")


def test_a_run_scores_every_question_one_way_decided_by_the_data_set(tmp_path):
    """scoring auto: KorQuAD's for dataset korquad, SQuAD's for squad (no data read), and for a file or the synthetic
    set one mode from its passages and questions, so a Korean set's gold "1398" or "BTS" earns KorQuAD's credit (per
    gold, the old rule gave these F1 0), an English set's Korean name SQuAD's; the same for every variant."""
    import json

    korean = tmp_path / "ko.jsonl"
    korean.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in [
        {"context": "세종은 1398년에 태어났다.", "question": "세종은 언제 태어났나?", "answer": "1398"},
        {"context": "BTS는 2013년에 데뷔했다.", "question": "2013년에 데뷔한 그룹은?", "answer": "BTS"},
        {"context": "Seoul is a city.", "question": "What is Seoul?", "answer": "a city"}]))
    cfg = RunConfig(**dict(OFFLINE, dataset=str(korean), num_samples=2))
    each = question_scores(["1398년", "BTS는"], [["1398"], ["BTS"]], scoring_mode(cfg))
    assert [f for _, f in each] == [pytest.approx(8 / 9), pytest.approx(6 / 7)]
    assert {scoring_mode(c) for c in (cfg, cfg.replace(strategy="zero2", seed=3, num_samples=1))} == {"korquad"}
    assert scoring_mode(RunConfig(**dict(OFFLINE, dataset="korquad"))) == "korquad"
    assert scoring_mode(RunConfig(**dict(OFFLINE, dataset="squad"))) == "squad"
    assert scoring_mode(RunConfig(**OFFLINE)) == "korquad"  # half its rows Korean
    english = tmp_path / "en.jsonl"
    english.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in [
        {"context": "The capital is 서울.", "question": "What is the capital?", "answer": "서울"},
        {"context": "The river is long.", "question": "What is long?", "answer": "The river"},
        {"context": "The hill is high.", "question": "What is high?", "answer": "The hill"}]))
    cfg = RunConfig(**dict(OFFLINE, dataset=str(english), num_samples=1))
    assert scoring_mode(cfg) == "squad" and scoring_mode(cfg.replace(scoring="korquad")) == "korquad"
    assert question_scores(["river"], [["The river"]], scoring_mode(cfg)) == [(1.0, 1.0)]


def test_answers_stop_at_every_token_that_ends_a_turn():
    """A chat template whose turns end with a token other than the end-of-sequence one (Llama 3's <|eot_id|> beside
    <|end_of_text|>): generation stops at it, and an answer never runs on into the next role's name."""
    from transformers import AutoTokenizer

    from dsnb.config import OFFLINE, RunConfig
    from dsnb.model import tokenizer_path

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path(RunConfig(**OFFLINE).model))
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|eot_id|>", "<|start_header_id|>"]})
    tokenizer.chat_template = ("{% for m in messages %}<|start_header_id|>{{ m['role'] }}\n{{ m['content'] }}"
                               "<|eot_id|>{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant\n"
                               "{% endif %}")
    eot = tokenizer.convert_tokens_to_ids("<|eot_id|>")
    stops = stop_tokens(tokenizer)
    assert eot in stops and tokenizer.eos_token_id in stops
    answer = tokenizer("Denver Broncos", add_special_tokens=False)["input_ids"]
    header = tokenizer.convert_tokens_to_ids("<|start_header_id|>")
    generated = answer + [eot, header] + tokenizer("user", add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(cut_at_stop(generated, stops)) == "Denver Broncos"
    assert cut_at_stop(answer, stops) == answer


def test_the_paired_held_out_test_holds_its_false_alarm_rate_at_equal_skill():
    """The paired test at equal skill (each question its own difficulty, both variants answering it alike in
    distribution): it reports a difference at most ALPHA of the time, and near it; it sees a real gap of 0.15 in
    exact match on 64 questions most of the time; six scores of 0 are no signal, not agreement."""
    from dsnb.report import ALPHA, paired_test, same_answers

    rng = random.Random(0)

    def runs(difficulty, skill, repeats):
        return [{q: float(rng.random() < min(1.0, p + skill)) for q, p in difficulty.items()} for _ in range(repeats)]

    for repeats, skill in ((1, 0.0), (3, 0.0)):
        alarms = 0
        for _ in range(400):
            difficulty = {f"q{i}": rng.choice([0.05, 0.5, 0.8, 0.95]) for i in range(64)}
            alarms += paired_test(runs(difficulty, skill, repeats), runs(difficulty, skill, repeats))["p"] < ALPHA
        assert 0.01 <= alarms / 400 <= ALPHA + 0.02, (repeats, alarms)
    found = 0
    for _ in range(100):
        difficulty = {f"q{i}": 0.6 for i in range(64)}
        found += paired_test(runs(difficulty, 0.0, 3), runs(difficulty, 0.25, 3))["p"] < ALPHA
    assert found > 80
    zeros = [{f"q{i}": 0.0 for i in range(64)}] * 3
    assert same_answers(zeros, zeros)["signal"] is False


def test_the_rank_test_gives_the_false_alarm_rate_of_non_overlapping_ranges():
    from dsnb.report import rank_test_p

    assert rank_test_p([1, 2, 3], [4, 5, 6]) == pytest.approx(0.1)  # 2 x 3! 3! / 6!
    assert rank_test_p([1, 2, 3, 4], [5, 6, 7, 8]) == pytest.approx(2 / 70)
    assert rank_test_p([1, 5, 3], [4, 2, 6]) > 0.5


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
    assert m["eval_questions"] == 72 and "recall_exact_match" not in m  # reading the passage: no recall needed
    assert m["eval_exact_match_before"] < 0.1 and m["eval_exact_match"] > 0.6, m
    assert m["eval_f1"] >= m["eval_exact_match"] and m["eval_tokens_per_second"] > 0
    assert quality_verdict(result).startswith("Training taught the model (held-out exact match rose by more than "
                                              "0.5): yes\nheld-out, reading the passage: exact match")
    client = mlflow.MlflowClient(result.tracking_uri.replace("sqlite:///", f"sqlite:///{workdir}/"))
    rows = json.load(open(client.download_artifacts(result.run_id, "answers.json", str(workdir))))
    assert len(rows) == 72 and {"set", "id", "question", "gold", "before", "after", "after_em"} <= set(rows[0])
    assert sum(r["after_em"] for r in rows) == round(72 * m["eval_exact_match"])
    params = client.get_run(result.run_id).data.params
    assert (params["eval_task"], params["scoring_mode"], params["eval_pool"], params["attention_used"]) == (
        "reading the passage", "korquad", "72", "sdpa")  # the attention the loaded model ran, not the field asked


@pytest.mark.integration
def test_a_closed_book_run_is_labelled_so_and_scored_on_trained_questions_too(workdir):
    """The tutorial's closed-book text: held-out scores are labelled as what the model knew, wherever they are shown
    (summary, table, MLflow), and the trained questions are asked again (recall), so the run still shows learning."""
    import mlflow

    from dsnb.config import OFFLINE, RunConfig
    from dsnb.launch import run_variant
    from dsnb.report import compare_table, run_summary

    cfg = RunConfig(**dict(OFFLINE, prompt="eos", max_steps=2, eval_samples=4, save_model=False))
    result = run_variant(cfg, progress=False)
    assert result.status == "FINISHED", result
    m = result.metrics
    assert m["eval_questions"] == 4 and m["recall_questions"] == 4
    assert {"recall_exact_match", "recall_exact_match_before", "recall_f1"} <= set(m)
    task = "closed-book: paraphrases of trained facts"
    uri = result.tracking_uri.replace("sqlite:///", f"sqlite:///{workdir}/")
    assert mlflow.MlflowClient(uri).get_run(result.run_id).data.params["eval_task"] == task
    summary = run_summary(m, cfg, result.run_id)
    assert f"held-out ({task}) exact match" in summary and "recall (trained questions) exact match" in summary
    assert f"eval_exact_match ({task}; korquad scoring)" in compare_table([result]).index  # the synthetic set's mode
