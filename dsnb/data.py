"""SQuAD-format rows from the hub, a local file or a deterministic offline generator, tokenized the tutorial's way.

    rows = load_records(cfg)                     # [{"question": ..., "answers": {"text": [...]}}, ...], validated
    asked, counts = held_out(cfg, 64, tokenizer) # questions no training row holds, and how many were left out, why
    train_set = build_dataset(cfg, tokenizer)    # input_ids / attention_mask / labels (padding ignored)
    collate = collator(tokenizer, cfg)           # pads (or packs) each batch as cfg.padding says
    question_key(row)                            # the question's own name, to join runs' answers on

Every row is checked as it is read: a file's bad bytes, a question that is not text, an `answers.text` that is a
string rather than a list, or an official nested JSON file of another shape stop the run before any model loads,
naming the file and the row (or article, paragraph and question). With the passage prompt, a row whose passage lacks
its answer is left out, and counted: training on it would teach an answer the sample does not show.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import random
import re

from .config import ConfigError, RunConfig, describe, hub_offline_note, unique_keys

PROMPT = "질문: {question}\n답변: {answer}"  # the tutorial's closed-book text
PASSAGE = "본문: {context}\n질문: {question}\n답변: {answer}"  # reading comprehension: SQuAD's task
CLOSED_BOOK = ("eos", "tutorial", "chat")  # prompts without the passage: the answer must come from memory
NO_ANSWER = "정답 없음"
FILE_TYPES = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


def eval_task(cfg: RunConfig) -> str:
    """What the held-out scores measure, as every report labels them: reading comprehension, or (a closed-book
    prompt) what the model already knew (synthetic data: paraphrases of the trained facts)."""
    if cfg.prompt not in CLOSED_BOOK:
        return "reading the passage"
    return "closed-book: paraphrases of trained facts" if cfg.dataset == "synthetic" else "closed-book: prior knowledge"
HUB_SQUAD = "rajpurkar/squad"  # the canonical, namespaced id: datasets 5 refuses the bare "squad"
# KorQuAD 1.0 (Korean SQuAD-format reading comprehension) for the Korean model the tutorial fine-tunes. Its hub
# repository holds a loading script, which datasets 5 no longer runs; the hub's own Parquet conversion is read instead.
HUB_DATASETS = {"squad": HUB_SQUAD, "korquad": "KorQuAD/squad_kor_v1"}
HUB_REVISIONS = {"korquad": "refs/convert/parquet"}
EVAL_SEED = 0  # draws the held-out questions: the same for every variant, run and seed


def load_records(cfg: RunConfig, split: str = "train", n: int | None = None) -> list[dict]:
    """Validated rows: the first cfg.num_samples of the training data, or (split "eval") the held-out rows that
    held_out() picks (n of them at most)."""
    if split == "eval":
        return held_out(cfg, cfg.num_samples if n is None else n)[0]
    n = cfg.num_samples if n is None else n
    if cfg.dataset == "synthetic":
        rows, where = synthetic_squad(n), "synthetic"
    elif cfg.dataset in HUB_DATASETS:
        rows, where = hub_rows(cfg.dataset, n, "train"), HUB_DATASETS[cfg.dataset]
    else:
        rows, where = file_records(cfg.dataset, n)
    return [normalize_row(row, f"{where}, row {i + 1}") for i, row in enumerate(rows)]


LEFT_OUT = ("shares_training", "not_in_passage", "answer_cut")  # why a held-out question is not asked


def held_out(cfg: RunConfig, n: int, tokenizer=None) -> tuple[list[dict], dict]:
    """Up to n held-out questions, and how many were left out and why.

    Candidates come in one seeded order (EVAL_SEED: the same for every variant, run and seed) over the whole held-out
    part: SQuAD's (or KorQuAD's) validation split, the rows of a file after the training ones, or the synthetic
    questions of the held-out kind. A candidate is left out, and the next one taken, where (a file) a training row
    has its passage, or without passages its question and answer (shares_training: the synthetic set shares passages
    by design, its questions are held out; SQuAD's splits hold different articles); where (prompt passage) none of its
    answers is in its passage (not_in_passage); where (prompt passage, given a tokenizer) the window of the passage
    it is asked with loses every answer (answer_cut). Returns (the rows in the held-out part's order, counts: eval_pool
    the held-out rows there are, eval_left_out_<reason> for each reason)."""
    trained, first = [], 0
    if cfg.dataset == "synthetic":
        pool, where = synthetic_squad(72, held_out=True), "synthetic"
    elif cfg.dataset in HUB_DATASETS:
        pool, where = hub_rows(cfg.dataset, None, "validation"), HUB_DATASETS[cfg.dataset]
    else:
        pool, where = file_records(cfg.dataset, None, skip=cfg.num_samples)
        trained, first = load_records(cfg), cfg.num_samples
    taken = {shared_part(row) for row in trained}
    left = dict.fromkeys(LEFT_OUT, 0)
    chosen: list[tuple[int, dict]] = []
    # A permutation of the whole part, so a question left out gives its place to the next of the same draw.
    for i in random.Random(EVAL_SEED).sample(range(len(pool)), len(pool)):
        if len(chosen) == n:
            break
        row = normalize_row(pool[i], f"{where}, row {first + i + 1}")
        reason = left_out_because(cfg, tokenizer, row, taken)
        if reason:
            left[reason] += 1
        else:
            chosen.append((i, row))
    return [row for _, row in sorted(chosen, key=lambda c: c[0])], {
        "eval_pool": len(pool), **{f"eval_left_out_{reason}": count for reason, count in left.items()}}


def shared_part(row: dict) -> tuple:
    """What a held-out row may not share with a training row: its passage, or without one its question and answers."""
    context = row.get("context")
    if isinstance(context, str) and context.strip():
        return ("passage", context)
    return ("question", row["question"], tuple(row["answers"]["text"]))


def left_out_because(cfg: RunConfig, tokenizer, row: dict, taken: set) -> str | None:
    """Why a held-out row is not asked (one of LEFT_OUT), or None."""
    if shared_part(row) in taken:
        return "shares_training"
    if not answer_in_passage(cfg, row):
        return "not_in_passage"
    if tokenizer is not None and cfg.prompt == "passage" and row["answers"]["text"]:
        window = passage_window(cfg, tokenizer, row)
        if not any(in_window(span, window) for span in answer_spans(row, row["context"])):
            return "answer_cut"
    return None


def hub_rows(name: str, n: int | None, split: str = "train") -> list[dict]:
    """The first n rows (all with None) of a split of SQuAD or KorQuAD 1.0 on the hub."""
    import datasets

    hub_id, revision = HUB_DATASETS[name], HUB_REVISIONS.get(name)
    try:
        rows = datasets.load_dataset(hub_id, split=split if n is None else f"{split}[:{n}]", revision=revision)
    except Exception as e:  # offline, blocked or renamed: all end the same way for the user
        raise ConfigError(f"dataset {name!r} ({hub_id}) could not be loaded from the hub ({describe(e)})"
                          f"{hub_offline_note()}; use "
                          "dataset=synthetic, or a local file (the official SQuAD-format JSON works as it is)") \
            from None
    return [dict(r) for r in rows]


def file_records(path: str, n: int | None, skip: int = 0) -> tuple[list[dict], str]:
    """Rows skip..skip+n (to the end with None) of a local JSON/JSONL/CSV/Parquet file with SQuAD's fields
    (`answers`, or a plain `answer`; the official nested SQuAD/KorQuAD JSON too), and how to name the file in
    messages. With skip (held-out rows), fewer rows are no error."""
    rows = file_dataset(path)
    if len(rows) == 0:
        raise ConfigError(f"dataset file {path} holds no rows")
    missing = [c for c in ("question",) if c not in rows.column_names]
    if missing or not {"answers", "answer"} & set(rows.column_names):
        raise ConfigError(f"dataset file {path} needs columns question and answers (or answer); "
                          f"it has {', '.join(rows.column_names)}")
    if not skip and n is not None and n > len(rows):
        raise ConfigError(f"num_samples is {n} but {path} holds {len(rows)} rows; set num_samples <= {len(rows)}")
    if skip >= len(rows):  # no row after the training ones: nothing held out
        return [], f"dataset file {path}"
    end = len(rows) if n is None else min(skip + n, len(rows))
    try:
        return [dict(r) for r in rows.select(range(skip, end))], f"dataset file {path}"
    except UnicodeDecodeError as e:  # a Parquet string column holding bytes that are not UTF-8
        raise ConfigError(f"dataset file {path} holds text that is not valid UTF-8 ({describe(e)}); "
                          "save it as UTF-8") from None
    except ValueError as e:  # rows that Arrow read but cannot hand out, e.g. keys "" and "\0" in one object
        raise ConfigError(f"dataset file {path}'s rows could not be read ({describe(e)}); give each row the fields "
                          "question and answers (with text), each key once") from None


def file_dataset(path: str):
    """A local data file, checked (its kind, that it exists, UTF-8 text) and read as a datasets.Dataset."""
    if os.path.isdir(path):
        raise ConfigError(f"dataset {path!r} is a folder, not a file; give the data file inside it")
    kind = FILE_TYPES.get(os.path.splitext(path)[1].lower())
    if kind is None:
        raise ConfigError(f"dataset {path!r} is not squad, korquad, synthetic, or a {'/'.join(FILE_TYPES)} file")
    if not os.path.isfile(path):
        raise ConfigError(f"dataset file {path!r} does not exist; check the path or use dataset=synthetic")
    stat = os.stat(path)
    return read_file(path, kind, stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=2)
def read_file(path: str, kind: str, size: int, mtime_ns: int):
    """A local data file as a datasets.Dataset (the official nested SQuAD JSON flattened first). Read once a process
    while the file stays as it was (its size and time, in the arguments): training rows, held-out rows and the
    scoring's language all come from it."""
    import datasets

    if kind != "parquet":
        check_utf8(path)
    nested = squad_articles(path) if kind == "json" else None
    try:
        with quiet_datasets():  # a local file's "Generating train split" bar tells nothing
            return datasets.Dataset.from_list(nested) if nested is not None else \
                datasets.load_dataset(kind, data_files=path, split="train")
    except Exception as e:
        while e.__cause__ is not None:  # datasets' "An error occurred while generating the dataset": say what did
            e = e.__cause__
        if no_rows(path, kind):  # Arrow's "BatchSize must be greater than 0", datasets' "corresponds to no data"
            raise ConfigError(f"dataset file {path} holds no rows{' (a header alone)' if kind == 'csv' else ''}; "
                              "give a file of question/context/answers records") from None
        raise ConfigError(f"dataset file {path} could not be read as {kind} ({describe(e)})") from None


def no_rows(path: str, kind: str) -> bool:
    """Whether a CSV holds a header and no row, or a Parquet file no row (each read fails in its own words)."""
    try:
        if kind == "parquet":
            import pyarrow.parquet as pq

            return pq.read_metadata(path).num_rows == 0
        if kind == "csv":
            with open(path, encoding="utf-8") as f:
                return sum(1 for line in f if line.strip()) <= 1
    except Exception:  # not Parquet at all: the read's own error says so
        return False
    return False


def squad_articles(path: str) -> list[dict] | None:
    """The questions of an official SQuAD-format JSON file ({"data": [{"title", "paragraphs": [{"context", "qas"}]}]}),
    flat, in the file's order, each checked where it stands (a ConfigError names the article, paragraph and question
    by number, and the article's title); None for any other JSON (a list of rows, JSON lines)."""
    try:
        with open(path, encoding="utf-8-sig") as f:  # a byte-order mark, as some Windows editors write, is no text
            top = json.load(f, object_pairs_hook=unique_keys(f"dataset file {path}"))
    except json.JSONDecodeError:  # JSON lines, or not JSON at all: datasets reads or refuses it
        return None
    except RecursionError:
        raise ConfigError(f"dataset file {path} is nested too deeply to read; give SQuAD's JSON or JSON lines") \
            from None
    articles = squad_data(top, path)
    if articles is None:
        return None
    rows = []
    for a, article in enumerate(articles, 1):
        place = f"dataset file {path}, article {a}"
        if not isinstance(article, dict):
            raise ConfigError(f"{place} is {brief(article)}; each entry of data is an object with title and paragraphs")
        title = article.get("title")
        place += f" ({title!r})" if title else ""
        paragraphs = article.get("paragraphs")
        if not isinstance(paragraphs, list):
            raise ConfigError(f"{place}: paragraphs is {brief(paragraphs)}; give a list of {{\"context\", \"qas\"}} "
                              "objects")
        for p, paragraph in enumerate(paragraphs, 1):
            rows += paragraph_rows(paragraph, f"{place}, paragraph {p}", "" if title is None else str(title))
    if not rows:
        raise ConfigError(f"dataset file {path} is SQuAD-format JSON but holds no questions")
    return rows


def squad_data(top, path: str) -> list | None:
    """The articles of a SQuAD-format file's JSON ({"data": [...]}, or that list alone), or None for other JSON."""
    if top in ([], {}):
        raise ConfigError(f"dataset file {path} holds no records; give question/context/answers records")
    if isinstance(top, list) and all(isinstance(a, dict) and isinstance(a.get("paragraphs"), list)
                                     and "question" not in a for a in top):
        return top  # the list of articles alone, without the file's {"version", "data"} around it
    if isinstance(top, dict) and "data" in top and not isinstance(top["data"], list):
        raise ConfigError(f"dataset file {path}: data is {brief(top['data'])}; SQuAD's JSON holds a list of articles "
                          "there: {\"data\": [{\"title\", \"paragraphs\": [...]}, ...]}")
    return top["data"] if isinstance(top, dict) and isinstance(top.get("data"), list) else None


def paragraph_rows(paragraph, place: str, title: str) -> list[dict]:
    """The validated rows of one paragraph of the official nested JSON. Its id is the file's own, or none: a number
    made up from the row's place would name different questions in two files."""
    if not isinstance(paragraph, dict):
        raise ConfigError(f"{place} is {brief(paragraph)}; each paragraph is an object with context and qas")
    context, qas = paragraph.get("context", ""), paragraph.get("qas") or []
    if not isinstance(context, str):
        raise ConfigError(f"{place}: context is {brief(context)}; give the passage as text")
    if isinstance(qas, dict) and "question" in qas:  # one question without its list around it: the meaning is clear
        qas = [qas]
    if not isinstance(qas, list):
        raise ConfigError(f"{place}: qas is {brief(qas)}; give a list of {{\"id\", \"question\", \"answers\"}} objects")
    rows = []
    for q, qa in enumerate(qas, 1):
        where = f"{place}, question {q}"
        if not isinstance(qa, dict):
            raise ConfigError(f"{where} is {brief(qa)}; each question is an object with question and answers")
        row = {"id": "" if qa.get("id") is None else str(qa["id"]), "title": title, "context": context,
               "question": qa.get("question"), "answers": qa.get("answers")}
        rows.append(normalize_row(row, where))
    return rows


def brief(value) -> str:
    """A value as messages show it: its type, and its start."""
    text = repr(value)
    return f"{type(value).__name__} {text[:40]}{'...' if len(text) > 40 else ''}"


@contextlib.contextmanager
def quiet_datasets():
    """datasets' progress bars off inside the block (as they were after it), and its log below errors: a file it
    cannot parse is said once, by dsnb's own error, not first as its "Failed to load JSON ..." line."""
    import datasets

    was, level = datasets.is_progress_bar_enabled(), datasets.logging.get_verbosity()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    try:
        yield
    finally:
        datasets.logging.set_verbosity(level)
        if was:
            datasets.enable_progress_bars()


def check_utf8(path: str) -> None:
    """A text file must be UTF-8 (name the first line that is not) and hold more than blank lines, in one read."""
    blank = True
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            try:
                text = line.decode("utf-8")
                blank = blank and not text.lstrip("\ufeff").strip()
            except UnicodeDecodeError as e:
                raise ConfigError(f"dataset file {path}, line {number}: byte {line[e.start]:#04x} is not UTF-8 "
                                  "text; save the file as UTF-8") from None
    if blank:
        raise ConfigError(f"dataset file {path} is empty; give a file of question/context/answers records")


def normalize_row(row: dict, place: str) -> dict:
    """The row with a text question and SQuAD's answers ({"text": [str, ...], "answer_start": [int, ...]}), or a
    ConfigError naming the row (place)."""
    question = row.get("question")
    if not isinstance(question, str) or not question.strip():
        raise ConfigError(f"{place}: question is {question!r}; every row needs its question as text")
    answers = row["answers"] if "answers" in row else row.get("answer")
    return {**row, "question": question, "answers": parse_answers(answers, place, listed="answers" in row)}


def decoded_cell(cell: str, place: str):
    """SQuAD's nested answers flattened into a CSV cell as JSON, decoded; a cell that only looks like JSON is its own
    text (a list of that one answer). Python's printout of a mapping (pandas' to_csv of a datasets column) is refused:
    read as text, the run would train that printout as the answer."""
    try:
        decoded = json.loads(cell)
    except json.JSONDecodeError:
        kind = ("a mapping" if re.match(r"\s*\{\s*'(text|answer_start)'\s*:", cell) else
                "a list" if cell.lstrip().startswith("[") and python_list(cell) else None)
        if kind:
            raise ConfigError(f"{place}: answers is {cell[:60]!r}..., Python's printout of {kind} (pandas' to_csv "
                              "of a datasets column writes it so), not JSON; write the answers with json.dumps, or "
                              "save the table as JSONL or Parquet") from None
        return [cell]
    if isinstance(decoded, list) and not (decoded and all(isinstance(a, str) or isinstance(a, dict) and "text" in a
                                                          for a in decoded)):
        return [cell]  # "[2]", "[0, 1]": text that reads as a JSON list of no answers ("[]": see parse_answers)
    return decoded


def python_list(cell: str) -> bool:
    """Whether a cell is Python's printout of a list of answer texts or mappings (['Paris'], [{'text': ...}])."""
    import ast

    try:
        value = ast.literal_eval(cell.strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return False
    return isinstance(value, list) and bool(value) and all(isinstance(a, (str, dict)) for a in value)


def parse_answers(answers, place: str, listed: bool = True) -> dict:
    """SQuAD's answers, {"text": [str, ...], "answer_start": [int, ...]} (-1 where a start is not given), from each
    shape with one meaning: SQuAD's flat mapping, the official nested list of {"text", "answer_start"}, a list of
    texts, a plain answer, or a JSON cell holding one of these (a list only in an `answers` column: listed)."""
    if isinstance(answers, str) and answers.lstrip().startswith("{" if not listed else ("{", "[")):
        answers = [] if listed and answers.strip() == "[]" else decoded_cell(answers, place)  # a JSON cell of answers
    starts = []
    if isinstance(answers, dict):
        if answers and "text" not in answers:  # {"texts": [...]}: a typo would train the "no answer" marker
            raise ConfigError(f"{place}: answers has no \"text\" (its keys: {', '.join(map(str, answers))}); give "
                              "SQuAD's {\"text\": [...], \"answer_start\": [...]}")
        texts, starts = answers.get("text"), answers.get("answer_start")
        if isinstance(texts, str):
            raise ConfigError(f"{place}: answers.text is the string {texts[:40]!r}; SQuAD's answers.text is a "
                              f"list of strings, e.g. {{\"text\": [{json.dumps(texts[:40], ensure_ascii=False)}]}}")
        texts = [] if texts is None else texts
        if not isinstance(texts, list) or not all(isinstance(t, (str, int, float)) for t in texts):
            raise ConfigError(f"{place}: answers.text is {texts!r}; give a list of answer strings")
    elif isinstance(answers, list):  # texts, or the official file's {"text", "answer_start"} objects
        pairs = [(a.get("text"), a.get("answer_start")) if isinstance(a, dict) else (a, -1) for a in answers]
        if not all(isinstance(text, (str, int, float)) for text, _ in pairs):
            raise ConfigError(f"{place}: answers is {brief(answers)}; give a list of answer strings or of "
                              "{\"text\", \"answer_start\"} objects")
        texts, starts = [text for text, _ in pairs], [start for _, start in pairs]
    elif answers is None or answers == "":
        texts = []
    elif isinstance(answers, (str, int, float)):
        texts = [answers]
    else:
        raise ConfigError(f"{place}: answers is {answers!r}; give SQuAD's {{\"text\": [...]}} or a plain answer")
    starts = starts if isinstance(starts, list) else []
    starts = [s if isinstance(s, int) and not isinstance(s, bool) and s >= 0 else -1 for s in starts[:len(texts)]]
    return {"text": [str(t) for t in texts], "answer_start": starts + [-1] * (len(texts) - len(starts))}


def answer_text(row: dict) -> str:
    """The first answer's text, or the tutorial's "no answer" marker."""
    texts = row["answers"]["text"]
    return texts[0] if texts else NO_ANSWER


def question_key(row: dict) -> str:
    """A short, stable name of the question a row asks: a hash of its id, passage and question text together. Runs'
    answers are joined on it: an id alone can name different questions (two files numbered alike), and a question
    text alone can stand for several (one question over several passages)."""
    parts = ["" if row.get(k) is None else str(row[k]) for k in ("id", "context", "question")]
    return hashlib.sha1("\x1f".join(parts).encode()).hexdigest()[:16]


HANGUL = re.compile("[\uac00-\ud7a3\u1100-\u11ff\u3130-\u318f]")


def korean_text(cfg: RunConfig) -> bool:
    """Whether at least half the rows of a file or of the synthetic set (all of them, training and held-out) are
    Korean: Hangul in the passage or the question. Decided from the set's text, so every variant of it decides
    alike."""
    if cfg.dataset == "synthetic":
        rows = synthetic_squad(240) + synthetic_squad(72, held_out=True)  # every question the generator asks
        texts = [f"{r['context']} {r['question']}" for r in rows]
    else:
        rows = file_dataset(cfg.dataset)
        columns = [rows[c] for c in ("context", "question") if c in rows.column_names]
        texts = [" ".join(t for t in parts if isinstance(t, str)) for parts in zip(*columns, strict=True)]
    return 2 * sum(bool(HANGUL.search(t)) for t in texts) >= len(texts)


def format_prompt(row: dict) -> str:
    return PROMPT.format(question=row["question"], answer=answer_text(row))


def prompt_parts(cfg: RunConfig, tokenizer, row: dict, window: tuple[int, int] | None = None
                 ) -> tuple[list[int], list[int]]:
    """(the prompt's tokens, the whole sample's tokens) of a row in cfg.prompt's format.

    passage: the passage's window (characters start..end; without one, passage_window's for a question asked),
    its question and answer ("본문: ...\n질문: ...\n답변: ...") and the end-of-sequence token;
    tutorial: the tutorial's closed-book text exactly; eos: that text and the end-of-sequence token, so a generated
    answer stops; chat: the model's own chat template (question as the user's turn, answer as the assistant's). The
    loss covers the whole sample, as in the tutorial; the closed-book prompts are cut at max_length by the caller.
    """
    if cfg.prompt == "passage":
        start, end = window or passage_window(cfg, tokenizer, row)
        fields = dict(context=row["context"][start:end], question=row["question"])
        prompt = tokenizer(PASSAGE.format(**fields, answer="").rstrip())["input_ids"]
        whole = tokenizer(PASSAGE.format(**fields, answer=answer_text(row)))["input_ids"]
        return prompt, whole + [tokenizer.eos_token_id]
    if cfg.prompt == "chat":
        if not tokenizer.chat_template:
            raise ConfigError(f"prompt is 'chat' but {cfg.model} has no chat template; use prompt eos")
        user = [{"role": "user", "content": row["question"]}]
        prompt = tokenizer.apply_chat_template(user, add_generation_prompt=True, return_dict=False)
        whole = tokenizer.apply_chat_template(user + [{"role": "assistant", "content": answer_text(row)}],
                                              return_dict=False)
        return list(prompt), list(whole)
    prompt = tokenizer(PROMPT.format(question=row["question"], answer="").rstrip())["input_ids"]
    whole = tokenizer(format_prompt(row))["input_ids"]
    return prompt, whole + ([tokenizer.eos_token_id] if cfg.prompt == "eos" else [])


def passage(cfg: RunConfig, row: dict) -> str:
    """The row's passage, which prompt passage needs."""
    context = row.get("context")
    if not isinstance(context, str) or not context.strip():
        raise ConfigError(f"prompt is 'passage' but a row of {cfg.dataset} has no passage (its question: "
                          f"{row['question'][:60]!r}); give rows a context column, or use prompt eos (closed-book)")
    return context


def answer_spans(row: dict, context: str) -> list[tuple[int, int] | None]:
    """Where each answer lies in the passage, (start, end) in characters: at its answer_start where that points at its
    text, else where the text first occurs; None where the passage does not hold it."""
    starts = list(row["answers"].get("answer_start") or [])
    spans = []
    for i, text in enumerate(row["answers"]["text"]):
        start = starts[i] if i < len(starts) else -1
        if not (isinstance(start, int) and start >= 0 and context.startswith(text, start)):
            start = context.find(text)
        spans.append((start, start + len(text)) if text and start >= 0 else None)
    return spans


def in_window(span: tuple[int, int] | None, window: tuple[int, int]) -> bool:
    """Whether an answer's span (None: not in the passage) lies whole in a window of the passage."""
    return span is not None and window[0] <= span[0] and span[1] <= window[1]


def answer_in_passage(cfg: RunConfig, row: dict, trained: bool = False) -> bool:
    """Whether the row's passage holds its answer (trained: the first, which the sample teaches; else any of them).
    True without an answer, and for the closed-book prompts, which show no passage."""
    if cfg.prompt != "passage" or not row["answers"]["text"]:
        return True
    spans = answer_spans(row, passage(cfg, row))
    return spans[0] is not None if trained else any(spans)


def passage_window(cfg: RunConfig, tokenizer, row: dict, trained: bool = False) -> tuple[int, int]:
    """The characters (start, end) of the row's passage its sample shows: all of it where the sample fits max_length.

    A trained row's window holds the answer it teaches (answer_start where given, else its first occurrence): the
    passage's start where that holds it, else the first window that does, its start moved half a window at a time, as
    SQuAD's readers stride over a long passage. A question asked gets the passage's start, as much as lets the
    prompt fit.
    """
    context, answer = passage(cfg, row), answer_text(row)

    def fits(start: int, end: int) -> bool:
        fields = dict(context=context[start:end], question=row["question"])
        if trained:  # the whole sample: passage, question, answer and the end-of-sequence token
            return len(tokenizer(PASSAGE.format(**fields, answer=answer))["input_ids"]) + 1 <= cfg.max_length
        # A question asked is shown its window without knowing the answer, as a reader meets it: a window placed (or
        # sized) by the answer would tell the model where to look. The prompt fits; the answer is generated after it.
        return len(tokenizer(PASSAGE.format(**fields, answer="").rstrip())["input_ids"]) < cfg.max_length

    end = widest(fits, 0, len(context))
    span = answer_spans(row, context)[0] if trained and row["answers"]["text"] else None
    if span is None or span[1] <= end or end == 0:  # end 0: no window shows any of the passage
        return 0, end
    stride = max(1, end // 2)
    first = max(1, (span[1] - end) // stride)  # the windows before, about as wide as the first, end before the answer
    for start in [*range(first * stride, span[0], stride), span[0]]:
        start = context.rfind(" ", 0, start) + 1 if start < span[0] else start  # from a word's first character
        end = widest(fits, start, len(context))
        if end >= span[1]:
            break
    return start, end


def widest(fits, start: int, stop: int) -> int:
    """The largest end (start..stop) with fits(start, end), as few characters cut as must be; start where none fits
    (the question alone too long: the passage goes)."""
    if fits(start, stop):
        return stop
    low, high = start, stop - 1
    while low < high:
        mid = (low + high + 1) // 2
        if fits(start, mid):
            low = mid
        else:
            high = mid - 1
    return low


def build_dataset(cfg: RunConfig, tokenizer, rows: list[dict] | None = None):
    """Tokenize rows into a datasets.Dataset of input_ids, attention_mask, labels, full_length, window_moved and
    answer_cut.

    Labels are the input ids with padding masked to -100, so the loss never counts padding; full_length is a
    sample's length before truncation to max_length; window_moved, that its passage's window moved off the start to
    hold the answer; answer_cut, that the sample does not show its whole answer (max_length cut the passage or the
    answer). With prompt passage, rows whose passage lacks their answer are left out: the sample would teach an
    answer it does not show. A max_length that leaves no answer token in any sample is an error (the run would
    train on prompts alone).
    """
    import datasets

    rows = load_records(cfg) if rows is None else rows
    if len(rows) < cfg.num_samples:
        raise ConfigError(f"num_samples is {cfg.num_samples} but the data holds {len(rows)} rows; lower num_samples")
    if rows and not any(text.strip() for r in rows for text in r["answers"]["text"]):  # none, or blank ones only
        raise ConfigError(f"every one of the {len(rows)} training rows of {cfg.dataset} has an empty answer (none, or "
                          f"blank text), so the run would only learn to say {NO_ANSWER!r} or nothing; check the file's "
                          "answers column")
    kept = [row for row in rows if answer_in_passage(cfg, row, trained=True)]
    if rows and not kept:
        raise ConfigError(f"none of the {len(rows)} training rows of {cfg.dataset} has its answer in its passage, so "
                          "the passage prompt would teach answers it never shows; check the file's context and answers "
                          "columns, or use prompt eos (closed-book)")
    windows = [passage_window(cfg, tokenizer, row, trained=True) if cfg.prompt == "passage" else None for row in kept]
    parts = [prompt_parts(cfg, tokenizer, row, window) for row, window in zip(kept, windows, strict=True)]
    if all(len(prompt) >= cfg.max_length for prompt, _ in parts):
        whole = [prompt_parts(cfg, tokenizer, row, (0, len(row["context"])) if window else None)[1]
                 for row, window in zip(kept, windows, strict=True)]  # the whole passage, not the cut window
        raise ConfigError(f"max_length is {cfg.max_length}, which cuts every sample before its answer (the prompts "
                          f"alone take {min(len(p) for p, _ in parts)} tokens or more); {max(map(len, whole))} "
                          "keeps every sample whole (its whole passage, question and answer)")
    columns: dict[str, list] = {"input_ids": [], "attention_mask": [], "labels": [], "full_length": [],
                                "window_moved": [], "answer_cut": []}
    for row, window, (_, whole) in zip(kept, windows, parts, strict=True):
        ids = whole[:cfg.max_length]
        pad = cfg.max_length - len(ids) if cfg.padding == "max_length" else 0
        span = answer_spans(row, row["context"])[0] if window and row["answers"]["text"] else None
        columns["input_ids"].append(ids + [tokenizer.pad_token_id] * pad)
        columns["attention_mask"].append([1] * len(ids) + [0] * pad)
        columns["labels"].append(ids + [-100] * pad)
        columns["full_length"].append(len(whole))
        columns["window_moved"].append(bool(window and window[0] > 0))
        columns["answer_cut"].append(len(whole) > cfg.max_length or bool(span and not in_window(span, window)))
    return datasets.Dataset.from_dict(columns)


def truncated(dataset) -> int:
    """Samples whose answer max_length cut: out of the passage's window, or tokens (or the end-of-sequence token) of
    the answer itself lost."""
    return sum(dataset["answer_cut"])


def held_out_warning(cfg: RunConfig, counts: dict, asked: int) -> str:
    """What a run asked fewer held-out questions than eval_samples should say, or ""."""
    if not cfg.eval_samples or asked >= cfg.eval_samples:
        return ""
    left = sum(counts.get(f"eval_left_out_{reason}", 0) for reason in LEFT_OUT)
    if not counts.get("eval_pool"):
        why = f"num_samples {cfg.num_samples} takes every row of {cfg.dataset}, so none is held out; lower num_samples"
    else:
        why = f"the held-out part holds {counts['eval_pool']} rows, {left} of them left out"
    return f"{asked} of the {cfg.eval_samples} held-out questions asked (eval_samples): {why}"


class BatchLog:
    """A collator that records each micro-batch's samples and real (non-padding) tokens, in order.

    Throughput counts what was really trained: the micro-batches a loop consumed, summed from here,
    the same way for the HF Trainer's loop and dsnb's compiled one (a short last batch counts short).
    """

    def __init__(self, collate):
        self.collate, self.sizes = collate, []

    def __call__(self, features: list[dict]) -> dict:
        self.sizes.append((sum(samples_in(f) for f in features), sum(sum(f["attention_mask"]) for f in features)))
        return self.collate(features)

    def totals(self, micro_batches: int) -> tuple[int, int]:
        """(samples, real tokens) in the first `micro_batches` micro-batches."""
        done = self.sizes[:micro_batches]
        return sum(n for n, _ in done), sum(t for _, t in done)


def samples_in(feature: dict) -> int:
    """Samples in one feature: a sample, or a row of fill_rows (one sample starts at each position id 0)."""
    return 1 if "position_ids" not in feature else sum(p == 0 for p in feature["position_ids"])


MODEL_INPUTS = ("input_ids", "attention_mask", "labels")  # what a padded batch holds (full_length stays behind)
BUCKET = 64  # padding "bucket" rounds each batch's length up to a multiple of this
PACK_ROWS = 2  # padding "packed" rounds each batch's row count up to a multiple of this


def collator(tokenizer, cfg: RunConfig):
    """Batches of input ids, labels (-100 where nothing is predicted) and a mask or position ids.

    max_length/longest/bucket pad to the batch's longest row (rounded up to BUCKET for bucket);
    packed puts the samples end to end in rows of cfg.max_length tokens; filled pads the rows fill_rows made.
    """
    if cfg.padding == "packed":
        return PackedCollator(tokenizer.pad_token_id, cfg.max_length)
    if cfg.padding == "filled":
        return FilledCollator(tokenizer.pad_token_id, cfg.max_length, cfg.batch_size)
    from transformers import DataCollatorForSeq2Seq

    pad = DataCollatorForSeq2Seq(tokenizer, padding="longest", label_pad_token_id=-100,
                                 pad_to_multiple_of=BUCKET if cfg.padding == "bucket" else None)
    return lambda features: pad([{k: f[k] for k in MODEL_INPUTS} for f in features])


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
        order, placed = best_fit([len(f["input_ids"]) for f in features], self.row_length)
        rows: list[tuple[list, list, list]] = [([], [], []) for _ in range(packed_rows(placed))]
        for i in order:
            sample, (ids, labels, positions) = list(features[i]["input_ids"]), rows[placed[i]]
            ids.extend(sample)
            labels.extend([-100] + list(features[i]["labels"])[1:])
            positions.extend(range(len(sample)))
        return padded_rows(rows, self.pad_id, self.row_length)


def padded_rows(rows: list[tuple[list, list, list]], pad_id: int, row_length: int) -> dict:
    """(input ids, labels, position ids) of packed rows as tensors, each row's tail padded to row_length tokens
    (label -100, positions of its own)."""
    import torch

    out = {"input_ids": [], "labels": [], "position_ids": []}
    for ids, labels, positions in rows:  # no sample is longer than a row: both are max_length
        pad = row_length - len(ids)
        out["input_ids"].append(ids + [pad_id] * pad)
        out["labels"].append(labels + [-100] * pad)
        out["position_ids"].append(positions + list(range(pad)))
    return {k: torch.tensor(v) for k, v in out.items()}


def fill_rows(samples, row_length: int):
    """Padding "filled": the samples end to end in rows of row_length tokens, placed once before training, best fit
    and longest first over the whole set, so the rows come out nearly full (a batch of whole rows then holds more
    samples than packed's fixed count would fill). A datasets.Dataset of rows: input ids, labels (each sample's first
    token -100, as in PackedCollator), position ids restarting at each sample, and an attention mask of ones (the
    real tokens; the collator pads the tails and drops it)."""
    import datasets

    plain = samples.select_columns(["input_ids", "labels", "attention_mask"]).to_dict()  # lists: fast to index
    lengths = [sum(mask) for mask in plain["attention_mask"]]
    order, placed = best_fit(lengths, row_length)
    members: list[list[int]] = [[] for _ in range(max(placed, default=-1) + 1)]
    for i in order:
        members[placed[i]].append(i)
    ids, labels = plain["input_ids"], plain["labels"]
    columns: dict[str, list] = {"input_ids": [], "labels": [], "position_ids": [], "attention_mask": []}
    for row in members:
        columns["input_ids"].append([t for i in row for t in ids[i][:lengths[i]]])
        columns["labels"].append([t for i in row for t in [-100] + list(labels[i][1:lengths[i]])])
        columns["position_ids"].append([p for i in row for p in range(lengths[i])])
        columns["attention_mask"].append([1] * sum(lengths[i] for i in row))
    return datasets.Dataset.from_dict(columns)


class FilledCollator:
    """Pads fill_rows' rows to row_length tokens, and a batch short of `rows` rows (an epoch's last) with whole
    padding rows: every batch has one shape, compiled once."""

    def __init__(self, pad_id: int, row_length: int, rows: int):
        self.pad_id, self.row_length, self.rows = pad_id, row_length, rows

    def __call__(self, features: list[dict]) -> dict:
        rows = [(list(f["input_ids"]), list(f["labels"]), list(f["position_ids"])) for f in features]
        return padded_rows(rows + [([], [], [])] * (self.rows - len(rows)), self.pad_id, self.row_length)


def best_fit(lengths: list[int], row_length: int) -> tuple[list[int], list[int]]:
    """Best fit, longest first: (samples in placing order, each sample's row), each sample in the row with the least
    room that holds it. Few rows, so a packed batch's row count barely varies and filled rows come out nearly full;
    a sorted list of rooms keeps it fast over a whole data set (fill_rows)."""
    import bisect

    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    rooms: list[tuple[int, int]] = []  # (tokens left, row), sorted: the first with room enough fits best
    placed, rows = [0] * len(lengths), 0
    for i in order:
        at = bisect.bisect_left(rooms, (lengths[i], -1))
        room, placed[i] = rooms.pop(at) if at < len(rooms) else (row_length, rows)
        rows += placed[i] == rows
        bisect.insort(rooms, (room - lengths[i], placed[i]))
    return order, placed


def packed_rows(placed: list[int]) -> int:
    """Rows a packed batch takes, given best_fit's row of each sample: padding rows included."""
    rows = max(placed, default=-1) + 1
    return rows + (-rows % PACK_ROWS)


# --- the offline SQuAD-format generator ------------------------------------------------------------
# Fixed facts (12 capitals, each city's oldest landmark and its opening year), asked in Korean and English,
# each kind of question in 4 paraphrases, about as long as SQuAD's rows (~43 tokens in the tutorial's
# prompt). The prompt holds no context, so answers are facts the model must learn. For fact f the paraphrase
# (f + kind) % 4 of each kind is held out (a Latin square): training sees every fact through 3 paraphrases
# and every paraphrase with 9 of the 12 facts; the 72 held-out questions never appear in training, yet
# training teaches their answers. Unanswerable questions (answer "정답 없음", as SQuAD 2.0 has them) are
# training-only. Deterministic: the same rows for every variant and machine.
_FACTS = [  # Korean city, city, Korean country, country, Korean landmark, landmark, the year it opened
    ("서울", "Seoul", "대한민국", "South Korea", "대학교", "university", 1398),
    ("도쿄", "Tokyo", "일본", "Japan", "도서관", "library", 1872),
    ("파리", "Paris", "프랑스", "France", "박물관", "museum", 1793),
    ("베를린", "Berlin", "독일", "Germany", "성당", "cathedral", 1905),
    ("로마", "Rome", "이탈리아", "Italy", "기차역", "railway station", 1863),
    ("마드리드", "Madrid", "스페인", "Spain", "병원", "hospital", 1752),
    ("카이로", "Cairo", "이집트", "Egypt", "대학교", "university", 1908),
    ("오타와", "Ottawa", "캐나다", "Canada", "도서관", "library", 1876),
    ("리마", "Lima", "페루", "Peru", "박물관", "museum", 1822),
    ("하노이", "Hanoi", "베트남", "Vietnam", "성당", "cathedral", 1886),
    ("나이로비", "Nairobi", "케냐", "Kenya", "기차역", "railway station", 1899),
    ("캔버라", "Canberra", "호주", "Australia", "병원", "hospital", 1943),
]
# (kind, language) -> paraphrases; {c} country, {t} city, {p} landmark (with Korean particles: _eun, _eul, _i).
_TEMPLATES = {
    ("capital", "en"): ["According to the passage, what is the capital city of {c}?",
                        "Which city does the passage name as the capital of {c}?",
                        "The government of {c} sits in which capital city, according to the text?",
                        "What city serves as the national capital of {c} in the passage?"],
    ("capital", "ko"): ["본문에 따르면 {c}의 수도는 어디인가요?", "본문에서 {c}의 수도로 소개된 도시는 어디인가요?",
                        "{c} 정부가 있는 수도는 어느 도시라고 본문은 말하나요?",
                        "본문에 의하면 {c}의 수도 역할을 하는 도시는 무엇인가요?"],
    ("country", "en"): ["According to the passage, {t} is the capital of which country?",
                        "Which country has {t} as its capital city, according to the text?",
                        "The passage says that {t} is the capital of what nation?",
                        "Of which country is {t} the capital, according to the passage?"],
    ("country", "ko"): ["본문에 따르면 {t_eun} 어느 나라의 수도인가요?",
                        "본문에서 {t_eul} 수도로 두는 나라는 어디인가요?",
                        "{t_i} 수도인 나라는 어디라고 본문은 말하나요?",
                        "본문에 의하면 {t_eun} 어떤 나라의 수도 역할을 하나요?"],
    ("year", "en"): ["In which year did the oldest {p} in {t} first open its doors?",
                     "According to the passage, when did the oldest {p} in {t} open?",
                     "The oldest {p} in {t} opened in what year, according to the text?",
                     "What year does the passage give for the opening of the oldest {p} in {t}?"],
    ("year", "ko"): ["{t}에서 가장 오래된 {p_eun} 몇 년에 문을 열었나요?",
                     "본문에 따르면 {t}의 가장 오래된 {p_eun} 언제 문을 열었나요?",
                     "{t}에 있는 가장 오래된 {p_i} 개관한 해는 언제라고 본문은 말하나요?",
                     "본문에 의하면 {t}의 가장 오래된 {p_eun} 몇 년에 처음 문을 열었나요?"],
    ("none", "en"): ["Who designed the oldest {p} in {t}, and when was it finished?"],
    ("none", "ko"): ["{t}에서 가장 오래된 {p_eul} 설계한 사람은 누구인가요?"],
}
_ASKED = [key for key in _TEMPLATES if key[0] != "none"]  # the kinds with answers: each holds out a paraphrase


def synthetic_squad(n: int, seed: int = 0, held_out: bool = False) -> list[dict]:
    """n deterministic SQuAD-format rows (id, title, context, question, answers), Korean and English.

    Training rows cycle through their 240 questions in shuffled order; held_out gives the held-out questions
    (72 at most, each once), which no training row holds.
    """
    pool = [(f, key, t) for f in range(len(_FACTS)) for key in _TEMPLATES for t in range(len(_TEMPLATES[key]))
            if (key in _ASKED and t == (f + _ASKED.index(key)) % 4) == held_out]
    rng, rows = random.Random(seed), []
    while len(rows) < n and (not held_out or not rows):
        order = pool[:]
        rng.shuffle(order)
        rows += [_row(*combo, f"synthetic{'-heldout' if held_out else ''}-{len(rows) + i:06d}")
                 for i, combo in enumerate(order[:n - len(rows)])]
    return rows


def _row(fact: int, key: tuple[str, str], template: int, row_id: str) -> dict:
    ko_city, city, ko_country, country, ko_place, place, year = _FACTS[fact]
    kind, language = key
    if language == "en":
        context = f"{city} is the capital of {country}. Its oldest {place} opened in {year}."
        fields = dict(c=country, t=city, p=place)
        answer = {"capital": city, "country": country, "year": str(year), "none": None}[kind]
    else:
        context = (f"{ko_country}의 수도는 {ko_city}이다. "
                   f"그 도시의 가장 오래된 {_josa(ko_place, '은는')} {year}년에 문을 열었다.")
        fields = dict(c=ko_country, t=ko_city, p=ko_place, t_eun=_josa(ko_city, "은는"), t_eul=_josa(ko_city, "을를"),
                      t_i=_josa(ko_city, "이가"), p_eun=_josa(ko_place, "은는"), p_eul=_josa(ko_place, "을를"),
                      p_i=_josa(ko_place, "이가"))
        answer = {"capital": ko_city, "country": ko_country, "year": f"{year}년", "none": None}[kind]
    return {"id": row_id, "title": country, "context": context, "question": _TEMPLATES[key][template].format(**fields),
            "answers": {"text": [answer] if answer else [], "answer_start": [context.find(answer)] if answer else []}}


def _josa(word: str, pair: str) -> str:
    """word with the Korean particle of pair ("은는", "이가", "을를") that fits its last syllable."""
    last = ord(word[-1]) - 0xAC00
    return word + (pair[0] if 0 <= last < 11172 and last % 28 else pair[1])
