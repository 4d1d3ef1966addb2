"""The notebooks as users and CI run them: nbval against the committed outputs, papermill with parameters."""
import ast
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tomllib

import mlflow
import nbformat
import papermill
import pytest

from dsnb.config import RunConfig, field_names
from dsnb.data import synthetic_squad
from dsnb.model import resolve_model

ROOT = pathlib.Path(__file__).parent.parent
NOTEBOOKS = ROOT / "notebooks"
NAMES = ["01_deepspeed_vs_baseline.ipynb", "02_zero_stages.ipynb", "03_compare_runs.ipynb"]
FIRST = ["preset", "results_folder"]  # what a Colab user sets, at the top of every parameters cell


def parameters_cell(name):
    cells = [c for c in nbformat.read(NOTEBOOKS / name, 4).cells if "parameters" in c.metadata.get("tags", [])]
    assert len(cells) == 1, f"{name} needs exactly one cell tagged parameters"
    return cells[0].source


@pytest.mark.parametrize("name", NAMES)
def test_the_committed_notebooks_hold_the_cells_build_notebooks_writes(name, monkeypatch):
    """A change to notebooks/build_notebooks.py reaches the committed notebooks (whose outputs nbval checks)."""
    monkeypatch.syspath_prepend(str(NOTEBOOKS))
    import build_notebooks

    built, committed = build_notebooks.notebook(name), nbformat.read(NOTEBOOKS / name, 4)
    assert [(c.cell_type, c.source) for c in committed.cells] == [(c.cell_type, c.source) for c in built.cells]


@pytest.mark.parametrize("name", NAMES)
def test_parameters_are_literal_run_config_fields(name):
    tree = ast.parse(parameters_cell(name))
    defaults = RunConfig().to_dict()
    for node in tree.body:
        assert isinstance(node, ast.AnnAssign) and isinstance(node.value, ast.Constant), ast.unparse(node)
        assert node.target.id in field_names(), node.target.id
        if not name.startswith("03"):  # the defaults are what from_notebook treats as "not set"
            assert node.value.value == defaults[node.target.id], node.target.id
    names = [n.target.id for n in tree.body]
    assert names[:2] == FIRST
    if not name.startswith("03"):
        assert names == FIRST + [n for n in field_names() if n not in FIRST]


