"""SQuAD-format rows from the hub, a local file or a deterministic offline generator, tokenized the tutorial's way.

    rows = load_records(cfg)                     # [{"question": ..., "answers": {"text": [...]}}, ...]
    train_set = build_dataset(cfg, tokenizer)    # input_ids / attention_mask / labels (padding ignored)
    collate = collator(tokenizer, cfg)           # pads (or packs) each batch as cfg.padding says
"""
from __future__ import annotations

import json
import os
import random

from .config import ConfigError, RunConfig, describe

PROMPT = "질문: {question}\n답변: {answer}"
NO_ANSWER = "정답 없음"
FILE_TYPES = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


def load_records(cfg: RunConfig) -> list[dict]:
    """The first cfg.num_samples rows of the train split, each with `question` and `answers`."""
    if cfg.dataset == "synthetic":
        return synthetic_squad(cfg.num_samples)
    if cfg.dataset == "squad":
        return hub_squad(cfg.num_samples)
    return file_records(cfg.dataset, cfg.num_samples)


def hub_squad(n: int) -> list[dict]:
    import datasets

    try:
        rows = datasets.load_dataset("squad", split=f"train[:{n}]")
    except Exception as e:  # offline, blocked or renamed: all end the same way for the user
        raise ConfigError(f"dataset 'squad' could not be loaded from the hub ({describe(e)}); use dataset=synthetic or a local file") from None
    return [dict(r) for r in rows]


def file_records(path: str, n: int) -> list[dict]:
    """Rows of a local JSON/JSONL/CSV/Parquet file with SQuAD's fields (`answers`, or a plain `answer`)."""
    kind = FILE_TYPES.get(os.path.splitext(path)[1].lower())
    if kind is None:
        raise ConfigError(f"dataset {path!r} is not squad, synthetic, or a {'/'.join(FILE_TYPES)} file")
    if not os.path.isfile(path):
        raise ConfigError(f"dataset file {path!r} does not exist; check the path or use dataset=synthetic")
    import datasets

    try:
        rows = datasets.load_dataset(kind, data_files=path, split="train")
    except Exception as e:
        raise ConfigError(f"dataset file {path} could not be read as {kind} ({describe(e)})") from None
    if len(rows) == 0:
        raise ConfigError(f"dataset file {path} holds no rows")
    missing = [c for c in ("question",) if c not in rows.column_names]
    if missing or not {"answers", "answer"} & set(rows.column_names):
        raise ConfigError(f"dataset file {path} needs columns question and answers (or answer); "
                          f"it has {', '.join(rows.column_names)}")
    if n > len(rows):
        raise ConfigError(f"num_samples is {n} but {path} holds {len(rows)} rows; set num_samples <= {len(rows)}")
    return [dict(r) for r in rows.select(range(n))]


def answer_text(row: dict) -> str:
    """The first answer's text, or the tutorial's "no answer" marker."""
    answers = row.get("answers", row.get("answer"))
    if isinstance(answers, str) and answers.startswith("{"):
        answers = json.loads(answers)  # SQuAD's nested field, flattened into a CSV cell
    if isinstance(answers, dict):
        texts = answers.get("text") or []
        return texts[0] if texts else NO_ANSWER
    return answers if answers else NO_ANSWER


def format_prompt(row: dict) -> str:
    return PROMPT.format(question=row["question"], answer=answer_text(row))


def build_dataset(cfg: RunConfig, tokenizer, rows: list[dict] | None = None):
    """Tokenize rows into a datasets.Dataset of input_ids, attention_mask and labels.

    Labels are the input ids with padding masked to -100, so the loss never counts padding.
    """
    import datasets

    rows = load_records(cfg) if rows is None else rows
    if len(rows) < cfg.num_samples:
        raise ConfigError(f"num_samples is {cfg.num_samples} but the data holds {len(rows)} rows; lower num_samples")
    encoded = tokenizer([format_prompt(r) for r in rows], truncation=True, max_length=cfg.max_length,
                        padding="max_length" if cfg.padding == "max_length" else False)
    labels = [[t if m else -100 for t, m in zip(ids, mask)]
              for ids, mask in zip(encoded["input_ids"], encoded["attention_mask"])]
    return datasets.Dataset.from_dict({"input_ids": encoded["input_ids"],
                                       "attention_mask": encoded["attention_mask"], "labels": labels})


BUCKET = 64  # padding "bucket" rounds each batch's length up to a multiple of this
PACK_ROWS = 2  # padding "packed" rounds each batch's row count up to a multiple of this


def collator(tokenizer, cfg: RunConfig):
    """Batches of input ids, labels (-100 where nothing is predicted) and a mask or position ids.

    max_length/longest/bucket pad to the batch's longest row (rounded up to BUCKET for bucket);
    packed puts the samples end to end in rows of cfg.max_length tokens.
    """
    if cfg.padding == "packed":
        return PackedCollator(tokenizer.pad_token_id, cfg.max_length)
    from transformers import DataCollatorForSeq2Seq

    return DataCollatorForSeq2Seq(tokenizer, padding="longest", label_pad_token_id=-100,
                                  pad_to_multiple_of=BUCKET if cfg.padding == "bucket" else None)


