"""A run's adapter as a product: saved with a real model card, reloaded with the run's own logits (on its 8-bit or
4-bit base too), merged with the merge's own difference written down, never pushed without a token."""
import json
import os
import pathlib
import subprocess
import sys

import mlflow
import pytest

from dsnb.config import OFFLINE, ConfigError, RunConfig
from dsnb.data import synthetic_squad
from dsnb.evaluate import probe_logit_norm
from dsnb.publish import check_push, load_saved, save_model
from dsnb.tracking import RunResult

from conftest import train_here

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """LoRA runs of synthetic:tiny on an unquantized, an 8-bit and a 4-bit base, trained hard enough that the adapters
    are far from zero; and one ("kept") as a notebook on Drive makes it: its store and runs in a results_folder, its
    data a local file."""
    folder = tmp_path_factory.mktemp("publish")
    uri = f"sqlite:///{folder}/mlflow.db"
    fields = dict(OFFLINE, quantization="none", max_steps=6, learning_rate=1e-2, eval_samples=8)
    cfg = RunConfig(**fields, tracking_uri=uri, output_dir=str(folder / "runs"), run_name="to-save")
    data = folder / "data" / "my_squad.jsonl"
    data.parent.mkdir()
    data.write_text("\n".join(json.dumps(row, ensure_ascii=False) for row in synthetic_squad(80)))
    kept = RunConfig.layered(fields, {"results_folder": str(folder / "results"), "dataset": str(data),
                                      "run_name": "kept"})
    full = kept.replace(lora_r=0, learning_rate=1e-3, run_name="full")
    cfgs = [cfg, cfg.replace(quantization="8bit", run_name="eight"), cfg.replace(quantization="4bit", run_name="four"),
            kept, full]
    runs = train_here(cfgs, folder)
    results = {c.quantization: RunResult.read(uri, runs[c.name].run_id) for c in cfgs[:3]}
    return folder, {**results, **{c.name: RunResult.read(kept.tracking_uri, runs[c.name].run_id) for c in cfgs[3:]}}


def test_a_saved_adapter_reloads_with_the_runs_logits_and_merges(trained):
    folder, runs = trained
    result = runs["none"]
    logged = result.metrics["probe_logit_norm"]  # measured in the training process, on the trained model
    adapter = save_model(result, str(folder / "adapter"))
    assert json.load(open(folder / "adapter" / "dsnb_run.json"))["run_id"] == result.run_id
    model, tokenizer = load_saved(adapter)
    assert type(model).__name__.startswith("Peft")
    assert probe_logit_norm(model, tokenizer) == pytest.approx(logged, rel=1e-5)
    base = model.get_base_model()
    with model.disable_adapter():  # the adapter is not a no-op: without it the logits move
        assert abs(probe_logit_norm(base, tokenizer) - logged) > 1e-3
    merged_model, _ = load_saved(save_model(result, str(folder / "merged"), merge=True))
    assert not (folder / "merged" / "adapter_config.json").exists()  # a plain transformers model
    assert probe_logit_norm(merged_model, tokenizer) == pytest.approx(logged, rel=1e-4)
    facts = json.load(open(folder / "merged" / "dsnb_run.json"))
    assert facts["merged"] and facts["probe_relative_difference"] < 1e-4
    with pytest.raises(ConfigError, match="already exists"):
        save_model(result, str(folder / "adapter"))  # never over an earlier save


@pytest.mark.parametrize("quantization", ["8bit", "4bit"])
def test_an_adapter_trained_on_a_quantized_base_reloads_onto_that_base(trained, quantization):
    """The adapter goes back onto the base quantized as it was trained, so its logits are the run's own; merged into
    the unquantized weights, the merged model's difference from the run's logits is measured and written down."""
    folder, runs = trained
    result = runs[quantization]
    logged = result.metrics["probe_logit_norm"]
    model, tokenizer = load_saved(save_model(result, str(folder / f"adapter-{quantization}")))
    assert probe_logit_norm(model, tokenizer) == pytest.approx(logged, rel=1e-5)
    save_model(result, str(folder / f"merged-{quantization}"), merge=True)
    facts = json.load(open(folder / f"merged-{quantization}" / "dsnb_run.json"))
    merged_model, _ = load_saved(str(folder / f"merged-{quantization}"))
    assert facts["probe_logit_norm_merged"] == pytest.approx(probe_logit_norm(merged_model, tokenizer), rel=1e-5)
    assert facts["probe_logit_norm_run"] == logged and facts["merged_in"] == "fp32"
    assert abs(facts["probe_relative_difference"] - abs(facts["probe_logit_norm_merged"] - logged) / logged) < 1e-9
    card = (folder / f"merged-{quantization}" / "README.md").read_text()
    assert f"{facts['probe_relative_difference']:.2e} (relative)" in card


