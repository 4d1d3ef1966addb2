"""Faults a user or a machine throws at dsnb, each class ending in one line that names the path or value and what to
change, before anything loads where it can be known, with nothing half-written left behind. The file-system faults run
on real mounts: a read-only bind mount and a tmpfs too small for what is written (skipped where mounting is refused)."""
import contextlib
import json
import os
import pathlib
import sqlite3
import subprocess
import sys
import time
import uuid
import zipfile

import mlflow
import pytest

from dsnb.config import OFFLINE, ConfigError, RunConfig
from dsnb.tracking import create_run, open_store, ui_command


@pytest.fixture
def here(workdir, capsys):
    """`python -m dsnb ...` in this process: exit code and the last line of stderr."""
    from dsnb.cli import main

    def call(*args):
        capsys.readouterr()
        code = main(list(args))
        err = capsys.readouterr().err.strip().splitlines()
        assert code != 2 or (len(err) == 1 and "Traceback" not in err[0]), err
        return code, err[-1] if err else ""

    return call


def mount(*args) -> bool:
    return subprocess.run(["mount", *args], capture_output=True).returncode == 0


@pytest.fixture
def read_only(tmp_path):
    """A folder on a read-only mount (root ignores file modes, so a mode bit would prove nothing)."""
    source, target = tmp_path / "ro-source", tmp_path / "ro"
    source.mkdir()
    target.mkdir()
    (source / "inside").mkdir()
    if not (mount("--bind", str(source), str(target)) and mount("-o", "remount,ro,bind", str(target))):
        pytest.skip("this machine refuses mounts (they need root and CAP_SYS_ADMIN)")
    yield target
    # lazy: detached now, gone once nothing holds it (MLflow keeps a store it read open for the process's life)
    subprocess.run(["umount", "--lazy", str(target)], check=True)


@pytest.fixture
def tiny_disk(tmp_path):
    """A 2 MB tmpfs: full after the first 2 MB written."""
    target = tmp_path / "tiny"
    target.mkdir()
    if not mount("-t", "tmpfs", "-o", "size=2m", "tmpfs", str(target)):
        pytest.skip("this machine refuses mounts (they need root and CAP_SYS_ADMIN)")
    yield target
    subprocess.run(["umount", str(target)], check=True)


def a_store_with_a_run(workdir, size_mb: float = 3) -> str:
    """A store holding one finished run with an artifact of `size_mb` MB of random bytes (zip cannot shrink it)."""
    uri = f"sqlite:///{workdir}/mlflow.db"
    run_id = create_run(RunConfig(**OFFLINE, tracking_uri=uri, run_name="stored"))
    blob = workdir / "blob.bin"
    blob.write_bytes(os.urandom(int(size_mb * 2**20)))
    client = mlflow.MlflowClient(uri)
    client.log_artifact(run_id, str(blob))
    client.set_terminated(run_id)
    blob.unlink()
    return run_id


def test_a_read_only_place_is_refused_before_anything_loads(here, read_only):
    code, err = here("run", "--offline", "--output_dir", str(read_only / "runs"))
    assert code == 2 and "output_dir" in err and "cannot be written to (read-only?)" in err
    code, err = here("run", "--offline", "--tracking_uri", f"sqlite:///{read_only}/mlflow.db")
    assert code == 2 and "is not a folder dsnb can write to (read-only?)" in err
    a_store_with_a_run(pathlib.Path.cwd(), 0.01)
    code, err = here("export", "-o", str(read_only / "store.zip"))
    assert code == 2 and "cannot be written to (read-only?)" in err
    code, err = here("save", "--run_id", "x", "-o", str(read_only / "adapter"))
    assert code == 2 and "cannot be written to (read-only?)" in err
    assert os.listdir(read_only) == ["inside"]


def test_a_full_disk_is_refused_or_leaves_nothing_half_written(here, workdir, tiny_disk):
    a_store_with_a_run(workdir, 3)
    code, err = here("export", "-o", str(tiny_disk / "store.zip"))
    assert code == 2 and "No space left on device" in err and "free space there" in err
    assert os.listdir(tiny_disk) == []  # no .partial, no empty zip
    (tiny_disk / "filler").write_bytes(b"x" * (2 * 2**20 - 64 * 1024))
    code, err = here("run", "--offline", "--output_dir", str(tiny_disk / "runs"))
    assert code == 2 and "output_dir" in err and "MB free but this run writes about" in err


