"""The chunked loss (loss_chunk; dsnb/loss.py): the model's own loss and gradients, without holding the logits."""
import pytest
import torch

from conftest import train_here
from dsnb.config import OFFLINE, ConfigError, RunConfig
from dsnb.loss import chunk_the_loss, head_loss
from dsnb.model import load_model


def loss_and_grads(cfg, batch, items, compiled=False):
    torch.manual_seed(0)  # the same LoRA adapters in both models
    model, _ = load_model(cfg, "cpu")
    model.train()
    forward = torch.compile(model) if compiled else model
    loss = forward(**batch, num_items_in_batch=items).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def a_batch(tokenizer):
    """Two rows, the second padded (label -100), more tokens than a chunk of 7 divides."""
    rows = tokenizer(["질문: 서울은 어디에 있나?\n답변: 한국", "질문: a?\n답변: b"], return_tensors="pt", padding=True)
    labels = rows["input_ids"].masked_fill(rows["attention_mask"] == 0, -100)
    assert rows["input_ids"].numel() % 7 and (labels == -100).any()
    return {**rows, "labels": labels}


@pytest.mark.parametrize("kind", ["lora", "full", "8bit", "compiled"])
def test_the_chunked_loss_is_the_models_own(kind):
    """Loss and every trained weight's gradient as the model's own forward gives them: LoRA, full fine-tuning (the
    tied head's gradient joins the embedding's), 8-bit weights, and under torch.compile; with the Trainer's
    num_items_in_batch (the step's label count, here more than this batch holds) and without it."""
    cfg = RunConfig(**dict(OFFLINE, quantization="8bit" if kind == "8bit" else "none",
                           lora_r=0 if kind == "full" else 8, lora_dropout=0.0))
    _, tokenizer = load_model(cfg, "cpu")
    batch = a_batch(tokenizer)
    for items in (torch.tensor(40), None):
        own_loss, own = loss_and_grads(cfg, batch, items, kind == "compiled")
        loss, grads = loss_and_grads(cfg.replace(loss_chunk=7), batch, items, kind == "compiled")
        assert loss == pytest.approx(own_loss.item(), rel=1e-5)
        assert grads.keys() == own.keys() and len(grads) > 0
        tolerance = 1e-2 if kind == "8bit" else 1e-4  # int8 matmuls round the backward's input differently by batch
        largest = max(g.abs().max() for g in own.values())  # LoRA's A gets none at first (B starts at zero)
        assert largest > 0
        for name, grad in grads.items():
            assert torch.allclose(grad, own[name], rtol=tolerance, atol=tolerance * largest), name


