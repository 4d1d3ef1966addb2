import json
import random
import re

import pandas as pd
import pytest

from dsnb.config import OFFLINE, ConfigError, RunConfig
from dsnb.data import (EVAL_SEED, NO_ANSWER, PACK_ROWS, build_dataset, collator, format_prompt, held_out,
                       load_records, passage_window, prompt_parts, question_key, synthetic_squad, truncated)
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
    from dsnb.planning import describe_plan, plan

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


def test_flex_attention_reads_grouped_key_value_heads_once_with_the_same_loss(monkeypatch):
    """attention flex on a model whose query heads are not a power of two (the 3B's 24 over 8 key/value heads):
    transformers' path copies each key/value head for its group; dsnb's hands flex the grouped heads as they are
    (enable_gqa). The same loss, compiled as training runs it and eager, with no copy made (forward: the CPU has no
    flex backward; the trained step's loss was compared on the GPU, throughput_levers.py repeatkv)."""
    import torch
    from transformers import AttentionInterface, LlamaConfig, LlamaForCausalLM
    from transformers.integrations import flex_attention as hf

    from dsnb.model import attend_to_grouped_heads, build_block_masks_in_graph

    monkeypatch.setitem(AttentionInterface._global_mapping, "flex_attention", hf.flex_attention_forward)
    copies = []
    repeat_kv = hf.repeat_kv
    monkeypatch.setattr(hf, "repeat_kv", lambda x, n: copies.append(n) or repeat_kv(x, n))
    build_block_masks_in_graph()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=96, intermediate_size=192, num_hidden_layers=2, vocab_size=256,
                                         num_attention_heads=6, num_key_value_heads=2, head_dim=16,
                                         attn_implementation="flex_attention")).eval()
    ids = torch.randint(0, 256, (2, 256))
    positions = torch.cat([torch.arange(100), torch.arange(156)]).repeat(2, 1)  # two samples packed in each row
    batch = dict(input_ids=ids, position_ids=positions, labels=ids)

    def losses():
        torch._dynamo.reset()
        with torch.no_grad():
            return float(model(**batch).loss), float(torch.compile(model, dynamic=False)(**batch).loss)

    stock = losses()
    assert copies and set(copies) == {3}  # each key/value head copied for its 3 query heads, eager and traced
    copies.clear()
    attend_to_grouped_heads()
    ours = losses()
    assert not copies
    assert ours == pytest.approx(stock, rel=1e-5) and stock[0] == pytest.approx(stock[1], rel=1e-5)
    model.set_attn_implementation("sdpa")  # and the block mask kept samples apart, as SDPA's packed mask does
    with torch.no_grad():
        assert float(model(**batch).loss) == pytest.approx(stock[0], rel=1e-5)
    # called as a layer calls it: its own scale, in training mode, and rows too short for flex's decoding kernel with
    # groups of 3 (refused by older torch) left to transformers' copies
    from torch.nn.attention.flex_attention import create_block_mask

    attend = AttentionInterface._global_mapping["flex_attention"]
    layer = model.model.layers[0].self_attn.train()
    for length, copied in ((256, False), (64, True)):
        q, k, v = torch.randn(2, 6, length, 16), torch.randn(2, 2, length, 16), torch.randn(2, 2, length, 16)
        mask = create_block_mask(lambda b, h, i, j: i >= j, 2, None, length, length, device="cpu")
        copies.clear()
        with torch.no_grad():
            ours, weights = attend(layer, q, k, v, mask, scaling=0.3)
            assert bool(copies) == copied and weights is None and ours.shape == (2, length, 6, 16)
            theirs = hf.flex_attention_forward(layer, q, k, v, mask, scaling=0.3)[0]
        assert torch.allclose(ours, theirs, atol=1e-5)
        assert not torch.allclose(ours, attend(layer, q, k, v, mask, scaling=0.25)[0], atol=1e-3)


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
    for name, content in (("empty.jsonl", ""), ("blank.json", "\n  \n")):
        (tmp_path / name).write_text(content)
        with pytest.raises(ConfigError, match=f"dataset file {tmp_path / name} is empty; give a file of"):
            load(tmp_path / name)
    for content in ("[]", "{}"):
        (tmp_path / "none.json").write_text(content)
        with pytest.raises(ConfigError, match="none.json holds no records; give question/context/answers records"):
            load(tmp_path / "none.json")
    (tmp_path / "fields.jsonl").write_text('{"prompt": "x"}\n{"prompt": "y"}\n')
    with pytest.raises(ConfigError, match="needs columns question and answers"):
        load(tmp_path / "fields.jsonl")
    (tmp_path / "few.jsonl").write_text('{"question": "x", "answer": "y"}\n')
    with pytest.raises(ConfigError, match="num_samples is 2 but .* holds 1 rows"):
        load(tmp_path / "few.jsonl")
    # what the parser found, not datasets' "An error occurred while generating the dataset"
    for name, content in (("broken.json", "{not json"), ("cut.json", '{"data": ['), ("cut.jsonl", '{"a": 1\n')):
        (tmp_path / name).write_text(content)
        with pytest.raises(ConfigError, match=f"{name} could not be read as json \\(ArrowInvalid: JSON parse error"):
            load(tmp_path / name)


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
    assert load_records(RunConfig(**OFFLINE), "eval", 10) == [held_out[i] for i in drawn]
    assert drawn != list(range(10)) and load_records(RunConfig(**OFFLINE), "eval", 10) == load_records(
        RunConfig(**dict(OFFLINE, seed=7, strategy="zero2")), "eval", 10)  # the same for every variant and seed


