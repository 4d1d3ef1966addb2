"""The Colab path, rehearsed as closely as a CPU machine allows, and the hub path where a hub can be reached.

Colab itself cannot be reached from where dsnb is built: the rehearsal gives a fresh Python that already has torch
(as Colab does, and whose build must stay) and Colab's versions of the packages dsnb shares with it (COLAB_PACKAGES,
Colab's own list), sets COLAB_RELEASE_TAG (which Colab sets), and executes notebook 01 from its first cell, the setup
cell included, with this checkout as DSNB_SOURCE and the offline defaults.
"""
import contextlib
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

import mlflow
import pytest

ROOT = pathlib.Path(__file__).parent.parent
COLAB_PACKAGES = ROOT / "tests" / "colab_packages.txt"  # Colab's `pip freeze` (its header says which image)
# The packages dsnb needs that Colab has, with what they need at Colab's versions: installed at those versions into the
# rehearsal's Python (small wheels; Colab's CUDA torch 2.11, a multi-GB wheel, and its Python 3.12 are not installed:
# the CPU torch and the Python here stand in).
COLAB_STACK = ("transformers", "peft", "accelerate", "datasets", "tokenizers", "huggingface-hub", "safetensors",
               "pyarrow", "fsspec", "dill", "multiprocess", "xxhash", "hf-xet", "typer")


def colab_versions() -> dict[str, str]:
    """Colab's packages, name -> version, from COLAB_PACKAGES."""
    lines = COLAB_PACKAGES.read_text().splitlines()
    return dict(line.split("==") for line in lines if "==" in line and not line.startswith("#"))


def dsnb_requirements() -> list[str]:
    """This checkout's requirements.txt, which dsnb's package metadata lists."""
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def colab_python(tmp_path, fresh: bool) -> str:
    """A new Python environment with torch, a Jupyter kernel and papermill already in it, as Colab has them.

    fresh: an empty environment (torch and the kernel installed into it), so the setup cell installs every
    requirement and builds CPU Adam from nothing. Otherwise it sees the packages of the Python running the tests
    (Colab also comes with many installed) through a .pth file, which works whether that Python is a virtual
    environment or the system's (a venv's --system-site-packages would give the base Python's instead), with
    COLAB_STACK at Colab's versions installed in front of them."""
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
        colab = {name.lower().replace("_", "-"): version for name, version in colab_versions().items()}
        subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        *[f"{name}=={colab[name]}" for name in COLAB_STACK]], check=True, timeout=1200,
                       env={**os.environ, "PIP_ROOT_USER_ACTION": "ignore"})
    subprocess.run([python, "-m", "ipykernel", "install", "--prefix", str(venv), "--name", "colab"], check=True,
                   capture_output=True)
    return python


