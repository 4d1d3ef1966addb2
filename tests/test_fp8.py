"""FP8 frozen base weights (dsnb/fp8.py): where a run takes them, their math against bf16 on the same weights, LoRA's
loss over a few steps, the bytes they hold, and DeepSpeed's engine leaving them as they are.

A run refuses the CPU, which has no FP8 matmuls (torch._scaled_mm is emulated there), so these tests call dsnb.fp8's
functions directly on the CPU: the same code a GPU runs."""
import json
import pathlib
import subprocess
import sys

import pytest
import torch

from dsnb import fp8
from dsnb.config import OFFLINE, ConfigError, RunConfig
from dsnb.model import SHAPES, count_parameters, load_base, load_model, synthetic_config

FP8 = dict(quantization="fp8", dtype="bf16")
E4M3_STEP = 2**-4  # e4m3 keeps 3 mantissa bits: rounding moves a value by at most 2^-4 of itself


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("changes, message", [
    (dict(dtype="fp16"), "quantization fp8 computes in bf16 (its matmuls give bf16), not fp16; set dtype bf16"),
    (dict(dtype="fp32"), "quantization fp8 computes in bf16 (its matmuls give bf16), not fp32; set dtype bf16"),
    (dict(lora_r=0), "quantization fp8 weights cannot be trained directly; set lora_r > 0 (LoRA) or quantization none"),
    (dict(strategy="zero3"), "quantization fp8 weights are not partitioned by ZeRO-3; use strategy zero2"),
])
def test_fp8_is_refused_where_it_cannot_train_with_what_to_change(changes, message):
    with pytest.raises(ConfigError) as err:
        RunConfig(**{**FP8, **changes})
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_fp8_takes_lora_in_bf16_compiled_or_not_and_under_zero_1_or_2():
    cfg = RunConfig(**FP8, torch_compile=True, padding="filled", attention="flex", max_length=1024)
    assert cfg.to_dict()["quantization"] == "fp8"  # logged with the run, as every field is
    assert cfg.name == "baseline_lora16_fp8_bf16_compiled_flex"
    for strategy in ("zero1", "zero2"):
        assert RunConfig(**FP8, strategy=strategy, torch_compile=True, padding="bucket").quantization == "fp8"


@pytest.mark.parametrize("device, gpu, capability, refused", [
    ("cpu", "", (0, 0), "on the CPU they are emulated"),
    ("cuda:0", "Tesla T4", (7, 5), "Tesla T4 has 7.5"),
    ("cuda:0", "NVIDIA A100-SXM4-80GB", (8, 0), "NVIDIA A100-SXM4-80GB has 8.0"),
    ("cuda:0", "NVIDIA L4", (8, 9), None),
    ("cuda:0", "NVIDIA H200", (9, 0), None),
])
def test_a_device_without_fp8_matmuls_is_refused(device, gpu, capability, refused):
    why = fp8.refusal(device, gpu, capability)
    assert why is None if refused is None else (refused in why and "use quantization" in why)


def test_a_run_on_the_cpu_is_refused_before_the_model_loads():
    with pytest.raises(ConfigError, match="quantization fp8 needs a GPU with FP8 matmuls"):
        load_model(RunConfig(**{**OFFLINE, **FP8}), "cpu")


def test_scales_are_powers_of_two_per_row_and_every_value_fits_e4m3():
    t = torch.randn(6, 40, generator=torch.Generator().manual_seed(0)) * torch.tensor(
        [1e-3, 0.02, 1.0, 300.0, 1e5, 0.0]).view(-1, 1)
    t8, scale = fp8.quantize_rows(t)
    assert t8.dtype == torch.float8_e4m3fn and scale.shape == (6, 1)
    assert torch.equal(torch.exp2(torch.log2(scale).round()), scale)  # exact in bf16 too
    assert torch.isfinite(t8.float()).all() and t8.float().abs().max() <= fp8.E4M3_MAX
    back = t8.float() * scale
    # each value within e4m3's rounding of itself: 2^-4 of it, or half the step of e4m3's subnormals (2^-9) near 0
    assert ((back - t).abs() <= E4M3_STEP * t.abs() + 2**-10 * scale).all()
    assert torch.equal(back[5], t[5])  # a row of zeros stays zeros


