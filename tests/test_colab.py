"""The Colab path, rehearsed as closely as a CPU machine allows, and the hub path where a hub can be reached.

Colab itself cannot be reached from where dsnb is built: the rehearsal gives a fresh Python that already has torch
(as Colab does, and whose build must stay), sets COLAB_RELEASE_TAG (which Colab sets), and executes notebook 01
from its first cell, the setup cell included, with this checkout as DSNB_SOURCE and the offline defaults.
"""
import json
import os
import pathlib
import subprocess
import sys
import time

import mlflow
import pytest

ROOT = pathlib.Path(__file__).parent.parent


def colab_python(tmp_path, fresh: bool) -> str:
    """A new Python environment with torch, a Jupyter kernel and papermill already in it, as Colab has them.

    fresh: an empty environment (torch and the kernel installed into it), so the setup cell installs every
    requirement and builds CPU Adam from nothing. Otherwise it sees the packages of the Python running the tests
    (Colab also comes with many installed) through a .pth file, which works whether that Python is a virtual
    environment or the system's (a venv's --system-site-packages would give the base Python's instead)."""
    import site

    import torch

    venv = tmp_path / "colab-python"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    if fresh:
        subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        f"torch=={torch.__version__.split('+')[0]}", "ipykernel", "papermill"], check=True,
                       timeout=1200)
    else:
        purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        ours = [p for p in site.getsitepackages() + [site.getusersitepackages()] if os.path.isdir(p)]
        pathlib.Path(purelib, "running-python.pth").write_text("\n".join(ours) + "\n")
    subprocess.run([python, "-m", "ipykernel", "install", "--prefix", str(venv), "--name", "colab"], check=True,
                   capture_output=True)
    return python


