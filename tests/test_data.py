import json

import pandas as pd
import pytest

from dsnb.config import OFFLINE, ConfigError, RunConfig
from dsnb.data import NO_ANSWER, build_dataset, collator, format_prompt, load_records, synthetic_squad
from dsnb.model import load_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(RunConfig(**OFFLINE))


def test_synthetic_is_deterministic_squad_format_in_two_languages():
    rows = synthetic_squad(200)
    assert rows == synthetic_squad(200)
    assert {"id", "title", "context", "question", "answers"} <= set(rows[0])
    prompts = [format_prompt(r) for r in rows]
    assert all(p.startswith("질문: ") and "\n답변: " in p for p in prompts)
    assert any("수도" in p for p in prompts) and any("capital" in p for p in prompts)
    assert any(p.endswith(NO_ANSWER) for p in prompts)
    for r in rows:  # answers point into their context, as in SQuAD
        for text, start in zip(r["answers"]["text"], r["answers"]["answer_start"]):
            assert r["context"][start:start + len(text)] == text


def test_prompt_is_the_tutorials():
    row = {"question": "Q?", "answers": {"text": ["A", "B"], "answer_start": [0, 1]}}
    assert format_prompt(row) == "질문: Q?\n답변: A"
    assert format_prompt({"question": "Q?", "answers": {"text": []}}) == "질문: Q?\n답변: 정답 없음"


@pytest.mark.parametrize("padding", ["max_length", "longest"])
def test_labels_ignore_padding(tokenizer, padding):
    cfg = RunConfig(**dict(OFFLINE, padding=padding, max_length=64, num_samples=8))
    ds = build_dataset(cfg, tokenizer)
    lengths = {len(x) for x in ds["input_ids"]}
    assert lengths == {64} if padding == "max_length" else len(lengths) > 1
    batch = collator(tokenizer)([ds[i] for i in range(4)])
    mask, labels = batch["attention_mask"], batch["labels"]
    assert ((labels == -100) == (mask == 0)).all()
    assert batch["input_ids"].shape[1] == (64 if padding == "max_length" else int(mask.sum(1).max()))


def test_local_files_in_every_format(tmp_path):
    rows = synthetic_squad(6)
    paths = {}
    paths["json"] = tmp_path / "d.json"
    paths["json"].write_text(json.dumps(rows))
    paths["jsonl"] = tmp_path / "d.jsonl"
    paths["jsonl"].write_text("\n".join(json.dumps(r) for r in rows))
    paths["parquet"] = tmp_path / "d.parquet"
    pd.DataFrame(rows).to_parquet(paths["parquet"])
    paths["csv"] = tmp_path / "d.csv"
    pd.DataFrame([{"question": r["question"], "answer": (r["answers"]["text"] or [""])[0]} for r in rows]).to_csv(
        paths["csv"], index=False)
    expected = [format_prompt(r) for r in rows[:5]]
    for kind, path in paths.items():
        got = load_records(RunConfig(**dict(OFFLINE, dataset=str(path), num_samples=5)))
        assert [format_prompt(r) for r in got] == expected, kind


def test_bad_files_say_what_to_change(tmp_path):
    def load(path, n=2):
        return load_records(RunConfig(**dict(OFFLINE, dataset=str(path), num_samples=n)))

    with pytest.raises(ConfigError, match="does not exist"):
        load(tmp_path / "missing.json")
    with pytest.raises(ConfigError, match="is not squad, synthetic"):
        load(tmp_path / "data.txt")
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ConfigError):
        load(tmp_path / "empty.jsonl")
    (tmp_path / "fields.jsonl").write_text('{"prompt": "x"}\n{"prompt": "y"}\n')
    with pytest.raises(ConfigError, match="needs columns question and answers"):
        load(tmp_path / "fields.jsonl")
    (tmp_path / "few.jsonl").write_text('{"question": "x", "answer": "y"}\n')
    with pytest.raises(ConfigError, match="num_samples is 2 but .* holds 1 rows"):
        load(tmp_path / "few.jsonl")
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ConfigError, match="could not be read"):
        load(tmp_path / "broken.json")
