"""Does the trained model answer? Greedy answers to held-out questions, scored as SQuAD and KorQuAD define it.

    scores, answers = answer_and_score(model, tokenizer, cfg, rows)   # exact_match, f1, tokens_per_second, ...
    exact_match("The Eiffel Tower!", "eiffel tower")                   # 1.0: SQuAD's normalization
    f1("서울에", "서울", "korquad")                                    # 0.8: KorQuAD's, over characters
    scoring_mode(cfg)                                                  # squad or korquad: one for the whole run

SQuAD (v1.1's official script): lower case, punctuation and the articles a, an and the removed, whitespace
collapsed; F1 over the words of that text. KorQuAD (1.0's official evaluate script, which scores a Korean answer
fairly: particles and counters stay attached to words): quotes and brackets (《》〈〉<>()‘’'") to spaces, lower case,
punctuation removed, no articles, whitespace collapsed; F1 over the characters of the words (spaces left out), so
"서울에" against "서울" or "1398년" against "1398" earn partial credit and "세종대왕" against "세종 대왕" full F1. Both
take the text in Unicode NFC first (NFD Hangul, as some macOS files hold it, otherwise matches nothing; the official
scripts leave the text as it is). A run scores every question one way (scoring_mode), so its mean never mixes
character F1 with word F1. Each score is the best over the question's gold answers; a row without an answer expects
the training text's "정답 없음". Generation is greedy from the training text's own prompt (the part before the answer),
in the precision the run trains in, and stops at the end-of-sequence token, any token that ends a chat turn, or a
new line.
"""
from __future__ import annotations

import collections
import re
import string
import time
import unicodedata

from .config import RunConfig
from .data import HUB_DATASETS, NO_ANSWER, korean_text, prompt_parts
from .model import sdpa_attention

PROBE = "질문: 본문에 따르면 프랑스의 수도는 어디인가요?\n답변:"  # the fixed prompt of probe_logit_norm
MAX_NEW_TOKENS = 32  # SQuAD's answers are short: a name, a date, a phrase
BATCH = 32
KORQUAD_MARKS = "'\"《》<>〈〉()‘’"


def normalize_answer(text: str, scoring: str = "squad") -> str:
    """SQuAD's normalization (lower case, no punctuation, no articles, single spaces), or KorQuAD's (quotes and
    brackets to spaces, lower case, no punctuation, single spaces); both on NFC text."""
    text = unicodedata.normalize("NFC", text)
    if scoring == "korquad":
        text = "".join(" " if ch in KORQUAD_MARKS else ch for ch in text)
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    if scoring == "squad":
        text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def scoring_mode(cfg: RunConfig) -> str:
    """How a run scores every question: the scoring field's, or for auto, by the data set: korquad for KorQuAD and
    squad for SQuAD; for a file or the synthetic set, korquad where at least half its rows are Korean (a gold
    answer without Hangul, "1398" or "BTS", still gets KorQuAD's credit for "1398년" or "BTS는"), else squad."""
    if cfg.scoring != "auto":
        return cfg.scoring
    if cfg.dataset in HUB_DATASETS:
        return cfg.dataset
    return "korquad" if korean_text(cfg) else "squad"


def exact_match(prediction: str, gold: str, scoring: str = "squad") -> float:
    """1.0 where the normalized texts are equal; scoring is squad or korquad."""
    return float(normalize_answer(prediction, scoring) == normalize_answer(gold, scoring))


