"""Model and tokenizer loading: a hub id, a local directory, or an offline synthetic model of a real shape.

    model, tokenizer = load_model(cfg, device="cuda:0")   # quantized and wrapped in LoRA as cfg says

Synthetic models (`synthetic:tiny`, `synthetic:llama-3.2-3b`, ...) have random weights and a real Llama
architecture, so memory and speed are real while loss values mean nothing. They are built once into
a cache folder (DSNB_CACHE, default ~/.cache/dsnb) with a byte-level BPE tokenizer trained by dsnb on
its own synthetic text, then loaded through the same from_pretrained path as any local model.
"""
from __future__ import annotations

import contextlib
import copy
import fnmatch
import functools
import os
import shutil
import tempfile
import threading
import time
import warnings

from .config import ConfigError, RunConfig, describe, hub_offline_note
from .data import format_prompt, synthetic_squad

# Llama shapes: hidden, layers, heads, kv heads, MLP width, vocab, tied embeddings.
SHAPES = {
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=172, vocab_size=0, tie_word_embeddings=True),
    # Twice tiny's width: learns the offline set's facts on 2 CPU cores within a minute (variants/quality.yaml).
    "small": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=344, vocab_size=0, tie_word_embeddings=True),
    "llama-3.2-1b": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                         intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True),
    "llama-3.2-3b": dict(hidden_size=3072, num_hidden_layers=28, num_attention_heads=24, num_key_value_heads=8,
                         intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True),
    "llama-3.1-8b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                         intermediate_size=14336, vocab_size=128256, tie_word_embeddings=False),
}
TOKENIZER_VOCAB = 420  # gives ~43 tokens a prompt, near the ~39 of the real model on SQuAD; vocab_size 0 above = this
SYNTHETIC_VERSION = 2  # bump when SHAPES, the tokenizer or its text change, so cached builds are not reused
TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
DOWNLOAD_POLL_S = 2.0  # how often a download's bytes are looked at (fetch)
ELSEWHERE = "a local folder, or synthetic:tiny (--offline: dsnb's own model and data)"  # what else to give


