import json
import random

import pandas as pd
import pytest

from dsnb.config import OFFLINE, ConfigError, RunConfig
from dsnb.data import (EVAL_SEED, NO_ANSWER, PACK_ROWS, build_dataset, collator, format_prompt, load_records,
                       prompt_parts, synthetic_squad)
from dsnb.model import load_tokenizer

CLOSED = dict(OFFLINE, prompt="eos")  # the tutorial's closed-book text: the padding tests' lengths are its

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
        for text, start in zip(r["answers"]["text"], r["answers"]["answer_start"], strict=False):
            assert r["context"][start:start + len(text)] == text


def test_prompt_is_the_tutorials():
    row = {"question": "Q?", "answers": {"text": ["A", "B"], "answer_start": [0, 1]}}
    assert format_prompt(row) == "질문: Q?\n답변: A"
    assert format_prompt({"question": "Q?", "answers": {"text": []}}) == "질문: Q?\n답변: 정답 없음"


@pytest.mark.parametrize("padding", ["max_length", "longest"])
def test_labels_ignore_padding(tokenizer, padding):
    cfg = RunConfig(**dict(CLOSED, padding=padding, max_length=64, num_samples=8))
    ds = build_dataset(cfg, tokenizer)
    lengths = {len(x) for x in ds["input_ids"]}
    assert lengths == {64} if padding == "max_length" else len(lengths) > 1
    batch = collator(tokenizer, cfg)([ds[i] for i in range(4)])
    mask, labels = batch["attention_mask"], batch["labels"]
    assert ((labels == -100) == (mask == 0)).all()
    assert batch["input_ids"].shape[1] == (64 if padding == "max_length" else int(mask.sum(1).max()))


