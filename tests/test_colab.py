"""The Colab path, rehearsed as closely as a CPU machine allows, and the hub path where a hub can be reached.

Colab itself cannot be reached from where dsnb is built: the rehearsal gives a fresh Python that already has torch
(as Colab does, and whose build must stay), sets COLAB_RELEASE_TAG (which Colab sets), and executes notebook 01
from its first cell, the setup cell included, with this checkout as DSNB_SOURCE and the offline defaults.
"""
import os
import pathlib
import subprocess
import sys

import mlflow
import pytest

ROOT = pathlib.Path(__file__).parent.parent


def rehearse(tmp_path, fresh: bool) -> None:
    """A new Python environment with torch (and a Jupyter kernel) already in it, as Colab has them; notebook 01
    executed from its first cell with COLAB_RELEASE_TAG set, this checkout as DSNB_SOURCE, the offline defaults.

    fresh: an empty environment, so the setup cell installs every requirement and builds CPU Adam from nothing;
    otherwise it sees this machine's packages (Colab also comes with many installed) and the rehearsal checks the
    setup cell's own work: dsnb installed from the source, torch kept, CPU Adam reported, the log and timing.
    """
    import torch

    venv = tmp_path / "colab-python"
    subprocess.run([sys.executable, "-m", "venv", *([] if fresh else ["--system-site-packages"]), str(venv)],
                   check=True)
    python = str(venv / "bin" / "python")
    if fresh:  # what Colab has before the notebook runs: its own torch and a Jupyter kernel (papermill drives it)
        subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        f"torch=={torch.__version__.split('+')[0]}", "ipykernel", "papermill"], check=True,
                       timeout=1200)
    subprocess.run([python, "-m", "ipykernel", "install", "--prefix", str(venv), "--name", "colab"], check=True,
                   capture_output=True)
    work = tmp_path / "content"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(COLAB_RELEASE_TAG="rehearsal", DSNB_SOURCE=str(ROOT), DSNB_OFFLINE="1",
               JUPYTER_PATH=str(venv / "share" / "jupyter"), PATH=f"{venv / 'bin'}:{env['PATH']}")
    out = work / "01.ipynb"
    notebook = str(ROOT / "notebooks" / "01_deepspeed_vs_baseline.ipynb")
    done = subprocess.run([python, "-m", "papermill", notebook, str(out), "-k", "colab", "--cwd", str(work),
                           "-p", "repeats", "1", "-p", "eval_samples", "0"],
                          env=env, capture_output=True, text=True, timeout=2400)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    text = out.read_text()
    assert "dsnb set up from" in text and "DeepSpeed's CPU Adam" in text  # the setup cell's log and timing
    where = subprocess.run([python, "-c", "import dsnb, torch; print(dsnb.__file__, torch.__version__)"],
                           capture_output=True, text=True, cwd=work).stdout.split()
    assert where[0].startswith(str(venv)) and where[1] == torch.__version__  # installed from the source; torch kept
    client = mlflow.MlflowClient(f"sqlite:///{work}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("DeepSpeed_Comparison").experiment_id])
    assert sorted((r.info.run_name, r.info.status) for r in runs) == [("With_DeepSpeed", "FINISHED"),
                                                                      ("Without_DeepSpeed", "FINISHED")]
    assert (work / "dsnb_mlflow.zip").is_file() and list(work.glob("adapter-*/adapter_config.json"))


@pytest.mark.integration
def test_colab_rehearsal_installs_from_the_notebook_and_runs_both_variants(tmp_path):
    rehearse(tmp_path, fresh=False)


@pytest.mark.slow
def test_colab_rehearsal_from_an_empty_environment(tmp_path):
    """The whole install, every requirement resolved and CPU Adam built from nothing (minutes)."""
    rehearse(tmp_path, fresh=True)


def test_every_hub_id_is_namespaced():
    """datasets 5 refuses a bare "squad" (it wants rajpurkar/squad): every hub id dsnb uses names its owner."""
    from dsnb.config import RunConfig
    from dsnb.data import HUB_DATASETS

    for hub_id in (*HUB_DATASETS.values(), RunConfig().model):
        owner, _, name = hub_id.partition("/")
        assert owner and name and "/" not in name, hub_id


def hub_reachable() -> bool:
    import urllib.request

    from huggingface_hub import constants

    try:
        urllib.request.urlopen(f"{constants.ENDPOINT}/api/models?limit=1", timeout=5)
        return True
    except OSError:
        return False


@pytest.mark.network
def test_the_real_model_and_squad_load_from_the_hub(monkeypatch):
    """The tutorial's hub path: Bllossom's config and tokenizer, and SQuAD's first 8 rows, read and validated."""
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    if not hub_reachable():
        pytest.skip("the model hub cannot be reached from here (run where it can: python -m pytest -m network)")
    from dsnb.config import RunConfig
    from dsnb.data import load_records
    from dsnb.model import load_tokenizer, model_config

    cfg = RunConfig(num_samples=8)
    assert model_config(cfg.model).hidden_size == 3072
    assert load_tokenizer(cfg).chat_template
    rows = load_records(cfg)
    assert len(rows) == 8 and all(r["answers"]["text"] for r in rows)
    assert len(load_records(cfg, "eval", 4)) == 4
