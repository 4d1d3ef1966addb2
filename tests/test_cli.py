"""The README's main job and the CLI's contract, run as a user runs them (real processes, real MLflow store)."""
import os
import shutil
import subprocess
import sys
import zipfile

import mlflow
import pytest

from dsnb.model import resolve_model
from dsnb.report import METRICS

pytestmark = pytest.mark.integration


def dsnb(*args, cwd):
    return subprocess.run([sys.executable, "-m", "dsnb", *args], cwd=cwd, capture_output=True, text=True, timeout=900)


@pytest.fixture
def here(workdir, capsys):
    """`python -m dsnb ...` in this process (for commands that end before any training): exit code and output."""
    from dsnb.cli import main

    def call(*args, cwd=None):
        capsys.readouterr()
        code = main(list(args))
        out = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, out.out, out.err)

    return call


def test_offline_compare_end_to_end(workdir):
    done = dsnb("compare", "--offline", cwd=workdir)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Without_DeepSpeed" in done.stdout and "With_DeepSpeed" in done.stdout
    client = mlflow.MlflowClient(f"sqlite:///{workdir}/mlflow.db")
    exp = client.get_experiment_by_name("DeepSpeed_Comparison")
    runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}
    assert set(runs) == {"Without_DeepSpeed", "With_DeepSpeed"}
    for name, run in runs.items():
        assert run.info.status == "FINISHED"
        # the default prompt reads the passage: held-out scores measure the task, and there is no recall set
        assert run.data.params["prompt"] == "passage" and "recall_exact_match" not in run.data.metrics
        gpu = {"gpu_memory_used_mb", "peak_gpu_allocated_mb", "peak_gpu_reserved_mb", "peak_gpu_nvml_mb"}  # no GPU here
        missing = [m for m in METRICS if m not in run.data.metrics and not m.startswith("recall_") and m not in gpu]
        assert not missing and not gpu & set(run.data.metrics), (name, missing)
        assert run.data.metrics["tokens_per_second"] > 0 and run.data.metrics["peak_cpu_rss_mb"] > 100
        assert run.data.metrics["est_peak_host_mb"] > 0  # the estimate made before training, logged beside it
        assert abs(run.data.metrics["est_error_host"]) <= 0.25  # on the CPU too (benchmarks/results/host_cpu.md)
        assert "est_peak_gpu_mb" not in run.data.metrics  # on the CPU no GPU figure, estimated or measured
        assert len(client.get_metric_history(run.info.run_id, "loss")) >= 4  # the loss curve, per logging step
        assert run.data.params["model"] == "synthetic:tiny" and "seed" in run.data.params
        assert (workdir / "mlartifacts").is_dir() and not (workdir / "mlruns").exists()
    assert runs["With_DeepSpeed"].data.params["strategy"] == "zero2"
    assert runs["With_DeepSpeed"].data.params["offload_optimizer"] == "cpu"
    # every run's MFU over one peak, the CPU's nominal one: its ratios are the speed's (one model's FLOPs a token)
    every = client.search_runs([exp.experiment_id], "attributes.status = 'FINISHED'")
    assert len({(r.data.params["peak_flops"], r.data.params["peak_flops_source"]) for r in every}) == 1
    assert every[0].data.params["peak_flops_source"].startswith("nominal fp32")
    per_token = [r.data.metrics["mfu"] / r.data.metrics["tokens_per_second"] for r in every]
    assert len(every) >= 2 and max(per_token) / min(per_token) - 1 < 1e-9, per_token

    done = dsnb("export", "-o", "out.zip", cwd=workdir)
    assert done.returncode == 0, done.stderr
    names = zipfile.ZipFile(workdir / "out.zip").namelist()
    assert "mlflow.db" in names and any(n.endswith("environment.json") for n in names)
    again = dsnb("export", "-o", "out.zip", cwd=workdir)
    assert again.returncode == 2 and "already exists" in again.stderr


