"""A run's adapter as a product: saved, reloaded with the run's own logits, merged, never pushed without a token."""
import json
import subprocess
import sys

import pytest

from dsnb.config import OFFLINE, ConfigError, RunConfig
from dsnb.evaluate import probe_logit_norm
from dsnb.launch import run_variant
from dsnb.publish import check_push, load_saved, save_model

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A LoRA run of synthetic:tiny trained hard enough that its adapter is far from zero."""
    folder = tmp_path_factory.mktemp("publish")
    cfg = RunConfig(**dict(OFFLINE, quantization="none", max_steps=6, learning_rate=1e-2, eval_samples=0),
                    tracking_uri=f"sqlite:///{folder}/mlflow.db", run_name="to-save")
    result = run_variant(cfg, progress=False)
    assert result.status == "FINISHED", result
    return folder, result


def test_a_saved_adapter_reloads_with_the_runs_logits_and_merges(trained):
    folder, result = trained
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
    with pytest.raises(ConfigError, match="already exists"):
        save_model(result, str(folder / "adapter"))  # never over an earlier save


def test_push_needs_a_repository_and_a_token_and_nothing_is_written_without_them(trained, monkeypatch):
    folder, result = trained
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