def notebook_env(venv: pathlib.Path, cache: pathlib.Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(COLAB_RELEASE_TAG="rehearsal", DSNB_SOURCE=str(ROOT), DSNB_OFFLINE="1", PIP_CACHE_DIR=str(cache),
               JUPYTER_PATH=str(venv / "share" / "jupyter"), PATH=f"{venv / 'bin'}:{env['PATH']}")
    return env


NOTEBOOK = str(ROOT / "notebooks" / "01_deepspeed_vs_baseline.ipynb")
PARAMS = ["-p", "repeats", "1", "-p", "eval_samples", "2", "-p", "max_steps", "16", "-p", "checkpoint_steps", "2",
          "-p", "logging_steps", "1"]


def papermill(python, work, env, drive=None, **kwargs):
    place = ["-p", "results_folder", str(drive)] if drive else []
    return subprocess.Popen([python, "-m", "papermill", NOTEBOOK, str(work / "01.ipynb"), "-k", "colab", "--cwd",
                             str(work), *PARAMS, *place], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, **kwargs)


def installed(python) -> dict:
    done = subprocess.run([python, "-m", "pip", "list", "--format", "json", "--disable-pip-version-check"],
                          capture_output=True, text=True, check=True)
    return {p["name"].lower(): p["version"] for p in json.loads(done.stdout)}


def store_runs(store: pathlib.Path) -> list:
    if not store.exists():
        return []
    client = mlflow.MlflowClient(f"sqlite:///{store}")
    return [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]


def cell_running(notebook: pathlib.Path, text: str) -> bool:
    """Whether papermill shows the cell whose source holds `text` running (it saves the notebook as each cell
    starts)."""
    with contextlib.suppress(OSError, ValueError):
        cells = json.loads(notebook.read_text())["cells"]
        return any(text in "".join(c["source"]) and c.get("metadata", {}).get("papermill", {}).get("status") ==
                   "running" for c in cells)
    return False


def kill_when(child, moment, timeout: float = 1800) -> bool:
    """Kill the kernel and everything it started (each in a session of its own) once moment() holds; False where the
    notebook ended first."""
    from conftest import kill_tree

    deadline = time.time() + timeout
    while child.poll() is None and time.time() < deadline:
        if moment():
            kill_tree(child.pid)
            child.wait()
            return True
        time.sleep(0.05)  # the save cell of a tiny adapter lasts about a second
    child.wait()
    return False


def rehearse(tmp_path, fresh: bool, kills: tuple = ()) -> dict:
    """Notebook 01 executed from its first cell in a Colab-like Python (colab_python), COLAB_RELEASE_TAG set, this
    checkout as DSNB_SOURCE, the offline defaults, its results_folder on a stand-in for Drive. With kills, the whole
    kernel is killed at each moment in turn, everything of the runtime but Drive wiped (a new runtime: the setup runs
    again), and the notebook run all again, as a user does after a disconnect: "variant" once the second variant has
    trained a few steps (its checkpoints written), "quality" while the quality check trains (the pair finished),
    "save" while the cell that keeps the model runs; a number: that many seconds into the pass. Returns what the setup
    changed (packages added and changed, MB downloaded, seconds), the run ids of each pass, and the last pass's text."""
    python = colab_python(tmp_path, fresh)
    venv, work, cache = tmp_path / "colab-python", tmp_path / "content", tmp_path / "pip-cache"
    drive = tmp_path / "drive" / "MyDrive" / "dsnb"
    store = drive / "mlflow.db"
    work.mkdir()
    env = notebook_env(venv, cache)
    before, started = installed(python), time.time()
    moments = {"variant": lambda: any(r.info.run_name == "With_DeepSpeed" and len(mlflow.MlflowClient(
                   f"sqlite:///{store}").get_metric_history(r.info.run_id, "loss")) >= 3 for r in store_runs(store)),
               "quality": lambda: any(r.info.run_name == "quality" and r.info.status == "RUNNING"
                                      for r in store_runs(store)),
               "save": lambda: cell_running(work / "01.ipynb", "dsnb.keep(")}
    passes = []
    for moment in kills:  # a moment's name, or seconds after the pass started (the pass may end before them)
        child, begun = papermill(python, work, env, drive), time.time()
        late = lambda b=begun, m=moment: time.time() - b > m  # noqa: E731
        killed = kill_when(child, moments[moment] if isinstance(moment, str) else late)
        assert killed or not isinstance(moment, str), f"the notebook ended before the {moment} moment: " + \
            child.stdout.read()[-4000:]
        passes.append({r.info.run_id: (r.info.run_name, r.info.status) for r in store_runs(store)})
        shutil.rmtree(work)  # a new runtime: only Drive is left
        work.mkdir()
    done = papermill(python, work, env, drive)
    out, _ = done.communicate(timeout=2400)
    assert done.returncode == 0, out[-4000:]
    passes.append({r.info.run_id: (r.info.run_name, r.info.status) for r in store_runs(store)})
    text = outputs(work / "01.ipynb")
    log = (work / "dsnb_setup.log").read_text()  # the setup cell's own record (a rerun in one runtime skips it)
    assert "dsnb setup: ready in" in log and "DeepSpeed's CPU Adam" in log
    assert not re.search(r"ERROR|WARNING|Traceback|requires .* which is not installed", log), log
    where = subprocess.run([python, "-c", "import dsnb, torch; print(dsnb.__file__, torch.__version__)"],
                           capture_output=True, text=True, cwd=work, env=env).stdout.split()
    import torch

    assert where[0].startswith(str(venv)) and where[1] == torch.__version__  # installed from the source; torch kept
    pair = sorted(name for name, status in passes[-1].values() if name != "quality" and status == "FINISHED")
    assert pair == ["With_DeepSpeed", "Without_DeepSpeed"], passes[-1]  # an attempt killed before a checkpoint: KILLED
    assert {status for _, status in passes[-1].values()} <= {"FINISHED", "KILLED"}, passes[-1]  # none left RUNNING
    assert list(drive.glob("dsnb_mlflow*.zip")) and list(drive.glob("models/adapter-*/adapter_config.json"))
    saved = ("adapter-", "merged-", "model-", "dsnb_mlflow")
    assert not [p.name for p in work.iterdir() if p.name.startswith(saved)]  # Drive's
    assert "No GPU in this runtime" not in text and "Traceback" not in text
    after = installed(python)
    return {"added": sorted(set(after) - set(before)),
            "changed": sorted(n for n in set(before) & set(after) if before[n] != after[n]),
            "downloaded_mb": sum(f.stat().st_size for f in cache.rglob("*") if f.is_file()) / 2**20,
            "seconds": time.time() - started, "passes": passes, "text": text, "store": store, "drive": drive}


def outputs(path) -> str:
    """Everything an executed notebook's cells printed or showed as text."""
    cells = json.loads(pathlib.Path(path).read_text())["cells"]
    return "\n".join("".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", "")) + "".join(
        o.get("traceback", [])) for c in cells for o in c.get("outputs", []))