def notebook_env(venv: pathlib.Path, cache: pathlib.Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(COLAB_RELEASE_TAG="rehearsal", DSNB_SOURCE=str(ROOT), DSNB_OFFLINE="1", PIP_CACHE_DIR=str(cache),
               JUPYTER_PATH=str(venv / "share" / "jupyter"), PATH=f"{venv / 'bin'}:{env['PATH']}")
    return env


NOTEBOOK = str(ROOT / "notebooks" / "01_deepspeed_vs_baseline.ipynb")
PARAMS = ["-p", "repeats", "1", "-p", "eval_samples", "0", "-p", "max_steps", "16", "-p", "checkpoint_steps", "2",
          "-p", "logging_steps", "1"]


def papermill(python, work, env, **kwargs):
    return subprocess.Popen([python, "-m", "papermill", NOTEBOOK, str(work / "01.ipynb"), "-k", "colab", "--cwd",
                             str(work), *PARAMS], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, **kwargs)


def installed(python) -> dict:
    done = subprocess.run([python, "-m", "pip", "list", "--format", "json", "--disable-pip-version-check"],
                          capture_output=True, text=True, check=True)
    return {p["name"].lower(): p["version"] for p in json.loads(done.stdout)}


def rehearse(tmp_path, fresh: bool, kill: bool) -> dict:
    """Notebook 01 executed from its first cell in a Colab-like Python (colab_python), COLAB_RELEASE_TAG set, this
    checkout as DSNB_SOURCE, the offline defaults; with kill, the whole kernel is killed once the second variant has
    trained a few steps (its checkpoints written), and the notebook run again from its first cell, as a user runs all
    after a disconnect. Returns what the setup changed: packages added and changed, MB downloaded, seconds."""
    python = colab_python(tmp_path, fresh)
    venv, work, cache = tmp_path / "colab-python", tmp_path / "content", tmp_path / "pip-cache"
    work.mkdir()
    env = notebook_env(venv, cache)
    before, started = installed(python), time.time()
    client = None
    if kill:
        first = papermill(python, work, env)
        target = wait_for_steps(work, first, "With_DeepSpeed", 3)
        import psutil  # the kernel and the variant's process run in sessions of their own: each is killed

        for process in [psutil.Process(first.pid), *psutil.Process(first.pid).children(recursive=True)]:
            process.kill()
        first.wait()
        assert target is not None, first.stdout.read()[-4000:]
        client = mlflow.MlflowClient(f"sqlite:///{work}/mlflow.db")
        assert client.get_run(target).info.status == "RUNNING"  # its process died with the kernel
    done = papermill(python, work, env)
    out, _ = done.communicate(timeout=2400)
    assert done.returncode == 0, out[-4000:]
    text = outputs(work / "01.ipynb")
    log = (work / "dsnb_setup.log").read_text()  # the setup cell's own record (a rerun in one runtime skips it)
    assert "dsnb setup: ready in" in log and "DeepSpeed's CPU Adam" in log
    where = subprocess.run([python, "-c", "import dsnb, torch; print(dsnb.__file__, torch.__version__)"],
                           capture_output=True, text=True, cwd=work).stdout.split()
    import torch

    assert where[0].startswith(str(venv)) and where[1] == torch.__version__  # installed from the source; torch kept
    client = client or mlflow.MlflowClient(f"sqlite:///{work}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("DeepSpeed_Comparison").experiment_id])
    assert sorted((r.info.run_name, r.info.status) for r in runs) == [("With_DeepSpeed", "FINISHED"),
                                                                      ("Without_DeepSpeed", "FINISHED")]
    if kill:
        assert "Without_DeepSpeed (repeat 1): kept its FINISHED run" in text
        assert f"With_DeepSpeed (repeat 1): resumes its interrupted run {target} from checkpoint-" in text
        resumed = client.get_run(target)
        assert resumed.info.status == "FINISHED" and "resumed_from" in resumed.data.tags
    assert list(work.glob("dsnb_mlflow*.zip")) and list(work.glob("adapter-*/adapter_config.json"))
    assert "No GPU in this runtime" not in text and "Traceback" not in text
    after = installed(python)
    return {"added": sorted(set(after) - set(before)),
            "changed": sorted(n for n in set(before) & set(after) if before[n] != after[n]),
            "downloaded_mb": sum(f.stat().st_size for f in cache.rglob("*") if f.is_file()) / 2**20,
            "seconds": time.time() - started}


def outputs(path) -> str:
    """Everything an executed notebook's cells printed or showed as text."""
    cells = json.loads(pathlib.Path(path).read_text())["cells"]
    return "\n".join("".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", "")) + "".join(
        o.get("traceback", [])) for c in cells for o in c.get("outputs", []))


def wait_for_steps(work, child, name: str, steps: int, timeout: float = 1200) -> str | None:
    """The id of the run `name` once it has logged `steps` steps' loss, while `child` runs."""
    deadline, client = time.time() + timeout, None
    while child.poll() is None and time.time() < deadline:
        if (work / "mlflow.db").exists():
            client = client or mlflow.MlflowClient(f"sqlite:///{work}/mlflow.db")
            exp = client.get_experiment_by_name("DeepSpeed_Comparison")
            run = next((r for r in (client.search_runs([exp.experiment_id]) if exp else [])
                        if r.info.run_name == name), None)
            if run and len(client.get_metric_history(run.info.run_id, "loss")) >= steps:
                return run.info.run_id
        time.sleep(0.2)
    return None


@pytest.mark.integration
def test_colab_rehearsal_survives_a_killed_kernel_and_leaves_colabs_packages_alone(tmp_path):
    """Notebook 01 from its setup cell, killed mid-run, run all again: it resumed and finished; the setup added dsnb
    and changed nothing Colab had."""
    facts = rehearse(tmp_path, fresh=False, kill=True)
    assert set(facts["added"]) <= {"dsnb"} and facts["changed"] == [], facts  # dsnb lands in the venv (checked)
    (tmp_path / "install.json").write_text(json.dumps(facts))
    print(f"setup: {facts}")


@pytest.mark.slow
def test_colab_rehearsal_from_an_empty_environment(tmp_path):
    """The whole install, every requirement resolved and CPU Adam built from nothing (minutes)."""
    facts = rehearse(tmp_path, fresh=True, kill=False)
    assert "torch" not in facts["changed"], facts
    print(f"setup: {facts}")


def test_the_setup_keeps_every_installed_package_and_installs_only_what_dsnb_lacks():
    """The setup cell's installer: what is missing or at a version dsnb cannot use is installed; every other installed
    package (Colab's pyarrow and huggingface-hub, which a missing package's needs could upgrade) is pinned as it is."""
    from importlib import metadata

    import torch

    from dsnb.install import plan, requirements

    install, everything, own = plan(requirements() + ["dsnb-missing-package>=1", "numpy<1"])
    assert install == ["dsnb-missing-package>=1", "numpy<1"]  # numpy 2 is installed, which numpy<1 cannot use
    pinned = dict(p.split("==") for p in everything)
    assert "numpy" not in pinned and pinned["pyarrow"] == metadata.version("pyarrow")
    assert pinned["torch"] == torch.__version__ and f"torch=={torch.__version__}" in own
    assert f"transformers=={metadata.version('transformers')}" in own and len(everything) > len(own)


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