@pytest.mark.parametrize("flags, message", [
    (["--output_dir", "a_file"], "output_dir a_file is a file, not a folder"),
    (["--tracking_uri", "sqlite:///a_folder"], "a_folder is a folder; name the database file in it"),
    (["--tracking_uri", "sqlite:///:memory:"], "keeps the store in memory, so every run is lost"),
    (["--output_dir", "x" * 300], "over the file-name limit of 255"),
    (["--experiment", "e" * 600], "experiment must be at most 250 characters (MLflow's limit; it has 600)"),
    (["--tracking_uri", "postgresql://u:p@127.0.0.1:9/db"], "needs the database driver psycopg2"),
    (["--output_dir", "/".join(["p" * 250] * 18)], "bytes long and dsnb writes up to 256 more under it, over the path "
                                                   "limit of 4096"),
    (["--tracking_uri", "sqlite:///m.db?timeout=30"], "holds a query ('?timeout=30'); give a plain file path"),
    (["--tracking_uri", "sqlite:///file::memory:?cache=shared"], "holds a query ('?cache=shared'); give a plain"),
])
def test_wrong_places_and_values_are_named(here, workdir, flags, message):
    (workdir / "a_file").write_text("")
    (workdir / "a_folder").mkdir()
    code, err = here("check", "--offline", *flags)
    assert code == 2 and message in err, err
    assert "u:p@" not in err
    assert sorted(p.name for p in workdir.iterdir()) == ["a_file", "a_folder"]  # nothing made on the way