def cache_dir() -> str:
    return os.environ.get("DSNB_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "dsnb"))


def synthetic_shape(name: str) -> str:
    """The shape of a synthetic:<shape> name, or a ConfigError listing the shapes."""
    shape = name.split(":", 1)[1]
    if shape not in SHAPES:
        raise ConfigError(f"model {name!r} is unknown; synthetic shapes are "
                          f"{', '.join('synthetic:' + s for s in SHAPES)}")
    return shape


@functools.lru_cache(maxsize=None)
def resolve_model(name: str) -> str:
    """A path or hub id that from_pretrained can load; synthetic models are built on first use (once a process)."""
    if name.startswith("synthetic:"):
        shape = synthetic_shape(name)
        path = os.path.join(cache_dir(), f"synthetic-v{SYNTHETIC_VERSION}", shape)
        if not os.path.isfile(os.path.join(path, "config.json")):
            build_synthetic(shape, path)
        return path
    if os.path.isdir(name):
        return name
    if name.startswith(("/", ".", "~")) or name.count("/") > 1:
        raise ConfigError(f"model directory {name!r} does not exist; give a local folder, a hub id or synthetic:tiny")
    return name


def not_loaded(name: str, error: Exception) -> str:
    """Why a hub id or folder did not load, and what to give instead; offline (config.stay_off_the_hub) a hub id the
    hub's cache lacks is said so, not as a connection that failed."""
    note = hub_offline_note()
    missing = "find them in the cached files" in str(error)  # huggingface_hub's words; a broken cached file differs
    why = (f"is not in the hub's cache{note}" if note and missing and not os.path.isdir(name) else
           f"could not be loaded ({describe(error)}){note}")
    return f"model {name!r} {why}; give an existing hub id, {ELSEWHERE}"


def fetch(name: str, say) -> None:
    """A hub model's files downloaded into the hub's cache, telling `say` how far along it is (every 10%, by bytes),
    so a notebook sees the minutes a 6 GB download takes; local folders, synthetic shapes and cached models pass."""
    if name.startswith("synthetic:") or os.path.isdir(name):
        return
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.utils import HfHubHTTPError, LocalEntryNotFoundError

    patterns = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt"]
    try:
        snapshot_download(name, allow_patterns=patterns, local_files_only=True)
        return  # already cached
    except (LocalEntryNotFoundError, OSError, ValueError):
        pass
    try:
        files = [f for f in HfApi().model_info(name, files_metadata=True).siblings
                 if any(fnmatch.fnmatch(f.rfilename, p) for p in patterns)]
    except (HfHubHTTPError, OSError, ValueError) as e:
        raise ConfigError(f"model {name!r} could not be reached on the hub ({describe(e)}); check its id and the "
                          f"network, or give {ELSEWHERE}") from None
    total = sum(f.size or 0 for f in files)
    say(f"downloading {name}: {len(files)} files, {total / 1e9:.1f} GB (once: the hub's cache keeps them)")
    from huggingface_hub import constants

    blobs = os.path.join(constants.HF_HUB_CACHE, f"models--{name.replace('/', '--')}", "blobs")
    started, stop = time.perf_counter(), threading.Event()
    at_start = folder_bytes(blobs)

    def watch():  # the blobs folder grows as each file arrives (.incomplete until whole): a 5 GB shard shows too
        told = 0
        while not stop.wait(DOWNLOAD_POLL_S):
            done = folder_bytes(blobs) - at_start
            if total and done * 10 // total > told:
                told = done * 10 // total
                say(f"downloaded {done / 1e9:.1f} of {total / 1e9:.1f} GB in {time.perf_counter() - started:.0f} s")

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        snapshot_download(name, allow_patterns=patterns)
    finally:
        stop.set()
        watcher.join()
    say(f"downloaded {name} in {time.perf_counter() - started:.0f} s")


def folder_bytes(folder: str) -> int:
    """The bytes of the files in a folder (0 where it does not exist yet)."""
    try:
        return sum(e.stat().st_size for e in os.scandir(folder) if e.is_file())
    except OSError:
        return 0


@functools.lru_cache(maxsize=None)
def model_config(name: str):
    """The text model's config of cfg.model (hub, folder or synthetic), read without loading (or building) any
    weight: a synthetic shape's config is made from SHAPES alone."""
    from transformers import AutoConfig

    if name.startswith("synthetic:"):
        return synthetic_config(SHAPES[synthetic_shape(name)], bos=0, eos=1)
    try:
        config = AutoConfig.from_pretrained(resolve_model(name), trust_remote_code=False)
    except (OSError, ValueError) as e:
        raise ConfigError(not_loaded(name, e)) from None
    return config.get_text_config()


# What dsnb's plan, memory estimate and FLOPs read of a decoder's config, as Llama's names them
ARCHITECTURE_FIELDS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers", "vocab_size")


def check_architecture(name: str, config) -> None:
    """A model whose config names its sizes as Llama's does (Llama, Mistral, Qwen, Gemma, Phi-3, OLMo, Cohere, ...);
    GPT-2, OPT, Falcon, Bloom, MPT or Mamba name them otherwise, and are refused before anything loads."""
    missing = [f for f in ARCHITECTURE_FIELDS if not isinstance(getattr(config, f, None), int)]
    if missing:
        raise ConfigError(f"{name} (model type {getattr(config, 'model_type', '?')}) has no {', '.join(missing)} in "
                          "its config: dsnb's plan and memory estimate read a decoder's config as Llama's "
                          "names it, as Llama, Mistral, Qwen, Gemma, Phi-3, OLMo and Cohere models do; choose such a "
                          "model")


SHAPES_SEEN: dict = {}  # a config's JSON -> its weights' shapes (weight_shapes), built once a process
KEYS_SEEN: dict = {}  # id(config) -> (the config, a copy of its attributes, its JSON): config_key's


def config_key(config) -> str:
    """config's JSON, the key of this module's caches, made once for each config object and again only where its
    attributes have changed since (to_json_string takes about a millisecond, and benchmarks/time_vs_measured.py's fit
    asks for a config's weights half a million times: six minutes of the tests)."""
    seen = KEYS_SEEN.get(id(config))
    if seen is None or seen[0] is not config or seen[1] != vars(config):
        seen = KEYS_SEEN[id(config)] = (config, copy.deepcopy(vars(config)), config.to_json_string())
    return seen[2]


def weight_shapes(config) -> dict:
    """The weights a model of this config has, read off the model built on the meta device (no memory, no weights):
    {"linear": {module name: (in, out)} for every Linear (GPT-2's Conv1D too), "embedding": {name: (rows, width)},
    "total": every parameter once (tied ones once), "experts": whether some weights are not in a Linear (a mixture of
    experts' stacked matrices)}. What the estimates and MFU count, whatever the architecture names its layers."""
    key = config_key(config)
    if key not in SHAPES_SEEN:
        import torch

        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = causal_lm_class(config)(config)
        linear, embedding, held = {}, {}, set()
        for name, module in model.named_modules():
            weight = getattr(module, "weight", None)
            if isinstance(module, torch.nn.Linear):
                linear[name] = (module.in_features, module.out_features)
            elif type(module).__name__ == "Conv1D" and weight is not None:  # GPT-2's: weight is (in, out)
                linear[name] = tuple(weight.shape)
            elif isinstance(module, torch.nn.Embedding):
                embedding[name] = tuple(weight.shape)
            else:
                continue
            held.add(id(weight))
        stacked = any(p.ndim > 2 and id(p) not in held for p in model.parameters())
        SHAPES_SEEN[key] = {"linear": linear, "embedding": embedding, "experts": stacked,
                            "total": sum(p.numel() for p in model.parameters())}
    return SHAPES_SEEN[key]


def matmul_weights(config, head: bool = True) -> int:
    """Weights in the model's matrix multiplies: every linear layer of the model built on the meta device
    (weight_shapes), the LM head where head. A mixture of experts' stacked matrices are counted as one expert's MLP a
    token (the Llama-family formula below), not measured."""
    shapes = weight_shapes(config)
    if not shapes["experts"]:
        return sum(i * o for name, (i, o) in shapes["linear"].items()
                   if head or name.rsplit(".", 1)[-1] != "lm_head")
    h, heads = config.hidden_size, config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or h // heads
    attention = 2 * h * heads * head_dim + 2 * h * kv * head_dim  # q and o; k and v
    layers = config.num_hidden_layers * (attention + 3 * h * config.intermediate_size)  # and gate, up, down
    return layers + (h * config.vocab_size if head else 0)


def causal_lm_class(config):
    """The causal LM class transformers builds for this (text) config: its auto mapping's, or the class whose config it
    is (Llama 3.2 Vision's text config builds MllamaForCausalLM). Called directly, not through from_config, which
    under a ZeRO-3 run's TrainingArguments would build the weights partitioned by deepspeed.zero.Init."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    found = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)] if type(config) in MODEL_FOR_CAUSAL_LM_MAPPING else next(
        (c for c in MODEL_FOR_CAUSAL_LM_MAPPING.values() if getattr(c, "config_class", None) is type(config)), None)
    if found is None:
        raise ConfigError(f"transformers has no causal language model for {type(config).__name__} "
                          f"({getattr(config, 'model_type', '?')}); choose a decoder such as Llama, Qwen or Gemma")
    return found


def lora_matches(name: str, targets) -> bool:
    """Whether peft's target names (a module's name or its last parts) pick this module."""
    return any(name == t or name.endswith("." + t) for t in targets)


def eager_attention(cfg: RunConfig, config) -> str:
    """The model class's name where attention sdpa cannot be had (Gemma 2, GPT-OSS, ...: transformers loads them with
    its eager attention, which keeps each layer's length x length weights per head for the backward, counted by the
    memory estimate through eager_weight_bytes); else ''."""
    if cfg.attention != "sdpa":
        return ""
    model_class = causal_lm_class(config)
    return "" if getattr(model_class, "_supports_sdpa", True) else model_class.__name__


EAGER_WEIGHT_FALLBACK = 8  # bytes an attention weight where a small copy cannot be measured: the most measured


def eager_weight_bytes(config, dtype: str) -> tuple[float, str]:
    """(bytes, why not measured) that autograd keeps for the backward per attention weight (one row's query x key
    position, per layer and query head, averaged over the model's layers) where a model attends eagerly
    (eager_attention), in the compute dtype (bf16, fp16, fp32); why is '' where measured.

    Measured, not assumed: a small copy of the architecture (small_copy: one layer of each kind, 8 elements a head where
    it builds so, else its own width) run forward in training mode at 64, 128 and 192 tokens on the CPU, in the dtype
    as a model loads in it (its fp32 modules kept fp32), and the tensors each layer saves for the backward counted at
    each length, each storage once; their second difference is the part that grows with the length's square. Each kind
    of layer is weighted by how many of the model's layers are of that kind. Measured under eager autograd: a compiled
    step may keep less. Gemma 2's keeps 8 in bf16 (the softmax's fp32 output, its bf16 copy, soft-capping's tanh), 8 in
    fp32; GPT-OSS's and MiMo-V2-Flash's 2. Cached by config and dtype (a second or two the first time);
    EAGER_WEIGHT_FALLBACK, with the reason, where the copy cannot be built or run here."""
    key = (type(config).__name__, config_key(config), dtype)
    if key not in EAGER_WEIGHTS_SEEN:
        try:
            EAGER_WEIGHTS_SEEN[key] = (measure_eager_weights(config, dtype), "")
        except Exception as e:  # an architecture whose small copy transformers cannot build or run from its config
            EAGER_WEIGHTS_SEEN[key] = (EAGER_WEIGHT_FALLBACK, f"{type(e).__name__}: {str(e)[:160]}")
    return EAGER_WEIGHTS_SEEN[key]


EAGER_WEIGHTS_SEEN: dict = {}


def measure_eager_weights(config, dtype: str) -> float:
    """eager_weight_bytes' measurement: bytes per (row, query, key, layer, head), averaged over config's layers."""
    small = small_copy(config)
    narrow = copy.deepcopy(small)
    narrow.hidden_size = narrow.num_attention_heads * 8
    if isinstance(getattr(narrow, "head_dim", None), int):
        narrow.head_dim = 8
    try:
        per_layer = per_layer_squares(narrow, dtype)
    except Exception:  # a head whose parts are sized apart (rotary and other dims): the copy at its own width
        per_layer = per_layer_squares(small, dtype)
    kinds = list(getattr(small, "layer_types", None) or [None])  # the small model's layer i is of kinds[i]
    layers = list(getattr(config, "layer_types", None) or [None] * config.num_hidden_layers)[:config.num_hidden_layers]
    return sum(per_layer[kinds.index(kind)] for kind in layers) / (len(layers) * config.num_attention_heads)


def per_layer_squares(small, dtype: str) -> list[float]:
    """Bytes per (row, query, key) that each decoder layer of the small model saves for its backward."""
    import torch

    small._attn_implementation = "eager"
    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(dtype, torch.float32)
    with seeded_on_cpu():
        model = causal_lm_class(small)(small).to(torch_dtype).train()
        keep = [*(getattr(model, "_keep_in_fp32_modules", None) or []),
                *(getattr(model, "_keep_in_fp32_modules_strict", None) or [])]
        for name, module in model.named_modules():  # as from_pretrained(dtype=...) loads them
            if keep and any(k in name for k in keep):
                module.float()
        layers = next(m for m in model.modules()
                      if isinstance(m, torch.nn.ModuleList) and len(m) == small.num_hidden_layers)
        saved = [saved_bytes(model, layers, length) for length in (64, 128, 192)]
    return [(saved[2][i] - 2 * saved[1][i] + saved[0][i]) / (2 * 64 ** 2) for i in range(len(layers))]


def saved_bytes(model, layers, length: int) -> list[int]:
    """Bytes of the tensors each of `layers` saves for the backward in one forward of a row of `length` tokens, each
    storage once (where it is first saved)."""
    import torch

    storages, current = {}, [None]
    hooks = [layer.register_forward_pre_hook(lambda module, args, i=i: current.__setitem__(0, i))
             for i, layer in enumerate(layers)]

    def keep(t):
        if t.device.type != "meta" and current[0] is not None:
            storage = t.untyped_storage()
            storages.setdefault(storage.data_ptr(), (current[0], storage.nbytes()))
        return t

    try:
        ids = torch.randint(0, 128, (1, length))
        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            model(input_ids=ids, use_cache=False)
    finally:
        for hook in hooks:
            hook.remove()
    return [sum(n for i, n in storages.values() if i == layer) for layer in range(len(layers))]


def packing_isolates(config) -> bool:
    """Whether this architecture keeps the samples of a packed row apart as dsnb's collators pack them (padding packed
    or filled: position ids restarting at each sample, no attention mask). Transformers makes the block-diagonal mask
    from the position ids only where the model hands them to its mask (Llama, Qwen, Mistral, Gemma, Phi-3, GPT-2, ...);
    OPT, Bloom, MPT or BioGPT do not, and Mamba has no attention to mask, so there a packed sample attends to the ones
    before it. Checked by running it: a copy of the architecture with random weights, one layer of each kind it has
    (layer_types) and narrow MLPs, two samples packed in a row against the second alone, in fp32 on the CPU (under two
    seconds and 1 GB for an 8B shape), the caller's random state untouched."""
    import torch

    small = small_copy(config)
    with seeded_on_cpu():
        model = causal_lm_class(small)(small).float().eval()
        with torch.no_grad():
            ids = torch.randint(0, 128, (1, 12))
            first, second = 5, 7
            positions = torch.cat([torch.arange(first), torch.arange(second)])[None]
            packed = model(input_ids=ids, position_ids=positions, use_cache=False).logits[0, first:]
            alone = model(input_ids=ids[:, first:], position_ids=torch.arange(second)[None], use_cache=False).logits[0]
    # fp32 rounding between the two shapes: 5e-6 of logits up to 4.3 (the 3B shape); a sample that sees another:
    # 0.34 of logits up to 0.71 (OPT)
    return bool((packed - alone).abs().max() <= 1e-4 * alone.abs().max())