@pytest.mark.parametrize("flags, message", [
    (["--strategy", "zero2", "--offload_param", "cpu"], "offload_param needs strategy zero3"),
    (["--dtype", "fp16"], "dtype fp16 needs a GPU"),
    (["--attention", "flex", "--padding", "packed", "--torch_compile", "true", "--quantization", "none"],
     "attention flex needs a GPU"),
    (["--strategy", "zero3", "--quantization", "8bit"], "quantization 8bit cannot be partitioned"),
    (["--batch_size", "0"], "batch_size is 0"),
    (["--strategy", "zero3", "--quantization", "none", "--offload_param", "nvme", "--nvme_path", "/no/such"],
     "nvme_path '/no/such' does not exist"),
    (["--strategy", "zero3", "--quantization", "none", "--offload_param", "nvme", "--nvme_path", "/proc"],
     "nvme_path '/proc' is not writable"),
    (["--dataset", "missing.jsonl"], "dataset file 'missing.jsonl' does not exist"),
    (["--model", "some-org/no-such-model"], "model 'some-org/no-such-model' is not in the hub's cache (offline: "
     "dsnb reads only the hub's cache); give an existing hub id"),  # at once: no retries of a host it cannot reach
    (["--memory_budget_gb", "15"], "memory_budget_gb caps GPU memory and this machine has no GPU"),
    (["--strategy", "zero2", "--ds_config_path", "missing.json"], "ds_config 'missing.json' does not exist"),
    (["--model", "synthetic:huge"], "synthetic shapes are"),
    (["--dropout_kernel", "false"], "dropout_kernel is False but applies only with torch_compile true"),
])
def test_invalid_configuration_exits_2_with_one_line(here, flags, message):
    done = here("run", "--offline", *flags)
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()[-1]) < 300


def test_unknown_flag_and_unknown_yaml_key_exit_2(workdir, here):
    done = here("run", "--offline", "--batchsize", "3")
    assert done.returncode == 2 and "--batchsize: did you mean --batch_size? (python -m dsnb run --help lists" \
        in done.stderr, done.stderr
    # the command's own flags, never the one typed; the command named once in the help it points at
    assert "--ouput: did you mean --output? (python -m dsnb export --help" in here("export", "--ouput", "x").stderr
    assert "did you mean" not in here("ui", "--model", "x").stderr
    assert "(python -m dsnb ui --help lists" in here("ui", "--results_folder", "a", "--tracking_uri", "b").stderr
    (workdir / "v.yaml").write_text("strategy: zero1\nlearning_rat: 1\n")
    done = here("run", "-f", "v.yaml")
    assert done.returncode == 2 and "learning_rat is not a run-config field" in done.stderr
    # a bad value the file gave names the file and its variant; one a flag gave does not blame the file
    (workdir / "w.yaml").write_text("base: {quantization: none}\nvariants:\n  a: {lora_r: -2}\n  b: {}\n")
    assert "dsnb: error: w.yaml (variant a): lora_r is -2" in here("check", "--offline", "-f", "w.yaml", "--variant",
                                                                   "a").stderr
    assert "dsnb: error: lora_r is -3" in here("check", "--offline", "-f", "w.yaml", "--variant", "a", "--lora_r",
                                               "-3").stderr


def test_a_run_that_breaks_exits_1_and_is_recorded_failed(workdir):
    model = workdir / "broken-model"
    shutil.copytree(resolve_model("synthetic:tiny"), model)
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])  # a download cut short
    done = dsnb("run", "--offline", "--model", str(model), "--run_name", "broken", cwd=workdir)
    assert done.returncode == 1, done.stderr[-2000:]
    client = mlflow.MlflowClient(f"sqlite:///{workdir}/mlflow.db")
    [run] = client.search_runs([client.get_experiment_by_name("DeepSpeed_Comparison").experiment_id])
    assert run.info.status == "FAILED" and run.info.run_name == "broken"
    assert "peak_cpu_rss_mb" in run.data.metrics and run.data.tags["failure"]
    assert "error.txt" in {a.path for a in client.list_artifacts(run.info.run_id)}


