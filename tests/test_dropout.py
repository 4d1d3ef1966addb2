"""LoRA's dropout kernel (dsnb/dropout.py), run by Triton's interpreter on the CPU: the same Triton code the GPU runs,
through the same registered op. Each statistical bound is 5 standard deviations (a false alarm about once in 1.7
million runs)."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

# Triton picks its interpreter when a kernel is defined, from the environment: a process of its own.
PROBE = r"""
import json, torch
from dsnb import dropout
dropout.keep_mask_op()
out = {}
n = 4 * dropout.BLOCK * 300 + 777  # a tail that fills no whole program
for p in (0.05, 0.5):
    keep = torch.ops.dsnb.keep_mask(torch.tensor([2**61 + 12345]), torch.empty(n), p)
    flat = keep.view(-1).float()
    B = dropout.BLOCK
    out[str(p)] = {"kept": flat.mean().item(), "n": n,
                   # the four words of one Philox call land BLOCK elements apart: kept together as often as apart
                   "pairs": (flat[:-B] * flat[B:]).mean().item(),
                   # one program's elements against the next program's, 4 BLOCK apart: another Philox counter
                   "programs": (flat[:-4 * B] * flat[4 * B:]).mean().item(),
                   "dtype": str(keep.dtype), "shape": list(keep.shape)}
a = torch.ops.dsnb.keep_mask(torch.tensor([7]), torch.empty(n), 0.05)
b = torch.ops.dsnb.keep_mask(torch.tensor([8]), torch.empty(n), 0.05)
out["seeds_agree"] = (a == b).float().mean().item()
high = torch.ops.dsnb.keep_mask(torch.tensor([2**40 + 7]), torch.empty(n), 0.05)  # a seed's upper 32 bits count
out["high_bits_agree"] = (a == high).float().mean().item()
out["same_seed_same"] = torch.equal(a, torch.ops.dsnb.keep_mask(torch.tensor([7]), torch.empty(n), 0.05))
buf = torch.zeros(n + 4096, dtype=torch.bool)
dropout.launch(torch.tensor([3]), buf[:n], 0.0)  # p 0 keeps all: every element written, none past the end
out["p0_all_written"], out["past_end_untouched"] = bool(buf[:n].all()), not bool(buf[n:].any())

drop = dropout.KeepMaskDropout(0.2)
x = (torch.rand(64, 300) + 0.5).requires_grad_()
y = drop(x)
y.sum().backward()
kept = y != 0
out["values"] = torch.allclose(y[kept], x[kept] / 0.8) and bool((y[~kept] == 0).all())
out["grad_is_mask"] = torch.allclose(x.grad, kept.float() / 0.8)
out["fresh_each_call"] = not torch.equal(drop(x) != 0, kept)
drop.eval()
out["eval_identity"] = drop(x) is x
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def probe():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.split("RESULT ", 1)[1])


def within(value, expected, sd):
    return abs(value - expected) <= 5 * sd


@pytest.mark.parametrize("p", [0.05, 0.5])
def test_each_element_is_kept_with_probability_one_minus_p_independently(probe, p):
    r = probe[str(p)]
    q, n = 1 - p, r["n"]
    assert r["dtype"] == "torch.bool" and r["shape"] == [n]
    assert within(r["kept"], q, (q * p / n) ** 0.5), r
    # pairs one Philox call apart (its words 0-1, 1-2, 2-3) and across calls: q**2 if independent
    assert within(r["pairs"], q * q, (q * q * (1 - q * q) / n) ** 0.5 * 2), r
    assert within(r["programs"], q * q, (q * q * (1 - q * q) / n) ** 0.5 * 2), r


def test_seeds_give_independent_masks_and_a_seed_its_own(probe):
    p, n = 0.05, probe["0.05"]["n"]
    agree = p * p + (1 - p) ** 2
    assert within(probe["seeds_agree"], agree, (agree * (1 - agree) / n) ** 0.5), probe
    assert within(probe["high_bits_agree"], agree, (agree * (1 - agree) / n) ** 0.5), probe
    assert probe["same_seed_same"]


