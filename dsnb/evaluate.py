"""Does the trained model answer? Greedy answers to held-out questions, scored with SQuAD's own definitions.

    scores, answers = answer_and_score(model, tokenizer, cfg, rows)   # exact_match, f1, tokens_per_second, ...
    exact_match("The Eiffel Tower!", "eiffel tower")                   # 1.0: SQuAD's normalization

Exact match and F1 follow SQuAD v1.1's official script: lower case, punctuation and the articles a, an and
the removed, whitespace collapsed; F1 over the tokens of that text; the best over the gold answers. A row
without an answer expects the training text's "정답 없음". Generation is greedy from the training text's own
prompt (the part before the answer), in the precision the run trains in, and stops at the end-of-sequence
token or a new line.
"""
from __future__ import annotations

import collections
import re
import string
import time

from .config import RunConfig
from .data import NO_ANSWER, prompt_parts
from .model import sdpa_attention

PROBE = "질문: 본문에 따르면 프랑스의 수도는 어디인가요?\n답변:"  # the fixed prompt of probe_logit_norm
MAX_NEW_TOKENS = 32  # SQuAD's answers are short: a name, a date, a phrase
BATCH = 32


def normalize_answer(text: str) -> str:
    """SQuAD's normalization: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1(prediction: str, gold: str) -> float:
    predicted, wanted = normalize_answer(prediction).split(), normalize_answer(gold).split()
    common = sum((collections.Counter(predicted) & collections.Counter(wanted)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(wanted)
    return 2 * precision * recall / (precision + recall)


def squad_scores(predictions: list[str], golds: list[list[str]]) -> tuple[float, float]:
    """(exact match, F1), each the mean over questions of the best score over that question's gold answers."""
    golds = [g or [NO_ANSWER] for g in golds]
    pairs = list(zip(predictions, golds, strict=True))
    return (sum(max(exact_match(p, g) for g in gs) for p, gs in pairs) / len(pairs),
            sum(max(f1(p, g) for g in gs) for p, gs in pairs) / len(pairs))


def answer_and_score(model, tokenizer, cfg: RunConfig, rows: list[dict], synced: bool = False) -> tuple[dict, list]:
    """Greedy answers to rows' questions and their scores: ({exact_match, f1, tokens_per_second, seconds},
    answers). synced keeps every rank generating together (ZeRO-3 over several processes)."""
    import torch

    device = next(p for p in model.parameters()).device
    if device.type == "meta" or not next(model.parameters()).numel():  # ZeRO-3 partitions: its hooks fetch them
        device = torch.device(f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu")
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.dtype)
    was_training = model.training
    model.eval()
    answers, new_tokens, started = [], 0, time.perf_counter()
    with torch.no_grad(), torch.autocast(device.type, dtype=half or torch.float32, enabled=half is not None), \
            sdpa_attention(model):
        for i in range(0, len(rows), BATCH):
            texts, count = generate(model, tokenizer, cfg, rows[i:i + BATCH], device, synced)
            answers += texts
            new_tokens += count
    seconds = time.perf_counter() - started
    model.train(was_training)
    em, f1_score = squad_scores(answers, [r["answers"]["text"] for r in rows])
    return {"exact_match": em, "f1": f1_score, "tokens_per_second": new_tokens / seconds, "seconds": seconds}, answers


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


def generate(model, tokenizer, cfg: RunConfig, rows: list[dict], device, synced: bool) -> tuple[list[str], int]:
    """(answers, tokens generated) for one batch: prompts padded on the left, greedy, up to MAX_NEW_TOKENS."""
    import torch

    prompts = [prompt_parts(cfg, tokenizer, row)[0] for row in rows]
    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=pad, use_cache=True, synced_gpus=synced)
    texts, count = [], 0
    for row in out[:, width:].tolist():
        if tokenizer.eos_token_id in row:
            row = row[:row.index(tokenizer.eos_token_id)]
        count += len(row)
        texts.append(tokenizer.decode(row, skip_special_tokens=True).strip().split("\n")[0].strip())
    return texts, count