def test_a_max_length_that_cuts_every_answer_is_refused_and_one_that_cuts_some_is_counted(tokenizer):
    with pytest.raises(ConfigError, match="max_length is 8, which cuts every sample before its answer"):
        build_dataset(RunConfig(**dict(CLOSED, max_length=8, num_samples=16)), tokenizer)
    # with the passage prompt, the length named keeps every sample whole: at it nothing is cut
    import re

    with pytest.raises(ConfigError, match="cuts every sample before its answer") as refused:
        build_dataset(RunConfig(**dict(OFFLINE, max_length=8, num_samples=16)), tokenizer)
    enough = int(re.search(r"\); (\d+) keeps every sample whole", str(refused.value)).group(1))
    built = build_dataset(RunConfig(**dict(OFFLINE, max_length=enough, num_samples=16)), tokenizer)
    assert truncated(built) == 0 and not any(built["window_moved"]), enough
    cut = truncated(build_dataset(RunConfig(**dict(CLOSED, max_length=40, num_samples=64)), tokenizer))
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


def test_a_table_without_rows_is_said_so(tmp_path):
    """A CSV of a header alone and a Parquet file of no rows: each library fails in its own words ("corresponds to
    no data", "BatchSize must be greater than 0"); dsnb says the file holds no rows."""
    import pandas as pd

    (tmp_path / "h.csv").write_text("question,context,answers\n")
    pd.DataFrame({"question": [], "context": [], "answers": []}).to_parquet(tmp_path / "e.parquet")
    for name, said in (("h.csv", "holds no rows \\(a header alone\\)"), ("e.parquet", "holds no rows; give")):
        with pytest.raises(ConfigError, match=said):
            load_records(RunConfig(**dict(OFFLINE, dataset=str(tmp_path / name), num_samples=1)))