@pytest.mark.integration
def test_colab_rehearsal_survives_a_killed_kernel_and_leaves_colabs_packages_alone(tmp_path):
    """Notebook 01 from its setup cell, with Colab's transformers, peft, accelerate, datasets and pyarrow, its results
    on "Drive", killed in a new runtime each time: while the second variant trains, in the quality check, in the save
    cell; run all again after each. It resumed the variant into its own run, kept the finished pair (one comparison,
    never trained twice), ran the quality check to its end once, saved the model on Drive; the last Run all trained
    nothing. The setup added dsnb, changed nothing Colab had and printed no error or warning."""
    facts = rehearse(tmp_path, fresh=False, kills=("variant", "quality", "save"))
    assert set(facts["added"]) <= {"dsnb"} and facts["changed"] == [], facts  # dsnb lands in the venv (checked)
    after_variant, after_quality, after_save, last = facts["passes"]
    assert sorted(n for n, _ in last.values() if n != "quality") == ["With_DeepSpeed", "Without_DeepSpeed"], last
    target = next(i for i, (name, _) in after_variant.items() if name == "With_DeepSpeed")
    assert after_variant[target][1] == "RUNNING"  # its process died with the kernel (marked KILLED when next read)
    client = mlflow.MlflowClient(f"sqlite:///{facts['store']}")
    resumed = client.get_run(target)
    assert resumed.info.status == "FINISHED" and resumed.data.tags["resumed"].startswith("from checkpoint-")
    assert not {"failure", "error"} & set(resumed.data.tags)
    comparisons = {r.data.tags.get("comparison") for r in map(client.get_run, last) if r.info.run_name != "quality"}
    assert len(comparisons) == 1  # one comparison, its pair trained once
    assert sorted(s for n, s in last.values() if n == "quality") == ["FINISHED", "KILLED"]  # killed once, then done
    assert set(last) == set(after_save)  # the last Run all trained nothing
    text = facts["text"]
    assert re.search(r"this comparison \(\w+\) had finished", text)
    assert "quality: kept its FINISHED" in text
    # on Drive, one folder a kept run, each written once whatever the kills: the pair's run the save cell keeps and the
    # quality check's run the ask cell saves (the one that learned to answer, the model being a random synthetic one)
    kept = sorted(p.name for p in (facts["drive"] / "models").iterdir() if not p.name.startswith("."))
    quality_id = next(i for i, (n, s) in last.items() if n == "quality" and s == "FINISHED")
    assert len(kept) == 2 and f"model-{quality_id[:8]}" in kept, kept  # the quality check trains every weight
    (tmp_path / "install.json").write_text(json.dumps({k: v for k, v in facts.items() if k in ("added", "changed",
                                                                                                "downloaded_mb")}))
    print(f"setup: added {facts['added']}, changed {facts['changed']}, {facts['seconds']:.0f} s")