def test_the_kernel_writes_every_element_and_nothing_past_the_end(probe):
    assert probe["p0_all_written"] and probe["past_end_untouched"]


def test_the_module_scales_what_it_keeps_and_its_gradient_uses_the_same_mask(probe):
    assert probe["values"] and probe["grad_is_mask"]
    assert probe["fresh_each_call"] and probe["eval_identity"]


def test_every_lora_dropout_of_a_peft_model_is_swapped_with_its_p():
    from dsnb import dropout
    from dsnb.config import OFFLINE, RunConfig
    from dsnb.model import load_model

    model, _ = load_model(RunConfig(**dict(OFFLINE, quantization="none", lora_dropout=0.1)), "cpu")
    adapted = [m for m in model.modules() if hasattr(m, "lora_dropout")]
    assert adapted and dropout.use_keep_masks(model) == len(adapted)
    assert all(type(m.lora_dropout["default"]) is dropout.KeepMaskDropout and m.lora_dropout["default"].p == 0.1
               for m in adapted)
    assert dropout.use_keep_masks(model) == 0  # swapped once
    plain, _ = load_model(RunConfig(**dict(OFFLINE, quantization="none", lora_dropout=0.0)), "cpu")
    assert dropout.use_keep_masks(plain) == 0  # peft's p 0 is no dropout at all


def test_the_compiled_loop_swaps_on_a_gpu_unless_dropout_kernel_is_false():
    import torch

    from dsnb import dropout
    from dsnb.config import OFFLINE, RunConfig
    from dsnb.loop import keep_masks
    from dsnb.model import load_model

    base = dict(OFFLINE, quantization="none", lora_dropout=0.1, torch_compile=True, padding="bucket")
    model, _ = load_model(RunConfig(**base), "cpu")

    def swapped():
        return sum(type(d) is dropout.KeepMaskDropout for d in model.modules())

    keep_masks(model, RunConfig(**base, dropout_kernel=False), torch.device("cuda"))
    keep_masks(model, RunConfig(**base), torch.device("cpu"))  # the CPU keeps torch's dropout
    assert swapped() == 0
    keep_masks(model, RunConfig(**base), torch.device("cuda"))
    assert swapped() == sum(hasattr(m, "lora_dropout") for m in model.modules()) > 0


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a GPU (run on the GPU machine)")
def test_compiled_with_cuda_graphs_each_replay_draws_a_fresh_mask():
    """As dsnb's compiled loop runs it (torch.compile, reduce-overhead: CUDA graphs replayed): every step a new mask
    at the rate 1 - p, and the backward scales by the forward's own mask."""
    import torch

    from dsnb import dropout

    dropout.keep_mask_op()
    drop = dropout.KeepMaskDropout(0.05)
    forward = torch.compile(drop, mode="reduce-overhead")  # as the loop compiles the model; backward outside
    x = (torch.rand(4096, 1024, device="cuda") + 0.5).requires_grad_()
    masks = []
    for _ in range(5):
        torch.compiler.cudagraph_mark_step_begin()
        y = forward(x)
        (y * y).sum().backward()
        y, g = y.detach().clone(), x.grad
        x.grad = None
        kept = y != 0
        assert torch.allclose(y[kept], x[kept] / 0.95) and bool((y[~kept] == 0).all())
        assert torch.allclose(g, 2 * y / 0.95)  # d(y^2)/dx = 2 y * keep / (1 - p): the forward's own mask
        masks.append(kept)
    n = masks[0].numel()
    for kept in masks:
        assert within(kept.float().mean().item(), 0.95, (0.95 * 0.05 / n) ** 0.5)
    agree = 0.05**2 + 0.95**2
    for a, b in zip(masks, masks[1:], strict=False):
        assert within((a == b).float().mean().item(), agree, (agree * (1 - agree) / n) ** 0.5)
