import pytest
import torch

from conftest import free_port
from dsnb.config import OFFLINE, ConfigError, RunConfig
from dsnb.metrics import flops_per_token, matmul_params
from dsnb.model import SHAPES, count_parameters, load_model


@pytest.mark.parametrize("quantization", ["none", "8bit", "4bit"])
def test_tiny_loads_quantized_with_lora_and_trains_a_step(quantization):
    cfg = RunConfig(**dict(OFFLINE, quantization=quantization))
    model, tokenizer = load_model(cfg, "cpu")
    trainable, total = count_parameters(model)
    assert 0 < trainable < total / 3
    assert all("lora" in n for n, p in model.named_parameters() if p.requires_grad)
    if quantization != "none":
        assert getattr(model.base_model.model, f"is_loaded_in_{quantization}")
    batch = tokenizer(["질문: a?\n답변: b"], return_tensors="pt")
    loss = model(**batch, labels=batch["input_ids"]).loss
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert torch.isfinite(loss) and any(g is not None and g.abs().sum() > 0 for g in grads)


def test_full_fine_tuning_trains_every_weight():
    model, _ = load_model(RunConfig(**dict(OFFLINE, quantization="none", lora_r=0)), "cpu")
    trainable, total = count_parameters(model)
    assert trainable == total


def test_synthetic_shapes_match_the_real_models():
    # Llama 3.2 3B has 3.21e9 parameters with tied embeddings: N (matmul weights) counts the LM head once.
    from transformers import LlamaConfig

    cfg = LlamaConfig(**SHAPES["llama-3.2-3b"], head_dim=128)
    assert matmul_params(cfg) == pytest.approx(3.21e9, rel=0.01)
    assert flops_per_token(cfg, trainable=0, full=False) == pytest.approx(4 * 3.21e9, rel=0.01)
    cfg8 = LlamaConfig(**SHAPES["llama-3.1-8b"], head_dim=128)
    assert matmul_params(cfg8) + 4096 * 128256 == pytest.approx(8.03e9, rel=0.01)


def test_unknown_models_say_what_to_give():
    with pytest.raises(ConfigError, match="synthetic shapes are"):
        load_model(RunConfig(**dict(OFFLINE, model="synthetic:gpt5")), "cpu")
    with pytest.raises(ConfigError, match="does not exist"):
        load_model(RunConfig(**dict(OFFLINE, model="./no/such/folder")), "cpu")


def test_zero3_loads_each_weight_into_its_partition_and_counts_it_whole(monkeypatch):
    """Under transformers' ZeRO-3 hook (which dsnb's run arms before loading) no weight loads whole; counts stay
    full size."""
    from transformers.integrations import HfDeepSpeedConfig

    from dsnb.zero import deepspeed_config

    port = free_port()  # a port of its own: a fixed one was taken by the same test of another checkout
    for name, value in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                            DS_ACCELERATOR="cpu").items():
        monkeypatch.setenv(name, value)
    cfg = RunConfig(**OFFLINE, quantization="none", lora_r=0, strategy="zero3", offload_param="cpu",
                    offload_optimizer="cpu")
    plain, _ = load_model(cfg.replace(strategy="baseline", offload_param="none", offload_optimizer="none"), "cpu")
    loading = HfDeepSpeedConfig(deepspeed_config(cfg))
    try:  # the hook is global while `loading` lives: a failure here must not leave it armed for the next test
        model, _ = load_model(cfg, "cpu")
        assert all(hasattr(p, "ds_id") and p.numel() == 0 for p in model.parameters())
        assert count_parameters(model) == count_parameters(plain)
    finally:
        del loading


def test_a_misspelled_lora_target_is_an_error_not_a_dropped_adapter():
    # peft adapts q_proj and quietly drops v_projx when another name matches; dsnb names it.
    with pytest.raises(ConfigError, match="lora_targets 'q_proj,v_projx': v_projx matches no module of synthetic:tiny; "
                                          "its linear layers are .*v_proj"):
        load_model(RunConfig(**dict(OFFLINE, quantization="none", lora_targets="q_proj,v_projx")), "cpu")


def test_a_hub_download_reports_its_bytes_while_one_large_file_arrives(tmp_path, monkeypatch):
    """fetch tells the notebook how far a download is by the bytes in the hub cache, within a file too (a 3B model's
    5 GB shard would otherwise show nothing for minutes). The hub is not reachable here: its two calls are stood in
    for by a listing and a writer that fills the cache's blobs folder as huggingface_hub does."""
    import time
    from types import SimpleNamespace

    import huggingface_hub
    from huggingface_hub import constants

    from dsnb import model as model_module

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(model_module, "DOWNLOAD_POLL_S", 0.05)  # a busy machine's late thread still sees the file grow
    blobs = tmp_path / "models--owner--big" / "blobs"
    files = [SimpleNamespace(rfilename="config.json", size=100), SimpleNamespace(rfilename="model.safetensors",
                                                                                 size=10_000_000)]
    monkeypatch.setattr(huggingface_hub, "HfApi", lambda: SimpleNamespace(
        model_info=lambda name, files_metadata: SimpleNamespace(siblings=files)))

    def snapshot_download(name, allow_patterns, local_files_only=False):
        if local_files_only:
            raise huggingface_hub.utils.LocalEntryNotFoundError("not cached")
        blobs.mkdir(parents=True)
        with open(blobs / "abc.incomplete", "wb") as f:  # one file, arriving over about 5 s
            for _ in range(10):
                f.write(b"x" * 1_000_010)
                f.flush()
                time.sleep(0.5)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    said = []
    model_module.fetch("owner/big", said.append)
    progress = [s for s in said if s.startswith("downloaded ") and " of " in s]
    assert said[0].startswith("downloading owner/big: 2 files") and said[-1].startswith("downloaded owner/big in")
    assert len(progress) >= 2 and progress[0] != progress[-1], said  # within the one file, not only after it