def test_bucket_padding_rounds_up_to_the_bucket(tokenizer):
    from dsnb.data import BUCKET

    cfg = RunConfig(**dict(OFFLINE, padding="bucket", num_samples=16))
    ds = build_dataset(cfg, tokenizer)
    batch = collator(tokenizer, cfg)([ds[i] for i in range(8)])
    longest = int(batch["attention_mask"].sum(1).max())
    assert batch["input_ids"].shape[1] == BUCKET * -(-longest // BUCKET)
    assert ((batch["labels"] == -100) == (batch["attention_mask"] == 0)).all()


def test_packed_rows_give_the_padded_batch_its_loss(tokenizer):
    """Packing changes the layout only: same predicted tokens, same loss, within fp32 rounding."""
    import torch

    from dsnb.data import BatchLog
    from dsnb.model import load_model

    padded_cfg = RunConfig(**dict(CLOSED, quantization="none", lora_r=0, padding="longest", num_samples=12))
    packed_cfg = padded_cfg.replace(padding="packed", max_length=128)
    ds = build_dataset(padded_cfg, tokenizer)
    features = [ds[i] for i in range(12)]
    padded = collator(tokenizer, padded_cfg)(features)
    packed = collator(tokenizer, packed_cfg)(features)
    assert "attention_mask" not in packed and packed["input_ids"].shape[1] == 128
    assert 1 < packed["input_ids"].shape[0] < 12  # several samples share a row
    assert packed["input_ids"].shape[0] % PACK_ROWS == 0  # padding rows round the count: fewer shapes
    counted = BatchLog(collator(tokenizer, packed_cfg))
    counted(features)  # what the throughput counts of a packed batch: the padded batch's real tokens
    assert counted.sizes == [(12, int(padded["attention_mask"].sum()))]
    predicted = int((padded["labels"][:, 1:] != -100).sum())
    assert int((packed["labels"][:, 1:] != -100).sum()) == predicted
    model, _ = load_model(padded_cfg, "cpu")
    model.eval()
    with torch.no_grad():
        a, b = model(**padded).loss, model(**packed).loss
    assert float(b) == pytest.approx(float(a), rel=1e-5)
    packed["position_ids"][:] = torch.arange(128)  # without restarts the samples see each other
    with torch.no_grad():
        assert abs(float(model(**packed).loss) - float(a)) > 3e-4  # 5x the tolerance the packed loss is held to


def test_filled_rows_hold_each_sample_once_nearly_full_and_give_the_padded_batch_its_loss(tokenizer):
    """padding filled: rows made once, best fit; every sample in exactly one row, whole; fuller rows than packed's
    batches of the same samples; one batch shape (padding rows fill a short batch); the padded batch's loss."""
    import torch

    from dsnb.data import BatchLog, fill_rows, best_fit, packed_rows
    from dsnb.model import load_model

    padded_cfg = RunConfig(**dict(CLOSED, quantization="none", lora_r=0, padding="longest", num_samples=48))
    ds = build_dataset(padded_cfg, tokenizer)
    rows = fill_rows(ds, 128)
    ids = [list(x) for x in ds["input_ids"]]
    split = []  # the rows cut back into samples where the position ids restart
    for row, positions in zip(rows["input_ids"], rows["position_ids"], strict=True):
        assert len(row) <= 128
        starts = [i for i, p in enumerate(positions) if p == 0] + [len(row)]
        split += [row[a:b] for a, b in zip(starts, starts[1:], strict=False)]
    assert sorted(split) == sorted(ids)
    lengths = [len(x) for x in ids]
    packed = sum(packed_rows(best_fit(lengths[i:i + 16], 128)[1]) for i in range(0, 48, 16))
    assert len(rows) < packed  # fuller rows: the same samples in fewer of them
    assert sum(lengths) / (128 * len(rows)) > 0.85

    filled_cfg = padded_cfg.replace(padding="filled", max_length=128, batch_size=len(rows) + 1)
    counted = BatchLog(collator(tokenizer, filled_cfg))
    filled = counted([rows[i] for i in range(len(rows))])
    assert set(filled) == {"input_ids", "labels", "position_ids"}
    assert filled["input_ids"].shape == (len(rows) + 1, 128)  # a short batch still takes batch_size rows
    assert (filled["labels"][-1] == -100).all()
    padded = collator(tokenizer, padded_cfg)([ds[i] for i in range(48)])
    assert counted.sizes == [(48, int(padded["attention_mask"].sum()))]  # samples and real tokens, as trained
    assert int((filled["labels"] != -100).sum()) == int((padded["labels"][:, 1:] != -100).sum())
    model, _ = load_model(padded_cfg, "cpu")
    model.eval()
    with torch.no_grad():
        assert float(model(**filled).loss) == pytest.approx(float(model(**padded).loss), rel=1e-5)


def test_filled_rows_place_the_longest_first_each_where_it_fits_best():
    """Best fit, longest first, on lengths chosen so each choice shows: a sample of exactly max_length has a row to
    itself; 28 tokens go to the row with 28 left, not the one with 1; 1 token fills the row with 1 left."""
    import datasets

    from dsnb.data import fill_rows, samples_in

    lengths = [128, 100, 28, 1, 127]
    ids = [[10 + i] * n for i, n in enumerate(lengths)]  # each sample's tokens name it
    masks = [[1] * n for n in lengths]
    samples = datasets.Dataset.from_dict({"input_ids": ids, "labels": ids, "attention_mask": masks})
    rows = fill_rows(samples, 128)
    assert [sorted(set(row)) for row in rows["input_ids"]] == [[10], [13, 14], [11, 12]]
    assert [len(row) for row in rows["input_ids"]] == [128, 128, 128]
    assert rows["position_ids"][1] == list(range(127)) + [0]
    assert rows["labels"][1] == [-100] + [14] * 126 + [-100]  # nothing predicts a sample's first token
    assert [samples_in(rows[i]) for i in range(3)] == [1, 2, 2]


def test_a_filled_step_larger_than_its_rows_is_refused_naming_them():
    """64 offline samples fill 25 rows of 128 tokens: 16 x 2 rows a step would pass the samples' check (32 <= 64)."""
    from dsnb.train import describe_plan, plan

    cfg = RunConfig(**dict(CLOSED, padding="filled", batch_size=16, grad_accum=2))
    with pytest.raises(ConfigError, match=r"puts the 64 samples in \d+ rows of 128 tokens.* = 32 rows"):
        plan(cfg)
    p = plan(cfg.replace(batch_size=4))
    assert (p.samples, len(p.train_set)) == (64, 25)
    assert describe_plan(cfg, p).startswith("64 samples of 45 real tokens on average in 25 rows of 128 tokens (")


def test_flex_attention_gives_packed_rows_the_padded_batch_its_loss_in_one_graph(tokenizer):
    """attention flex: the block mask of packed rows is built inside the compiled graph (transformers' own call
    breaks it), no sample sees another, and held-out answers are generated through SDPA as in every other variant.
    The CPU runs flex attention's forward only (no backward here); training with it was measured on the H200."""
    import torch
    from torch._dynamo.utils import counters

    from dsnb.evaluate import answer_and_score
    from dsnb.model import load_model

    padded_cfg = RunConfig(**dict(OFFLINE, quantization="none", lora_r=0, padding="longest", num_samples=12))
    # Rows of 512 tokens: 4 x 4 blocks of 128 each, most of them holding no pair of one sample (skipped).
    flex_cfg = padded_cfg.replace(padding="packed", max_length=512, torch_compile=True, attention="flex")
    ds = build_dataset(padded_cfg, tokenizer)
    features = [ds[i] for i in range(12)]
    padded, packed = collator(tokenizer, padded_cfg)(features), collator(tokenizer, flex_cfg)(features)
    sdpa, _ = load_model(padded_cfg, "cpu")
    flex, _ = load_model(flex_cfg, "cpu")
    assert flex.config._attn_implementation == "flex_attention"
    sdpa.eval()
    flex.eval()
    torch._dynamo.reset()
    counters.clear()
    with torch.no_grad():
        expected = float(sdpa(**padded).loss)
        loss = float(torch.compile(flex, dynamic=False)(**packed).loss)
    assert loss == pytest.approx(expected, rel=1e-5)
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    seen = []  # the attention each forward of the answers ran with
    flex.register_forward_pre_hook(lambda module, args: seen.append(module.config._attn_implementation))
    rows = synthetic_squad(4)
    answers = answer_and_score(flex, tokenizer, flex_cfg, rows)[1]
    assert seen and set(seen) == {"sdpa"}
    assert answers == answer_and_score(sdpa, tokenizer, padded_cfg, rows)[1]
    assert flex.config._attn_implementation == "flex_attention"  # back to flex for training


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


def test_squad_that_cannot_be_reached_says_what_to_use_instead(monkeypatch):
    """SQuAD with the hub out of reach (here: the hub libraries' offline mode, so no retries) is a ConfigError naming
    the hub id and the offline alternatives, not a traceback."""
    import datasets
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    message = r"dataset 'squad' \(rajpurkar/squad\) could not be loaded.*use dataset=synthetic"
    with pytest.raises(ConfigError, match=message):
        load_records(RunConfig(**dict(OFFLINE, dataset="squad", num_samples=2)))


def test_bad_files_say_what_to_change(tmp_path):
    def load(path, n=2):
        return load_records(RunConfig(**dict(OFFLINE, dataset=str(path), num_samples=n)))

    with pytest.raises(ConfigError, match="does not exist"):
        load(tmp_path / "missing.json")
    with pytest.raises(ConfigError, match="is not squad, korquad, synthetic"):
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


def test_the_training_text_ends_in_eos_and_the_loss_covers_it(tokenizer):
    rows = synthetic_squad(4)
    eos = build_dataset(RunConfig(**dict(CLOSED, num_samples=4, padding="longest")), tokenizer, rows)
    plain = build_dataset(RunConfig(**dict(OFFLINE, num_samples=4, padding="longest", prompt="tutorial")),
                          tokenizer, rows)
    for with_eos, without in zip(eos, plain, strict=True):
        assert with_eos["input_ids"] == without["input_ids"] + [tokenizer.eos_token_id]
        assert with_eos["labels"][-1] == tokenizer.eos_token_id  # predicted, though the pad token is EOS too
    padded = build_dataset(RunConfig(**dict(CLOSED, num_samples=4, max_length=64)), tokenizer, rows)
    for sample, row in zip(padded, eos, strict=True):  # padding after the EOS is masked, the EOS is not
        n = len(row["input_ids"])
        assert sample["labels"][n - 1] == tokenizer.eos_token_id and set(sample["labels"][n:]) == {-100}
    with pytest.raises(ConfigError, match="has no chat template; use prompt eos"):
        build_dataset(RunConfig(**dict(OFFLINE, num_samples=4, prompt="chat")), tokenizer, rows)


def test_held_out_questions_are_in_no_training_row_yet_training_teaches_their_answers():
    train, held_out = synthetic_squad(2000), synthetic_squad(500, held_out=True)
    assert len(held_out) == 72 and all(r["answers"]["text"] for r in held_out)
    assert not {r["question"] for r in train} & {r["question"] for r in held_out}
    taught = {r["answers"]["text"][0] for r in train if r["answers"]["text"]}
    assert {r["answers"]["text"][0] for r in held_out} <= taught
    # the questions asked: drawn with the fixed seed from the whole held-out part, not its first rows
    drawn = sorted(random.Random(EVAL_SEED).sample(range(72), 10))
    assert load_records(RunConfig(**OFFLINE), "eval", 10) == [dict(held_out[i], answers={"text": held_out[i]["answers"][
        "text"]}) for i in drawn]
    assert drawn != list(range(10)) and load_records(RunConfig(**OFFLINE), "eval", 10) == load_records(
        RunConfig(**dict(OFFLINE, seed=7, strategy="zero2")), "eval", 10)  # the same for every variant and seed


def test_a_max_length_that_cuts_every_answer_is_refused_and_one_that_cuts_some_is_counted(tokenizer):
    from dsnb.data import truncated

    with pytest.raises(ConfigError, match="max_length is 8, which cuts every sample before its answer"):
        build_dataset(RunConfig(**dict(CLOSED, max_length=8, num_samples=16)), tokenizer)
    cut = truncated(RunConfig(**dict(CLOSED, max_length=40, num_samples=64)),
                    build_dataset(RunConfig(**dict(CLOSED, max_length=40, num_samples=64)), tokenizer))
    assert 0 < cut < 64


@pytest.mark.parametrize("content, message", [
    ('{"question": "q?", "answers": {"text": "Paris"}}\n', "row 1: answers.text is the string 'Paris'"),
    ('{"question": null, "answer": "a"}\n', "row 1: question is None; every row needs its question as text"),
    ('{"question": "q?", "answer": "a"}\n{"question": 5, "answer": "b"}\n', "row 2: question is 5"),
    (b'{"question": "q1?", "answer": "a"}\n{"question": "q\xff?", "answer": "b"}\n', "line 2: byte 0xff is not UTF-8"),
])
def test_rows_that_would_train_on_garbage_name_the_file_and_row(tmp_path, content, message):
    path = tmp_path / "data.jsonl"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("?", r"\?")):
        load_records(RunConfig(**dict(OFFLINE, dataset=str(path), num_samples=path.read_bytes().count(b"\n"))))