def test_the_badges_the_setup_cells_source_and_the_docs_name_the_one_repository():
    """pyproject.toml's [project.urls] names where dsnb is published; every Colab badge opens that repository's
    notebook, every setup cell installs from it by default, and no doc, notebook or script names another home."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        repository = tomllib.load(f)["project"]["urls"]["Repository"]
    owner_name = repository.removeprefix("https://github.com/")
    for name in NAMES:
        nb = nbformat.read(NOTEBOOKS / name, 4)
        badge = f"(https://colab.research.google.com/github/{owner_name}/blob/main/notebooks/{name})"
        assert badge in nb.cells[0].source
        setup = next(c.source for c in nb.cells if c.cell_type == "code" and "COLAB_RELEASE_TAG" in c.source)
        assert f'else "git+{repository}")' in setup
    named = 0
    for path in [ROOT / "README.md", ROOT / "pyproject.toml", *ROOT.glob("docs/*.md"), *NOTEBOOKS.glob("*.ipynb"),
                 *NOTEBOOKS.glob("*.py"), ROOT / "colab_setup.sh"]:
        homes = set(re.findall(r"github\.com/([\w.-]+/dsnb)\b", path.read_text()))
        assert homes <= {owner_name}, (path.name, homes)
        named += bool(homes)
    assert named >= 5  # pyproject, the three notebooks and docs/colab.md at least


@pytest.mark.parametrize("name", NAMES)
def test_help_notebook_lists_every_parameter_with_type_and_comment(name):
    out = subprocess.run(["papermill", "--help-notebook", str(NOTEBOOKS / name)], capture_output=True, text=True)
    assert out.returncode == 0 and "Unknown type" not in out.stdout and "Unable to parse" not in out.stderr
    for node in ast.parse(parameters_cell(name)).body:
        assert f"{node.target.id}: {type(node.value.value).__name__} (default" in out.stdout


@pytest.mark.parametrize("name", NAMES[:2])
@pytest.mark.parametrize("where", ["COLAB_RELEASE_TAG", "KAGGLE_KERNEL_RUN_TYPE"])
def test_the_colab_badge_opens_a_t4_and_a_runtime_without_a_gpu_is_told_before_installing(name, where, tmp_path):
    """The notebooks that train ask Colab for a T4 runtime and Kaggle for its two; opened in one without a GPU (on
    Colab, on Kaggle), the setup cell says in one line how to switch, before it installs anything (a switch wipes the
    install)."""
    nb = nbformat.read(NOTEBOOKS / name, 4)
    assert nb.metadata["accelerator"] == "GPU" and nb.metadata["colab"]["gpuType"] == "T4"
    assert nb.metadata["kaggle"]["accelerator"] == "nvidiaTeslaT4" and nb.metadata["kaggle"]["isInternetEnabled"]
    setup = next(c.source for c in nb.cells if c.cell_type == "code" and "COLAB_RELEASE_TAG" in c.source)
    env = {k: v for k, v in os.environ.items() if k not in ("DSNB_OFFLINE", "COLAB_RELEASE_TAG")}
    done = subprocess.run([sys.executable, "-c", setup], cwd=tmp_path, capture_output=True, text=True,
                          env={**env, where: "rehearsal", "CUDA_VISIBLE_DEVICES": ""}, timeout=300)
    assert done.returncode == 1 and done.stderr.strip().splitlines()[-1] == (
        "No GPU in this runtime: on Colab, Runtime > Change runtime type > T4 GPU; on Kaggle, Settings > Accelerator > "
        "GPU T4 x2 (and Internet on); then run all again"), done.stderr[-2000:]
    assert not list(tmp_path.iterdir())  # no setup log: nothing was installed


def test_on_kaggle_the_hub_token_comes_from_its_secrets_and_the_first_cell_names_its_kept_folder(tmp_path, monkeypatch,
                                                                                                 capsys):
    """Kaggle's notebooks hold secrets in kaggle_secrets (Add-ons > Secrets) and keep only /kaggle/working: a
    stand-in for its module gives the token; the first dsnb cell says where to put results_folder."""
    from dsnb.notebook import from_notebook
    from dsnb.publish import hub_token

    import types

    class UserSecretsClient:
        def get_secret(self, name):
            return {"HF_TOKEN": "hf_kaggle"}[name]

    # in sys.modules for this test alone: an imported stand-in left there would hand its token to later tests
    monkeypatch.setitem(sys.modules, "kaggle_secrets", types.SimpleNamespace(UserSecretsClient=UserSecretsClient))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    assert hub_token() == "hf_kaggle"
    monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Interactive")
    monkeypatch.setenv("DSNB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    from_notebook({"tracking_uri": f"sqlite:///{tmp_path}/mlflow.db"})
    assert 'results_folder = "/kaggle/working/dsnb" keeps the store and checkpoints there' in capsys.readouterr().out


@pytest.mark.parametrize("folder", ["drive/MyDrive/dsnb", "/content/drive/MyDrive/dsnb/", "~/dsnb"])
def test_on_colab_a_results_folder_on_drive_mounts_drive_however_it_is_spelled(folder, tmp_path, monkeypatch):
    """Colab's working directory is /content: "drive/MyDrive/dsnb" is on Drive as much as the absolute path, and Drive
    is mounted before the store is made there (else the store lands in the mount point, which a later mount refuses).
    "~/dsnb" is the home's dsnb folder, not a folder named "~" (a stand-in for google.colab's drive records mounts)."""
    import types

    from conftest import fake_colab
    from dsnb import notebook

    content, home, mounted = tmp_path / "content", tmp_path / "home", []
    content.mkdir()
    monkeypatch.setattr(notebook, "DRIVE", str(content / "drive"))
    fake_colab(monkeypatch, drive=types.SimpleNamespace(mount=mounted.append))
    monkeypatch.setenv("COLAB_RELEASE_TAG", "rehearsal")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(content)
    cfg = notebook.from_notebook({"results_folder": folder.replace("/content", str(content))}, check=False)
    assert mounted == ([] if folder.startswith("~") else [str(content / "drive")])
    if folder.startswith("~"):
        assert cfg.results_folder == str(home / "dsnb")
        assert cfg.tracking_uri == f"sqlite:///{home}/dsnb/mlflow.db" and cfg.output_dir == f"{home}/dsnb/runs"


@pytest.mark.integration
def test_committed_notebooks_pass_nbval(tmp_path):
    for name in NAMES:
        shutil.copy(NOTEBOOKS / name, tmp_path / name)
    env = {**os.environ, "DSNB_OFFLINE": "1"}
    # -n 0: this run finds the project's pytest settings too, and nbval's cells must run in order in one kernel
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "--nbval-lax",
                           "--sanitize-with", str(NOTEBOOKS / "nbval_sanitize.cfg"), *NAMES],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-4000:]
    assert " passed" in done.stdout and "failed" not in done.stdout.splitlines()[-1]


@pytest.mark.integration
def test_notebook_03_opens_results_folders_store_and_leaves_the_quality_check_out(workdir):
    """Notebook 03 with results_folder set reads the store there, every repeat of the pair (their medians and
    spread); the quality check, which logs its toy model's run into the pair's experiment, is in none of its tables
    and is never "the fastest within" the budget."""
    folder = workdir / "results"
    folder.mkdir()
    client = mlflow.MlflowClient(f"sqlite:///{folder}/mlflow.db")
    experiment = client.create_experiment("DeepSpeed_Comparison")
    runs = [(name, "", strategy, speed, repeat) for repeat in range(3) for name, strategy, speed in
            (("Without_DeepSpeed", "baseline", 2.0 + repeat / 10), ("With_DeepSpeed", "zero2", 1.5 - repeat / 10))]
    for name, preset, strategy, speed, repeat in runs + [("quality", "quality", "baseline", 90.0, 0)]:
        run = client.create_run(experiment, run_name=name, tags={"comparison": "c1", "repeat": str(repeat)})
        client.log_param(run.info.run_id, "preset", preset)
        client.log_param(run.info.run_id, "strategy", strategy)
        for key, value in (("samples_per_second", speed), ("peak_gpu_allocated_mb", 900.0),
                           ("peak_gpu_nvml_mb", 1200.0), ("train_runtime_sec", 10 / speed)):
            client.log_metric(run.info.run_id, key, value)
        client.set_terminated(run.info.run_id, "FINISHED")
    papermill.execute_notebook(NOTEBOOKS / NAMES[2], workdir / "out.ipynb", parameters={"results_folder": str(folder)},
                               cwd=workdir, kernel_name="python3", progress_bar=False)
    shown = json.dumps([[o.get("text"), o.get("data", {}).get("text/html")] for c in nbformat.read(
        workdir / "out.ipynb", 4).cells for o in c.get("outputs", [])])  # what the cells printed and their tables
    # every repeat of the pair read (three each): the medians, and whether the difference is beyond their spread
    assert "Fastest within 15 GB: Without_DeepSpeed (2.1 samples/s, median of 3 runs" in shown, shown[-3000:]
    assert "larger than the spread (p = 0.10)" in shown, shown[-3000:]
    assert "With_DeepSpeed" in shown and "quality" not in shown
    assert not (workdir / "mlflow.db").exists()  # the store in results_folder, none made beside the notebook


@pytest.mark.integration
def test_notebook_02_runs_zero3_full_fine_tuning(workdir):
    params = dict(model="synthetic:tiny", dataset="synthetic", num_samples=32, max_length=64, max_steps=3,
                  dtype="fp32", quantization="none", lora_r=0, strategy="zero3", offload_param="cpu",
                  offload_optimizer="cpu", logging_steps=1, run_name="nb-zero3")
    papermill.execute_notebook(NOTEBOOKS / NAMES[1], workdir / "out.ipynb", parameters=params, cwd=workdir,
                               kernel_name="python3", progress_bar=False)
    client = mlflow.MlflowClient(f"sqlite:///{workdir}/mlflow.db")
    [run] = client.search_runs([client.get_experiment_by_name("DeepSpeed_Comparison").experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "nb-zero3"
    logged = run.data.params
    assert (logged["strategy"], logged["offload_param"], logged["lora_r"]) == ("zero3", "cpu", "0")
    ds = json.loads(client.download_artifacts(run.info.run_id, "deepspeed_config.json") and
                    open(client.download_artifacts(run.info.run_id, "deepspeed_config.json")).read())
    assert ds["zero_optimization"]["stage"] == 3 and ds["zero_optimization"]["offload_param"]["device"] == "cpu"
    assert "comparison.png" in {a.path for a in client.list_artifacts(run.info.run_id)}
    # Run all again (a disconnect after it finished, say): the finished variant is kept, not trained again
    again = papermill.execute_notebook(NOTEBOOKS / NAMES[1], workdir / "again.ipynb", parameters=params, cwd=workdir,
                                       kernel_name="python3", progress_bar=False)
    assert len(client.search_runs([run.info.experiment_id])) == 1
    said = "".join(o.get("text", "") for c in again.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert f"nb-zero3: kept its FINISHED run {run.info.run_id}" in said, said[-2000:]


@pytest.mark.integration
def test_notebook_01_with_a_dataset_file(workdir):
    path = workdir / "my_squad.jsonl"
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in synthetic_squad(40, seed=7)))
    params = dict(model="synthetic:tiny", dataset=str(path), num_samples=40, max_length=64, max_steps=2,
                  dtype="bf16", logging_steps=1, experiment="nb01", repeats=1, eval_samples=0)
    papermill.execute_notebook(NOTEBOOKS / NAMES[0], workdir / "out.ipynb", parameters=params, cwd=workdir,
                               kernel_name="python3", progress_bar=False)
    client = mlflow.MlflowClient(f"sqlite:///{workdir}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("nb01").experiment_id])
    assert {r.info.run_name: r.info.status for r in runs} == {"Without_DeepSpeed": "FINISHED",
                                                              "With_DeepSpeed": "FINISHED"}
    assert all(r.data.params["dataset"] == str(path) and r.data.params["dtype"] == "bf16" for r in runs)
    out = (workdir / "out.ipynb").read_text()
    assert "final loss" in out and "agree" in out and "image/png" in out


@pytest.mark.integration
def test_a_bad_parameter_fails_in_the_first_dsnb_cell(workdir):
    with pytest.raises(papermill.PapermillExecutionError) as err:
        papermill.execute_notebook(NOTEBOOKS / NAMES[1], workdir / "out.ipynb", parameters={"strategy": "zero9"},
                                   cwd=workdir, kernel_name="python3", progress_bar=False)
    assert "strategy is 'zero9'; use one of baseline, zero0" in str(err.value)
    assert "dsnb.from_notebook" in err.value.source  # the first dsnb cell, before anything trains
    assert not (workdir / "mlflow.db").exists()


@pytest.mark.integration
def test_sweep_goes_on_after_a_failed_variant(workdir):
    broken = workdir / "broken-model"
    shutil.copytree(resolve_model("synthetic:tiny"), broken)
    (broken / "model.safetensors").write_bytes(b"not weights")
    (workdir / "sweep.yaml").write_text(f"""# python -m dsnb sweep -f sweep.yaml --offline