def test_deepspeeds_own_launcher_runs_one_rank_per_process(workdir):
    """What a team types on a multi-GPU node, here with two CPU processes: one MLflow run, every rank's peak."""
    done = subprocess.run([sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "2", "--module", "dsnb",
                           "run", "--offline", "--strategy", "zero2", "--quantization", "none", "--max_steps", "2",
                           "--save_model", "false"], cwd=workdir, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "DS_ACCELERATOR": "cpu"})
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    client = mlflow.MlflowClient(f"sqlite:///{workdir}/mlflow.db")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert [r.info.status for r in runs] == ["FINISHED"]
    assert {"peak_cpu_rss_mb_rank0", "peak_cpu_rss_mb_rank1"} <= set(runs[0].data.metrics)


def test_bench_baseline_must_exist(here):
    done = here("bench", "--offline", "--baseline", "missing.json")
    assert done.returncode == 2 and "--baseline missing.json does not exist" in done.stderr


@pytest.mark.parametrize("args, message", [
    (["run", "--learning_rat", "1"], "unrecognized arguments: --learning_rat 1"),  # never expanded to learning_rate
    (["run", "--batch_size"], "argument --batch_size: expected one argument"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["bench", "--repeats", "0"], "argument --repeats: '0' is not a whole number of at least 1"),
    (["bench", "--steps", "2.5"], "argument --steps: '2.5' is not a whole number of at least 1"),
    (["save", "--run_id", "x"], "the following arguments are required: -o/--output"),
    (["check", "--offline", "--learning_rate", "-1e-4"], "learning_rate must be positive"),  # a value, not a flag
    (["check", "--offline", "--batch_size", "2.5"], "batch_size is 2.5; expected an integer"),
    (["check", "--offline", "--num_samples", "4"], "num_samples is 4 but one step takes"),
    (["check", "--offline", "--warmup_steps", "2"], "warmup_steps is now untimed_steps"),
    (["check", "--offline", "--tracking_uri", "sqlite:///"], "tracking_uri 'sqlite:///' names no database file"),
    (["check", "--offline", "--tracking_uri", "./mlruns"], "is a file store, which MLflow 3"),
    (["check", "--offline", "--tracking_uri", "databricks"], "(a Databricks workspace) is not a store dsnb runs"),
    (["ui", "--tracking_uri", "dsnb_mlflow.zip"], "is a zip of a store: open it with dsnb.open_store"),
    (["check", "--offline", "--lora_targets", "foo_proj"],
     "lora_targets 'foo_proj': foo_proj names no layer of synthetic:tiny"),
    (["ui", "--tracking_uri", "http://127.0.0.1:9"], "tracking_uri http://127.0.0.1:9 does not answer"),
])
def test_every_cli_error_is_one_line(workdir, capsys, args, message):
    from dsnb.cli import main

    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dsnb: error: ") and message in err[0], err


def test_a_flag_given_twice_says_which_value_counts(workdir, capsys):
    from dsnb.cli import build_config, parser

    args = parser().parse_args(["check", "--offline", "--max_steps", "3", "--lora_r", "8", "--max_steps", "5",
                                "--lora_r", "8", "--learning_rate", "1e-4", "--learning_rate", "0.0001"])
    assert build_config(args).max_steps == 5
    out = capsys.readouterr().out.strip().splitlines()
    # --lora_r twice with one value, --learning_rate with one number spelled two ways: no note
    assert out == ["dsnb: note: --max_steps given twice (3, then 5); the last counts: --max_steps 5"]
    # the file and the variant too; a password in a tracking_uri is not printed
    args = parser().parse_args(["run", "-f", "a.yaml", "--variant", "x", "-f", "b.yaml", "--tracking_uri",
                                "https://alice:s3cret@host/x", "--tracking_uri", "https://alice:n3w@host/x"])
    assert (args.file, args.variant) == ("b.yaml", "x")
    out = capsys.readouterr().out
    assert "-f given twice (a.yaml, then b.yaml); the last counts: -f b.yaml" in out and "--variant" not in out
    assert "--tracking_uri given twice" in out and "s3cret" not in out and "n3w" not in out, out
    # a text field's two spellings of one number are two values: run names 1e-4 and 0.0001 name two runs
    parser().parse_args(["run", "--run_name", "1e-4", "--run_name", "0.0001"])
    assert "--run_name given twice (1e-4, then 0.0001)" in capsys.readouterr().out


