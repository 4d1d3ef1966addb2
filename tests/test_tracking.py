"""MLflow as users meet it: a real `mlflow server`, the zip export read back elsewhere, stale runs, no secrets."""
import base64
import contextlib
import http.server
import os
import pathlib
import signal
import subprocess
import json
import sys
import threading
import time
import urllib.error
import urllib.request
import zipfile

import mlflow
import pytest

from conftest import free_port
from dsnb.config import OFFLINE, ConfigError, RunConfig
from dsnb.tracking import create_run, export_store, mlflow_client

pytestmark = pytest.mark.integration
SECRET = "hf_dsnbTestSecretValue1234567890"


def dsnb(*args, cwd, env=None):
    return subprocess.run([sys.executable, "-m", "dsnb", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=900, env=env)


@pytest.fixture
def mlflow_server(tmp_path):
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
                               "--backend-store-uri", f"sqlite:///{tmp_path}/server.db",
                               "--artifacts-destination", str(tmp_path / "server-artifacts"), "--workers", "1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                              # no job runner: its seven consumer processes only compete with the test for the CPU
                              env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 300  # a new store's migrations and the server's imports: a minute or more on 2 busy cores
    while server.poll() is None and time.time() < deadline:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=1)
            break
        except OSError:
            time.sleep(0.5)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        pytest.fail(f"mlflow server did not start on 127.0.0.1 within 300 s (exit {server.poll()})")
    yield url
    os.killpg(server.pid, signal.SIGTERM)
    server.wait(timeout=30)


@pytest.fixture
def guarded_server(mlflow_server):
    """mlflow_server behind a proxy that answers 401 to every request without the basic-auth pair dsnb-user:SECRET
    (MLflow's own basic-auth app needs Flask-WTF, which dsnb does not install)."""
    expected = "Basic " + base64.b64encode(f"dsnb-user:{SECRET}".encode()).decode()

    class Proxy(http.server.BaseHTTPRequestHandler):
        def forward(self):
            if self.headers.get("Authorization") != expected:
                self.send_response(401)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "authorization")}
            request = urllib.request.Request(mlflow_server + self.path, data=body if self.command != "GET" else None,
                                             method=self.command, headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=120) as reply:
                    status, replied, data = reply.status, reply.headers, reply.read()
            except urllib.error.HTTPError as e:
                status, replied, data = e.code, e.headers, e.read()
            self.send_response(status)
            for key, value in replied.items():
                if key.lower() not in ("transfer-encoding", "connection", "content-length", "server", "date"):
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = forward

        def log_message(self, *args):
            pass

    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    yield f"http://dsnb-user:{SECRET}@127.0.0.1:{proxy.server_address[1]}"
    proxy.shutdown()