def test_cells_that_only_look_like_json_are_read_as_their_text(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text('question,answers\n"q1?","{not json"\n"q2?","{""text"": [""Seoul""]}"\n')
    rows = load_records(RunConfig(**dict(OFFLINE, dataset=str(path), num_samples=2)))
    assert [format_prompt(r) for r in rows] == ["질문: q1?\n답변: {not json", "질문: q2?\n답변: Seoul"]
    # a list of answers as JSON is the list; text that only reads as a list of numbers stays text, and a singular
    # `answer` column holds one answer whatever it looks like
    path.write_text('question,answers\n"q1?","[""Seoul"", ""서울""]"\n"q2?","[2]"\n"q3?","[0, 1] (x)"\n')
    rows = load_records(RunConfig(**dict(OFFLINE, dataset=str(path), num_samples=3)))
    assert [r["answers"]["text"] for r in rows] == [["Seoul", "서울"], ["[2]"], ["[0, 1] (x)"]]
    path.write_text('question,answer\n"q1?","[""Seoul""]"\n')
    assert load_records(RunConfig(**dict(OFFLINE, dataset=str(path), num_samples=1)))[0]["answers"]["text"] == \
        ['["Seoul"]']


def test_the_passage_prompt_reads_the_passage_and_cuts_only_its_end(tokenizer):
    """prompt passage (the default): SQuAD's task, the passage with the question, the same text trained and asked;
    where a sample would exceed max_length, the passage's end goes and the question and answer stay; a row without a
    passage is refused, naming the closed-book prompt."""
    row = synthetic_squad(1)[0]
    cfg = RunConfig(**OFFLINE)
    prompt, whole = prompt_parts(cfg, tokenizer, row)
    text = tokenizer.decode(whole, skip_special_tokens=True)
    assert text == f"본문: {row['context']}\n질문: {row['question']}\n답변: {row['answers']['text'][0]}"
    assert whole[:len(prompt)] == prompt and whole[-1] == tokenizer.eos_token_id
    short = cfg.replace(max_length=len(whole) - 5)
    trained = prompt_parts(short, tokenizer, row, passage_window(short, tokenizer, row, trained=True))[1]
    cut = tokenizer.decode(trained, skip_special_tokens=True)
    assert len(trained) <= short.max_length and len(prompt_parts(short, tokenizer, row)[0]) < short.max_length
    assert cut.endswith(f"\n질문: {row['question']}\n답변: {row['answers']['text'][0]}")
    shown = cut.split("\n")[0][len("본문: "):]
    assert shown in row["context"] and len(shown) < len(row["context"])
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
    assert rows[0]["answers"] == {"text": ["서울"], "answer_start": [0]}


# --- inputs of every shape a user meets, passages that do not fit, held-out questions that cannot be answered ---
SMALL = dict(OFFLINE, batch_size=1, grad_accum=1, max_steps=1)


def write_rows(path, rows):
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows))
    return str(path)


def nested(paragraphs, title="Seoul"):
    return {"version": "1.1", "data": [{"title": title, "paragraphs": paragraphs}]}


def qa(i, answer="서울", start=0):
    return {"id": f"q{i}", "question": f"질문 {i}?", "answers": [{"text": answer, "answer_start": start}]}


def test_a_byte_order_mark_is_read_in_json_jsonl_and_csv(tmp_path):
    """A UTF-8 byte-order mark (Notepad and Excel write one) is no text: the official nested JSON, a JSON list, JSON
    lines and CSV read alike with it."""
    bom = b"\xef\xbb\xbf"
    rows = synthetic_squad(3)
    files = {"nested.json": json.dumps(nested([{"context": r["context"], "qas": [
                 {"id": r["id"], "question": r["question"], "answers": [{"text": t, "answer_start": s} for t, s in zip(
                     r["answers"]["text"], r["answers"]["answer_start"], strict=True)]}]} for r in rows]),
                 ensure_ascii=False),
             "list.json": json.dumps(rows, ensure_ascii=False),
             "rows.jsonl": "\n".join(json.dumps(r, ensure_ascii=False) for r in rows),
             "rows.csv": pd.DataFrame([{"question": r["question"], "answer": (r["answers"]["text"] or [""])[0]}
                                       for r in rows]).to_csv(index=False)}
    for name, text in files.items():
        (tmp_path / name).write_bytes(bom + text.encode())
        got = load_records(RunConfig(**dict(OFFLINE, dataset=str(tmp_path / name), num_samples=3)))
        assert [format_prompt(r) for r in got] == [format_prompt(r) for r in rows], name