def test_every_saved_folder_carries_a_model_card_and_no_local_path(trained):
    folder, runs = trained
    result = runs["8bit"]
    for name, merge in (("card-adapter", False), ("card-merged", True)):
        saved = folder / name
        save_model(result, str(saved), merge=merge)
        card = (saved / "README.md").read_text()
        assert "More Information Needed" not in card and str(folder) not in card and "/.cache/" not in card
        assert "synthetic:tiny" in card and "dsnb's synthetic SQuAD-format set" in card
        assert "| held-out questions (reading the passage) | exact match" in card and "samples/s" in card
        assert "LoRA r 16" in card and "base weights 8bit" in card and f"`{result.run_id}`" in card
        assert "| memory | peak host " in card and "GPU 0.0 GB" not in card  # trained on the CPU: no GPU figure
        for path in saved.rglob("*.json"):
            text = path.read_text()
            assert "/.cache/" not in text and str(folder) + "/mlartifacts" not in text, path
    adapter_config = json.load(open(folder / "card-adapter" / "adapter_config.json"))
    assert adapter_config["base_model_name_or_path"] == "synthetic:tiny"


def test_a_merge_that_would_not_fit_the_host_is_refused_before_it_starts(trained):
    folder, runs = trained
    cfg = RunConfig(**dict(OFFLINE, model="synthetic:llama-3.1-8b", quantization="8bit", ram_budget_gb=4))
    from dsnb.publish import check_merge_ram

    with pytest.raises(ConfigError, match="merging the adapter into synthetic:llama-3.1-8b in fp16 needs about"):
        check_merge_ram(cfg, "fp16")