def test_cells_that_only_look_like_json_are_read_as_their_text(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text('question,answers\n"q1?","{not json"\n"q2?","{""text"": [""Seoul""]}"\n')
    rows = load_records(RunConfig(**dict(OFFLINE, dataset=str(path), num_samples=2)))
    assert [format_prompt(r) for r in rows] == ["질문: q1?\n답변: {not json", "질문: q2?\n답변: Seoul"]


def test_the_passage_prompt_reads_the_passage_and_cuts_only_its_end(tokenizer):
    """prompt passage (the default): SQuAD's task, the passage with the question, the same text trained and asked;
    where a sample would exceed max_length, the passage's end goes and the question and answer stay; a row without a
    passage is refused, naming the closed-book prompt."""
    from dsnb.data import passage_cuts

    row = synthetic_squad(1)[0]
    cfg = RunConfig(**OFFLINE)
    prompt, whole = prompt_parts(cfg, tokenizer, row)
    text = tokenizer.decode(whole, skip_special_tokens=True)
    assert text == f"본문: {row['context']}\n질문: {row['question']}\n답변: {row['answers']['text'][0]}"
    assert whole[:len(prompt)] == prompt and whole[-1] == tokenizer.eos_token_id
    short = cfg.replace(max_length=len(whole) - 5)
    cut = tokenizer.decode(prompt_parts(short, tokenizer, row)[1], skip_special_tokens=True)
    assert len(prompt_parts(short, tokenizer, row)[1]) <= short.max_length
    assert cut.endswith(f"\n질문: {row['question']}\n답변: {row['answers']['text'][0]}")
    assert row["context"].startswith(cut.split("\n")[0][len("본문: "):]) and len(cut) < len(text)
    rows = synthetic_squad(8)
    assert passage_cuts(cfg, tokenizer, rows) == (0, 0)
    assert passage_cuts(cfg.replace(max_length=40), tokenizer, rows)[0] == 8
    with pytest.raises(ConfigError, match="has no passage.*use prompt eos"):
        prompt_parts(cfg, tokenizer, {"question": "q?", "answers": {"text": ["a"]}})


def test_the_official_nested_squad_json_reads_as_it_is(tmp_path):
    """SQuAD's and KorQuAD's own files ({"data": [{"paragraphs": [{"context", "qas"}]}]}) need no conversion."""
    data = {"version": "1.0", "data": [{"title": "서울", "paragraphs": [
        {"context": "서울은 대한민국의 수도이다.", "qas": [
            {"id": f"q{i}", "question": f"질문 {i}?", "answers": [{"text": "서울", "answer_start": 0}]}
            for i in range(5)]}]}]}
    path = tmp_path / "KorQuAD_v1.0_train.json"
    path.write_text(json.dumps(data, ensure_ascii=False))
    rows = load_records(RunConfig(**dict(OFFLINE, dataset=str(path), num_samples=3)))
    assert [r["id"] for r in rows] == ["q0", "q1", "q2"] and rows[0]["context"] == "서울은 대한민국의 수도이다."
    assert rows[0]["answers"]["text"] == ["서울"]
    held = load_records(RunConfig(**dict(OFFLINE, dataset=str(path), num_samples=3)), "eval", 5)
    assert sorted(r["id"] for r in held) == ["q3", "q4"]  # the rows after the training ones