notebook: {NOTEBOOKS / NAMES[1]}
base: {{max_steps: 2, num_samples: 16}}
variants:
  - {{run_name: broken, model: {broken}}}
  - {{run_name: bad_data, dataset: bad.json}}
  - {{run_name: zero1, strategy: zero1}}
""")
    (workdir / "bad.json").write_text('{"data": [')
    done = subprocess.run([sys.executable, "-m", "dsnb", "sweep", "-f", "sweep.yaml", "--offline"], cwd=workdir,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 1, done.stderr[-3000:]
    client = mlflow.MlflowClient(f"sqlite:///{workdir}/mlflow.db")
    runs = {r.info.run_name: r for r in client.search_runs(
        [client.get_experiment_by_name("DeepSpeed_Comparison").experiment_id])}
    assert runs["broken"].info.status == "FAILED" and runs["zero1"].info.status == "FINISHED"
    # the cell's own error, where papermill's text opens with a rule of dashes: what to change, not "-----"
    assert runs["broken"].data.tags["error"].startswith("SafetensorError")  # recorded by the run itself
    said = runs["bad_data"].data.tags["notebook_error"]  # refused in a cell, before a run of its own began
    assert runs["bad_data"].info.status == "FAILED" and said.startswith("ConfigError: dataset file bad.json"), said
    assert f"bad_data: failed ({said[:200]}" in done.stdout, done.stdout[-2000:]
    # failed in its own training process, its cell going on: the sweep says why all the same
    assert "broken: failed (SafetensorError" in done.stdout, done.stdout[-2000:]
    for run in runs.values():
        artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert any(a.endswith(".ipynb") for a in artifacts), artifacts
    assert len(list((workdir / "sweeps" / "sweep").glob("*.ipynb"))) == 3

    again = subprocess.run([sys.executable, "-m", "dsnb", "sweep", "-f", "sweep.yaml", "--offline"], cwd=workdir,
                           capture_output=True, text=True, timeout=900)
    assert "zero1: already FINISHED" in again.stdout, again.stdout[-2000:]
    names = [r.info.run_name for r in client.search_runs(
        [client.get_experiment_by_name("DeepSpeed_Comparison").experiment_id])]
    assert sorted(names) == ["bad_data", "bad_data", "broken", "broken", "zero1"]  # the failed ran again, not zero1


@pytest.mark.integration
def test_a_sweep_stopped_with_ctrl_c_records_its_variant_killed_and_says_so(workdir):
    """Ctrl-C to `dsnb sweep` while a variant trains: the run ends KILLED with its notebook as far as it ran (it was
    left RUNNING, and the sweep said no run was recorded)."""
    import signal

    from conftest import LONG, wait_for_training

    (workdir / "sweep.yaml").write_text(f"""notebook: {NOTEBOOKS / NAMES[1]}