def test_push_needs_a_repository_and_a_token_and_nothing_is_written_without_them(trained, monkeypatch):
    folder, runs = trained
    result = runs["none"]
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with pytest.raises(ConfigError, match="needs a token"):
        check_push("me/model", "")
    with pytest.raises(ConfigError, match="owner/name"):
        check_push("model", "hf_x")
    done = subprocess.run([sys.executable, "-m", "dsnb", "save", "--run_id", result.run_id, "-o", "pushed",
                           "--push_to", "me/model", "--tracking_uri", result.tracking_uri], cwd=folder,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "needs a token" in done.stderr and "Traceback" not in done.stderr
    assert not (folder / "pushed").exists()


def test_no_file_in_a_saved_folder_names_a_place_on_this_machine(trained):
    """dsnb_run.json names the data file and the base by their names alone and leaves out where the run was kept
    (output_dir, results_folder, tracking_uri); the Trainer's training_args.bin (a pickle of those paths) is left
    out; what is left still reloads with the run's own logits."""
    folder, runs = trained
    result = runs["kept"]
    for name, merge in (("portable", False), ("portable-merged", True)):
        saved = folder / name
        save_model(result, str(saved), merge=merge)
        assert not (saved / "training_args.bin").exists()
        for path in saved.rglob("*"):
            data = path.read_bytes()
            for place in (str(folder), os.path.expanduser("~"), str(pathlib.Path(folder).resolve())):
                assert place.encode() not in data, (path, place)
    config = json.load(open(folder / "portable" / "dsnb_run.json"))["config"]
    assert config["dataset"] == "my_squad.jsonl" and config["model"] == "synthetic:tiny"
    assert not {"output_dir", "results_folder", "tracking_uri"} & set(config)
    model, tokenizer = load_saved(str(folder / "portable"))
    assert probe_logit_norm(model, tokenizer) == pytest.approx(result.metrics["probe_logit_norm"], rel=1e-5)


def test_save_stages_under_a_name_of_its_own_and_leaves_a_users_partial_folder(trained):
    folder, runs = trained
    (folder / "out.partial").mkdir()
    (folder / "out.partial" / "notes.txt").write_text("mine")
    done = subprocess.run([sys.executable, "-m", "dsnb", "save", "--run_id", runs["none"].run_id, "-o", "out",
                           "--tracking_uri", runs["none"].tracking_uri], cwd=folder, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (folder / "out.partial" / "notes.txt").read_text() == "mine" and (folder / "out" / "dsnb_run.json").exists()
    assert not [p.name for p in folder.iterdir() if ".dsnb-" in p.name]  # nothing of dsnb's staging left


def test_keep_saves_with_the_results_merges_only_what_it_says_and_a_failed_push_loses_nothing(trained, capsys,
                                                                                             monkeypatch):
    """keep saves under <results_folder>/models/ where the run has one; a folder holding the run's adapter is not
    passed off as merged; with no network the model is saved, the push's failure said in one line that speaks to a
    notebook (Colab's Secrets, not --token), and the folder returned: Run all goes on to the download cell."""
    from dsnb.publish import keep

    folder, runs = trained
    result = runs["kept"]
    adapter = keep(result)
    assert adapter == str(folder / "results" / "models" / f"adapter-{result.run_id[:8]}")
    assert json.load(open(os.path.join(adapter, "dsnb_run.json")))["merged"] is False
    assert keep(result) == adapter and "already holds run" in capsys.readouterr().out
    with pytest.raises(ConfigError, match=f"already holds run {result.run_id}'s adapter, not the merged model asked "
                                          "for"):
        keep(result, folder=adapter, merge=True)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    for token, why in (("", "needs a token: add HF_TOKEN to Colab's Secrets"),
                       ("hf_x", "the hub did not accept the token or could not be reached")):
        capsys.readouterr()
        merged_folder = keep(result, merge=True, push_to="me/model", token=token)
        out = capsys.readouterr().out.strip().splitlines()
        assert merged_folder == str(folder / "results" / "models" / f"merged-{result.run_id[:8]}")
        assert json.load(open(os.path.join(merged_folder, "dsnb_run.json")))["merged"] is True
        assert out[-1].startswith(f"dsnb: {merged_folder} is saved but was not pushed to me/model: ") and why in out[-1]
        assert "--token" not in out[-1]
    # a fully fine-tuned run has no adapter: its folder says "model", and merge (nothing to merge) saves no second copy
    full = runs["full"]
    whole = keep(full)
    assert whole == str(folder / "results" / "models" / f"model-{full.run_id[:8]}")
    assert keep(full, merge=True) == whole and "no adapter to merge" in capsys.readouterr().out
    assert "fully fine-tuned model" in open(os.path.join(whole, "README.md")).read()
    assert sorted(p.name for p in (folder / "results" / "models").iterdir() if full.run_id[:8] in p.name) == [
        f"model-{full.run_id[:8]}"]


def test_ask_and_keep_say_what_to_change(tmp_path):
    """ask with no question, no passage text or no run says so before any model loads (an empty question was answered);
    keep on a run that failed before its model was saved says to run it again (it said to set save_model true)."""
    from dsnb.publish import ask, keep
    from dsnb.tracking import create_run

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    run_id = create_run(RunConfig(**dict(OFFLINE, tracking_uri=uri, output_dir=str(tmp_path / "runs"))))
    mlflow.MlflowClient(uri).set_terminated(run_id, "FAILED")
    failed = RunResult.read(uri, run_id)
    for call, message in ((lambda: ask(failed, ""), "question is ''; ask the model a question"),
                          (lambda: ask(failed, None), "question is None"),
                          (lambda: ask(failed, "수도는?", None), "passage is NoneType"),
                          (lambda: ask(None, "수도는?", "서울"), "ask takes a run"),
                          (lambda: keep(failed, str(tmp_path / "kept")),
                           f"run {run_id} has no saved model .*it ended FAILED, before its model was saved: run it")):
        with pytest.raises(ConfigError, match=message):
            call()