def test_an_unanswering_tracking_server_fails_in_seconds(here):
    import time

    started = time.time()
    done = here("check", "--offline", "--tracking_uri", "http://127.0.0.1:9")
    assert done.returncode == 2 and "does not answer" in done.stderr.strip().splitlines()[-1]
    assert time.time() - started < 60  # MLflow's own retries take minutes


def test_check_reads_the_data_and_estimates_without_training(workdir, here):
    done = here("check", "--offline")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "64 samples of" in done.stdout and "64 held-out questions" in done.stdout and "host RAM" in done.stdout
    assert not (workdir / "mlflow.db").exists()  # nothing recorded


def test_bench_never_writes_over_a_result(workdir, here):
    (workdir / "out").mkdir()
    (workdir / "out" / "cpu.json").write_text("{}")
    done = here("bench", "--offline", "--out", "out")
    assert done.returncode == 2 and "out/cpu.json exists" in done.stderr
    assert (workdir / "out" / "cpu.json").read_text() == "{}"


def test_a_deleted_experiment_is_restored_and_said_so(workdir):
    done = dsnb("run", "--offline", "--max_steps", "1", "--eval_samples", "0", "--save_model", "false", cwd=workdir)
    assert done.returncode == 0, done.stderr[-2000:]
    client = mlflow.MlflowClient(f"sqlite:///{workdir}/mlflow.db")
    client.delete_experiment(client.get_experiment_by_name("DeepSpeed_Comparison").experiment_id)  # the UI's delete
    again = dsnb("run", "--offline", "--max_steps", "1", "--eval_samples", "0", "--save_model", "false", cwd=workdir)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "had been deleted in MLflow; restored it" in again.stderr
    exp = client.get_experiment_by_name("DeepSpeed_Comparison")
    assert exp.lifecycle_stage == "active" and len(client.search_runs([exp.experiment_id])) == 2


def test_a_run_name_with_quotes_resumes_and_reruns(workdir, here):
    name = "it's \"quoted\""
    flags = ["--offline", "--max_steps", "2", "--eval_samples", "0", "--run_name", name, "--save_model", "false"]
    assert dsnb("run", *flags, cwd=workdir).returncode == 0
    done = here("run", *flags, "--resume")
    assert done.returncode == 2 and "nothing to resume" in done.stderr and "Traceback" not in done.stderr


def test_host_ram_beyond_the_budget_is_refused_before_loading_or_warned(here):
    big = ["check", "--offline", "--model", "synthetic:llama-3.1-8b", "--quantization", "none", "--strategy", "zero3",
           "--offload_param", "cpu", "--offload_optimizer", "cpu", "--ram_budget_gb", "12.7"]
    done = here(*big)
    assert done.returncode == 2 and "GB of host RAM" in done.stderr and "ram_budget_gb is 12.7" in done.stderr
    warned = here(*big, "--host_ram_check", "warn", "--max_length", "64", "--num_samples", "8")
    assert warned.stdout.count("dsnb: warning: this run needs about") == 1, warned.stdout  # the check's and the plan's
    assert "trying anyway (host_ram_check warn)" in warned.stdout and "set host_ram_check warn" not in warned.stdout
    # on the CPU the check counts what the plan prints: a budget above the plan's figure passes
    import re

    plain = ["check", "--offline", "--quantization", "none"]
    shown = float(re.search(r"host RAM about ([\d.]+) GB", here(*plain).stdout).group(1))
    assert here(*plain, "--ram_budget_gb", f"{shown + 0.1:.1f}").returncode == 0