@pytest.mark.parametrize("paragraphs, message", [
    (["서울은 수도이다."], "article 1 ('Seoul'), paragraph 1 is str '서울은 수도이다.'; each paragraph is an object"),
    ([{"context": "서울은 수도이다.", "qas": [qa(0), "서울은 어디?"]}],
     "article 1 ('Seoul'), paragraph 1, question 2 is str '서울은 어디?'; each question is an object"),
    ([{"context": "서울은 수도이다.", "qas": {"q0": qa(0)}}], "article 1 ('Seoul'), paragraph 1: qas is dict"),
    ({"context": "서울은 수도이다.", "qas": [qa(0)]}, "article 1 ('Seoul'): paragraphs is dict"),
    ([{"context": ["서울은 수도이다."], "qas": [qa(0)]}], "article 1 ('Seoul'), paragraph 1: context is list"),
    ([{"context": "서울은 수도이다.", "qas": [{"id": "q0", "answers": []}]}],
     "article 1 ('Seoul'), paragraph 1, question 1: question is None"),
    ([{"context": "서울은 수도이다.", "qas": [{"question": "q?", "answers": [["서울"]]}]}],
     "article 1 ('Seoul'), paragraph 1, question 1: answers is list"),
])
def test_the_nested_json_of_another_shape_is_refused_naming_the_place(tmp_path, paragraphs, message):
    """A string where a paragraph or question object belongs, qas or paragraphs of the wrong type: one line naming the
    article (by number and title), paragraph and question, not an AttributeError."""
    path = tmp_path / "korquad.json"
    path.write_text(json.dumps(nested(paragraphs), ensure_ascii=False))
    with pytest.raises(ConfigError, match="^" + re.escape(f"dataset file {path}, {message}")):
        load_records(RunConfig(**dict(OFFLINE, dataset=str(path), num_samples=1)))
    path.write_text(json.dumps({"data": ["서울"]}, ensure_ascii=False))
    with pytest.raises(ConfigError, match=r"article 1 is str '서울'; each entry of data is an object"):
        load_records(RunConfig(**dict(OFFLINE, dataset=str(path), num_samples=1)))
    # one article where the list of them belongs: said as SQuAD's shape, not as a table lacking columns
    path.write_text(json.dumps({"version": "1.1", "data": nested([])["data"][0]}, ensure_ascii=False))
    with pytest.raises(ConfigError, match=r"data is dict .*; SQuAD's JSON holds a list of articles there"):
        load_records(RunConfig(**dict(OFFLINE, dataset=str(path), num_samples=1)))


def test_the_list_of_squad_articles_alone_is_read_as_the_official_file(tmp_path):
    """The official file's "data" list without the {"version", "data"} around it: the same rows as the whole file."""
    whole, alone = tmp_path / "whole.json", tmp_path / "alone.json"
    articles = nested([{"context": "서울은 수도이다.", "qas": [qa(0), qa(1)]}])
    whole.write_text(json.dumps(articles, ensure_ascii=False))
    alone.write_text(json.dumps(articles["data"], ensure_ascii=False))
    rows = [load_records(RunConfig(**dict(OFFLINE, dataset=str(p), num_samples=2))) for p in (whole, alone)]
    assert rows[0] == rows[1] and [r["question"] for r in rows[1]] == ["질문 0?", "질문 1?"]


def test_nested_json_shapes_with_one_meaning_are_read_as_meant(tmp_path):
    """Answers in SQuAD's flat shape ({"text": [...], "answer_start": [...]}) or as a list of texts, and qas written as
    one question object, train on their answer (not on "정답 없음"), answer_start kept."""
    path = tmp_path / "korquad.json"
    path.write_text(json.dumps(nested([
        {"context": "수도는 서울이다.", "qas": [{"id": "a", "question": "수도는?",
                                             "answers": {"text": ["서울"], "answer_start": [4]}}]},
        {"context": "강은 한강이다.", "qas": [{"id": "b", "question": "강은?", "answers": ["한강"]}]},
        {"context": "산은 북한산이다.", "qas": {"id": "c", "question": "산은?", "answers": [{"text": "북한산"}]}}]),
        ensure_ascii=False))
    rows = load_records(RunConfig(**dict(OFFLINE, dataset=str(path), num_samples=3)))
    assert [format_prompt(r) for r in rows] == ["질문: 수도는?\n답변: 서울", "질문: 강은?\n답변: 한강",
                                                 "질문: 산은?\n답변: 북한산"]
    assert [r["answers"]["answer_start"] for r in rows] == [[4], [-1], [-1]]