@contextlib.contextmanager
def seeded_on_cpu():
    """For a small copy's check: the CPU's generator seeded 0 and given back as it was after (a GPU's stays as the
    caller left it), transformers' warnings about the copy's odd sizes silenced."""
    import torch

    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.default_generator.manual_seed(0)
        yield


def small_copy(config):
    """A copy of config that transformers builds in a moment on the CPU and that checks the same things: one layer of
    each kind it has (layer_types), a vocabulary of 128, no special token ids, MLPs at most 256 wide and, for a mixture
    of experts, two experts."""
    small = copy.deepcopy(config)
    kinds = list(dict.fromkeys(getattr(small, "layer_types", None) or [None]))
    small.num_hidden_layers, small.vocab_size = len(kinds), 128
    if kinds != [None]:
        with contextlib.suppress(AttributeError):  # a property of num_hidden_layers (Mamba's): set already
            small.layer_types = kinds
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if hasattr(small, name):
            setattr(small, name, None)
    for name in ("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size"):  # masks are
        if isinstance(getattr(small, name, None), int):  # not in the MLP: a narrow one checks the same
            setattr(small, name, min(getattr(small, name), 256))
    for name in ("num_local_experts", "num_experts", "n_routed_experts"):  # a mixture of experts: two are enough
        if isinstance(getattr(small, name, None), int) and getattr(small, name) > 2:
            setattr(small, name, 2)
            small.num_experts_per_tok = min(getattr(small, "num_experts_per_tok", 1) or 1, 2)
            for group in ("n_group", "topk_group"):
                if hasattr(small, group):
                    setattr(small, group, 1)
    return small