def test_a_store_whose_writer_was_killed_mid_write_is_read(here, workdir):
    """A process SIGKILLed inside a write (a dsnb whose kernel was killed while it logged) leaves the store's journal
    behind; the next reader rolls the write back, as SQLite and MLflow do. The store is whole and is used as it is,
    never called unreadable (a read-only look at it fails on that journal)."""
    run_id = a_store_with_a_run(workdir, 0.01)
    writer = subprocess.Popen([sys.executable, "-c", """
import sqlite3, sys
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.execute("PRAGMA cache_size = 1")
con.execute("BEGIN IMMEDIATE")
for i in range(20000):
    con.execute("INSERT INTO tags (key, value, run_uuid) VALUES (?, ?, ?)", (f"k{i}", "x" * 200, sys.argv[2]))
print("inside", flush=True)
sys.stdin.read()
""", str(workdir / "mlflow.db"), run_id], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert writer.stdout.readline() == "inside\n"
    writer.kill()
    writer.wait()
    assert (workdir / "mlflow.db-journal").exists()
    code, err = here("check", "--offline")
    assert code == 0, err
    tags = mlflow.MlflowClient(f"sqlite:///{workdir}/mlflow.db").get_run(run_id).data.tags
    assert not any(key.startswith("k") for key in tags)  # the killed write was rolled back


def test_a_cache_folder_that_cannot_be_written_is_named(here, workdir, read_only, monkeypatch):
    monkeypatch.setenv("DSNB_CACHE", str(read_only / "cache"))
    code, err = here("check", "--offline")
    assert code == 2 and "DSNB_CACHE" in err and "cannot be written to" in err
    (workdir / "cache_file").write_text("")
    monkeypatch.setenv("DSNB_CACHE", str(workdir / "cache_file"))
    code, err = here("check", "--offline")
    assert code == 2 and "DSNB_CACHE" in err and "is a file, not a folder" in err


def test_a_locked_store_is_refused_in_seconds(here, workdir):
    a_store_with_a_run(workdir, 0.01)
    holder = sqlite3.connect(workdir / "mlflow.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # a database browser with a write open
    try:
        started = time.time()
        code, err = here("check", "--offline")
        assert code == 2 and "is locked by another program" in err
        assert time.time() - started < 30
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert here("check", "--offline")[0] == 0


@pytest.mark.parametrize("content, message", [
    (b"{not json", "is not a bench result's JSON"),
    (b"\x89PNG\r\n\x1a\n\x00\x00", "is not a bench result's JSON"),
    (b"[1, 2]", "holds no bench variants"),
    (b'{"variants": "none"}', "holds no bench variants"),
    (b'{"variants": []}', "holds no bench variants"),  # nothing to compare: never "no regression"
    (b'{"variants": [{"name": "tutorial", "ratio_to_tutorial": "fast"}]}',
     "variant 'tutorial' has ratio_to_tutorial 'fast'; it must be a number or null"),
])
def test_a_bench_baseline_of_the_wrong_shape_is_named(here, workdir, content, message):
    (workdir / "base.json").write_bytes(content)
    code, err = here("bench", "--offline", "--baseline", "base.json")
    assert code == 2 and "--baseline base.json" in err and message in err


def test_bench_out_naming_a_file_is_refused_before_any_run(here, workdir):
    (workdir / "results").write_text("")
    code, err = here("bench", "--offline", "--out", "results")
    assert code == 2 and "--out results is a file" in err
    assert not (workdir / "mlflow.db").exists()


def test_a_deepspeed_config_whose_precision_contradicts_the_run_is_named(here, workdir):
    (workdir / "ds.json").write_text(json.dumps({"fp16": {"enabled": True}, "zero_optimization": {"stage": 2}}))
    code, err = here("check", "--offline", "--strategy", "zero2", "--ds_config_path", "ds.json")
    assert code == 2 and "fp16.enabled is True but the run's dtype is fp32" in err
    (workdir / "ds3.json").write_text(json.dumps({"zero_optimization": {"stage": 3}}))  # the stage contradicts it too
    code, err = here("check", "--offline", "--strategy", "zero2", "--ds_config_path", "ds3.json")
    assert code == 2 and "zero_optimization.stage is 3 but strategy is zero2" in err


@pytest.mark.parametrize("text, message", [
    ("strategy: zero1\nstrategy: zero2\n", "'strategy' is given twice"),
    ("[]\n", "must hold field: value pairs, not list"),
    ("false\n", "must hold field: value pairs, not bool"),
])
def test_a_yaml_file_dsnb_would_misread_is_refused(here, workdir, text, message):
    (workdir / "v.yaml").write_text(text)
    code, err = here("check", "--offline", "-f", "v.yaml")
    assert code == 2 and "v.yaml" in err and message in err
    (workdir / "s.yaml").write_text("variants:\n  - {run_name: a}\n  - {run_name: b}\nvariants: []\n")
    code, err = here("sweep", "--offline", "-f", "s.yaml")
    assert code == 2 and "'variants' is given twice" in err
    (workdir / "c.yaml").write_text("models: [synthetic:tiny]\nbudgets_gb: [15]\n"
                                    "variants:\n  a: {}\n  a: {lora_r: 0}\n")
    code, err = here("capacity", "--offline", "-f", "c.yaml")
    assert code == 2 and "'a' is given twice" in err
    (workdir / "m.yaml").write_text("models: [synthetic:tiny, synthetic:tiny]\nbudgets_gb: [15]\nvariants:\n  a: {}\n")
    code, err = here("capacity", "--offline", "-f", "m.yaml")
    assert code == 2 and "models entry 'synthetic:tiny' is given twice" in err


@pytest.mark.parametrize("name, value, message", [
    ("DSNB_OFFLINE", "maybe", "DSNB_OFFLINE is 'maybe'; set it to 1"),
    ("DSNB_CUDAGRAPHS", "0", "DSNB_CUDAGRAPHS is no longer read: set the run-config field cuda_graphs"),
    ("DSNB_OFLINE", "1", "DSNB_OFLINE is not a variable dsnb reads"),
])
def test_an_environment_switch_dsnb_does_not_understand_is_an_error(here, monkeypatch, name, value, message):
    monkeypatch.setenv(name, value)
    code, err = here("check", "--offline")
    assert code == 2 and message in err


def test_reading_commands_never_create_a_store(here, workdir):
    code, err = here("save", "--run_id", "abc", "-o", "out", "--tracking_uri", "sqlite:///typo.db")
    assert code == 2 and "there is no store at" in err
    code, err = here("ui", "--tracking_uri", "sqlite:///typo.db")
    assert code == 2 and "there is no store at" in err
    code, err = here("ui", "--tracking_uri", "typo.db")  # no scheme: MLflow's file store, never a command to open it
    assert code == 2 and "'typo.db' is a file store" in err and "use sqlite:///typo.db" in err
    assert not (workdir / "typo.db").exists() and not (workdir / "out").exists()


def test_export_refuses_what_would_lose_or_loop(here, workdir):
    a_store_with_a_run(workdir, 0.01)
    (workdir / "link").symlink_to(workdir / "mlartifacts")
    for dest, message in (("", "give a file name"),
                          ("mlartifacts/x.zip", "would sit inside the store's own artifacts"),
                          ("link/y.zip", "would sit inside the store's own artifacts")):
        code, err = here("export", "-o", dest)
        assert code == 2 and message in err, err
    (workdir / "corrupt").mkdir()
    (workdir / "corrupt" / "mlflow.db").write_bytes(b"SQLite format 3\x00" + os.urandom(4096))
    code, err = here("export", "--tracking_uri", "sqlite:///corrupt/mlflow.db", "-o", "c.zip")
    assert code == 2 and "is not a readable MLflow store" in err
    assert sorted(p.name for p in workdir.iterdir() if p.suffix in (".zip", ".partial")) == []
    code, err = here("export", "-o", "new/folder/store.zip")  # a folder not made yet is made, as results_folder is
    assert code == 0 and zipfile.is_zipfile(workdir / "new" / "folder" / "store.zip"), err


def test_the_ui_command_is_quoted_for_the_shell_and_names_the_store(workdir):
    folder = workdir / "my runs"
    command = ui_command(f"sqlite:///{folder}/mlflow.db")
    assert f"--backend-store-uri 'sqlite:///{folder}/mlflow.db' --host 127.0.0.1" in command
    assert "***@" in ui_command("http://user:secret@host:5000") and "secret" not in ui_command("http://u:secret@h")
    assert ui_command("https://mlflow.example:5000") == ("https://mlflow.example:5000 (the tracking server's own UI: "
                                                         "open it in a browser)")


def test_a_zip_that_is_no_store_is_named(workdir):
    (workdir / "dsnb_mlflow.zip").write_bytes(b"PK\x03\x04 cut short")
    with pytest.raises(ConfigError, match="dsnb_mlflow.zip is not a readable zip"):
        open_store("dsnb_mlflow.zip")
    assert not (workdir / "dsnb_mlflow").exists()


@pytest.mark.parametrize("texts", [[], [""], ["  ", "\n"]])
def test_a_data_file_with_no_answer_at_all_is_refused(here, workdir, texts):
    rows = [{"question": f"question {i}?", "answers": {"text": texts}} for i in range(70)]
    (workdir / "empty.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    code, err = here("check", "--offline", "--dataset", "empty.jsonl")
    assert code == 2 and "has an empty answer" in err


def test_a_plan_says_when_no_step_is_timed(here, workdir, capsys):
    from dsnb.cli import main

    assert main(["check", "--offline", "--max_steps", "1"]) == 0
    assert "leaves none of the 1 steps timed" in capsys.readouterr().out
    # a warm-up longer than the run and a checkpoint interval past its end are said, with what they leave
    assert main(["check", "--offline", "--max_steps", "4", "--lr_warmup_steps", "100", "--checkpoint_steps", "50",
                 "--checkpoint_minutes", "0"]) == 0
    out = capsys.readouterr().out
    assert "lr_warmup_steps 100 is more than max_steps 4: the learning rate rises to about 8e-06, never to its 0.0002" \
        in out and "checkpoint_steps 50 is more than max_steps 4: no checkpoint at a step; a killed run starts again" \
        in out, out
    assert main(["check", "--offline", "--quantization", "none", "--lora_r", "0", "--lora_targets", "all-linear"]) == 0
    said = capsys.readouterr().out
    assert "note: lora_r 0 trains every weight; without effect in this run: lora_targets all-linear" in said


def test_a_push_to_a_name_the_hub_refuses_writes_nothing(here, workdir):
    code, err = here("save", "--run_id", uuid.uuid4().hex, "-o", "pushed", "--push_to", "me/bad name!!",
                     "--token", "hf_x")
    assert code == 2 and "which the hub does not take as a repository name" in err
    assert not (workdir / "pushed").exists()


def test_credentials_are_masked_wherever_a_uri_is_shown():
    with contextlib.suppress(ConfigError):
        RunConfig(tracking_uri="http://me:hf_topsecret@host:5000", experiment="")
    try:
        RunConfig(tracking_uri="http://me:hf_topsecret@host:5000", experiment="")
    except ConfigError as e:
        assert "topsecret" not in str(e) and "topsecret" not in "".join(e._render_traceback_())
    error = ConfigError("tracking_uri https://me:hf_topsecret@host/x does not answer")
    assert str(error) == "tracking_uri https://***@host/x does not answer"


def test_an_export_to_a_full_disk_blames_the_destination(here, workdir, tiny_disk):
    """A small store copied onto a full disk: SQLite says "database or disk is full" while it copies, which is the
    destination's fault, never the store's."""
    a_store_with_a_run(workdir, 0.01)
    (tiny_disk / "filler").write_bytes(b"x" * (2 * 2**20 - 128 * 1024))
    code, err = here("export", "-o", str(tiny_disk / "store.zip"))
    assert code == 2 and f"could not write {tiny_disk / 'store.zip'} (No space left on device" in err, err
    assert "not a readable MLflow store" not in err
    assert os.listdir(tiny_disk) == ["filler"]


def test_a_full_cache_is_refused_and_a_failed_build_leaves_nothing(here, workdir, tiny_disk, monkeypatch):
    """A synthetic model built into a cache with no room: refused before anything loads; a build that fails all the
    same (the disk filled meanwhile) leaves no temporary folder and names DSNB_CACHE."""
    from dsnb.model import build_synthetic

    (tiny_disk / "filler").write_bytes(b"x" * (2 * 2**20 - 300 * 1024))
    monkeypatch.setenv("DSNB_CACHE", str(tiny_disk / "cache"))
    code, err = here("check", "--offline")
    assert code == 2 and "DSNB_CACHE" in err and "MB free but this run writes about" in err, err
    place = tiny_disk / "cache" / "synthetic-v2"
    with pytest.raises(ConfigError, match="could not build synthetic:tiny in .*No space left on device.*DSNB_CACHE"):
        build_synthetic("tiny", str(place / "tiny"))
    assert os.listdir(place) == []  # no .tiny-xxxx left behind


def test_a_sweep_run_from_a_read_only_folder_is_refused_before_it_starts(here, workdir, read_only):
    notebook = pathlib.Path(__file__).parents[1] / "notebooks" / "02_zero_stages.ipynb"
    (workdir / "s.yaml").write_text(f"notebook: {notebook}\nvariants:\n  - {{run_name: a}}\n")
    os.chdir(read_only)  # the sweep's folder (sweeps/s) would go here; left before the mount is undone
    try:
        code, err = here("sweep", "--offline", "-f", str(workdir / "s.yaml"), "--output_dir", str(workdir / "runs"),
                         "--tracking_uri", f"sqlite:///{workdir}/mlflow.db")
    finally:
        os.chdir(workdir)
    assert code == 2 and "the sweep's output folder (output_dir) sweeps/s" in err and "cannot be written to" in err
    assert not (workdir / "mlflow.db").exists()


def test_a_store_on_a_read_only_mount_can_be_read(here, workdir, read_only):
    """save, export and notebook 03's table read a store where nothing can be written beside it (no lock file)."""
    from dsnb.report import compare_table, find_runs

    source = read_only.parent / "ro-source"  # the same folder, writable: the run is logged there
    done = subprocess.run([sys.executable, "-m", "dsnb", "run", "--offline", "--max_steps", "1", "--eval_samples", "0",
                           "--run_name", "kept"], cwd=source, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    uri = f"sqlite:///{read_only}/mlflow.db"
    [run] = find_runs(uri, "DeepSpeed_Comparison")
    assert compare_table([run]).loc["status", "kept"] == "FINISHED"
    assert here("save", "--run_id", run.run_id, "-o", "saved", "--tracking_uri", uri)[0] == 0
    assert (workdir / "saved").is_dir()
    code, err = here("save", "--run_id", "0" * 32, "-o", "other", "--tracking_uri", uri)
    assert code == 2 and f"run {'0' * 32} is not in {uri}" in err
    assert here("export", "-o", "store.zip", "--tracking_uri", uri)[0] == 0


def older_store(path: pathlib.Path, revision: str) -> None:
    """A store as an older MLflow left it: every migration up to `revision`, none after."""
    import sqlalchemy
    from alembic import command
    from mlflow.store.db.utils import InitialBase, _get_alembic_config

    engine = sqlalchemy.create_engine(f"sqlite:///{path}")
    InitialBase.metadata.create_all(engine)
    config = _get_alembic_config(f"sqlite:///{path}")
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
    engine.dispose()


def test_a_store_of_another_schema_is_named_with_what_to_do(here, workdir):
    """A store whose last migration was cut short (its alembic_version behind tables already made: what a kill during
    creation leaves) is to be moved away; an older MLflow's whole store is to be upgraded, and then works."""
    mlflow.MlflowClient(f"sqlite:///{workdir}/mlflow.db").search_experiments()
    with contextlib.closing(sqlite3.connect(workdir / "mlflow.db")) as con:
        con.execute("UPDATE alembic_version SET version_num = 'b7e4c1a90f23'")
        con.commit()
    code, err = here("check", "--offline")
    assert code == 2 and "creation was interrupted" in err and "mv mlflow.db mlflow.db.broken" in err, err
    code, err = here("save", "--run_id", "0" * 32, "-o", "out")
    assert code == 2 and "creation was interrupted" in err
    (workdir / "mlflow.db").rename(workdir / "mlflow.db.broken")
    older_store(workdir / "mlflow.db", "b7e4c1a90f23")
    code, err = here("check", "--offline")
    assert code == 2 and "of an older schema (b7e4c1a90f23" in err, err
    command = err.split("upgrade it in place: ")[1]
    assert command == f"cp mlflow.db mlflow.db.bak && mlflow db upgrade sqlite:///{workdir}/mlflow.db"
    subprocess.run(command, shell=True, cwd=workdir, check=True, capture_output=True)
    assert here("check", "--offline")[0] == 0


def test_another_zip_uploaded_under_the_same_name_is_read_not_the_earlier_ones_store(workdir, capsys):
    """Notebook 03 opens an uploaded dsnb_mlflow.zip by unzipping it beside itself once. A new zip uploaded under the
    same name was read as the earlier one's store, silently; now it is unzipped into a folder of its own, and said."""
    from dsnb.report import find_runs
    from dsnb.tracking import export_store

    zips = []
    for name in ("a", "b"):
        (workdir / name).mkdir()
        run_id = a_store_with_a_run(workdir / name, 0.01)
        zips.append((export_store(f"sqlite:///{workdir / name}/mlflow.db", str(workdir / f"{name}.zip")), run_id))
    upload = workdir / "up" / "dsnb_mlflow.zip"
    upload.parent.mkdir()
    opened = []
    for path, _ in zips:
        upload.write_bytes(pathlib.Path(path).read_bytes())
        uri = open_store(str(upload))
        opened.append((uri, [r.run_id for r in find_runs(uri, "DeepSpeed_Comparison")]))
    assert [ids for _, ids in opened] == [[run_id] for _, run_id in zips]
    assert opened[0][0] != opened[1][0] and (workdir / "up" / "dsnb_mlflow" / "mlflow.db").is_file()  # both kept
    assert "is not the zip unzipped into" in capsys.readouterr().out
    assert open_store(str(upload)) == opened[1][0]  # the same zip again: its folder, nothing unzipped anew
    # a folder an earlier dsnb unzipped carries no digest: a zip under its name is unzipped apart, not read as it
    (workdir / "up" / "dsnb_mlflow" / ".dsnb_zip").unlink()
    upload.write_bytes(pathlib.Path(zips[0][0]).read_bytes())
    uri = open_store(str(upload))
    assert uri != opened[0][0] and [r.run_id for r in find_runs(uri, "DeepSpeed_Comparison")] == [zips[0][1]]