def test_rows_whose_passage_lacks_their_answer_are_left_out_counted_and_refused_when_none_is_left(tmp_path, tokenizer):
    """With the passage prompt, a training row whose passage does not hold its answer would teach an answer it does not
    show: it is left out, counted in the plan (and as a run param); a held-out one is left out too, the next question
    taken; a file with no row left is refused. Closed-book prompts show no passage and keep every row."""
    from dsnb.planning import describe_plan, plan

    good = [{"context": f"Town {i} lies on river {i}.", "question": f"Which river is town {i} on?",
             "answers": {"text": [f"river {i}"]}} for i in range(8)]
    bad = [{"context": f"Town {i} lies in a valley.", "question": f"Which river is town {i} on?",
            "answers": {"text": [f"river {i}"]}} for i in range(8, 12)]
    path = write_rows(tmp_path / "d.jsonl", good[:4] + bad[:2] + good[4:] + bad[2:])  # 6 trained, then 6 held out
    cfg = RunConfig(**dict(SMALL, dataset=path, num_samples=6, eval_samples=6))
    p = plan(cfg)
    assert p.samples == 4 and p.data["train_left_out_not_in_passage"] == 2
    assert len(p.eval_rows) == 4 and p.data["eval_left_out_not_in_passage"] == 2
    text = describe_plan(cfg, p)
    assert "note: 2 training rows left out: their passage does not hold their answer" in text
    assert "2 have no answer in their passage" in text
    assert plan(cfg.replace(prompt="eos")).samples == 6  # closed-book: the passage is not shown
    path = write_rows(tmp_path / "bad.jsonl", bad)
    with pytest.raises(ConfigError, match="none of the 4 training rows of .* has its answer in its passage"):
        build_dataset(RunConfig(**dict(SMALL, dataset=path, num_samples=4)), tokenizer)


FILLER = "The valley road winds past farms and an old mill. "


def test_a_training_passage_too_long_is_cut_around_its_answer(tokenizer):
    """A passage longer than max_length allows keeps its answer in view (answer_start where given, else the first
    occurrence): the window moves off the start, as SQuAD's readers stride. A sample whose answer no window can show
    (too long to stand twice within max_length: in the passage and after 답변:) counts as cut, though no token of it
    is lost past max_length."""
    cfg = RunConfig(**dict(SMALL, num_samples=1))
    context = "Kim Lee built a barn. " + FILLER * 8 + "The mill was founded by Kim Lee in 1801. " + FILLER * 4
    row = {"context": context, "question": "Who founded the mill?",
           "answers": {"text": ["Kim Lee"], "answer_start": [context.index("by Kim Lee") + 3]}}
    sample = build_dataset(cfg, tokenizer, [row])[0]
    shown = tokenizer.decode(sample["input_ids"], skip_special_tokens=True).split("\n")[0]
    assert "founded by Kim Lee in 1801" in shown and len(sample["input_ids"]) <= cfg.max_length
    assert sample["window_moved"] and not sample["answer_cut"]
    first = build_dataset(cfg, tokenizer, [dict(row, answers={"text": ["Kim Lee"]})])[0]  # no answer_start: the first
    assert tokenizer.decode(first["input_ids"], skip_special_tokens=True).startswith("본문: Kim Lee built a barn.")
    assert not first["window_moved"]
    long_answer = "the old mill by the river and the farms past the valley road, near the bridge over the stream"
    wide = {"context": FILLER * 4 + f"It stands at {long_answer}.", "question": "Where?", "answers": {"text": [
        long_answer]}}
    ds = build_dataset(cfg, tokenizer, [wide])
    assert ds[0]["full_length"] <= cfg.max_length and truncated(ds) == 1