@pytest.mark.slow  # notebook 01 eleven times over (about 12 minutes on 2 idle cores)
def test_notebook_01_killed_at_moments_across_its_run_ends_as_an_uninterrupted_run_does(tmp_path):
    """Killed at nine moments, from a tenth to nine tenths of an uninterrupted Run all's time (setup, either variant,
    the comparison, the quality check, the save), each pass in a new runtime with only Drive kept: nothing that
    finished ran again (each run FINISHED stays so, under its id, and no name finishes twice), and the last Run all
    ends with what one uninterrupted Run all records: one comparison of the pair, each variant's loss at every step
    once and the same as the uninterrupted run's, one finished quality check and the two saved models. An attempt
    killed before its first checkpoint stays in the store as KILLED (its variant trained again from the start); the
    table, verdict and model card read the finished runs alone."""
    whole = rehearse(tmp_path / "whole", fresh=False)
    facts = rehearse(tmp_path / "killed", fresh=False, kills=tuple(whole["seconds"] * i / 10 for i in range(1, 10)))
    finished = {}
    for number, runs in enumerate(facts["passes"]):
        for run_id, (name, status) in runs.items():
            if status == "FINISHED":
                assert finished.setdefault(name, run_id) == run_id, (number, name, facts["passes"])  # never twice
        assert all(runs.get(i) == (n, "FINISHED") for n, i in finished.items()), (number, facts["passes"])
    assert sorted(finished) == ["With_DeepSpeed", "Without_DeepSpeed", "quality"], facts["passes"]

    def record(store):
        client = mlflow.MlflowClient(f"sqlite:///{store}")
        runs = [r for r in store_runs(store) if r.info.status == "FINISHED"]
        losses = {r.info.run_name: {m.step: m.value for m in client.get_metric_history(r.info.run_id, "loss")}
                  for r in runs}
        return losses, {r.data.tags.get("comparison") for r in runs if r.info.run_name != "quality"}

    (want, one), (got, comparisons) = record(whole["store"]), record(facts["store"])
    assert len(comparisons) == 1 and len(one) == 1
    for name in ("Without_DeepSpeed", "With_DeepSpeed"):
        assert sorted(got[name]) == sorted(want[name]) == list(range(1, 17)), (name, got[name])
        assert [got[name][s] for s in sorted(got[name])] == pytest.approx([want[name][s] for s in sorted(want[name])],
                                                                         rel=1e-5), name
    kept = [p.name for p in (facts["drive"] / "models").iterdir() if not p.name.startswith(".")]
    assert len(kept) == 2, kept


@pytest.mark.slow
def test_colab_rehearsal_from_an_empty_environment(tmp_path):
    """The whole install, every requirement resolved and CPU Adam built from nothing (minutes)."""
    facts = rehearse(tmp_path, fresh=True)
    assert "torch" not in facts["changed"], facts
    print(f"setup: {facts}")


def test_dsnbs_bounds_accept_every_package_colab_has():
    """Against Colab's own package list, the install plan installs only what Colab lacks (DeepSpeed, bitsandbytes,
    MLflow, GPUtil): transformers 5.9, peft 0.19, accelerate 1.13, datasets 4.0 and pyarrow 18.1 are kept, pinned."""
    from dsnb.install import norm, plan, requirement_class

    colab = colab_versions()
    install, everything, own = plan(dsnb_requirements(), colab)
    names = {norm(requirement_class()(text).name) for text in install}
    assert names == {"deepspeed", "bitsandbytes", "mlflow", "gputil"}, install
    pinned = dict(p.split("==") for p in everything)
    for name in ("transformers", "peft", "accelerate", "datasets", "pyarrow", "python-dateutil", "torch"):
        assert pinned[name] == colab[name], name
    assert "torch==2.11.0+cu128" in own


