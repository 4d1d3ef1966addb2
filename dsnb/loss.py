"""The training loss computed chunk by chunk (cfg.loss_chunk): the LM head and cross-entropy over `chunk` tokens at a
time, so a step never holds the whole logits.

    chunk_the_loss(model, 1024)   # a transformers causal LM, before peft wraps it: its training forwards with
                                  # labels now return the loss and no logits

A causal LM's own forward makes logits for every token (tokens x V, V = 128,256 for Llama 3), upcasts them to fp32 for
the cross-entropy and keeps both for the backward: 10 bytes a token and vocabulary entry in the HF Trainer's eager step,
about 8 in dsnb's compiled one as it was (estimate.py). On the throughput mode's 12,288 tokens a micro-batch, chunking
freed 10.6 GB (benchmarks/results/chunkloss_h100.md). dsnb's compiled loop has returned only the loss since
(loop.loss_only), which frees 6 of those 8 bytes; chunking's gain over it is estimated, not measured. Here the
forward runs the model to its last hidden state, then for each chunk of tokens: the head's logits, their fp32
log-sum-exp and the loss of the labelled tokens, and at once the gradient of that loss to the chunk's hidden state
(softmax minus the label's one-hot, over the step's label count, through the head's weight) and, where the head trains,
to its weight. The backward only scales those by the loss's incoming gradient. No matmul is added in bf16: the head's
forward and its two backward matmuls run as before, chunk by chunk (with fp8_head the forward's through the head's fp8
copy, dsnb/fp8.py Fp8Head, the gradients through its bf16 weight, as the whole logits' head). In fp16 the gradients
wait for the backward, where the loss scale arrives, and each chunk's logits are made again (HeadLoss). The loss and
gradients are the model's own within rounding (the sums go in another order; tests/test_loss.py).

Labels follow transformers' ForCausalLMLoss: token t predicts label t + 1, -100 is ignored, and the sum is divided by
the Trainer's num_items_in_batch (the step's label count) where it is given, else by this batch's. Only architectures
whose head is a plain Linear on the last hidden state are changed (Llama, Mistral, Qwen 2/3); others are refused, as is
a head ZeRO-3 partitions (its weight is gathered only inside the head's own forward).
"""
from __future__ import annotations

import inspect

import torch

from .config import ConfigError
from .fp8 import TRAINED_HEAD, Fp8Head

IGNORE = -100
PLAIN_HEADS = ("llama", "mistral", "qwen2", "qwen3")  # CausalLM forward: lm_head(last_hidden_state), nothing after it