def test_a_held_out_window_ignores_the_answer_and_a_question_it_loses_gives_way_to_the_next(tmp_path, tokenizer):
    """A held-out question is shown the passage's start, chosen without its answer (two answers, one window); where
    that window loses every answer, the question is left out and counted, and the next of the seeded draw is asked,
    so the run still asks eval_samples questions, the same for every variant and seed."""
    cfg = RunConfig(**dict(SMALL, num_samples=4))
    row = {"context": FILLER * 6, "question": "What winds past farms?", "answers": {"text": ["The valley road"]}}
    longer = dict(row, answers={"text": ["The valley road winds past farms and an old mill"]})
    assert prompt_parts(cfg, tokenizer, row)[0] == prompt_parts(cfg, tokenizer, longer)[0]
    assert len(prompt_parts(cfg, tokenizer, row)[0]) < cfg.max_length
    rows = [{"context": f"Mill {i} was built in 18{i:02d}. " + FILLER * 4 + (f"Its owner was Kim {i}." * (i % 2)),
             "question": f"Who owned mill {i}?" if i % 2 else f"When was mill {i} built?",
             "answers": {"text": [f"Kim {i}" if i % 2 else f"18{i:02d}"]}} for i in range(40)]
    path = write_rows(tmp_path / "long.jsonl", rows)
    cfg = cfg.replace(dataset=path)
    asked, counts = held_out(cfg, 10, tokenizer)
    assert len(asked) == 10 and counts["eval_left_out_answer_cut"] > 0 and counts["eval_pool"] == 36
    assert all(r["answers"]["text"][0].startswith("18") for r in asked)  # the owners, at the passages' end, are cut
    assert held_out(cfg.replace(strategy="zero2", seed=7), 10, tokenizer) == (asked, counts)
    assert load_records(cfg, "eval", 10) != asked  # without the windows' check the owners would be asked


def test_held_out_rows_of_a_file_share_no_passage_or_row_with_training(tmp_path):
    """A file's held-out rows come after the training ones; one whose passage a training row has, or (without passages)
    whose question and answer a training row has, is left out and counted."""
    rows = [{"context": f"Passage {i}.", "question": f"Question {i}?", "answers": {"text": ["Passage"]}}
            for i in range(4)]
    later = [dict(rows[0]), dict(rows[1], question="Another question?"), {"context": "Passage 9.",
             "question": "Question 9?", "answers": {"text": ["Passage"]}}]
    path = write_rows(tmp_path / "d.jsonl", rows + later)
    cfg = RunConfig(**dict(SMALL, dataset=path, num_samples=4))
    asked, counts = held_out(cfg, 8)
    assert [r["question"] for r in asked] == ["Question 9?"] and counts["eval_left_out_shares_training"] == 2
    closed = [{"question": f"Question {i}?", "answer": f"Answer {i}"} for i in range(3)]
    path = write_rows(tmp_path / "closed.jsonl", closed + [closed[1], dict(closed[2], answer="Other"), closed[0]])
    asked, counts = held_out(RunConfig(**dict(SMALL, dataset=path, num_samples=3, prompt="eos")), 8)
    assert [format_prompt(r) for r in asked] == ["질문: Question 2?\n답변: Other"]
    assert counts["eval_left_out_shares_training"] == 2


def test_taking_the_whole_file_says_no_question_is_held_out(tmp_path, workdir, capsys):
    """num_samples = the file's rows leaves nothing to ask: the plan and `python -m dsnb check` say so."""
    from dsnb.cli import main
    from dsnb.planning import describe_plan, plan

    path = write_rows(tmp_path / "d.jsonl", [{"context": f"Passage {i}.", "question": f"Question {i}?",
                                               "answers": {"text": ["Passage"]}} for i in range(4)])
    cfg = RunConfig(**dict(SMALL, dataset=path, num_samples=4, eval_samples=8))
    p = plan(cfg)
    warning = (f"warning: 0 of the 8 held-out questions asked (eval_samples): num_samples 4 takes every row of {path}, "
               "so none is held out; lower num_samples")
    assert warning in describe_plan(cfg, p)
    assert p.eval_rows == [] and p.data["eval_pool"] == 0
    assert main(["check", "--offline", "--dataset", path, "--num_samples", "4", "--eval_samples", "8",
                 "--batch_size", "1", "--grad_accum", "1"]) == 0
    assert warning in capsys.readouterr().out