def test_bf16_keeps_the_models_rounding():
    """In bf16 the logits are rounded as the head gives them and the loss summed in fp32, as transformers does."""
    torch.manual_seed(1)
    hidden = torch.randn(3, 11, 16, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(50, 16, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, 50, (3, 11))
    labels[2, 5:] = -100
    from transformers.loss.loss_utils import ForCausalLMLoss

    own = ForCausalLMLoss(hidden @ weight.t(), labels, 50)
    own.backward()
    own_grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    loss = head_loss(hidden, weight, labels, None, 4)
    loss.backward()
    assert loss.dtype == torch.float32 and loss.item() == pytest.approx(own.item(), rel=1e-5)
    for grad, want in zip((hidden.grad, weight.grad), own_grads, strict=True):
        assert grad.dtype == torch.bfloat16 and torch.allclose(grad.float(), want.float(), rtol=2e-2, atol=1e-3)


def test_fp16_gradients_wait_for_the_loss_scale():
    """In fp16 the loss scale (the GradScaler's 2**16) reaches the gradients before they are rounded to fp16, as in the
    model's own backward: made in the forward, (softmax - one-hot) / 2,000 labels would underflow (NaN and zeros)."""
    torch.manual_seed(0)
    hidden = (torch.randn(4, 500, 32) * 0.5).half().requires_grad_()
    weight = (torch.randn(3000, 32) * 0.5).half().requires_grad_()
    labels = torch.randint(0, 3000, (4, 500))
    from transformers.loss.loss_utils import ForCausalLMLoss

    own = ForCausalLMLoss(hidden @ weight.t(), labels, 3000)
    (own * 2**16).backward()
    own_grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    loss = head_loss(hidden, weight, labels, None, 300)
    (loss * 2**16).backward()
    assert loss.item() == pytest.approx(own.item(), rel=1e-5)
    for grad, want in zip((hidden.grad, weight.grad), own_grads, strict=True):
        assert grad.dtype == torch.float16 and torch.isfinite(grad).all()
        assert (grad != 0).float().mean() == pytest.approx((want != 0).float().mean().item(), abs=1e-4)
        assert torch.allclose(grad.float(), want.float(), rtol=1e-2, atol=1e-3 * want.float().abs().max())


def test_fp16_autocast_over_fp32_weights_waits_too():
    """Full fine-tuning in fp16 keeps fp32 weights under fp16 autocast: the hidden states are fp32 but the head's
    matmuls run in fp16, so the gradients wait for the loss scale there too (made at once, 99% of the head's were 0)."""
    from transformers.loss.loss_utils import ForCausalLMLoss

    torch.manual_seed(0)
    hidden = (torch.randn(4, 500, 32) * 0.5).requires_grad_()
    weight = (torch.randn(3000, 32) * 0.5).requires_grad_()
    labels = torch.randint(0, 3000, (4, 500))
    grads = []
    for chunked in (False, True):
        hidden.grad = weight.grad = None
        with torch.autocast("cpu", dtype=torch.float16):
            loss = head_loss(hidden, weight, labels, torch.tensor(12288), 300) if chunked else \
                ForCausalLMLoss(torch.nn.functional.linear(hidden, weight), labels, 3000,
                                num_items_in_batch=torch.tensor(12288))
        (loss * 2**16).backward()
        grads.append((loss.item(), hidden.grad.clone(), weight.grad.clone()))
    (own_loss, *own), (loss, *mine) = grads
    assert loss == pytest.approx(own_loss, rel=1e-4)
    for grad, want in zip(mine, own, strict=True):
        assert (grad != 0).float().mean() == pytest.approx((want != 0).float().mean().item(), abs=1e-3)
        assert torch.allclose(grad, want, rtol=1e-2, atol=1e-2 * want.abs().max())


def test_an_fp8_head_makes_each_chunks_logits_as_its_whole_forward_does(monkeypatch):
    """With quantization fp8 and fp8_head (the default) the chunks' logits come through the head's fp8 copy and the
    gradients through its bf16 weight, as the head's own forward and backward make them: the same loss and LoRA
    gradients as the whole logits, and not the bf16 head's (a chunked loss that read the head's weight alone would
    give those). The CPU let past the check that refuses it fp8 (tests/test_fp8.py: the GPU's math, emulated)."""
    from dsnb import fp8

    monkeypatch.setattr(fp8, "check_device", lambda device: None)
    cfg = RunConfig(**dict(OFFLINE, quantization="fp8", dtype="bf16", lora_r=8, lora_dropout=0.0))
    _, tokenizer = load_model(cfg, "cpu")
    batch, items = a_batch(tokenizer), torch.tensor(40)
    own_loss, own = loss_and_grads(cfg, batch, items)
    loss, grads = loss_and_grads(cfg.replace(loss_chunk=7), batch, items)
    bf16_head, _ = loss_and_grads(cfg.replace(loss_chunk=7, fp8_head=False), batch, items)
    assert loss.item() == pytest.approx(own_loss.item(), rel=1e-5)
    assert abs(bf16_head.item() - own_loss.item()) > 2e-5 * own_loss.item()  # the fp8 head's own rounding
    largest = max(g.abs().max() for g in own.values())
    assert largest > 0 and grads.keys() == own.keys()
    for name, grad in grads.items():  # bf16 gradients, the sums in another order
        assert torch.allclose(grad.float(), own[name].float(), rtol=2e-2, atol=2e-2 * largest), name


def test_a_copied_or_pickled_model_keeps_its_own_chunked_forward():
    import copy
    import pickle

    cfg = RunConfig(**dict(OFFLINE, quantization="none", lora_r=0, loss_chunk=5))
    model, tokenizer = load_model(cfg, "cpu")
    batch = a_batch(tokenizer)
    model.train()
    want = model(**batch).loss.item()
    for other in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert other.forward.model is other
        other.train()
        with torch.no_grad():  # the loss without gradients made for nothing
            assert other(**batch).loss.item() == pytest.approx(want, rel=1e-6)
    with pytest.raises(ConfigError, match="loss_chunk computes the LM head from its own weight, so a LoRA adapter"):
        RunConfig(**dict(OFFLINE, loss_chunk=64, lora_targets="q_proj,lm_head"))


def test_evaluation_and_generation_keep_the_logits():
    cfg = RunConfig(**dict(OFFLINE, quantization="none", loss_chunk=5))
    model, tokenizer = load_model(cfg, "cpu")
    batch = a_batch(tokenizer)
    model.train()
    assert model(**batch).logits is None
    model.eval()
    out = model(**batch)
    assert out.logits is not None and out.logits.shape[-1] == model.config.vocab_size and torch.isfinite(out.loss)
    assert model.generate(**tokenizer(["질문: a?\n답변:"], return_tensors="pt"), max_new_tokens=2).shape[1] > 2


def test_what_it_cannot_chunk_is_refused():
    with pytest.raises(ConfigError, match="loss_chunk needs the LM head's whole weight, which ZeRO-3 partitions"):
        RunConfig(**dict(OFFLINE, quantization="none", strategy="zero3", loss_chunk=1024))
    with pytest.raises(ConfigError, match="loss_chunk is -1; it must be 0 or more"):
        RunConfig(**dict(OFFLINE, loss_chunk=-1))
    from transformers import GPT2Config, GPT2LMHeadModel

    with pytest.raises(ConfigError, match="loss_chunk 8 needs a plain Linear head .*; gpt2 is not one: set loss_chunk"):
        chunk_the_loss(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50)), 8)
    assert RunConfig(**dict(OFFLINE, loss_chunk=64)).name.endswith("_chunkloss64")