def check_packing(cfg: RunConfig, config) -> None:
    """padding packed or filled only for an architecture that keeps a row's samples apart (packing_isolates)."""
    if cfg.padding not in ("packed", "filled"):
        return
    kind = getattr(config, "model_type", "?")
    try:
        apart = packing_isolates(config)
    except Exception as e:  # a model transformers cannot build from its config alone here
        raise ConfigError(f"padding {cfg.padding}: could not check that {cfg.model} ({kind}) keeps the samples of a "
                          f"packed row apart ({type(e).__name__}: {str(e)[:200]}); set padding bucket") from None
    if not apart:
        raise ConfigError(f"padding {cfg.padding} puts several samples in a row, kept apart only by position ids "
                          f"that restart at each sample; {cfg.model} ({kind}) does not read them into its attention "
                          "mask, so each sample would attend to the ones before it in its row and train on them; set "
                          "padding bucket (or longest)")


def build_synthetic(shape: str, path: str, dims: dict | None = None) -> None:
    """Write a random-init Llama of `shape` (or of `dims`, SHAPES' fields) and dsnb's tokenizer to `path`
    (atomically). Models wider than 1024 are stored in bf16, smaller ones in fp32."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path("synthetic:tiny"))
    with built_whole(path, f"synthetic:{shape}") as tmp:
        tokenizer.save_pretrained(tmp)
        config = synthetic_config(dims or SHAPES[shape], tokenizer.bos_token_id, tokenizer.eos_token_id)
        assert config.vocab_size >= len(tokenizer)
        torch.manual_seed(0)
        large = config.hidden_size > 1024
        device = "cuda" if large and torch.cuda.is_available() else "cpu"
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16 if large else torch.float32)
        model.save_pretrained(tmp)
        del model


@contextlib.contextmanager
def built_whole(path: str, what: str):
    """A folder for `path` to be written into under a temporary name beside it, renamed into place when the block
    ends (kept as it is where another process finished first); on any failure it is removed, and a write that failed
    (a full disk, say) is a ConfigError naming the place and DSNB_CACHE."""
    from safetensors import SafetensorError

    folder = os.path.dirname(path)
    tmp = None
    try:
        os.makedirs(folder, exist_ok=True)
        tmp = tempfile.mkdtemp(dir=folder, prefix=f".{os.path.basename(path)}-")
        yield tmp
        if not os.path.isdir(path):  # else another process finished first
            os.replace(tmp, path)
    except (OSError, SafetensorError) as e:
        fix = "free space there" if "No space left" in str(e) or getattr(e, "errno", None) == 28 else \
            "make it writable"
        raise ConfigError(f"could not build {what} in {folder} ({describe(e)}); {fix}, or set DSNB_CACHE to another "
                          "folder") from None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def synthetic_config(dims: dict, bos: int, eos: int):
    """A Llama config of SHAPES' fields (vocab_size 0: dsnb's own tokenizer), stored in bf16 above 1024 wide."""
    from transformers import LlamaConfig

    dims = dict(dims)
    dims["vocab_size"] = dims["vocab_size"] or TOKENIZER_VOCAB
    return LlamaConfig(**dims, max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5,
                       bos_token_id=bos, eos_token_id=eos, head_dim=dims["hidden_size"] // dims["num_attention_heads"],
                       dtype="bfloat16" if dims["hidden_size"] > 1024 else "float32")


def train_tokenizer():
    """A byte-level BPE tokenizer trained on dsnb's synthetic SQuAD text (Korean and English)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast


    rows = synthetic_squad(4000, seed=1)
    corpus = [format_prompt(r) for r in rows] + [r["context"] for r in rows]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>"]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bos = tok.token_to_id(specials[0])
    tok.post_processor = processors.TemplateProcessing(single=f"{specials[0]} $A", special_tokens=[(specials[0], bos)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=specials[0], eos_token=specials[1],
                                   pad_token=specials[1], model_max_length=8192)


@functools.lru_cache(maxsize=None)
def tokenizer_path(name: str) -> str:
    """Where cfg.model's tokenizer loads from: for a synthetic shape, dsnb's own tokenizer (built once, shared by
    every shape, so a plan or check never builds weights); else the model itself."""
    if not name.startswith("synthetic:"):
        return resolve_model(name)
    synthetic_shape(name)
    path = os.path.join(cache_dir(), f"synthetic-v{SYNTHETIC_VERSION}", "tokenizer")
    if not os.path.isfile(os.path.join(path, "tokenizer.json")):
        with built_whole(path, "dsnb's tokenizer") as tmp:
            train_tokenizer().save_pretrained(tmp)
    return path


def load_tokenizer(cfg: RunConfig):
    from transformers import AutoTokenizer

    path = tokenizer_path(cfg.model)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except OSError as e:
        raise ConfigError(not_loaded(cfg.model, e)) from None
    except (ValueError, ImportError):  # a local folder holding weights but no tokenizer files
        if os.path.isdir(path) and not any(n.startswith("tokenizer") for n in os.listdir(path)):
            raise ConfigError(f"model folder {cfg.model!r} has no tokenizer (no tokenizer.json or "
                              "tokenizer_config.json in it); copy the base model's tokenizer files into it") from None
        raise
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token  # the tutorial's choice; labels still ignore padding
    return tokenizer


def load_model(cfg: RunConfig, device: str, tokenizer=None):
    """(model, tokenizer): cfg.model in cfg's precision and quantization, with LoRA adapters when lora_r > 0."""
    tokenizer = tokenizer or load_tokenizer(cfg)
    model = load_base(cfg, device)
    # The tokenizer's pad token (the EOS, as the tutorial sets it) in the model's configs, so transformers does not
    # align them itself with a notice at every run.
    model.config.pad_token_id = tokenizer.pad_token_id
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    if cfg.loss_chunk:  # before peft wraps it: peft's forward calls this model's
        from .loss import chunk_the_loss  # deferred: it loads torch at import

        chunk_the_loss(model, cfg.loss_chunk)
    if cfg.lora_r > 0:
        from peft import LoraConfig, get_peft_model

        targets = cfg.lora_targets if cfg.lora_targets == "all-linear" else cfg.lora_targets.split(",")
        try:
            with warnings.catch_warnings():  # peft asks transformers' deprecated is_gradient_checkpointing itself
                warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
                model = get_peft_model(model, LoraConfig(
                    r=cfg.lora_r, lora_alpha=cfg.lora_alpha, target_modules=targets, lora_dropout=cfg.lora_dropout,
                    bias="none", task_type="CAUSAL_LM"))
        except ValueError as e:
            raise ConfigError(f"lora_targets {cfg.lora_targets!r} do not fit this model ({describe(e)})") from None
        check_targets(cfg, model)
    return model, tokenizer


def load_base(cfg: RunConfig, device: str, path: str | None = None):
    """cfg.model (or the model at path) in cfg's precision and quantization, as a run trains it: what an adapter
    saved from that run goes back onto."""
    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    if cfg.quantization == "fp8":
        from . import fp8  # deferred: it loads torch at import, and only an fp8 run needs it

        fp8.check_device(device)
    dtype = getattr(torch, TORCH_DTYPES[cfg.dtype])
    if cfg.lora_r == 0 and cfg.dtype == "fp16":
        dtype = torch.float32  # fp16 AMP cannot unscale fp16 gradients: full fine-tuning keeps fp32 masters
    kwargs: dict = {"dtype": dtype}
    if cfg.attention == "flex":
        kwargs["attn_implementation"] = "flex_attention"
        build_block_masks_in_graph()
        attend_to_grouped_heads()
    if cfg.quantization == "8bit":
        kwargs["quantization_config"] = BitsAndBytesConfig(load_in_8bit=True)
    elif cfg.quantization == "4bit":
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=dtype,
            # ZeRO-3 partitions the packed 4-bit weights as tensors of this dtype; it must match the rest.
            bnb_4bit_quant_storage=dtype)
    # Each weight straight to the GPU as it is read (bitsandbytes quantizes it there): loaded on the CPU first, an
    # fp16 run of bf16 files held both copies in host RAM (13.4 GB for the 3B shape on the H200, over Colab's 12.7).
    # Under ZeRO-3 DeepSpeed places the weights, in their partitions.
    if (device.startswith("cuda") or cfg.quantization != "none") and cfg.zero_stage != 3:
        kwargs["device_map"] = {"": device}
    try:
        model = AutoModelForCausalLM.from_pretrained(path or resolve_model(cfg.model), **kwargs)
    except OSError as e:
        raise ConfigError(f"model {cfg.model!r} could not be loaded ({describe(e)})") from None
    model.config.use_cache = False
    if cfg.quantization == "fp8":  # loaded in bf16, then each frozen Linear's weight to fp8, one layer at a time
        fp8.quantize_linears(model, cfg.fp8_fast_accum, head=cfg.fp8_head)
    if cfg.quantization == "4bit" and device == "cpu":
        unpacked_4bit_on_cpu(model)
    return model