def test_question_key_names_the_question_not_its_place(tmp_path):
    """Files without ids get none made up from the row's place (the same number would name different questions in
    two files); question_key tells questions apart by id, passage and question, and names one question alike in
    every file. A file's own ids are kept."""
    def nested_file(name, cities):
        path = tmp_path / name
        path.write_text(json.dumps(nested([{"context": f"{c} district {i} is old.", "qas": [
            {"question": f"How old is district {i}?", "answers": [{"text": "old", "answer_start": 0}]}]}
            for c in cities for i in range(2)]), ensure_ascii=False))
        return load_records(RunConfig(**dict(OFFLINE, dataset=str(path), num_samples=4)))

    lima, seoul = nested_file("lima.json", ["Lima", "Cusco"]), nested_file("seoul.json", ["Seoul", "Cusco"])
    assert {r["id"] for r in lima + seoul} == {""}
    assert question_key(lima[0]) != question_key(seoul[0])  # the same place in two files, two questions
    assert [question_key(r) for r in lima[2:]] == [question_key(r) for r in seoul[2:]]  # one question, one key
    same = [{"id": "", "context": f"Passage {i}.", "question": "What is it?", "answers": {"text": ["it"]}}
            for i in range(4)]
    assert len({question_key(r) for r in same}) == 4
    path = write_rows(tmp_path / "ids.jsonl", [dict(r, id=f"own-{i}") for i, r in enumerate(same)])
    assert [r["id"] for r in load_records(RunConfig(**dict(OFFLINE, dataset=path, num_samples=4)))] == [
        "own-0", "own-1", "own-2", "own-3"]


@pytest.mark.integration
def test_the_data_counts_and_scoring_mode_reach_the_run(tmp_path, workdir):
    """One real run on a file with rows whose passage lacks the answer, passages longer than max_length and held-out
    rows that share a training passage: the counts, the scoring mode and the warning are on the MLflow run."""
    import mlflow

    from dsnb.launch import run_variant

    rows = [{"context": f"강 {i}은 바다로 흐른다. " + "마을을 지나 " * 30 + f"끝에 {i}번 다리가 있다.",
             "question": f"{i}번 강의 끝에는 무엇이 있나?", "answers": {"text": [f"{i}번 다리"]}} for i in range(12)]
    rows[1]["answers"] = {"text": ["없는 답"]}
    rows += [dict(rows[0], question="다른 질문?"),
             {"context": "그 다리는 1398년에 지어졌다.", "question": "다리는 언제?", "answers": {"text": ["1398"]}}]
    path = write_rows(tmp_path / "long.jsonl", rows)
    cfg = RunConfig(**dict(SMALL, dataset=path, num_samples=8, eval_samples=20, save_model=False))
    result = run_variant(cfg, progress=False)
    assert result.status == "FINISHED", result
    run = mlflow.MlflowClient(result.tracking_uri.replace("sqlite:///", f"sqlite:///{workdir}/")).get_run(
        result.run_id)
    params = run.data.params
    assert params["train_left_out_not_in_passage"] == "1" and int(params["train_windows_moved"]) >= 6
    assert params["truncated_samples"] == "0" and params["scoring_mode"] == "korquad"
    assert (params["eval_pool"], params["eval_left_out_shares_training"]) == ("6", "1")
    assert (params["eval_left_out_answer_cut"], result.metrics["eval_questions"]) == ("4", 1)
    assert run.data.tags["data_warning"] == ("1 of the 20 held-out questions asked (eval_samples): the held-out part "
                                             "holds 6 rows, 5 of them left out")