def test_a_run_with_the_chunked_loss_trains_the_same_curve(tmp_path):
    """The Trainer's step and dsnb's compiled loop log the same loss curve with the loss chunked as without, and under
    DeepSpeed ZeRO-2 too; loss_chunk does not change the work (the runs compare as the same)."""
    from dsnb.config import WORK_FIELDS

    common = dict(OFFLINE, quantization="none", max_steps=4, logging_steps=1, learning_rate=1e-3, batch_size=2,
                  grad_accum=2, num_samples=4, eval_samples=0, lora_dropout=0.0, padding="bucket", save_model=False,
                  prompt="tutorial", tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    trainer = RunConfig(**common, run_name="trainer")
    cfgs = [trainer, trainer.replace(loss_chunk=16, run_name="trainer_chunked"),
            trainer.replace(torch_compile=True, loss_chunk=16, run_name="compiled_chunked"),
            trainer.replace(strategy="zero2", loss_chunk=16, run_name="zero2_chunked")]
    assert "loss_chunk" not in WORK_FIELDS
    curves = {name: r.curve for name, r in train_here(cfgs, tmp_path).items()}
    assert len(curves["trainer"]) == 4 and curves["trainer"][-1] < curves["trainer"][0]
    for name in ("trainer_chunked", "compiled_chunked", "zero2_chunked"):
        assert curves[name][0] == pytest.approx(curves["trainer"][0], rel=1e-5), name
        assert curves[name] == pytest.approx(curves["trainer"], rel=1e-3), name