base: {json.dumps({k: v for k, v in LONG.items() if k != "repeats"})}
variants:
  - {{run_name: long}}
""")
    sweep = subprocess.Popen([sys.executable, "-m", "dsnb", "sweep", "-f", "sweep.yaml", "--offline"], cwd=workdir,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run = wait_for_training(f"sqlite:///{workdir}/mlflow.db", "long", timeout=400)
    sweep.send_signal(signal.SIGINT)
    _, err = sweep.communicate(timeout=300)
    assert sweep.returncode == 130, err[-2000:]
    assert f"its run {run.info.run_id} recorded KILLED" in err, err[-2000:]
    client = mlflow.MlflowClient(f"sqlite:///{workdir}/mlflow.db")
    assert client.get_run(run.info.run_id).info.status == "KILLED"
    assert any(a.path.endswith(".ipynb") for a in client.list_artifacts(run.info.run_id))


@pytest.mark.integration
def test_a_sweep_killed_mid_variant_resumes_it_from_its_checkpoint_when_started_again(workdir):
    """The whole sweep killed while a variant trains (its kernel and training process too: a runtime that ends), then
    started again: the variant resumes from its last checkpoint into its own run, which reads as one never stopped
    (it trained from step 0 again, a second run beside the KILLED one); the killed pass's notebook is kept beside."""
    import signal
    import time

    from conftest import kill_tree
    from dsnb.report import loss_curve
    from dsnb.tracking import mlflow_client

    (workdir / "sweep.yaml").write_text(f"""notebook: {NOTEBOOKS / NAMES[1]}
base: {{max_steps: 24, checkpoint_steps: 2, logging_steps: 1, save_model: false, eval_samples: 0}}
variants:
  - {{run_name: long}}
""")
    command = [sys.executable, "-m", "dsnb", "sweep", "-f", "sweep.yaml", "--offline"]
    sweep = subprocess.Popen(command, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client, run, deadline = None, None, time.time() + 600
    while sweep.poll() is None and time.time() < deadline:
        if (workdir / "mlflow.db").exists():
            client = client or mlflow_client(f"sqlite:///{workdir}/mlflow.db")
            runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
            run = next((r for r in runs if r.info.run_name == "long"), None)
            if run and any(m.step >= 3 for m in client.get_metric_history(run.info.run_id, "loss")):
                kill_tree(sweep.pid)  # papermill's kernel and the training process run in sessions of their own
                break
        time.sleep(0.2)
    sweep.wait()
    assert run is not None and sweep.returncode == -signal.SIGKILL
    assert client.get_run(run.info.run_id).info.status == "RUNNING"  # nothing of it was left to record the kill

    again = subprocess.run(command, cwd=workdir, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stdout[-3000:]
    assert f"long: resumes its run {run.info.run_id} (killed) from checkpoint-" in again.stdout, again.stdout[-3000:]
    client = mlflow.MlflowClient(f"sqlite:///{workdir}/mlflow.db")
    [resumed] = client.search_runs([run.info.experiment_id])
    assert resumed.info.run_id == run.info.run_id and resumed.info.status == "FINISHED"
    assert not {"failure", "error", "notebook_error"} & set(resumed.data.tags), resumed.data.tags
    assert resumed.data.tags["resumed"].startswith("from checkpoint-")
    assert loss_curve(client, run.info.run_id)[0] == list(range(1, 25))  # every step once
    notebooks = sorted(a.path for a in client.list_artifacts(run.info.run_id) if a.path.endswith(".ipynb"))
    assert notebooks == [f"long-{run.info.run_id[:8]}-resumed.ipynb", f"long-{run.info.run_id[:8]}.ipynb"]


def test_a_sweep_run_again_keeps_a_variant_that_ran_out_of_gpu_memory(workdir, capsys):
    """Out of GPU memory is an answer (the variant does not fit), kept as a comparison keeps it: a sweep started again
    does not train it again (it did, every time, where only FINISHED runs were kept)."""
    from dsnb import tracking
    from dsnb.sweep import load_sweep, run_sweep

    (workdir / "sweep.yaml").write_text(f"""notebook: {NOTEBOOKS / NAMES[1]}
base: {{max_steps: 2, num_samples: 16}}
variants:
  - {{run_name: too_big}}
""")
    _, [cfg], _ = load_sweep("sweep.yaml", True, None)
    run_id = tracking.create_run(cfg, tags={"sweep": "sweep", "failure": "oom"})
    tracking.finish(run_id, cfg.tracking_uri, "FAILED")
    [result] = run_sweep("sweep.yaml", offline=True)
    assert result.run_id == run_id
    assert f"too_big: already FAILED (out of memory) in run {run_id}; skipped" in capsys.readouterr().out


def test_a_sweep_goes_on_past_a_variant_still_running_elsewhere(workdir, capsys):
    """A variant whose run another sweep on the same store is training now is said and passed over: the sweep goes on
    (the variant was neither run beside it nor did its refusal stop the variants after it)."""
    from dsnb import tracking
    from dsnb.sweep import load_sweep, run_sweep

    (workdir / "sweep.yaml").write_text(f"""notebook: {NOTEBOOKS / NAMES[1]}
base: {{max_steps: 2, num_samples: 16}}
variants:
  - {{run_name: busy}}
""")
    _, [cfg], _ = load_sweep("sweep.yaml", True, None)
    run_id = tracking.create_run(cfg, tags={"sweep": "sweep"})  # RUNNING, owned by a process alive now (this one)
    [result] = run_sweep("sweep.yaml", offline=True)
    assert (result.run_id, result.status) == (run_id, "RUNNING")  # shown as it is; the sweep exits 1
    assert f"busy: not run: run busy ({run_id}) is still running" in capsys.readouterr().out
    assert tracking.mlflow_client(cfg.tracking_uri).get_run(run_id).info.status == "RUNNING"


@pytest.mark.integration
def test_a_sweep_whose_notebook_cannot_run_records_each_variant_failed_and_goes_on(workdir):
    """A notebook papermill cannot even read (not a notebook) writes no executed notebook: each variant's run is
    FAILED with that error, none left RUNNING, and the sweep goes on to the next (a run_name may hold a hub id's
    "/": its notebook's file name has "_" in its place)."""
    (workdir / "not.ipynb").write_text("this is not a notebook")
    (workdir / "sweep.yaml").write_text("notebook: not.ipynb\nbase: {max_steps: 2}\nvariants:\n  - {run_name: first}\n"
                                        "  - {run_name: org/second, strategy: zero1}\n")
    done = subprocess.run([sys.executable, "-m", "dsnb", "sweep", "-f", "sweep.yaml", "--offline"], cwd=workdir,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    client = mlflow.MlflowClient(f"sqlite:///{workdir}/mlflow.db")
    runs = {r.info.run_name: r for r in client.search_runs(
        [client.get_experiment_by_name("DeepSpeed_Comparison").experiment_id])}
    assert {n: r.info.status for n, r in runs.items()} == {"first": "FAILED", "org/second": "FAILED"}
    assert all(r.data.tags["notebook_error"] for r in runs.values())
    assert "first: failed (" in done.stdout and "not.ipynb did not run at all" in done.stdout, done.stdout[-2000:]
    assert "Executed notebooks: none; " in done.stdout  # failed, not skipped as finished before