def f1(prediction: str, gold: str, scoring: str = "squad") -> float:
    """F1 over words (squad) or over the characters of the words (korquad)."""
    predicted, wanted = normalize_answer(prediction, scoring).split(), normalize_answer(gold, scoring).split()
    if scoring == "korquad":
        predicted, wanted = list("".join(predicted)), list("".join(wanted))
    common = sum((collections.Counter(predicted) & collections.Counter(wanted)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(wanted)
    return 2 * precision * recall / (precision + recall)


def question_scores(predictions: list[str], golds: list[list[str]],
                    scoring: str = "squad") -> list[tuple[float, float]]:
    """(exact match, F1) of each question: the best over its gold answers."""
    golds = [g or [NO_ANSWER] for g in golds]
    return [(max(exact_match(p, g, scoring) for g in gs), max(f1(p, g, scoring) for g in gs))
            for p, gs in zip(predictions, golds, strict=True)]


def squad_scores(predictions: list[str], golds: list[list[str]], scoring: str = "squad") -> tuple[float, float]:
    """(exact match, F1), each the mean over questions of the best score over that question's gold answers."""
    each = question_scores(predictions, golds, scoring)
    return sum(e for e, _ in each) / len(each), sum(f for _, f in each) / len(each)


def answer_and_score(model, tokenizer, cfg: RunConfig, rows: list[dict], synced: bool = False) -> tuple[dict, list]:
    """Greedy answers to rows' questions and their scores: ({exact_match, f1, tokens_per_second, seconds, per_question},
    answers); per_question holds each question's (exact match, F1). synced keeps every rank generating together (ZeRO-3
    over several processes)."""
    import torch

    device = next(p for p in model.parameters()).device
    if device.type == "meta" or not next(model.parameters()).numel():  # ZeRO-3 partitions: its hooks fetch them
        device = torch.device(f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu")
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.dtype)
    was_training = model.training
    model.eval()
    stops = stop_tokens(tokenizer, model)
    answers, new_tokens, started = [], 0, time.perf_counter()
    with torch.no_grad(), torch.autocast(device.type, dtype=half or torch.float32, enabled=half is not None), \
            sdpa_attention(model):
        for i in range(0, len(rows), BATCH):
            texts, count = generate(model, tokenizer, cfg, rows[i:i + BATCH], device, synced, stops)
            answers += texts
            new_tokens += count
    seconds = time.perf_counter() - started
    model.train(was_training)
    each = question_scores(answers, [r["answers"]["text"] for r in rows], scoring_mode(cfg))
    return {"exact_match": sum(e for e, _ in each) / len(each), "f1": sum(f for _, f in each) / len(each),
            "tokens_per_second": new_tokens / seconds, "seconds": seconds, "per_question": each}, answers


def probe_logit_norm(model, tokenizer) -> float:
    """The norm of the next-token logits after a fixed prompt: a fingerprint of the trained weights, logged with
    the run so a saved and reloaded model can be checked against it."""
    import torch

    device = next(p for p in model.parameters()).device
    if not next(model.parameters()).numel():  # ZeRO-3 partitions: its hooks fetch the weights
        device = torch.device(f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu")
    ids = tokenizer(PROBE, return_tensors="pt")["input_ids"].to(device)
    was_training = model.training
    model.eval()
    with torch.no_grad(), sdpa_attention(model):  # as a reloaded model computes it
        logits = model(input_ids=ids).logits[0, -1].float()
    model.train(was_training)
    return float(logits.norm())


def stop_tokens(tokenizer, model=None) -> list[int]:
    """Every token an answer ends at: the end-of-sequence token, the model's own (its generation config may list
    several: Llama 3's <|end_of_text|>, <|eom_id|> and <|eot_id|>), and the token a chat template puts after an
    assistant's turn (found by rendering one)."""
    stops = {tokenizer.eos_token_id}
    listed = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    stops.update(listed if isinstance(listed, (list, tuple)) else [listed])
    if tokenizer.chat_template:
        marker = "dsnb-answer"
        turns = [{"role": "user", "content": "q"}, {"role": "assistant", "content": marker}]
        text = tokenizer.apply_chat_template(turns, tokenize=False)
        after = text[text.rfind(marker) + len(marker):]
        following = tokenizer(after, add_special_tokens=False)["input_ids"][:1]
        special = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}))
        stops.update(t for t in following if t in special)
    return sorted(t for t in stops if t is not None)


def cut_at_stop(tokens: list[int], stops: list[int]) -> list[int]:
    """The tokens before the first stop token."""
    ends = [tokens.index(t) for t in stops if t in tokens]
    return tokens[:min(ends)] if ends else tokens


def generate(model, tokenizer, cfg: RunConfig, rows: list[dict], device, synced: bool,
             stops: list[int]) -> tuple[list[str], int]:
    """(answers, tokens generated) for one batch: prompts padded on the left, greedy, up to MAX_NEW_TOKENS."""
    import torch

    prompts = [prompt_parts(cfg, tokenizer, row)[0] for row in rows]
    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
                         eos_token_id=stops, pad_token_id=pad, use_cache=True, synced_gpus=synced)
    texts, count = [], 0
    for row in out[:, width:].tolist():
        row = cut_at_stop(row, stops)
        count += len(row)
        texts.append(tokenizer.decode(row, skip_special_tokens=True).strip().split("\n")[0].strip())
    return texts, count