@pytest.mark.integration
def test_the_install_plan_resolves_against_colabs_packages_and_changes_none(tmp_path):
    """pip, asked as dsnb.install asks it (every installed package pinned), in a Python whose installed packages are
    Colab's own list (their metadata only), resolves what dsnb lacks without upgrading or downgrading any of them."""
    venv = tmp_path / "colab-metadata"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    purelib = pathlib.Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                          capture_output=True, text=True, check=True).stdout.strip())
    colab = colab_versions()
    for name, version in colab.items():  # what pip reads of an installed package: its name and version
        info = purelib / f"{re.sub(r'[-.]+', '_', name)}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (info / "RECORD").write_text("")
    script = ("import importlib.util, json, sys\n"  # the module alone: this Python has no dsnb (nor its yaml)
              "spec = importlib.util.spec_from_file_location('install', sys.argv[1])\n"
              "install = importlib.util.module_from_spec(spec); spec.loader.exec_module(install)\n"
              "wanted, everything, _ = install.plan(json.loads(sys.argv[2]))\n"
              "code, out = install.pip_install(wanted, everything)\n"
              "print(json.dumps({'install': wanted, 'code': code, 'out': out}))")
    report = tmp_path / "report.json"
    done = subprocess.run([python, "-c", script, str(ROOT / "dsnb" / "install.py"), json.dumps(dsnb_requirements())],
                          capture_output=True, text=True, timeout=1200,
                          env={**os.environ, "PIP_DRY_RUN": "1", "PIP_REPORT": str(report)})
    assert done.stdout, done.stderr[-3000:]
    facts = json.loads(done.stdout.splitlines()[-1])
    assert facts["code"] == 0, facts["out"][-3000:]
    from dsnb.install import norm

    ours = {norm(name) for name in colab}
    added = {norm(r["metadata"]["name"]): r["metadata"]["version"] for r in json.loads(report.read_text())["install"]}
    assert {"deepspeed", "bitsandbytes", "mlflow", "gputil"} <= set(added), added
    assert not set(added) & ours, {name: (colab_versions().get(name), added[name]) for name in set(added) & ours}
    print(f"added beside Colab's packages: {added}")