def one_line_error(done) -> str:
    """The one line a refused command prints (exit 2, no traceback)."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("dsnb: error: "), done.stderr[-3000:]
    return lines[0]


@pytest.mark.parametrize("content, message", [
    ('{"variants": [{"name": "tutorial", "samples_per_second": "fast"}]}',
     "variant 'tutorial' has samples_per_second 'fast'; it must be a number or null"),
    ('{"variants": [{"name": "tutorial", "tokens_per_second": [1, 2]}]}',
     "variant 'tutorial' has tokens_per_second '[1, 2]'; it must be a number or null"),
    ('{"variants": [{"name": "tutorial", "ratio_to_tutorial": true}]}', "has ratio_to_tutorial 'True'"),
    ('{"variants": [{"name": "a"}], "variants": []}', "the key 'variants' is given twice in one object"),
    ('{"variants": ' + "[" * 50000 + "]" * 50000 + "}", "is nested too deeply to read; give a bench result's JSON"),
])
def test_a_bench_baseline_is_checked_whole_before_anything_runs(workdir, content, message):
    """Every number the regression check reads of a baseline is one, and the file is read whole, before a bench
    starts: never a RecursionError, nor a bench run through to a TypeError."""
    (workdir / "base.json").write_text(content)
    done = dsnb("bench", "--offline", "--only", "tutorial", "--repeats", "1", "--untimed", "1", "--steps", "1",
                "--baseline", "base.json", "--out", "out", cwd=workdir)
    line = one_line_error(done)
    assert "--baseline base.json" in line and message in line
    assert not (workdir / "out").exists() and not (workdir / "mlflow.db").exists()


def test_sqlite_uris_that_sqlalchemy_and_mlflow_read_apart_are_refused_on_every_path(workdir, here):
    """SQLAlchemy decodes a percent-escape in an SQLite URI (sqlite:///a%3Fb/mlflow.db is the file a?b/mlflow.db),
    MLflow makes the folder as written: every command refuses such a URI in one line, creating nothing (no folder,
    no .creating file); a working directory whose name would put one in the store's absolute URI too."""
    for uri, escape in (("sqlite:///a%3Fb/mlflow.db", "%3F"), ("sqlite:///a%20b/mlflow.db", "%20")):
        for args in (["check", "--offline"], ["ui"], ["export", "-o", "s.zip"]):
            done = here(*args, "--tracking_uri", uri)
            assert done.returncode == 2 and f"SQLAlchemy reads {escape} in the store's path" in done.stderr, args
        line = one_line_error(dsnb("run", "--offline", "--max_steps", "1", "--tracking_uri", uri, cwd=workdir))
        assert f"SQLAlchemy reads {escape} in the store's path ({workdir}/a{escape}b/mlflow.db) as" in line
    odd = workdir / "runs%20here"
    odd.mkdir()
    line = one_line_error(dsnb("check", "--offline", cwd=odd))
    assert f"SQLAlchemy reads %20 in the store's path ({odd}/mlflow.db) as ' '" in line
    assert sorted(p.name for p in workdir.iterdir()) == ["runs%20here"] and not list(odd.iterdir())
    (workdir / "a b").mkdir()  # written as it is, a space needs no escape
    assert here("check", "--offline", "--tracking_uri", "sqlite:///a b/mlflow.db").returncode == 0


def test_a_store_missing_a_table_is_refused_before_a_run_opens(workdir):
    """A store of this MLflow's schema with a table dropped (by hand, or another tool) passed the pre-flight, then the
    run died with a traceback and stayed RUNNING: now the table is named before any run is opened."""
    import sqlite3

    from dsnb.tracking import mlflow_client

    mlflow_client(f"sqlite:///{workdir}/mlflow.db").search_experiments()  # a whole new store
    with sqlite3.connect(workdir / "mlflow.db") as con:
        con.execute("DROP TABLE latest_metrics")
    line = one_line_error(dsnb("run", "--offline", "--max_steps", "1", "--save_model", "false", cwd=workdir))
    assert "mlflow.db is an MLflow store that lacks its table latest_metrics" in line and "mv mlflow.db" in line
    with sqlite3.connect(workdir / "mlflow.db") as con:
        assert con.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 0  # no run was opened


def test_ui_on_a_file_that_is_not_a_store_is_refused(workdir):
    import sqlite3

    (workdir / "notes.txt").write_text("not a database")
    (workdir / "empty.db").write_bytes(b"")
    with sqlite3.connect(workdir / "other.db") as con:
        con.execute("CREATE TABLE t (x)")
    for name, message in (("notes.txt", "notes.txt is not a readable MLflow store"),
                          ("empty.db", "there is no store at"),
                          ("other.db", "other.db is an SQLite database but not an MLflow store")):
        done = dsnb("ui", "--tracking_uri", f"sqlite:///{name}", cwd=workdir)
        assert message in one_line_error(done) and "mlflow ui" not in done.stdout


def test_credentials_in_a_tracking_uri_are_never_printed(workdir, here):
    """However the user and password parse (an unencoded @ or a quote in the password, a token as the user) and
    whatever query parameter holds a secret, no command prints them: run, check, ui, export."""
    uris = ["http://me:p@ss-SECRET@127.0.0.1:9", "http://me:pa'ss\"SECRET@127.0.0.1:9", "https://SECRET@127.0.0.1:9",
            "http://127.0.0.1:9/?token=SECRET", "http://127.0.0.1:9/x?user=me&access_token=SECRET&sig=SECRET"]
    for uri in uris:
        for args in (["run", "--offline"], ["check", "--offline"], ["ui"], ["export"]):
            done = here(*args, "--tracking_uri", uri)
            assert "SECRET" not in done.stdout + done.stderr and "127.0.0.1:9" in done.stdout + done.stderr, (uri, args)
    done = dsnb("run", "--offline", "--tracking_uri", "http://me:p@ss'SECRET@127.0.0.1:9/?password=SECRET",
                cwd=workdir)
    assert "SECRET" not in one_line_error(done) and "holds a query, which MLflow cannot use" in done.stderr


def test_every_commands_help_prints_every_field_it_takes(capsys):
    """`--help` is where every error about a flag sends the user: it prints for dsnb and each of its commands, each
    field that a command takes listed with its text (a field's text with a % once made argparse raise instead)."""
    import argparse

    from dsnb.cli import parser
    from dsnb.config import field_names

    top = parser()
    commands = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert {"run", "check", "compare", "sweep", "bench", "capacity", "advise"} <= set(commands)
    for words in [[]] + [[name] for name in commands]:
        with pytest.raises(SystemExit) as done:
            top.parse_args([*words, "--help"])
        shown = capsys.readouterr().out
        assert done.value.code == 0 and shown.startswith("usage: python -m dsnb"), (words, shown[-500:])
        if words and any(a.dest == "strategy" for a in commands[words[0]]._actions):
            assert all(f"--{name} V" in shown for name in field_names()), words
    assert "within 0.03%;" in " ".join(commands["run"].format_help().split())


@pytest.mark.integration
def test_a_run_on_two_processes_started_by_dsnb_prints_its_summary(workdir):
    """`dsnb run --num_gpus 2` starts torchrun itself, then prints what its ranks recorded, as a one-process run does
    (it ended with nothing but exit 0 and no run id)."""
    done = subprocess.run([sys.executable, "-m", "dsnb", "run", "--offline", "--num_gpus", "2", "--strategy", "zero2",
                           "--quantization", "none", "--max_steps", "2", "--num_samples", "16", "--max_length", "64",
                           "--eval_samples", "0", "--save_model", "false", "--verbose"], cwd=workdir,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    head = next(line for line in done.stdout.splitlines() if ": finished" in line)
    run_id = head.split("(run ")[1].split(")")[0]
    run = mlflow.MlflowClient(f"sqlite:///{workdir}/mlflow.db").get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.params["num_gpus"] == "2"
    assert f"{'samples_per_second':>28}: " in done.stdout  # --verbose: every metric


def test_ui_and_export_open_the_store_of_a_results_folder(workdir, here):
    """The folder a compare wrote (--results_folder) opens as it was given to the run; with --tracking_uri too, one
    line says to give one."""
    from dsnb.config import RunConfig
    from dsnb.tracking import create_run

    folder = workdir / "results"
    create_run(RunConfig.layered({"results_folder": str(folder)}, offline=True))
    shown = here("ui", "--results_folder", str(folder))
    assert shown.returncode == 0 and f"--backend-store-uri sqlite:///{folder}/mlflow.db " in shown.stdout
    done = here("export", "--results_folder", str(folder), "-o", "r.zip")
    assert done.returncode == 0 and "mlflow.db" in zipfile.ZipFile(workdir / "r.zip").namelist()
    both = here("ui", "--results_folder", str(folder), "--tracking_uri", "sqlite:///x.db")
    assert both.returncode == 2 and "not allowed with argument" in both.stderr


def test_a_run_started_with_sigint_ignored_still_stops_on_sigint(workdir):
    """A script's background job (`dsnb run ... &`) starts with SIGINT ignored; kill -INT stops it as Ctrl-C does:
    exit 130, the run recorded KILLED."""
    import signal
    import time

    child = subprocess.Popen([sys.executable, "-m", "dsnb", "run", "--offline", "--max_steps", "400",
                              "--save_model", "false", "--run_name", "bg"], cwd=workdir, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    store = workdir / "mlflow.db"
    deadline = time.time() + 300
    while time.time() < deadline and child.poll() is None:
        time.sleep(1)
        if store.exists() and any(r.info.run_name == "bg" and mlflow.MlflowClient(f"sqlite:///{store}")
                                  .get_metric_history(r.info.run_id, "loss") for r in runs_in(store)):
            break
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=120)
    assert child.returncode == 130, err[-2000:]
    [run] = [r for r in runs_in(store) if r.info.run_name == "bg"]
    assert run.info.status == "KILLED" and "with what it had measured by then" in err


def runs_in(store):
    client = mlflow.MlflowClient(f"sqlite:///{store}")
    return [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]


def test_offline_dsnb_keeps_off_the_hub_whatever_was_imported_first(workdir):
    """DSNB_OFFLINE=1 without the hub's own switch: an unknown hub id fails in one line, with no attempt at the
    unreachable host (huggingface_hub's retry lines), and a notebook that imported huggingface_hub before dsnb is
    offline too."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    done = subprocess.run([sys.executable, "-m", "dsnb", "check", "--model", "some-org/no-such-model"], cwd=workdir,
                          capture_output=True, text=True, env={**env, "DSNB_OFFLINE": "1"}, timeout=300)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "dsnb: error: model 'some-org/no-such-model' is not in the hub's cache (offline: dsnb reads only the hub's "
        "cache); give an existing hub id, a local folder, or synthetic:tiny (--offline: dsnb's own model and data)"], \
        done.stderr
    first = subprocess.run([sys.executable, "-c", "import huggingface_hub.constants as c, datasets.config as d, dsnb; "
                            "print(c.HF_HUB_OFFLINE, d.HF_HUB_OFFLINE)"], capture_output=True, text=True,
                           env={**env, "DSNB_OFFLINE": "1"}, timeout=300)
    assert first.stdout.split() == ["True", "True"], first.stderr[-2000:]
    online = subprocess.run([sys.executable, "-c", "import dsnb, huggingface_hub.constants as c; "
                             "print(c.HF_HUB_OFFLINE)"], capture_output=True, text=True, env=env, timeout=300)
    assert online.stdout.split() == ["False"], online.stderr[-2000:]