class PackedCollator:
    """Packs a batch's samples into rows of `row_length` tokens, end to end with no padding between them.

    Position ids restart at 0 for each sample; with no attention mask, transformers then builds a
    block-diagonal causal mask from them, so no sample sees another. Each sample's first token gets
    label -100, as nothing predicts it in a padded batch either: the loss covers the same tokens.
    Each row's tail is padding (label -100, its own positions), and whole padding rows round the row
    count up to a multiple of PACK_ROWS: few distinct shapes, each compiled once and replayed as CUDA
    graphs (a new row count during the timed steps would recompile there).
    """

    def __init__(self, pad_id: int, row_length: int):
        self.pad_id, self.row_length = pad_id, row_length

    def __call__(self, features: list[dict]) -> dict:
        import torch

        order, placed = first_fit([len(f["input_ids"]) for f in features], self.row_length)
        rows: list[tuple[list, list, list]] = [([], [], []) for _ in range(packed_rows(placed))]
        for i in order:
            sample, (ids, labels, positions) = list(features[i]["input_ids"]), rows[placed[i]]
            ids.extend(sample)
            labels.extend([-100] + list(features[i]["labels"])[1:])
            positions.extend(range(len(sample)))
        out = {"input_ids": [], "labels": [], "position_ids": []}
        for ids, labels, positions in rows:  # no sample is longer than a row: both are max_length
            pad = self.row_length - len(ids)
            out["input_ids"].append(ids + [self.pad_id] * pad)
            out["labels"].append(labels + [-100] * pad)
            out["position_ids"].append(positions + list(range(pad)))
        return {k: torch.tensor(v) for k, v in out.items()}


def first_fit(lengths: list[int], row_length: int) -> tuple[list[int], list[int]]:
    """First fit, longest first: (samples in placing order, each sample's row). The fewest rows, so the
    row count barely varies between batches."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    used: list[int] = []
    placed = [0] * len(lengths)
    for i in order:
        row = next((r for r, n in enumerate(used) if n + lengths[i] <= row_length), len(used))
        if row == len(used):
            used.append(0)
        used[row] += lengths[i]
        placed[i] = row
    return order, placed


def packed_rows(placed: list[int]) -> int:
    """Rows a packed batch takes, given first_fit's row of each sample: padding rows included."""
    rows = max(placed, default=-1) + 1
    return rows + (-rows % PACK_ROWS)


def real_tokens(batch: dict, pad_id: int):
    """Non-padding tokens in a collated batch, as a tensor (no host sync)."""
    if "attention_mask" in batch:
        return batch["attention_mask"].sum()
    return (batch["input_ids"] != pad_id).sum()


# --- the offline SQuAD-format generator ------------------------------------------------------------
# Facts rendered as Korean and English question/answer pairs, about as long as SQuAD's (~40 tokens
# in the tutorial's prompt). A fixed seed makes the set identical for every variant and machine.
_FACTS = [
    ("서울", "Seoul", "대한민국", "South Korea"), ("도쿄", "Tokyo", "일본", "Japan"),
    ("파리", "Paris", "프랑스", "France"), ("베를린", "Berlin", "독일", "Germany"),
    ("로마", "Rome", "이탈리아", "Italy"), ("마드리드", "Madrid", "스페인", "Spain"),
    ("카이로", "Cairo", "이집트", "Egypt"), ("오타와", "Ottawa", "캐나다", "Canada"),
    ("리마", "Lima", "페루", "Peru"), ("하노이", "Hanoi", "베트남", "Vietnam"),
    ("나이로비", "Nairobi", "케냐", "Kenya"), ("캔버라", "Canberra", "호주", "Australia"),
]
_EVENTS = [("대학교", "university", 1636), ("도서관", "library", 1895), ("박물관", "museum", 1753),
           ("성당", "cathedral", 1163), ("기차역", "railway station", 1871), ("병원", "hospital", 1910)]


def synthetic_squad(n: int, seed: int = 0) -> list[dict]:
    """n deterministic SQuAD-format rows (id, title, context, question, answers), Korean and English."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        ko_city, en_city, ko_country, en_country = rng.choice(_FACTS)
        ko_place, en_place, year = rng.choice(_EVENTS)
        year += rng.randrange(0, 80)
        kind = rng.randrange(5)
        if kind == 0:
            context = f"{en_city} is the capital of {en_country}. Its oldest {en_place} opened in {year}."
            question, answer = f"According to the passage, what is the capital city of {en_country}?", en_city
        elif kind == 1:
            context = f"{en_city} is the capital of {en_country}. Its oldest {en_place} opened in {year}."
            question, answer = f"In which year did the oldest {en_place} in {en_city} first open its doors?", str(year)
        elif kind == 2:
            context = f"{ko_country}의 수도는 {ko_city}이다. 그 도시의 가장 오래된 {ko_place}은 {year}년에 문을 열었다."
            question, answer = f"본문에 따르면 {ko_country}의 수도는 어디인가요?", ko_city
        elif kind == 3:
            context = f"{ko_country}의 수도는 {ko_city}이다. 그 도시의 가장 오래된 {ko_place}은 {year}년에 문을 열었다."
            question, answer = f"{ko_city}에서 가장 오래된 {ko_place}은 몇 년에 문을 열었나요?", f"{year}년"
        else:  # unanswerable from its context, like SQuAD 2.0's; the prompt then says "정답 없음"
            context = f"{en_city} is the capital of {en_country}."
            question, answer = f"Who designed the oldest {en_place} in {en_city}, and when was it finished?", None
        start = context.find(answer) if answer else -1
        rows.append({"id": f"synthetic-{i:06d}", "title": en_country, "context": context, "question": question,
                     "answers": {"text": [answer] if answer else [], "answer_start": [start] if answer else []}})
    return rows