def unpacked_4bit_on_cpu(model) -> None:
    """bitsandbytes 0.50 on a CPU with AVX512-BF16 repacks each 4-bit weight for a fused kernel the first time the
    model runs in eval mode without gradients (answering questions), and that kernel asserts on widths it does not
    tile (synthetic:tiny's: "N must be divisible by block_n"); the repacked weight is also not what training reads.
    Each 4-bit layer keeps bitsandbytes' plain path instead: the same numbers, trained and asked alike."""
    for module in model.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False


def build_block_masks_in_graph() -> None:
    """Flex attention's BlockMask for packed rows, built inside the compiled model's graph.

    transformers builds it with create_block_mask(_compile=True), whose deprecation warning breaks dynamo's graph at
    every mask (one model became 5 graphs on the CPU, torch 2.13). While compiling, a mask without padding or offsets
    (a packed batch: the document mask comes from the restarting position ids) is built in the graph instead;
    anything else takes transformers' own path.
    """
    import torch
    from torch.nn.attention.flex_attention import create_block_mask
    from transformers import masking_utils

    stock = masking_utils.flex_attention_mask

    def block_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0,
                   mask_function=masking_utils.causal_mask_function, attention_mask=None, device="cpu", **kwargs):
        if torch.compiler.is_compiling() and attention_mask is None and not (q_offset or kv_offset):
            return create_block_mask(mask_function, batch_size, None, q_length, kv_length, device=device)
        return stock(batch_size, q_length, kv_length, q_offset, kv_offset, mask_function, attention_mask, device,
                     **kwargs)

    masking_utils.AttentionMaskInterface.register("flex_attention", block_mask)