def linear_and_reference():
    """An Fp8Linear, the bf16 weight it stands for, an input and an output gradient."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 96, bias=False).to(torch.bfloat16)
    layer = fp8.Fp8Linear(linear)
    weight = (layer.weight.view(torch.float8_e4m3fn).float() * layer.scale.view(-1, 1)).to(torch.bfloat16)
    assert rel(weight, linear.weight) < E4M3_STEP
    return layer, weight, torch.randn(3, 5, 64, dtype=torch.bfloat16), torch.randn(3, 5, 96, dtype=torch.bfloat16)


def forward_backward(run, x, dy) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.clone().requires_grad_()
    y = run(x)
    y.backward(dy)
    return y.detach(), x.grad


def test_the_fp8_linear_forward_and_input_gradient_match_bf16_on_the_same_weights():
    layer, weight, x, dy = linear_and_reference()
    assert layer.weight.dtype == torch.uint8 and not layer.weight.requires_grad
    y, dx = forward_backward(layer, x, dy)
    y_ref, dx_ref = forward_backward(lambda x: x @ weight.t(), x, dy)
    # One operand rounded to e4m3 per row in each matmul (x in the forward, dy in the backward).
    assert rel(y, y_ref) < E4M3_STEP and rel(dx, dx_ref) < E4M3_STEP
    assert y.dtype == dx.dtype == torch.bfloat16


def scaled_mm_fast_accum_flags(layer, x, dy) -> tuple[list, list]:
    """The use_fast_accum flag of each _scaled_mm call the layer makes in its forward, and in its backward."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._scaled_mm.default:
                named = dict(zip([a.name for a in func._schema.arguments], args, strict=False)) | (kwargs or {})
                seen.append(named.get("use_fast_accum", False))
            return func(*args, **(kwargs or {}))

    x = x.clone().requires_grad_()
    with Record():
        y = layer(x)
        forward, seen[:] = list(seen), []
        y.backward(dy)
    return forward, seen


@pytest.mark.parametrize("fast_accum, forward, backward", [("both", True, True), ("forward", True, False),
                                                           ("none", False, False)])
def test_each_pass_accumulates_as_the_runs_fp8_fast_accum_says(fast_accum, forward, backward, monkeypatch):
    """fp8_fast_accum reaches every _scaled_mm call a run's fp8 layers make: both passes take Hopper's fast
    accumulation by default, the forward's only with forward, neither with none. The CPU ignores the flag, so this
    reads the flag of each call the layers of a base model loaded as a run loads it make (the CPU let past the check
    that refuses it a run)."""
    monkeypatch.setattr(fp8, "check_device", lambda device: None)
    model = load_base(RunConfig(**{**OFFLINE, **FP8}, fp8_fast_accum=fast_accum), "cpu")
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not model.lm_head]
    assert layers and all(type(m) is fp8.Fp8Linear and m.fast_accum == fast_accum for m in layers)
    layer = model.model.layers[0].self_attn.q_proj
    x = torch.randn(4, layer.in_features, dtype=torch.bfloat16)
    dy = torch.randn(4, layer.out_features, dtype=torch.bfloat16)
    assert scaled_mm_fast_accum_flags(layer, x, dy) == ([forward], [backward])


def test_the_default_is_fast_accumulation_and_other_values_are_refused_or_named():
    assert RunConfig(**FP8).fp8_fast_accum == "both"
    assert RunConfig(**FP8, fp8_fast_accum="none").derived_name().endswith("fp8_exactaccum_bf16")
    with pytest.raises(ConfigError, match="fp8_fast_accum is 'none' but applies only with quantization fp8"):
        RunConfig(fp8_fast_accum="none")
    with pytest.raises(ConfigError, match="fp8_fast_accum is 'fast'; use one of both, forward, none"):
        RunConfig(**FP8, fp8_fast_accum="fast")