@pytest.mark.integration
def test_a_dsnb_wheel_on_drive_is_found_in_a_new_runtime(tmp_path):
    """After a disconnect Drive is not mounted: the setup cell mounts it before it looks for the wheel kept there
    (Colab's drive module stands in as one that shows MyDrive once mount is called; /content is a folder here). The
    store's zip that notebook 03 asks to upload to /content, and those dsnb writes beside a results folder on MyDrive,
    are no install source."""
    import zipfile

    content, drive = tmp_path / "content", tmp_path / "drive-files"
    (drive / "MyDrive").mkdir(parents=True)
    content.mkdir()
    for store_zip in (content / "dsnb_mlflow.zip", drive / "MyDrive" / "dsnb_mlflow-2.zip"):
        with zipfile.ZipFile(store_zip, "w") as z:
            z.writestr("mlflow.db", "")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(ROOT), "-w",
                    str(drive / "MyDrive")], check=True, capture_output=True, timeout=600)
    fake = tmp_path / "colab-module" / "google" / "colab"
    fake.mkdir(parents=True)
    (fake.parent / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("")
    (fake / "drive.py").write_text(f"import os\n\n\ndef mount(path):\n    os.symlink({str(drive)!r}, path)\n")
    import nbformat

    nb = nbformat.read(ROOT / "notebooks" / "03_compare_runs.ipynb", 4)  # its setup installs no CPU Adam: quick
    setup = next(c.source for c in nb.cells if c.cell_type == "code" and "COLAB_RELEASE_TAG" in c.source)
    python = colab_python(tmp_path, fresh=False)
    env = {k: v for k, v in os.environ.items() if k not in ("DSNB_SOURCE", "VIRTUAL_ENV")}
    done = subprocess.run([python, "-c", setup.replace("/content", str(content))], cwd=content, capture_output=True,
                          text=True, timeout=1200, env={**env, "COLAB_RELEASE_TAG": "rehearsal",
                                                        "PYTHONPATH": str(fake.parent.parent)})
    wheel = next((drive / "MyDrive").glob("dsnb-*.whl")).name
    assert done.stdout.startswith(f"installing dsnb from {content}/drive/MyDrive/{wheel}, then "), done.stdout[:500]
    assert f"dsnb set up from {content}/drive/MyDrive/{wheel}" in done.stdout, done.stdout[-3000:] + done.stderr
    where = subprocess.run([python, "-c", "import dsnb; print(dsnb.__file__)"], capture_output=True, text=True,
                           cwd=tmp_path, env={k: v for k, v in env.items() if k != "PYTHONPATH"}).stdout
    assert where.startswith(str(tmp_path / "colab-python")), where


def build_state(folder: pathlib.Path) -> dict:
    """What a CPU Adam build in `folder` is doing: torch's lock there, processes working in it, objects made."""
    import psutil

    working = []
    for process in psutil.process_iter(["cwd"]):
        if process.info["cwd"] == str(folder):
            working.append(process.pid)
    return {"lock": (folder / "lock").exists(), "working": working, "objects": len(list(folder.glob("*.o"))),
            "library": (folder / "cpu_adam.so").exists()}


def setup_killed_when(env: dict, folder: pathlib.Path, moment, everything: bool, timeout: float = 1800) -> str:
    """`python -m dsnb.install` (the setup cell's second step) SIGKILLed once `moment(build_state)` holds, its output.
    everything: it and every process under it, the compilers included (nothing of the build goes on); else its process
    group, as a Jupyter kernel restart kills the kernel's: ninja starts each compiler in a group of its own, so the
    compilers go on, orphaned."""
    child = subprocess.Popen([sys.executable, "-m", "dsnb.install"], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.time() + timeout
    try:
        while child.poll() is None and time.time() < deadline and not moment(build_state(folder)):
            time.sleep(0.05)
        assert child.poll() is None, f"the setup ended before its moment came:\n{child.stdout.read()[-3000:]}"
        assert time.time() < deadline, f"the moment never came in {timeout:.0f} s (a wedged build lock?)"
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        if everything:
            end_the_build(folder)
        child.wait()
    return child.stdout.read()


def end_the_build(folder: pathlib.Path) -> None:
    """Whatever still works in `folder` (compilers, and what they start while they are killed), killed."""
    import psutil

    while working := build_state(folder)["working"]:
        for pid in working:
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(pid).kill()
        time.sleep(0.2)


@pytest.mark.slow  # three builds of CPU Adam killed and a fourth to its end: 10 minutes idle, 23 under load (the lock's
def test_a_setup_killed_while_it_builds_cpu_adam_finishes_when_run_again(tmp_path):  # rule: test_preflight.py)
    """The setup killed during DeepSpeed's CPU Adam build, each kill leaving torch's build lock behind: with its
    compilers, as a kernel restart does (the compilers go on), and as the library is written. Each run after takes
    the lock over (at once, or once the orphaned compilers end) and goes on; the last finishes; each says what it does
    and how many seconds have passed."""
    folder = tmp_path / "ext" / "cpu_adam"
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"), "PYTHONUNBUFFERED": "1"}
    compiling = lambda state: state["lock"] and state["working"]  # noqa: E731
    outputs = []
    try:
        outputs.append(setup_killed_when(env, folder, compiling, everything=True))
        assert build_state(folder)["lock"] and not build_state(folder)["working"]  # left behind, as torch leaves it
        outputs.append(setup_killed_when(env, folder, compiling, everything=False))
        assert build_state(folder)["lock"] and build_state(folder)["working"]  # and its compilers go on
        outputs.append(setup_killed_when(env, folder, lambda state: state["library"], everything=True))
        started = time.time()
        done = subprocess.run([sys.executable, "-m", "dsnb.install"], env=env, capture_output=True, text=True,
                              timeout=1800)
    finally:
        end_the_build(folder)
    outputs.append(done.stdout + done.stderr)
    assert done.returncode == 0 and "dsnb setup: ready in" in outputs[-1], outputs[-1][-3000:]
    print(f"the last run took {time.time() - started:.0f} s")
    assert "took over the build lock of DeepSpeed's CPU Adam op" in outputs[1]  # the first kill's, at once
    assert "compilers still run" in outputs[2] and "took over the build lock" in outputs[2]  # once they ended
    assert any(re.search(r"dsnb setup: DeepSpeed's CPU Adam: \d+ s", text) for text in outputs), outputs
    assert not build_state(folder)["lock"]
    loaded = subprocess.run([sys.executable, "-c", "from deepspeed.ops.op_builder import CPUAdamBuilder; "
                             "CPUAdamBuilder().load(verbose=False); print('loaded')"], env=env, capture_output=True,
                            text=True, timeout=600)
    assert loaded.stdout.strip().endswith("loaded"), loaded.stderr[-2000:]


@pytest.fixture
def fuse_folder(tmp_path):
    """A folder on a FUSE mount, as Drive is on Colab (there through Google's own FUSE file system, here bindfs over a
    temporary folder: setup.sh installs it); a skip that says why where no FUSE mount can be made."""
    import shutil

    bindfs, backing, mount = shutil.which("bindfs"), tmp_path / "backing", tmp_path / "fuse"
    if not (bindfs and os.path.exists("/dev/fuse")):
        pytest.skip("no FUSE here (bindfs and /dev/fuse are needed: apt-get install bindfs, as setup.sh does)")
    backing.mkdir()
    mount.mkdir()
    done = subprocess.run([bindfs, str(backing), str(mount)], capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"a FUSE mount cannot be made here: {done.stderr.strip()}")
    assert any(line.split()[1] == str(mount) and line.split()[2].startswith("fuse")
               for line in pathlib.Path("/proc/mounts").read_text().splitlines())
    yield mount
    subprocess.run(["fusermount", "-u", "-z", str(mount)], check=True)  # lazily: this process's store stays open


@pytest.mark.integration
def test_a_store_made_and_a_run_written_on_a_fuse_mount(fuse_folder):
    """Drive's mount is FUSE: a fresh store made there by two processes at once (init_store: an flock, a SQLite file
    migrated beside it, then renamed into place) is made once and whole; a run with results_folder there writes its
    store, checkpoints (timed) and adapter, and finishes."""
    results = fuse_folder / "dsnb"
    uri = f"sqlite:///{results}/mlflow.db"
    make = [sys.executable, "-c", f"from dsnb.tracking import init_store; init_store({uri!r}); print('made')"]
    both = [subprocess.Popen(make, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for process in both:
        out, err = process.communicate(timeout=600)
        assert process.returncode == 0 and out.strip() == "made", err[-2000:]
    assert sorted(p.name for p in results.iterdir()) == ["mlflow.db", "mlflow.db.lock"]  # no half-made copy left
    done = subprocess.run([sys.executable, "-m", "dsnb", "run", "--offline", "--max_steps", "4", "--checkpoint_steps",
                           "2", "--eval_samples", "0", "--results_folder", str(results), "--run_name", "on-fuse"],
                          cwd=fuse_folder.parent, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    client = mlflow.MlflowClient(uri)
    [run] = client.search_runs([client.get_experiment_by_name("DeepSpeed_Comparison").experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "on-fuse"
    assert len(client.get_metric_history(run.info.run_id, "loss")) >= 1 and run.data.metrics["checkpoint_seconds"]
    assert run.info.artifact_uri.startswith(str(results))
    assert list((results / "mlartifacts").rglob("adapter_config.json"))
    assert not (fuse_folder.parent / "mlflow.db").exists()  # nothing beside it: all on the mount


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


@pytest.mark.integration
def test_a_package_replaced_takes_the_packages_it_pins_exactly_along(monkeypatch):
    """A runtime whose MLflow dsnb cannot use (a release requirements.txt leaves out): the installed MLflow pins its
    mlflow-skinny and mlflow-tracing to its own version, so they are not held where MLflow is replaced; held, pip found
    no version to install (ResolutionImpossible, and the fallback that may change other packages). pip, asked as
    dsnb.install asks it (a dry run), resolves at once."""
    from importlib import metadata

    from dsnb.install import pip_install, plan

    series = ".".join(metadata.version("mlflow").split(".")[:2])
    install, everything, _ = plan([f"mlflow>=3.7,<4,!={series}.*"])
    held = {pin.split("==")[0] for pin in everything}
    assert install and not held & {"mlflow", "mlflow-skinny", "mlflow-tracing"} and "pyarrow" in held
    monkeypatch.setenv("PIP_DRY_RUN", "1")
    code, out = pip_install(install, everything)
    assert code == 0 and "Would install mlflow-" in out, out[-3000:]
    code, out = pip_install(install, everything + [f"mlflow-skinny=={metadata.version('mlflow-skinny')}"])
    assert code != 0 and "ResolutionImpossible" in out, out[-3000:]  # held as before: no version of MLflow fits


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