class HeadLoss(torch.autograd.Function):
    """sum over labelled tokens of cross_entropy(hidden @ weight.T, target) * scale, chunk by chunk. In bf16 and fp32
    both gradients are made in the forward; in fp16 (fp16 tensors, or fp16 autocast over fp32 weights) they wait for
    the backward, which makes each chunk's logits again under the same autocast (one more head matmul): fp16's loss
    scale reaches the loss only there, and without it a gradient of (softmax minus one-hot) / label count would
    underflow fp16 where the model's own backward, scaled, does not."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, scale, chunk: int, wanted: bool, head=None):
        kind = hidden.device.type
        ctx.autocast = torch.is_autocast_enabled(kind), torch.get_autocast_dtype(kind), kind
        later = wanted and (hidden.dtype == torch.float16 or ctx.autocast[:2] == (True, torch.float16))
        grads = Grads(hidden, weight) if wanted and not later else None
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        lses = []
        for start, h, t, logits in chunks(hidden, weight, targets, chunk, head):
            lse = torch.logsumexp(logits, dim=-1)
            picked = logits.gather(1, t.clamp(min=0).unsqueeze(1)).squeeze(1)
            total += torch.where(t != IGNORE, lse - picked, 0.0).sum()
            if grads is not None:
                grads.add(start, h, weight, t, logits_grad(logits, lse, t, scale))
            if later:
                lses.append(lse)
        ctx.chunk, ctx.later, ctx.weight_dtype, ctx.head = chunk, later, weight.dtype, head
        if later:
            ctx.save_for_backward(hidden, weight, targets, scale, torch.cat(lses))
        elif grads is not None:
            ctx.save_for_backward(grads.hidden, grads.weight)
        return total * scale

    @staticmethod
    def backward(ctx, grad_loss):
        if ctx.later:
            hidden, weight, targets, scale, lse = ctx.saved_tensors
            grads, (on, dtype, kind) = Grads(hidden, weight), ctx.autocast
            with torch.autocast(kind, dtype=dtype, enabled=on):
                for start, h, t, logits in chunks(hidden, weight, targets, ctx.chunk, ctx.head):
                    grads.add(start, h, weight, t, logits_grad(logits, lse[start:start + ctx.chunk], t,
                                                               scale * grad_loss))
            grad_hidden, grad_weight = grads.hidden, grads.weight
        else:
            grad_hidden, grad_weight = ctx.saved_tensors
            grad_hidden = None if grad_hidden is None else (grad_hidden.float() * grad_loss).to(grad_hidden.dtype)
            grad_weight = None if grad_weight is None else grad_weight * grad_loss
        return (grad_hidden, None if grad_weight is None else grad_weight.to(ctx.weight_dtype), None, None, None,
                None, None)


def chunks(hidden, weight, targets, chunk: int, head=None):
    """(start, hidden states, targets, fp32 logits) of each chunk of `chunk` tokens; the logits through `head`'s fp8
    copy of weight where it is an Fp8Head (fp8_head: dsnb/fp8.py), else through weight."""
    for start in range(0, hidden.shape[0], chunk):
        h = hidden[start:start + chunk]
        yield start, h, targets[start:start + chunk], (h @ weight.t() if head is None else head.logits(h)).float()


def logits_grad(logits, lse, targets, factor):
    """The gradient of a chunk's summed loss to its logits times factor, in the hidden states' dtype: softmax minus the
    label's one-hot on labelled tokens, 0 elsewhere (made in the fp32 logits' place)."""
    grad = logits.sub_(lse.unsqueeze(1)).exp_()
    grad.scatter_add_(1, targets.clamp(min=0).unsqueeze(1), torch.full_like(lse, -1.0).unsqueeze(1))
    return grad.mul_(torch.where(targets != IGNORE, factor, 0.0).unsqueeze(1))


class Grads:
    """The hidden states' gradient and, where the head trains, its weight's (summed over chunks in fp32)."""

    def __init__(self, hidden, weight):
        self.hidden = torch.empty_like(hidden) if hidden.requires_grad else None
        self.weight = torch.zeros_like(weight, dtype=torch.float32) if weight.requires_grad else None

    def add(self, start: int, h, weight, targets, grad) -> None:
        grad = grad.to(h.dtype)
        if self.hidden is not None:
            self.hidden[start:start + len(targets)] = grad @ weight
        if self.weight is not None:
            self.weight += (grad.t() @ h).float()


def head_loss(hidden, weight, labels, num_items_in_batch, chunk: int, head=None):
    """The causal LM loss of hidden (batch, tokens, h) through the head's weight against labels (batch, tokens), as
    transformers' ForCausalLMLoss computes it from full logits; the logits through `head` where it is an Fp8Head,
    the gradients through weight (bf16) as that head's own backward."""
    targets = torch.nn.functional.pad(labels, (0, 1), value=IGNORE)[..., 1:].reshape(-1)
    count = num_items_in_batch if num_items_in_batch is not None else (targets != IGNORE).sum()
    scale = 1.0 / torch.as_tensor(count, dtype=torch.float32, device=hidden.device)
    wanted = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    return HeadLoss.apply(hidden.reshape(-1, hidden.shape[-1]), weight, targets, scale, chunk, wanted, head)


def chunk_the_loss(model, chunk: int) -> None:
    """Make `model`'s training forwards with labels compute the loss `chunk` tokens at a time and return no logits;
    evaluation (model.eval()) and forwards without labels keep the model's own forward."""
    kind = getattr(model.config, "model_type", "?")
    head = getattr(model, "lm_head", None)
    if kind not in PLAIN_HEADS or type(head) not in (torch.nn.Linear, Fp8Head) or head.bias is not None:
        raise ConfigError(f"loss_chunk {chunk} needs a plain Linear head on the last hidden state "
                          f"({', '.join(PLAIN_HEADS)} models); {kind} is not one: set loss_chunk 0")
    model.forward = ChunkedForward(model, chunk)


class ChunkedForward:
    """A causal LM's forward with its training loss chunked: an object, not a closure, so that a copied or pickled
    model keeps its own."""

    def __init__(self, model, chunk: int):
        self.model, self.chunk = model, chunk

    @property
    def __signature__(self):  # the model's own: the Trainer keeps the batch's columns that the forward names
        return inspect.signature(self.model.__class__.forward.__get__(self.model))

    def __call__(self, *args, labels=None, logits_to_keep=0, **kwargs):
        from transformers.modeling_outputs import CausalLMOutputWithPast

        model = self.model
        if labels is None or not model.training:  # the class's function called with the model, not bound by
            # function.__get__, which the GPU machine's torch.compile warned it cannot trace
            return type(model).forward(model, *args, labels=labels, logits_to_keep=logits_to_keep, **kwargs)
        head = model.lm_head
        if type(head) not in (torch.nn.Linear, Fp8Head):  # a LoRA adapter on the head would be left out of the loss
            raise ConfigError("loss_chunk computes the head from its own weight, and the head is now a "
                              f"{type(model.lm_head).__name__} (a LoRA target?); leave lm_head out of lora_targets "
                              "or set loss_chunk 0")
        if type(head) is Fp8Head and head.weight.requires_grad:  # its gradient here would leave the fp8 copy behind
            raise ConfigError(TRAINED_HEAD)
        out = model.model(*args, **kwargs)
        loss = head_loss(out.last_hidden_state, head.weight, labels, kwargs.get("num_items_in_batch"), self.chunk,
                         head if type(head) is Fp8Head else None)
        return CausalLMOutputWithPast(loss=loss)