FLEX_DECODING = 128  # rows shorter than this take flex attention's decoding kernel (inductor's choice)


def grouped_flex(heads: int, kv_heads: int, length: int) -> bool:
    """Whether dsnb's flex attention (attend_to_grouped_heads) hands these heads to flex grouped, as they are, for rows
    of length tokens: whole groups, and no group of a size other than a power of two under FLEX_DECODING tokens."""
    group = heads // kv_heads
    return heads % kv_heads == 0 and not (group & (group - 1) and length < FLEX_DECODING)


def attend_to_grouped_heads() -> None:
    """Flex attention reads each key/value head once for its group of query heads (enable_gqa).

    transformers' flex attention copies every key and value head for each query head of its group when the query heads
    are not a power of two (for tensor parallelism's splits): the 3B shape's 24 heads over 8 key/value heads. That
    writes three times the keys and values, keeps those copies for the backward, and sums their gradients back. Flex
    attention takes grouped heads itself; the same attention, without the copies. Masks other than a BlockMask,
    soft-capping, sinks, biases and dropout take transformers' own path; so do rows under FLEX_DECODING tokens where a
    group's query heads are not a power of two: inductor takes flex's decoding kernel for them, which refused such
    groups in torch releases before it learned to fall back (pytorch issue 151359)."""
    from torch.nn.attention.flex_attention import BlockMask
    from transformers import AttentionInterface
    from transformers.integrations import flex_attention as hf

    stock = hf.flex_attention_forward

    def attend(module, query, key, value, attention_mask, scaling=None, softcap=None, s_aux=None, position_bias=None,
               **kwargs):
        heads, kv_heads = query.shape[1], key.shape[1]
        if (not isinstance(attention_mask, BlockMask) or softcap is not None or s_aux is not None
                or position_bias is not None or kwargs.get("dropout", 0.0) > 0
                or not grouped_flex(heads, kv_heads, query.shape[2])):
            return stock(module, query, key, value, attention_mask, scaling=scaling, softcap=softcap, s_aux=s_aux,
                         position_bias=position_bias, **kwargs)
        out = hf.compile_friendly_flex_attention(query, key, value, block_mask=attention_mask, scale=scaling,
                                                 enable_gqa=heads != kv_heads, training=module.training,
                                                 kernel_options=kwargs.get("kernel_options"))
        return out.transpose(1, 2).contiguous(), None

    AttentionInterface.register("flex_attention", attend)


