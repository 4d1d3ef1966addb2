"""A run's trained adapter (or model) as a product: saved to a folder, merged into its base model, pushed to the hub.

    save_model(result, "my_adapter")                   # the LoRA adapter and tokenizer, loadable with peft
    save_model(result, "my_model", merge=True)         # the base model with the adapter merged in, transformers only
    push_to_hub("my_adapter", "me/bllossom-squad-lora", token)   # only with a repository and a token
    python -m dsnb save --run_id ID -o my_adapter [--merge] [--push_to me/repo --token ...]

A saved folder also holds dsnb_run.json: the run's id and config, naming no place on this machine
(card.portable_config). The token is used for the push and nowhere else: never logged, printed or written.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile

from .card import describe_base, portable_config, write_card
from .config import ConfigError, RunConfig, describe, predated
from .data import CLOSED_BOOK, prompt_parts
from .estimate import PROCESS_BASE_MB, total_params
from .evaluate import probe_logit_norm, stop_tokens
from .model import TORCH_DTYPES, load_base, model_config, resolve_model
from .preflight import check_output_folder, pick_device, staged
from .tracking import RunResult, existing_store, mlflow_client


def save_model(result: RunResult, dest: str, merge: bool = False) -> str:
    """Write the run's trained adapter (or fully fine-tuned model) to dest, a new folder; with merge, the LoRA
    weights merged into the base model, saved whole. Written into a folder of dsnb's own beside dest and renamed when
    whole: a failure (a full disk, say) leaves nothing behind. No file in it names a place on this machine (the
    Trainer's training_args.bin, a pickle of them, is left out). Returns dest."""
    check_output_folder(dest, "the output folder", empty=True)
    client = mlflow_client(existing_store(result.tracking_uri))
    run = client.get_run(result.run_id)
    cfg = run_config(run)
    try:
        os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
        with staged(dest) as part:
            os.mkdir(part)
            with tempfile.TemporaryDirectory() as tmp:
                try:
                    model_dir = client.download_artifacts(result.run_id, "model", tmp)
                except Exception as e:  # a run without save_model, or one that failed before saving
                    fix = ("train with save_model true" if run.info.status == "FINISHED" else "it is still running"
                           if run.info.status == "RUNNING" else
                           f"it ended {run.info.status}, before its model was saved: run it again")
                    raise ConfigError(f"run {result.run_id} has no saved model ({describe(e)}); {fix}") from None
                lora = os.path.isfile(os.path.join(model_dir, "adapter_config.json"))
                probe = run.data.metrics.get("probe_logit_norm")
                merge_facts = merged(cfg, model_dir, part, probe) if merge and lora else {}
                if not merge_facts:
                    shutil.copytree(model_dir, part, dirs_exist_ok=True,
                                    ignore=shutil.ignore_patterns("training_args.bin"))
            kind = "merged" if merge_facts else "adapter" if lora else "full"
            extra = {"merged": f"into the base's {merge_facts['merged_in']} weights; the merged model's probe logits "
                               f"differ from the run's by {merge_facts['probe_relative_difference']:.2e} (relative)"
                     } if merge_facts else None
            write_card(part, cfg, dict(run.data.metrics), result.run_id, kind, extra,
                       run.data.params.get("scoring_mode"))
            with open(os.path.join(part, "dsnb_run.json"), "w") as f:
                json.dump({"run_id": result.run_id, "merged": bool(merge_facts), **merge_facts,
                           **({"local_base": describe_base(cfg)} if local_base(cfg) else {}),
                           "config": portable_config(cfg)}, f, indent=2)
            if os.path.isdir(dest):
                os.rmdir(dest)  # an empty folder the user made for it
    except OSError as e:
        raise ConfigError(f"could not write {dest} ({describe(e)}); free space there or give another folder") from None
    return dest


def run_config(run) -> RunConfig:
    """The config an MLflow run was started with, from its params (a field its dsnb predates as it then was:
    config.predated)."""
    params = run.data.params
    return RunConfig.from_dict({**predated(params), **{k: v for k, v in params.items()
                                                      if k in RunConfig.__dataclass_fields__}})


def merged(cfg: RunConfig, adapter_dir: str, dest: str, probe: float | None) -> dict:
    """The base model with the adapter's LoRA weights added in, saved with its tokenizer; returns what the merge
    changed: the merged model's probe against the run's (probe_logit_norm), relative. A quantized base is merged
    into its unquantized weights, in fp16 (bf16 where the run trained in bf16, fp32 on the CPU): LoRA deltas cannot be
    added exactly to 8-bit or 4-bit weights, so the merged model's logits differ slightly from the run's, and by how
    much is written down. The host RAM the merge needs is checked first."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer


    name = cfg.dtype if cfg.quantization == "none" else "bf16" if cfg.dtype == "bf16" else \
        "fp16" if torch.cuda.is_available() else "fp32"
    check_merge_ram(cfg, name)
    base = AutoModelForCausalLM.from_pretrained(resolve_model(cfg.model), dtype=getattr(torch, TORCH_DTYPES[name]))
    model = PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()
    tokenizer = AutoTokenizer.from_pretrained(adapter_dir)
    model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    after = probe_logit_norm(model, tokenizer)
    return {"merged_in": name, "probe_logit_norm_run": probe, "probe_logit_norm_merged": after,
            "probe_relative_difference": abs(after - probe) / abs(probe) if probe else None}


def check_merge_ram(cfg: RunConfig, dtype: str) -> None:
    """Merging loads the whole base model in host RAM (the 3B shape in fp16: about 6 GB, and its file's pages on
    top while it is read): refused before it starts where it would not fit, as a run is."""
    import psutil


    config = model_config(cfg.model)
    need = (PROCESS_BASE_MB * 2**20 + total_params(config) * (4 if dtype == "fp32" else 2) * 2) / 2**30
    have = cfg.ram_budget_gb or psutil.virtual_memory().available / 2**30
    if need > have:
        where = f"ram_budget_gb is {cfg.ram_budget_gb:g}" if cfg.ram_budget_gb else f"{have:.1f} GB is free"
        raise ConfigError(f"merging the adapter into {cfg.model} in {dtype} needs about {need:.1f} GB of host RAM "
                          f"(the base model, and a copy while it merges) but {where}; keep the adapter (load it onto "
                          "the base with peft), or merge on a machine with more RAM")


def load_saved(folder: str, device: str | None = None, base: str = ""):
    """(model, tokenizer) from a folder save_model wrote: an adapter on its base, loaded as the run trained it (the
    same quantization and precision, so its logits are the run's own), or a whole model (merged or fully trained).
    base: the base model's folder, for an adapter of a local one (a saved folder names it by its name alone)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer


    saved = read_saved(folder)
    cfg = saved_config(saved)
    device = device or pick_device()
    if os.path.isfile(os.path.join(folder, "adapter_config.json")):
        if saved.get("local_base") and not base:  # never a hub model that shares its name
            raise ConfigError(f"{folder} is an adapter of the local model folder {saved['local_base']!r}; give that "
                              f"folder's path as base (load_saved({folder!r}, base=...))")
        model = PeftModel.from_pretrained(load_base(cfg, device, base or None), folder)
    else:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype="auto", device_map={"": device})
    return model, AutoTokenizer.from_pretrained(folder)


def saved_config(saved: dict) -> RunConfig:
    """The config of a folder save_model wrote (read_saved), a field its dsnb predates as it then was
    (config.predated)."""
    return RunConfig.from_dict({**predated(saved["config"]), **saved["config"]})


def read_saved(folder: str) -> dict:
    """The dsnb_run.json of a folder save_model wrote ({} where there is none)."""
    path = os.path.join(folder, "dsnb_run.json")
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        return json.load(f)


def local_base(cfg: RunConfig) -> str:
    """cfg.model where it is a local folder (which a saved folder names by its name alone), else ""."""
    return cfg.model if not cfg.model.startswith("synthetic:") and os.path.isdir(cfg.model) else ""


CLI_TOKEN = "pass --token or set HF_TOKEN"
NOTEBOOK_TOKEN = ("add HF_TOKEN to Colab's Secrets (the key icon on the left, with this notebook's access on), set "
                  "$HF_TOKEN, or pass keep(..., token=...)")


def check_push(repo: str, token: str | None, get_token: str = CLI_TOKEN) -> None:
    """A push needs a valid repository name (owner/name) and a token the hub accepts; get_token says where a token
    comes from in the place the user is (CLI_TOKEN, NOTEBOOK_TOKEN)."""
    from huggingface_hub import HfApi
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if not repo or repo.count("/") != 1 or not all(repo.split("/")):
        raise ConfigError(f"push_to is {repo!r}; give a hub repository as owner/name")
    try:
        validate_repo_id(repo)
    except HFValidationError:
        raise ConfigError(f"push_to is {repo!r}, which the hub does not take as a repository name: use letters, "
                          "digits, '-', '_' and '.' (not at either end), as owner/name") from None
    if not token:
        raise ConfigError(f"pushing to the hub needs a token: {get_token} (it is never logged)")
    try:
        HfApi(token=token).whoami()
    except Exception as e:  # offline, or a token the hub refuses
        raise ConfigError(f"the hub did not accept the token or could not be reached ({describe(e, 120)}); check the "
                          "token and the network") from None


def push_to_hub(folder: str, repo: str, token: str | None, get_token: str = CLI_TOKEN) -> str:
    """Upload a saved folder to a hub repository (created private if new); returns the repository."""
    check_push(repo, token, get_token)
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    try:
        api.create_repo(repo, private=True, exist_ok=True)
        api.upload_folder(folder_path=folder, repo_id=repo, commit_message="dsnb: trained adapter")
    except Exception as e:  # the message of a hub error never holds the token
        raise ConfigError(f"could not push {folder} to {repo} ({describe(e)})") from None
    return repo


def hub_token() -> str:
    """The hub token: Colab's Secrets or Kaggle's (HF_TOKEN, where this notebook was given access to it), else
    $HF_TOKEN; "" where none holds one. Never printed, logged or written."""
    for secret in (colab_secret, kaggle_secret):
        try:
            token = secret("HF_TOKEN")
        except Exception:  # not there, no such secret, or access not granted: the next place, then the environment's
            continue
        if token:
            return token
    return os.environ.get("HF_TOKEN", "")


def colab_secret(name: str) -> str:
    from google.colab import userdata

    return userdata.get(name) or ""


def kaggle_secret(name: str) -> str:
    from kaggle_secrets import UserSecretsClient  # Kaggle's notebooks have it; Add-ons > Secrets holds the value

    return UserSecretsClient().get_secret(name) or ""


def keep(result: RunResult, folder: str = "", merge: bool = False, push_to: str = "", token: str = "") -> str:
    """A notebook's one call to keep a run's model: saved first (merged with merge) into folder, then pushed to the hub
    repository push_to when given (the token from hub_token() unless passed). folder defaults to adapter-<run>,
    merged-<run> or, for a fully fine-tuned run (nothing to merge: merge is ignored, and said to be), model-<run>,
    under <results_folder>/models/ where the run has a results_folder (kept with its store); one that already holds
    this run's model of that kind is kept, not written again. A push that fails says in one line what was saved where
    and why, and the folder is returned all the same: Run all goes on. Returns the folder."""
    cfg = run_config(mlflow_client(existing_store(result.tracking_uri)).get_run(result.run_id))
    merging = merge and cfg.lora_r > 0  # a fully trained model has nothing to merge
    if merge and not merging:
        print(f"run {result.run_id} fine-tuned every weight: there is no adapter to merge, so its model is saved whole")
    name = f"{'merged' if merging else 'adapter' if cfg.lora_r else 'model'}-{result.run_id[:8]}"
    default = os.path.join(cfg.results_folder, "models", name) if cfg.results_folder else name
    legacy = default.replace(f"model-{result.run_id[:8]}", f"adapter-{result.run_id[:8]}")  # an earlier dsnb's name
    if not folder and not cfg.lora_r and os.path.isdir(legacy) and read_saved(legacy).get("run_id") == result.run_id:
        default = legacy
    folder = folder or default
    held = read_saved(folder) if os.path.isdir(folder) else {}
    if held.get("run_id") == result.run_id:
        if bool(held.get("merged")) != merging:
            kinds = {True: "merged model", False: "adapter"}
            raise ConfigError(f"{folder} already holds run {result.run_id}'s {kinds[bool(held.get('merged'))]}, not "
                              f"the {kinds[merging]} asked for (merge={merge}); give another folder, or none for "
                              f"{default}")
        print(f"{folder}: already holds run {result.run_id}'s model; kept")
    else:
        save_model(result, folder, merge)
        print(f"saved run {result.run_id}'s {'merged model' if merging else 'model'} to {folder} (its model card: "
              f"{folder}/README.md)")
    if push_to:
        try:
            print(f"pushed {folder} to the hub: {push_to_hub(folder, push_to, token or hub_token(), NOTEBOOK_TOKEN)} "
                  "(private)")
        except ConfigError as e:
            print(f"dsnb: {folder} is saved but was not pushed to {push_to}: {e}; run this cell again once that is "
                  "fixed")
    return folder


def model_to_ask(cfg: RunConfig, results: list[RunResult], quality: RunResult | None = None) -> RunResult:
    """The run a notebook asks: the comparison's first finished run, trained on cfg.model; but where cfg.model is one
    of dsnb's random synthetic models (offline), the quality check's run, which learned to answer."""
    finished = [r for r in results if r.status == "FINISHED"]
    if cfg.model.startswith("synthetic:") and quality is not None and quality.status == "FINISHED":
        return quality
    if not finished:
        raise ConfigError("no run of the comparison finished, so there is no trained model to ask; see its "
                          "failure above")
    return finished[0]


_ASKED: dict = {}  # folder -> (model, tokenizer, config): loaded once for every question


def ask(source, question: str, passage: str = "", max_new_tokens: int = 64) -> str:
    """Ask a trained model a question and stream its answer as it is generated (greedy, in the training text's own
    prompt): source is a RunResult (its model saved first, as keep saves it) or a folder save_model wrote; passage
    is the text to read, for a model trained on the passage prompt. The model is loaded once and kept."""
    import torch
    from transformers import TextStreamer

    if not isinstance(question, str) or not question.strip():
        raise ConfigError(f"question is {question!r}; ask the model a question, as text")
    if not isinstance(passage, str):
        raise ConfigError(f"passage is {type(passage).__name__}; give the text to read, or \"\" for none")
    if not isinstance(source, (str, RunResult)):
        raise ConfigError(f"ask takes a run (what compare, run_once or quality_check returned) or a saved model's "
                          f"folder, not {type(source).__name__}")
    folder = source if isinstance(source, str) else keep(source)
    if folder not in _ASKED:
        base = "" if isinstance(source, str) else \
            local_base(run_config(mlflow_client(source.tracking_uri).get_run(source.run_id)))
        model, tokenizer = load_saved(folder, base=base)
        _ASKED[folder] = (model.eval(), tokenizer, saved_config(read_saved(folder)))
    model, tokenizer, cfg = _ASKED[folder]
    if cfg.prompt not in CLOSED_BOOK and not passage.strip():
        raise ConfigError("this model was trained to answer from a passage (prompt passage): give the text to read as "
                          "passage=")
    row = {"question": question, "context": passage, "answers": {"text": []}}
    ids = torch.tensor([prompt_parts(cfg, tokenizer, row)[0]], device=next(model.parameters()).device)
    streamer = TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             do_sample=False, eos_token_id=stop_tokens(tokenizer, model),
                             pad_token_id=tokenizer.pad_token_id, streamer=streamer)
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip().split("\n")[0].strip()