def test_runs_logged_through_a_real_mlflow_server(workdir, mlflow_server):
    done = dsnb("run", "--offline", "--max_steps", "2", "--tracking_uri", mlflow_server, "--run_name", "served",
                cwd=workdir)
    assert done.returncode == 0, done.stderr[-2000:]
    client = mlflow.MlflowClient(mlflow_server)
    [run] = client.search_runs([client.get_experiment_by_name("DeepSpeed_Comparison").experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "served"
    assert run.data.metrics["tokens_per_second"] > 0 and run.data.params["strategy"] == "baseline"
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"environment.json", "model"} <= artifacts
    assert not (workdir / "mlflow.db").exists()


def test_export_reads_back_elsewhere_and_never_overwrites(workdir, monkeypatch):
    uri = f"sqlite:///{workdir}/mlflow.db"
    done = dsnb("run", "--offline", "--max_steps", "2", "--run_name", "exported", cwd=workdir)
    assert done.returncode == 0, done.stderr[-2000:]
    export_store(uri, str(workdir / "store.zip"))
    with pytest.raises(ConfigError, match="already exists"):
        export_store(uri, str(workdir / "store.zip"))
    elsewhere = workdir / "elsewhere"
    zipfile.ZipFile(workdir / "store.zip").extractall(elsewhere)
    original = mlflow.MlflowClient(uri)
    [before] = original.search_runs([original.get_experiment_by_name("DeepSpeed_Comparison").experiment_id])
    os.rename(workdir / "mlartifacts", workdir / "moved-away")  # the copy must not lean on the original
    monkeypatch.chdir(elsewhere)
    copy = mlflow.MlflowClient(f"sqlite:///{elsewhere}/mlflow.db")
    [after] = copy.search_runs([copy.get_experiment_by_name("DeepSpeed_Comparison").experiment_id])
    assert after.info.run_id == before.info.run_id and after.data.params == before.data.params
    assert after.data.metrics == before.data.metrics
    assert copy.get_metric_history(after.info.run_id, "loss") == original.get_metric_history(before.info.run_id, "loss")
    env_file = copy.download_artifacts(after.info.run_id, "environment.json", str(elsewhere))
    assert '"packages"' in open(env_file).read()


def test_a_run_left_running_by_a_killed_process_is_marked_on_next_start(workdir):
    cfg = RunConfig(**OFFLINE, tracking_uri=f"sqlite:///{workdir}/mlflow.db", run_name="orphan")
    code = (f"from dsnb.tracking import create_run; from dsnb.config import RunConfig, OFFLINE; "
            f"print(create_run(RunConfig(**OFFLINE, tracking_uri={cfg.tracking_uri!r}, run_name='orphan')))")
    orphan = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()[-1]
    client = mlflow.MlflowClient(cfg.tracking_uri)
    assert client.get_run(orphan).info.status == "RUNNING"  # its process is gone and never closed it
    mine = create_run(cfg.replace(run_name="next"))
    assert client.get_run(orphan).info.status == "KILLED"
    assert "ended without closing" in client.get_run(orphan).data.tags["error"]
    assert client.get_run(mine).info.status == "RUNNING"  # this process is alive: its run is left alone


def test_a_run_of_a_killed_process_its_parent_has_not_waited_for_is_marked(workdir):
    """A dsnb killed but not yet waited for by the program that started it (a zombie: a notebook server, a supervisor
    slow to reap it) has ended all the same. Counted as running, its run blocked a rerun on this host ("still
    running ... wait for it to end") until its heartbeat went stale, minutes later."""
    import psutil

    cfg = RunConfig(**OFFLINE, tracking_uri=f"sqlite:///{workdir}/mlflow.db", run_name="orphan")
    code = (f"import sys; from dsnb.tracking import create_run; from dsnb.config import RunConfig, OFFLINE; "
            f"print(create_run(RunConfig(**OFFLINE, tracking_uri={cfg.tracking_uri!r}, run_name='orphan')), "
            "flush=True); sys.stdin.read()")
    killed = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    orphan = killed.stdout.readline().strip()
    killed.kill()
    while psutil.Process(killed.pid).status() != psutil.STATUS_ZOMBIE:
        time.sleep(0.05)
    create_run(cfg.replace(run_name="next"))  # killed is still unreaped here
    run = mlflow.MlflowClient(cfg.tracking_uri).get_run(orphan)
    assert run.info.status == "KILLED" and f"process {killed.pid} ended" in run.data.tags["error"]
    killed.wait()


def test_a_store_is_created_whole_even_when_stopped_while_creating_it(workdir):
    """SIGTERM while MLflow creates a new store's tables (the first seconds of a first run): the next run on the same
    store works, and the message says that nothing had started."""
    child = subprocess.Popen([sys.executable, "-m", "dsnb", "compare", "--offline", "--max_steps", "1"], cwd=workdir,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while child.poll() is None and not list(workdir.glob("mlflow.db.creating-*")):
        time.sleep(0.01)
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=120)
    assert child.returncode == 130, err[-2000:]
    assert "before any variant started training; no run was recorded" in err and "recorded KILLED" not in err
    assert not list(workdir.glob("mlflow.db.creating-*"))  # nothing half-made left beside it
    done = dsnb("run", "--offline", "--max_steps", "1", "--eval_samples", "0", "--save_model", "false", cwd=workdir)
    assert done.returncode == 0, done.stderr[-2000:]
    client = mlflow.MlflowClient(f"sqlite:///{workdir}/mlflow.db")
    [run] = client.search_runs([client.get_experiment_by_name("DeepSpeed_Comparison").experiment_id])
    assert run.info.status == "FINISHED"


def test_a_half_made_store_is_named_with_what_to_do(workdir):
    """A store left half-migrated (by an older dsnb, or MLflow itself killed mid-way) is refused in one line."""
    import sqlite3

    with sqlite3.connect(workdir / "mlflow.db") as con:
        con.execute("CREATE TABLE experiments (experiment_id INTEGER)")
        con.execute("CREATE TABLE _alembic_tmp_experiments (experiment_id INTEGER)")
    done = dsnb("run", "--offline", "--max_steps", "1", cwd=workdir)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "creation was interrupted" in done.stderr and "mv mlflow.db mlflow.db.broken" in done.stderr


def test_credentials_in_a_server_uri_pass_the_check_and_are_never_shown(workdir, mlflow_server):
    """http://user:TOKEN@host: the health check sends them as basic auth, MLflow gets them as its documented
    variables, and no message, log, parameter or artifact holds the token."""
    uri = mlflow_server.replace("http://", f"http://dsnb-user:{SECRET}@")
    done = dsnb("run", "--offline", "--max_steps", "2", "--tracking_uri", uri, "--run_name", "credentialed",
                cwd=workdir)
    assert done.returncode == 0, done.stderr[-2000:]
    assert SECRET not in done.stdout + done.stderr
    client = mlflow.MlflowClient(mlflow_server)
    [run] = client.search_runs([client.get_experiment_by_name("DeepSpeed_Comparison").experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["tracking_uri"].startswith("http://***@")
    assert SECRET not in json.dumps([run.data.params, run.data.tags])
    client.download_artifacts(run.info.run_id, "", str(workdir / "downloaded"))
    assert searched_clean(workdir) > 5  # the server's store, its artifacts and what was downloaded from it
    refused = dsnb("check", "--offline", "--tracking_uri", uri.replace(str(mlflow_server.rsplit(":", 1)[1]), "9"),
                   cwd=workdir)
    assert refused.returncode == 2 and "does not answer" in refused.stderr and SECRET not in refused.stderr
    assert "http://***@127.0.0.1:9" in refused.stderr


def test_a_sweep_through_a_server_with_credentials_keeps_them_out_of_its_notebooks(workdir, mlflow_server,
                                                                                  guarded_server):
    """papermill writes every parameter into the executed notebook and its metadata: the kernel gets the URI without
    its user and password, and those as MLflow's variables, with which it still reaches a server that demands them."""
    notebook = pathlib.Path(__file__).parents[1] / "notebooks" / "02_zero_stages.ipynb"
    (workdir / "sweep.yaml").write_text(f"notebook: {notebook}\nbase: {{max_steps: 1, num_samples: 16, "
                                        "eval_samples: 0, save_model: false}\nvariants:\n  - {run_name: swept}\n")
    done = dsnb("sweep", "-f", "sweep.yaml", "--offline", "--tracking_uri", guarded_server, cwd=workdir)
    assert done.returncode == 0, done.stderr[-3000:]
    assert SECRET not in done.stdout + done.stderr
    client = mlflow.MlflowClient(mlflow_server)
    [run] = client.search_runs([client.get_experiment_by_name("DeepSpeed_Comparison").experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "swept"
    assert any(a.path.endswith(".ipynb") for a in client.list_artifacts(run.info.run_id))
    client.download_artifacts(run.info.run_id, "", str(workdir / "downloaded"))
    assert len(list(workdir.glob("sweeps/sweep/*.ipynb"))) == 1
    assert searched_clean(workdir) > 5  # the executed notebook, its MLflow copy, the server's store


def test_a_bench_through_a_server_with_credentials_writes_no_secret(workdir, guarded_server):
    done = dsnb("bench", "--offline", "--only", "tutorial", "--repeats", "1", "--steps", "1", "--untimed", "1",
                "--out", "results", "--tracking_uri", guarded_server, cwd=workdir)
    assert done.returncode == 0, done.stderr[-3000:]
    assert SECRET not in done.stdout + done.stderr and "http://***@127.0.0.1" in done.stdout
    result = json.loads((workdir / "results" / "cpu.json").read_text())
    assert "--tracking_uri http://***@127.0.0.1" in result["command"]
    assert searched_clean(workdir) > 3  # cpu.json, cpu.md, the server's store and artifacts


def test_no_secret_from_the_environment_reaches_the_store(workdir):
    env = {**os.environ, "HF_TOKEN": SECRET, "MLFLOW_TRACKING_PASSWORD": SECRET, "AWS_SECRET_ACCESS_KEY": SECRET}
    done = dsnb("compare", "--offline", "--max_steps", "2", "--repeats", "1", cwd=workdir, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert searched_clean(workdir) > 10  # the store, the logs and the artifacts were all there to search


def searched_clean(folder) -> int:
    """How many files under folder were searched; fails on the first that holds SECRET."""
    checked = 0
    for root, _, files in os.walk(folder):
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                assert SECRET.encode() not in f.read(), os.path.join(root, name)
            checked += 1
    return checked


def test_two_sweeps_writing_one_store_at_once_lose_nothing(workdir):
    uri = f"sqlite:///{workdir}/mlflow.db"
    code = ("import sys; from dsnb.config import OFFLINE, RunConfig; from dsnb.launch import run_all; "
            f"run_all([RunConfig(**dict(OFFLINE, max_steps=2, num_samples=16, logging_steps=1, save_model=False), "
            f"tracking_uri={uri!r}, run_name=sys.argv[1] + str(i), strategy=s) "
            "for i, s in enumerate(['baseline', 'zero1'])], progress=False)")
    sweeps = [subprocess.Popen([sys.executable, "-c", code, name], cwd=workdir) for name in ("a", "b")]
    assert [s.wait(timeout=900) for s in sweeps] == [0, 0]
    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("DeepSpeed_Comparison").experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["a0", "a1", "b0", "b1"]
    for run in runs:
        assert run.info.status == "FINISHED", run.info.run_name
        assert run.data.metrics["tokens_per_second"] > 0
        assert len(client.get_metric_history(run.info.run_id, "loss")) == 2
        assert len(run.data.params) > 30  # the whole config and the measurements' params


def test_a_relative_store_follows_the_working_directory(tmp_path, monkeypatch):
    """MLflow caches stores by URI string: sqlite:///mlflow.db must not keep writing to the first folder."""
    cfg = RunConfig(**OFFLINE)
    ids = {}
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
        monkeypatch.chdir(tmp_path / name)
        ids[name] = create_run(cfg.replace(run_name=name))
    for name, run_id in ids.items():
        client = mlflow.MlflowClient(f"sqlite:///{tmp_path / name}/mlflow.db")
        runs = client.search_runs([client.get_experiment_by_name("DeepSpeed_Comparison").experiment_id])
        assert [r.info.run_id for r in runs] == [run_id]


def test_the_loss_curve_is_written_in_batches_and_nothing_is_held_back(workdir):
    """A write per logged step cost more than a compiled step; the curve goes in batches of `records` steps, or
    after `seconds`, and write() (a run's end, finished or failed) sends what is left."""
    from dsnb.tracking import Curve

    cfg = RunConfig(**OFFLINE, tracking_uri="sqlite:///mlflow.db")
    run_id = create_run(cfg)
    client = mlflow_client(cfg.tracking_uri)
    steps = lambda: [m.step for m in client.get_metric_history(run_id, "loss")]  # noqa: E731
    curve = Curve(run_id, cfg.tracking_uri, records=4, seconds=3600)
    for step in range(1, 11):
        curve(step, {"loss": 1.0 / step, "grad_norm": 2.0, "learning_rate": 1e-4, "epoch": 0.1})
    assert steps() == list(range(1, 9))  # two batches of 4; steps 9 and 10 held
    curve.write()
    assert steps() == list(range(1, 11))
    assert [m.value for m in client.get_metric_history(run_id, "loss")][-1] == pytest.approx(0.1)
    assert "epoch" not in client.get_run(run_id).data.metrics  # only the curve's keys
    slow = Curve(run_id, cfg.tracking_uri, records=1000, seconds=0.0)  # a slow run's curve reaches the UI in time
    slow(11, {"loss": 0.05})
    assert steps()[-1] == 11


def test_a_password_with_an_at_sign_and_quotes_reaches_no_output_param_card_or_saved_file(workdir, mlflow_server):
    """A password that holds an unencoded @ and quotes (the userinfo is everything up to the last @): the run logs
    through the server, and neither its output, params, tags, artifacts, the saved folder with its card, nor the ui
    command shows any of it."""
    uri = mlflow_server.replace("http://", f"http://dsnb-user:p@ss'w\"{SECRET}@")
    done = dsnb("run", "--offline", "--max_steps", "2", "--eval_samples", "4", "--tracking_uri", uri, "--run_name",
                "at-sign", cwd=workdir)
    assert done.returncode == 0, done.stderr[-2000:]
    client = mlflow.MlflowClient(mlflow_server)
    [run] = client.search_runs([client.get_experiment_by_name("DeepSpeed_Comparison").experiment_id])
    assert run.data.params["tracking_uri"] == mlflow_server.replace("http://", "http://***@")
    for text in (done.stdout + done.stderr, json.dumps([run.data.params, run.data.tags])):
        assert SECRET not in text and "ss'w" not in text
    saved = dsnb("save", "--run_id", run.info.run_id, "-o", "saved", "--tracking_uri", uri, cwd=workdir)
    assert saved.returncode == 0 and SECRET not in saved.stdout + saved.stderr, saved.stderr[-2000:]
    assert "| held-out questions" in (workdir / "saved" / "README.md").read_text()
    shown = dsnb("ui", "--tracking_uri", uri, cwd=workdir)
    # a server: checked that it answers (with the credentials), then named by its address, masked
    assert shown.returncode == 0 and shown.stdout.startswith("http://***@127.0.0.1:") and SECRET not in shown.stdout
    assert "the tracking server's own UI: open it in a browser" in shown.stdout
    client.download_artifacts(run.info.run_id, "", str(workdir / "downloaded"))
    assert searched_clean(workdir) > 10  # the saved folder, its card, the run's artifacts


def test_export_and_unzip_stage_under_names_of_their_own_and_touch_no_users_file(workdir):
    """Files a user keeps beside the zip (x.zip.partial, the x.partial folder an older dsnb staged into, a folder
    named like the zip) are never written over or removed."""
    uri = f"sqlite:///{workdir}/mlflow.db"
    create_run(RunConfig(**OFFLINE, tracking_uri=uri, run_name="stored"))
    (workdir / "x.zip.partial").write_text("mine")
    (workdir / "x.partial").mkdir()
    (workdir / "x.partial" / "notes.txt").write_text("mine too")
    done = dsnb("export", "-o", "x.zip", cwd=workdir)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (workdir / "x.zip.partial").read_text() == "mine"
    assert "mlflow.db" in zipfile.ZipFile(workdir / "x.zip").namelist()
    elsewhere = workdir / "elsewhere"
    elsewhere.mkdir()
    os.replace(workdir / "x.zip", elsewhere / "x.zip")
    os.replace(workdir / "x.partial", elsewhere / "x.partial")
    from dsnb.tracking import open_store

    opened = open_store(str(elsewhere / "x.zip"))
    assert opened == f"sqlite:///{elsewhere}/x/mlflow.db" and (elsewhere / "x.partial" / "notes.txt").exists()
    (elsewhere / "y").mkdir()
    (elsewhere / "y" / "thesis.tex").write_text("mine")
    os.replace(elsewhere / "x.zip", elsewhere / "y.zip")
    with pytest.raises(ConfigError, match="y exists and holds no mlflow.db, so .*y.zip cannot be unzipped there"):
        open_store(str(elsewhere / "y.zip"))
    assert sorted(p.name for p in elsewhere.iterdir()) == ["x", "x.partial", "y", "y.zip"]
    assert [p.name for p in (elsewhere / "y").iterdir()] == ["thesis.tex"]
    assert sorted(p.name for p in workdir.iterdir()) == ["elsewhere", "mlflow.db", "mlflow.db.lock", "x.zip.partial"]


def test_the_stores_zip_lands_beside_the_store(workdir):
    """download_store writes into the store's folder (results_folder's, on Drive), not the working directory, never
    over an earlier zip; a copy for drive_folder is written whole too."""
    from dsnb.tracking import download_store

    cfg = RunConfig.layered(OFFLINE, {"results_folder": str(workdir / "results"), "run_name": "zipped"})
    create_run(cfg)
    first, second = download_store(cfg.tracking_uri), download_store(cfg.tracking_uri, str(workdir / "drive"))
    assert (first, second) == (str(workdir / "results" / "dsnb_mlflow.zip"),
                               str(workdir / "results" / "dsnb_mlflow-2.zip"))
    assert os.listdir(workdir / "drive") == ["dsnb_mlflow-2.zip"]
    assert not list(workdir.glob("*.zip")) and "mlflow.db" in zipfile.ZipFile(second).namelist()


def test_a_run_of_an_earlier_dsnb_without_a_newer_field_is_found_again_while_that_field_keeps_its_default(workdir):
    """A new runtime installs the newest dsnb: the finished runs of an earlier one, which logged no param for a field
    added since, are the same config while cfg leaves that field at its default, and another config where it does not;
    a run killed before its config was logged is nobody's."""
    from mlflow.entities import Param

    from dsnb.tracking import logged_params, same_config

    cfg = RunConfig(**OFFLINE, tracking_uri=f"sqlite:///{workdir}/mlflow.db", run_name="older")
    client = mlflow_client(cfg.tracking_uri)
    experiment = client.create_experiment("older")
    older = client.create_run(experiment, run_name="older").info.run_id
    client.log_batch(older, params=[Param(k, v) for k, v in logged_params(cfg).items() if k != "checkpoint_minutes"])
    run = client.get_run(older)
    assert same_config(run, cfg)
    assert not same_config(run, cfg.replace(checkpoint_minutes=cfg.checkpoint_minutes + 5))
    assert not same_config(run, cfg.replace(lora_r=cfg.lora_r * 2))  # a field the run did log still decides
    bare = client.get_run(client.create_run(experiment, run_name="older").info.run_id)
    assert not same_config(bare, cfg)
    # a run old enough to have logged a field since renamed (warmup_steps, now untimed_steps) must match in full
    renamed = client.create_run(experiment, run_name="older").info.run_id
    client.log_batch(renamed, params=[Param(k, v) for k, v in {**logged_params(cfg), "warmup_steps": "1"}.items()
                                      if k != "untimed_steps"])
    assert not same_config(client.get_run(renamed), cfg)
    # an fp8 run before fp8_fast_accum accumulated in fp32: it is fp8_fast_accum none's, not the new default's
    fp8 = cfg.replace(quantization="fp8", dtype="bf16")
    old_fp8 = client.create_run(experiment, run_name="older").info.run_id
    client.log_batch(old_fp8, params=[Param(k, v) for k, v in logged_params(fp8).items() if k != "fp8_fast_accum"])
    assert not same_config(client.get_run(old_fp8), fp8)
    assert same_config(client.get_run(old_fp8), fp8.replace(fp8_fast_accum="none"))



WRITER = """
import os, random, signal, sqlite3, sys, time
from mlflow.entities import Metric
from dsnb import tracking
client, db = tracking.mlflow_client(sys.argv[1]), sys.argv[2]
experiment = client.create_experiment("e")
signal.signal(signal.SIGALRM, lambda *_: os.kill(os.getpid(), signal.SIGINT))  # a SIGINT at a random moment
interrupted = locked = 0
with tracking.interrupts_after_writes():
    for _ in range(int(sys.argv[3])):
        run_id = client.create_run(experiment).info.run_id
        signal.setitimer(signal.ITIMER_REAL, random.uniform(0.0005, 0.03))
        try:
            for step in range(1000):
                client.log_batch(run_id, metrics=[Metric("loss", 1.0, 0, step * 10 + i) for i in range(10)])
        except KeyboardInterrupt:  # as train records a failure: within the handler, the interrupt's traceback alive
            interrupted += 1
            try:
                probe = sqlite3.connect(db, timeout=0.5, isolation_level=None)
                probe.execute("BEGIN IMMEDIATE")
                probe.execute("ROLLBACK")
                probe.close()
            except sqlite3.OperationalError:
                locked += 1
print(interrupted, locked)
"""


@pytest.mark.integration
def test_an_interrupt_during_a_store_write_leaves_the_store_writable(tmp_path):
    """Ctrl-C, SIGTERM or a parent gone (a SIGINT) that lands while MLflow writes to SQLite waits for the write's
    transaction to end. Raised inside it, it left the interrupted connection holding the database's lock for as long
    as the traceback lived: the failure's own record then failed "database is locked" and the run stayed RUNNING (CI,
    2026-12-06: a killed comparison's run read "killed", lost before its process could record the interrupt). 60
    SIGINTs at random moments of a stream of writes: the store is writable after every one (without the deferral,
    about one in ten left it locked)."""
    db = tmp_path / "mlflow.db"
    done = subprocess.run([sys.executable, "-c", WRITER, f"sqlite:///{db}", str(db), "60"], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    interrupted, locked = map(int, done.stdout.split())
    # stderr too: once in CI (2026-12-07) 59 of the 60 interrupts reached the handler, none locked, and not again in
    # 1,500 more here; an interrupt raised inside a finalizer is printed there and dropped by Python
    assert interrupted == 60 and locked == 0, (interrupted, locked, done.stderr[-3000:])


IDLE = """
import signal, sys, time
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session
from dsnb import tracking
tracking.HOLD_MAX_S = 2
client = tracking.mlflow_client(sys.argv[1])
client.search_experiments()
with tracking.interrupts_after_writes(), tracking.interrupts_after_writes():  # nested, as dsnb run's main and cmd_run
    idle = Session(create_engine(sys.argv[1]))
    idle.execute(text("SELECT 1")).all()  # a transaction begun and left open: no write, no lock
    start = time.monotonic()
    try:
        print("ready", flush=True)
        time.sleep(60)
        print("never interrupted", flush=True)
    except KeyboardInterrupt:
        print(f"interrupted {time.monotonic() - start:.1f}", flush=True)
"""


@pytest.mark.integration
def test_an_interrupt_held_by_a_transaction_left_open_goes_through_in_time(tmp_path):
    """One SIGINT (a parent gone sends one) while a store transaction stays open and idle (nothing ends it to deliver
    the interrupt) goes through after HOLD_MAX_S (2 s here), not never; in nested blocks too (the command line's: the
    outer one had held again what the inner one let go)."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    child = subprocess.Popen([sys.executable, "-c", IDLE, uri], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, cwd=tmp_path)
    assert child.stdout.readline().strip() == "ready", child.stderr.read()[-3000:]
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=120)
    word, seconds = out.split()
    assert word == "interrupted" and 2 <= float(seconds) < 30, (out, err[-3000:])


OPENING = """
import os, signal, sys
from sqlalchemy import event
from sqlalchemy.engine import Engine
from dsnb import tracking
from dsnb.config import OFFLINE, RunConfig

@event.listens_for(Engine, "before_cursor_execute")
def interrupt(conn, cursor, statement, *_):  # Ctrl-C as MLflow writes the new run's row
    if statement.lstrip().startswith("INSERT INTO runs"):
        os.kill(os.getpid(), signal.SIGINT)

with tracking.interrupts_after_writes():
    try:
        tracking.create_run(RunConfig(**OFFLINE, tracking_uri=sys.argv[1], run_name="opening"))
        print("not interrupted")
    except KeyboardInterrupt:
        print("interrupted", *tracking.STOPPED)
"""


@pytest.mark.integration
def test_a_run_being_opened_as_an_interrupt_comes_is_recorded_killed_with_its_config(workdir):
    """An interrupt while create_run writes the new run's row: the run is not left RUNNING without its config (the
    caller never got its id, so nothing else would end it, and a rerun saw it 'still running' for minutes); it gets
    its config, then is ended KILLED as interrupted, and the message after names it."""
    uri = f"sqlite:///{workdir}/mlflow.db"
    done = subprocess.run([sys.executable, "-c", OPENING, uri], capture_output=True, text=True, timeout=120,
                          cwd=workdir)
    word, *stopped = done.stdout.split()
    assert word == "interrupted", (done.stdout, done.stderr[-3000:])
    [run] = mlflow.MlflowClient(uri).search_runs([mlflow.MlflowClient(uri).get_experiment_by_name(
        RunConfig(**OFFLINE).experiment).experiment_id])
    assert stopped == [run.info.run_id]
    assert run.info.status == "KILLED" and run.data.tags["failure"] == "interrupted"
    assert run.data.params["model"] == OFFLINE["model"] and run.data.params["run_name"] == "opening"