@contextlib.contextmanager
def sdpa_attention(model):
    """model attending through SDPA inside the block: the held-out answers of a flex-attention run are generated as
    every other variant's are, so their scores and speed compare."""
    implementation = model.config._attn_implementation
    if implementation != "flex_attention":
        yield
        return
    model.set_attn_implementation("sdpa")
    try:
        yield
    finally:
        model.set_attn_implementation(implementation)


def check_targets(cfg: RunConfig, model) -> None:
    """Every module name in lora_targets got an adapter: peft drops a misspelled one silently when another matches."""
    if cfg.lora_targets == "all-linear":
        return
    missing = [t for t in cfg.lora_targets.split(",") if not any(lora_matches(name, [t.strip()])
                                                                  for name in model.targeted_module_names)]
    if missing:
        import torch

        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.get_base_model().named_modules()
                         if isinstance(m, torch.nn.Linear) and "lora" not in n})
        raise ConfigError(f"lora_targets {cfg.lora_targets!r}: {missing[0]} matches no module of {cfg.model}; "
                          f"its linear layers are {', '.join(linear)}")


def count_parameters(model) -> tuple[int, int]:
    """(trainable, total) parameter counts at full size: 4-bit weights unpacked, ZeRO-3 partitions whole, fp8 weights
    without their padding (dsnb/fp8.py)."""
    def size(p) -> int:
        if getattr(p, "quant_state", None):
            return p.quant_state.shape.numel()
        return getattr(p, "ds_numel", None) or getattr(p, "unpadded_numel", None) or p.numel()

    params = list(model.parameters())
    return sum(size(p) for p in params if p.requires_grad), sum(size(p) for p in params)