def test_a_local_model_folder_without_a_tokenizer_says_so(tmp_path):
    """Weights and config.json but no tokenizer files: what to copy in, not transformers' traceback about
    sentencepiece or tiktoken."""
    import shutil

    from dsnb.model import load_tokenizer, resolve_model

    source = resolve_model("synthetic:tiny")
    for name in ("config.json", "model.safetensors"):
        shutil.copy(f"{source}/{name}", tmp_path / name)
    with pytest.raises(ConfigError, match="has no tokenizer .*copy the base model's tokenizer files into it"):
        load_tokenizer(RunConfig(**dict(OFFLINE, model=str(tmp_path))))
    shutil.copy(f"{source}/tokenizer.json", tmp_path / "tokenizer.json")
    shutil.copy(f"{source}/tokenizer_config.json", tmp_path / "tokenizer_config.json")
    assert load_tokenizer(RunConfig(**dict(OFFLINE, model=str(tmp_path)))).pad_token is not None


TINY_DECODER = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                    num_key_value_heads=2, vocab_size=300)


@pytest.mark.parametrize("arch, apart", [("Llama", True), ("Qwen2", True), ("Gemma3Text", True), ("GPT2", True),
                                         ("OPT", False), ("BioGpt", False), ("Bloom", False)])
def test_packing_is_checked_by_running_the_architecture(arch, apart):
    """model.packing_isolates: a sample in a packed row (position ids restarting, no mask) sees the ones before it
    where the model does not hand its position ids to its mask (OPT, BioGPT, Bloom); the caller's random state is left
    as it was."""
    import transformers

    from dsnb.model import packing_isolates

    config = getattr(transformers, f"{arch}Config")(**{k: v for k, v in TINY_DECODER.items()
                                                       if arch not in ("GPT2", "Bloom") or k == "vocab_size"})
    torch.manual_seed(7)
    want = torch.rand(3)
    torch.manual_seed(7)
    assert packing_isolates(config) is apart
    assert torch.equal(torch.rand(3), want)


def test_a_model_that_mixes_packed_samples_or_names_its_sizes_otherwise_is_refused_before_it_loads(tmp_path):
    """`dsnb check` on a local BioGPT (which has Llama's size names but no mask from position ids): padding bucket
    passes, packed and filled are refused with what to set; a local GPT-2 (n_inner, not intermediate_size) is refused
    by name, before any weight loads, where the estimate raised AttributeError."""
    import shutil
    import subprocess
    import sys

    import transformers

    from dsnb.model import resolve_model

    tokenizer = resolve_model("synthetic:tiny")
    for arch, config in (("biogpt", transformers.BioGptConfig(**TINY_DECODER)),
                         ("gpt2", transformers.GPT2Config(n_embd=64, n_layer=1, n_head=4, vocab_size=300))):
        folder = tmp_path / arch
        folder.mkdir()
        (folder / "config.json").write_text(config.to_json_string())  # no weights: check loads none
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(f"{tokenizer}/{name}", folder / name)

    def check(arch, padding):
        return subprocess.run([sys.executable, "-m", "dsnb", "check", "--offline", "--model", str(tmp_path / arch),
                               "--quantization", "none", "--padding", padding], capture_output=True, text=True,
                              timeout=300, cwd=tmp_path)

    assert check("biogpt", "bucket").returncode == 0
    for padding in ("packed", "filled"):
        done = check("biogpt", padding)
        assert done.returncode != 0 and f"padding {padding} puts several samples in a row" in done.stderr
        assert "(biogpt) does not read them into its attention" in done.stderr and "set padding bucket" in done.stderr
    gemma2 = tmp_path / "gemma2"  # no SDPA in transformers: eager attention, which the plan says and counts
    shutil.copytree(tmp_path / "biogpt", gemma2)
    (gemma2 / "config.json").write_text(transformers.Gemma2Config(**TINY_DECODER, head_dim=16).to_json_string())
    done = check("gemma2", "bucket")
    assert done.returncode == 0 and "Gemma2ForCausalLM has no SDPA attention in transformers" in done.stdout
    assert "8 bytes each in" in done.stdout and "which the memory estimate counts" in done.stdout
    assert "eagerly" not in check("biogpt", "bucket").stdout
    done = check("gpt2", "bucket")
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "(model type gpt2) has no intermediate_size in its config" in done.stderr, done.stderr


def test_the_architecture_checks_build_their_copy_outside_a_zero3_runs_partitioning(monkeypatch):
    """A ZeRO-3 run's TrainingArguments switch on transformers' ZeRO-3 mode before the plan runs, where from_config
    would build packing_isolates' copy (and weight_shapes' meta model) partitioned by deepspeed.zero.Init, empty, and
    refuse padding packed; the class is built directly. Llama 3.2 Vision's text config (no auto mapping of its own) is
    built as MllamaForCausalLM."""
    import transformers
    from transformers.integrations import HfDeepSpeedConfig
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

    from dsnb.model import model_config, packing_isolates, weight_shapes

    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    zero3 = HfDeepSpeedConfig({"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 1})
    assert is_deepspeed_zero3_enabled()
    config = model_config("synthetic:tiny")
    assert packing_isolates(config) and len(weight_shapes(config)["linear"]) == 15
    del zero3
    vision = transformers.MllamaConfig(text_config=dict(TINY_DECODER, cross_attention_layers=[0], pad_token_id=0))
    assert weight_shapes(vision.get_text_config())["total"] > 0