@pytest.mark.integration
def test_torch_compile_runs_the_same_fp8_math():
    """What dsnb's compiled loop runs (on a GPU, replayed as CUDA graphs): the graph inductor makes of the fp8 layer's
    forward and backward gives what the eager layer gives, bit for bit; so does fp8_head's head."""
    layer, _, x, dy = linear_and_reference()
    head = fp8.Fp8Head(torch.nn.Linear(64, 96, bias=False).to(torch.bfloat16).requires_grad_(False))  # fp8_head's
    for module in (layer, head):
        eager, compiled = forward_backward(module, x, dy), forward_backward(torch.compile(module), x, dy)
        assert all(torch.equal(a, b) for a, b in zip(eager, compiled, strict=True))


def lora(model):
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                            lora_dropout=0.0, task_type="CAUSAL_LM"))


def tiny(intermediate: int = SHAPES["tiny"]["intermediate_size"]):
    """synthetic:tiny's shape in bf16 (random weights, seed 0), its MLP `intermediate` wide."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config = synthetic_config(dict(SHAPES["tiny"], intermediate_size=intermediate), bos=0, eos=1)
    return AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)


def linear_bytes(model) -> dict:
    """Bytes held by the Linear layers (their weights and scales) of the decoder, the LM head left out."""
    found = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and "lora" not in name and name.split(".")[-1] != "lm_head":
            found[name.removesuffix(".base_layer")] = sum(t.untyped_storage().nbytes() for t in
                                                          [*module.parameters(recurse=False), *module.buffers()])
    return found


def test_fp8_halves_the_linear_weights_and_leaves_the_head_in_bf16():
    model, quantized = tiny(176), tiny(176)  # tiny with its MLP 176 wide: every width a multiple of 16
    assert fp8.quantize_linears(quantized, head=False) == 14  # 2 layers x (q, k, v, o, gate, up, down)
    before, after = linear_bytes(model), linear_bytes(quantized)
    for name, module in quantized.named_modules():
        if type(module) is fp8.Fp8Linear:
            rows = module.out_features
            assert after[name] - 4 * rows == before[name] / 2  # one byte a weight, plus an fp32 scale a row
    assert quantized.lm_head.weight.dtype == torch.bfloat16
    assert quantized.lm_head.weight is quantized.model.embed_tokens.weight  # still tied
    kept = {name: t.clone() for name, t in quantized.state_dict().items() if "layers" in name}
    quantized.to(torch.bfloat16)  # a module cast: the fp8 bytes (uint8) and the power-of-two scales come through
    for name, t in quantized.state_dict().items():
        if name in kept:
            assert torch.equal(t.float(), kept[name].float()) and (t.dtype == kept[name].dtype or "scale" in name)
    odd = tiny()  # synthetic:tiny itself: its 172-wide MLP is not a width _scaled_mm takes on CUDA: padded to 176
    assert fp8.quantize_linears(odd, head=False) == 14
    assert odd.model.layers[0].mlp.up_proj.weight.shape == (176, 64)
    assert odd.model.layers[0].mlp.down_proj.weight.shape == (64, 176)
    assert count_parameters(odd)[1] == count_parameters(tiny())[1]  # the padding is not counted as weights


@pytest.mark.parametrize("inputs, outputs", [(64, 172), (172, 64), (40, 24)])
def test_a_layer_of_a_width_scaled_mm_does_not_take_is_padded_and_computes_the_unpadded_layers_math(inputs, outputs):
    """synthetic:tiny's and small's MLPs (172 and 344 wide): zero rows and columns up to a multiple of 16, the input
    padded and the output cut at each call, so y and x's gradient have the layer's own shapes and its values."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(inputs, outputs, bias=False).to(torch.bfloat16)
    layer = fp8.Fp8Linear(linear)
    assert layer.weight.shape == (-(-outputs // 16) * 16, -(-inputs // 16) * 16)
    assert (layer.in_features, layer.out_features) == (inputs, outputs)
    rows = (layer.weight.view(torch.float8_e4m3fn).float() * layer.scale.view(-1, 1))
    assert not rows[outputs:].any() and not rows[:, inputs:].any()  # the padding is zeros
    weight = rows[:outputs, :inputs].to(torch.bfloat16)
    for lead in ((3, 5), (7,)):  # a batch of rows, and rows alone
        x, dy = torch.randn(*lead, inputs, dtype=torch.bfloat16), torch.randn(*lead, outputs, dtype=torch.bfloat16)
        y, dx = forward_backward(layer, x, dy)
        y_ref, dx_ref = forward_backward(lambda x: x @ weight.t(), x, dy)
        assert y.shape == y_ref.shape and dx.shape == x.shape
        assert rel(y, y_ref) < E4M3_STEP and rel(dx, dx_ref) < E4M3_STEP


def train_steps(model, steps: int = 12) -> list[float]:
    """LoRA's loss over `steps` AdamW steps on one batch (rows of a short random run of tokens, repeated: a pattern to
    learn), under bf16 autocast as dsnb's loop trains."""
    batch = torch.randint(2, 400, (4, 8), generator=torch.Generator().manual_seed(1)).repeat(1, 4)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-2)
    losses = []
    for _ in range(steps):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def test_lora_on_fp8_weights_learns_as_on_bf16_ones():
    torch.manual_seed(2)
    reference = train_steps(lora(tiny(176)))
    quantized = tiny(176)
    fp8.quantize_linears(quantized)
    torch.manual_seed(2)  # the same initial adapters
    model = lora(quantized)
    assert type(model.base_model.model.model.layers[0].self_attn.q_proj.base_layer) is fp8.Fp8Linear
    losses = train_steps(model)
    assert reference[-1] < 0.95 * reference[0]  # it learns
    # Within 1% at every step (the bar; measured 0.07%); with no gradient through the fp8 layers: 7%.
    assert max(abs(a - b) / b for a, b in zip(losses, reference, strict=True)) < 0.01


# In a process of its own (DeepSpeed initialises torch.distributed): ZeRO-2 in bf16 over a LoRA model with fp8 weights.
ZERO2 = """
import json
import pathlib
from dsnb.train import deepspeed_env
deepspeed_env("cpu")
import deepspeed, torch
from tests.test_fp8 import fp8, lora, tiny
model = tiny(176)
fp8.quantize_linears(model)
model = lora(model)
before = {n: b.clone() for n, b in model.named_buffers() if n.endswith("scale")}
config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "steps_per_print": 10**6,
          "bf16": {"enabled": True}, "zero_optimization": {"stage": 2}}
trained = [p for p in model.parameters() if p.requires_grad]
engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(trained, lr=1e-2), config=config)
batch = torch.randint(2, 400, (2, 16))
losses = []
for _ in range(3):
    loss = engine(input_ids=batch, labels=batch).loss
    engine.backward(loss)
    engine.step()
    losses.append(loss.item())
layers = [m for m in engine.module.modules() if type(m) is fp8.Fp8Linear]
heads = [m for m in engine.module.modules() if type(m) is fp8.Fp8Head]
scales = {n: b for n, b in engine.module.named_buffers() if n.endswith("scale")}
print(json.dumps({"layers": len(layers), "weights": sorted({str(m.weight.dtype) for m in layers}),
                  "head": [(str(m.weight8.dtype), str(m.weight.dtype),
                            m.weight is engine.module.get_input_embeddings().weight) for m in heads],
                  "scales_kept": all(torch.equal(scales[n].float(), before[n]) for n in before), "losses": losses}))
torch.distributed.destroy_process_group()
"""


@pytest.mark.integration
def test_deepspeed_zero2_in_bf16_keeps_the_fp8_weights_and_their_scales():
    """ZeRO-1/2 take fp8 weights (ZeRO-3 is refused): DeepSpeed's engine over a LoRA model with fp8 layers and an fp8
    head (fp8_head), in bf16, trains the adapters through them and leaves the fp8 weights, the head's fp8 copy and
    their scales as they were."""
    done = subprocess.run([sys.executable, "-c", ZERO2], capture_output=True, text=True, timeout=300,
                          cwd=pathlib.Path(__file__).parent.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["layers"] == 14 and out["weights"] == ["torch.uint8"] and out["scales_kept"]
    assert out["head"] == [["torch.uint8", "torch.bfloat16", True]]  # fp8_head's copy kept, the head still tied
    assert all(loss == loss for loss in out["losses"]) and out["losses"][-1] < out["losses"][0]


def test_the_fp8_head_makes_the_logits_in_fp8_and_the_input_gradient_through_its_bf16_weight():
    """fp8_head: the LM head's forward through an fp8 copy of its weight (fast accumulation unless fp8_fast_accum is
    none), its input gradient dy W through the weight itself in bf16, no _scaled_mm in the backward. The head keeps its
    weight, still the input embedding's (tied), and the copy is not in the state dict (a saved model is the same)."""
    reference, model = tiny(176).requires_grad_(False), tiny(176).requires_grad_(False)  # frozen, as under LoRA
    assert fp8.quantize_linears(model, "both") == 14  # head=True by default, as fp8_head
    head = model.lm_head
    assert type(head) is fp8.Fp8Head and head.weight is model.model.embed_tokens.weight
    assert head.weight.dtype == torch.bfloat16 and torch.equal(head.weight, reference.lm_head.weight)
    assert head.weight8.dtype == torch.uint8 and head.weight8.shape == (432, 64)  # 420 rows padded to 16s
    assert [k for k in model.state_dict() if k.startswith("lm_head")] == ["lm_head.weight"]  # as saved before
    x = torch.randn(2, 7, head.in_features, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(1))
    dy = torch.randn(2, 7, head.out_features, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(2))
    (y, dx), (y_ref, dx_ref) = forward_backward(head, x, dy), forward_backward(reference.lm_head, x, dy)
    assert 0 < rel(y, y_ref) < 2 * E4M3_STEP  # x and W each rounded to e4m3 per row
    assert torch.equal(dx, dx_ref)  # the bf16 head's own input gradient, bit for bit
    assert scaled_mm_fast_accum_flags(head, x, dy) == ([True], [])
    exact = tiny(176).requires_grad_(False)
    fp8.quantize_linears(exact, "none")
    assert scaled_mm_fast_accum_flags(exact.lm_head, x, dy) == ([False], [])
    untouched = tiny(176)
    fp8.quantize_linears(untouched, "both", head=False)  # the head as it was
    assert type(untouched.lm_head) is torch.nn.Linear


def test_a_head_that_trains_is_refused_rather_than_left_behind_its_fp8_copy():
    """The fp8 copy is taken once: a head whose weight trains (modules_to_save, full fine-tuning) would make logits
    from a stale copy, so its backward stops with what to change."""
    head = fp8.Fp8Head(torch.nn.Linear(64, 96, bias=False).to(torch.bfloat16))
    y = head(torch.randn(2, 64, dtype=torch.bfloat16, requires_grad=True))
    with pytest.raises(ConfigError, match="the head cannot train .*; set fp8_head false"):
        y.sum().backward()
    from dsnb.loss import chunk_the_loss  # the chunked loss, which makes the head's gradients itself, refuses it too

    model = tiny(176)
    fp8.quantize_linears(model)
    chunk_the_loss(model, 8)
    ids = torch.randint(2, 400, (1, 12))
    with pytest.raises(ConfigError, match="the head cannot train .*; set fp8_head false"):
        model(input_ids=ids, labels=ids)


@pytest.mark.parametrize("head", [True, False])
def test_a_runs_fp8_head_field_decides_the_heads_form_and_is_logged_by_name(head, monkeypatch):
    """A run loads the head as its fp8_head says (default: fp8); false is named in the run's name (bf16head) and
    refused without quantization fp8; a LoRA model on it trains only its adapters."""
    monkeypatch.setattr(fp8, "check_device", lambda device: None)
    cfg = RunConfig(**{**OFFLINE, **FP8}, fp8_head=head)
    assert RunConfig(**FP8).fp8_head is True
    assert cfg.derived_name().endswith("_bf16head") == (not head)
    model, _ = load_model(cfg, "cpu")
    assert type(model.base_model.model.lm_head) is (fp8.Fp8Head if head else torch.nn.Linear)
    assert {n for n, p in model.named_parameters() if p.requires_grad} and \
        all("lora_" in n for n, p in model.named_parameters() if p.requires_grad)
    with pytest.raises(ConfigError, match="fp8_head is false but applies only with quantization fp8"):
        RunConfig(fp8_head=False)


def test_an_fp8_runs_mfu_says_it_is_of_bf16s_peak_where_a_person_reads_it():
    """MFU is model FLOPs over the GPU's dense bf16 peak; fp8 matmuls peak at twice that, so an fp8 run's MFU is
    bf16-equivalent and must say so in the run's summary and its model card (a bf16 run's must not)."""
    from dsnb.card import card
    from dsnb.report import run_summary

    m = {"samples_per_second": 586.3, "tokens_per_second": 47650.0, "timed_steps": 12, "mfu": 0.6204,
         "peak_gpu_allocated_mb": 44411.0, "peak_gpu_nvml_mb": 50000.0, "peak_cpu_rss_mb": 7330.0, "train_loss": 11.5}
    for quantization, dtype in (("fp8", "bf16"), ("none", "bf16")):
        cfg = RunConfig(model=OFFLINE["model"], quantization=quantization, dtype=dtype)
        texts = (run_summary(m, cfg, "r1"), card(cfg, m, "r1", "adapter", {}, "squad"))
        for text in texts:
            assert ("% of bf16's peak (fp8 weights: bf16-equivalent" in text) == (quantization == "fp8"), text
            assert "MFU 62.0" in text, text


def test_the_fp8head_lever_gives_the_head_an_fp8_copy_and_keeps_the_embedding(monkeypatch):
    """benchmarks/throughput_levers.py fp8head (issue 38's candidate for 1.3x, measured on the GPU): the LM head of a
    tied model becomes an Fp8Linear of its own while the input embedding keeps its bf16 weight, and the logits stay
    within e4m3's rounding of the bf16 model's (emulated here, the GPU's math)."""
    monkeypatch.syspath_prepend(str(pathlib.Path(__file__).parent.parent / "benchmarks"))
    import throughput_levers

    monkeypatch.setattr(fp8, "quantize_linears", fp8.quantize_linears)  # put back after the lever replaces it
    reference, base_only, with_head = tiny(176), tiny(176), tiny(176)
    fp8.quantize_linears(base_only, head=False)
    throughput_levers.head_in_fp8()
    assert fp8.quantize_linears(with_head, "both") == 15
    assert type(with_head.lm_head) is fp8.Fp8Linear and with_head.lm_head.weight.dtype == torch.uint8
    assert torch.equal(with_head.model.embed_tokens.weight, reference.model.embed_tokens.weight)
    ids = torch.randint(2, with_head.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = {name: m(ids).logits for name, m in [("bf16", reference), ("fp8", base_only), ("head", with_head)]}
    assert rel(logits["fp8"], logits["bf16"]) < 2 * E4M3_STEP
    assert 0 < rel(logits["head"], logits["fp8"]) < 2 * E4M3_STEP  # the head's own rounding, no more


def test_the_gemm_benchmark_times_every_form_and_checks_each_output_against_the_exact_product(tmp_path):
    """benchmarks/fp8_gemms.py --offline (the CPU, small widths): a line for every layer, pass and form, and each
    matmul's output as close to its operands' exact product as bf16 rounding allows (the CPU computes exactly and
    rounds once). It catches a form paired with another's operands or scales; not fast accumulation's error (the CPU
    ignores the flag), a mistake the form and its reference share, or a layout CUDA would refuse."""
    out = tmp_path / "gemms.jsonl"
    subprocess.run([sys.executable, "benchmarks/fp8_gemms.py", "--offline", "--out", str(out)], check=True,
                   cwd=pathlib.Path(__file__).resolve().parent.parent, capture_output=True)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert {(r["layer"], r["pass"], r["form"]) for r in lines} == {
        (layer, pass_, form) for layer in ("q", "k", "v", "o", "gate", "up", "down", "head")
        for pass_ in ("forward", "dgrad")
        for form in ("bf16", "rowwise", "rowwise_fast", "tensorwise", "tensorwise_fast")} | {
        (layer, "dgrad", "transpose") for layer in ("q", "k", "v", "o", "gate", "up", "down", "head")}
    for r in lines:
        if r["form"] != "transpose":
            assert r["ms"] > 0 and float(r["rel_err"]) <= 1.5 * float(r["bf16_rounding"]), r