def test_a_dataset_json_that_gives_a_key_twice_or_nests_too_deep_is_named(tmp_path):
    """JSON readers keep the last of two keys silently: in a SQuAD file that would train one of two questions."""
    twice = tmp_path / "twice.json"
    twice.write_text('{"data": [{"title": "t", "paragraphs": [{"context": "Seoul.", "qas": [{"id": "1", '
                     '"question": "Which?", "question": "What?", '
                     '"answers": [{"text": "Seoul", "answer_start": 0}]}]}]}]}')
    with pytest.raises(ConfigError, match="twice.json: the key 'question' is given twice in one object; keep one"):
        load_records(RunConfig(**dict(OFFLINE, dataset=str(twice), num_samples=1)))
    deep = tmp_path / "deep.json"
    deep.write_text('{"data": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(ConfigError, match="deep.json is nested too deeply to read"):
        load_records(RunConfig(**dict(OFFLINE, dataset=str(deep), num_samples=1)))


def test_answers_in_a_shape_that_would_train_the_no_answer_marker_are_refused_and_unanswerable_rows_counted(tmp_path):
    """A mapping of answers without "text" (a typo) and pandas' to_csv printout of a datasets column would each train
    the "no answer" marker (or the printout) unsaid: refused, naming the row. Rows with no answer at all (SQuAD 2.0's
    unanswerable questions) are valid: the plan says how many train the marker, and the run logs it."""
    import numpy as np

    from dsnb.planning import describe_plan, plan

    rows = [r for r in synthetic_squad(60) if r["answers"]["text"]][:24]
    typo = [dict(r, answers={"texts": r["answers"]["text"], "answer_start": [0]}) if i == 3 else r
            for i, r in enumerate(rows)]
    (tmp_path / "typo.jsonl").write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in typo))
    with pytest.raises(ConfigError, match='row 4: answers has no "text" \\(its keys: texts, answer_start\\)'):
        load_records(RunConfig(**dict(OFFLINE, dataset=str(tmp_path / "typo.jsonl"), num_samples=16)))
    frame = pd.DataFrame([{"context": r["context"], "question": r["question"],
                           "answers": {"text": np.array(r["answers"]["text"], dtype=object),
                                       "answer_start": np.array(r["answers"]["answer_start"], dtype=np.int32)}}
                          for r in rows])
    frame.to_csv(tmp_path / "p.csv", index=False)
    with pytest.raises(ConfigError, match="Python's printout of a mapping .* not JSON; write the answers with "
                                          "json.dumps"):
        load_records(RunConfig(**dict(OFFLINE, dataset=str(tmp_path / "p.csv"), num_samples=16)))
    # a list of answers as a cell: JSON is read as the list, Python's printout of one refused (not trained as text)
    frame.assign(answers=[json.dumps(r["answers"]["text"], ensure_ascii=False) for r in rows]).to_csv(
        tmp_path / "list.csv", index=False)
    loaded = load_records(RunConfig(**dict(OFFLINE, dataset=str(tmp_path / "list.csv"), num_samples=16)))
    assert [r["answers"]["text"] for r in loaded] == [r["answers"]["text"] for r in rows[:len(loaded)]] and loaded
    frame.assign(answers=[repr(r["answers"]["text"]) for r in rows]).to_csv(tmp_path / "plist.csv", index=False)
    with pytest.raises(ConfigError, match="Python's printout of a list .* not JSON"):
        load_records(RunConfig(**dict(OFFLINE, dataset=str(tmp_path / "plist.csv"), num_samples=16)))
    cfg = RunConfig(**dict(OFFLINE, num_samples=200, eval_samples=0))
    unanswerable = sum(not r["answers"]["text"] for r in load_records(cfg))
    p = plan(cfg)
    assert unanswerable and p.data["train_no_answer"] == unanswerable
    assert f"note: {unanswerable} of the {p.samples} training samples have no answer (SQuAD 2.0's unanswerable " \
           f"questions, or an answer left empty): they train the answer {NO_ANSWER!r}" in describe_plan(cfg, p)


def test_an_answer_start_that_misses_its_answer_is_not_trusted(tmp_path):
    """answer_start as a string, negative, past the passage's end or at another place: the answer is placed where its
    text occurs (the second 서울 here, where the start points at it, is kept)."""
    from dsnb.data import answer_spans

    context = "서울은 수도이다. 서울의 강은 한강이다."
    path = tmp_path / "starts.json"
    starts = ["zero", -5, 999, 4, 10]
    path.write_text(json.dumps(nested([{"context": context, "qas": [qa(i, "서울", s) for i, s in enumerate(starts)]}]),
                               ensure_ascii=False))
    rows = load_records(RunConfig(**dict(OFFLINE, dataset=str(path), num_samples=5)))
    assert [answer_spans(r, context) for r in rows] == [[(0, 2)], [(0, 2)], [(0, 2)], [(0, 2)], [(10, 12)]]
