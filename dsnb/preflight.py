"""Every check of this machine and a config before anything loads, run once per process and config.

    device = pick_device()
    check(cfg, device)          # raises ConfigError (exit 2, one line) for what the user must change

Checks that need the machine live here (GPU, files, disks, DeepSpeed's op builds); what a config can
say about itself alone is RunConfig's own validation.
"""
from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import shlex
import shutil
import sqlite3
import sys
import tempfile
import time
import uuid

from .config import ConfigError, RunConfig, check_environment, describe, preset_fields, sqlite_path
from .estimate import disk_mb, estimate_memory, host_ram_mb, stored_bytes, total_params, trainable_params
from .model import SYNTHETIC_VERSION, cache_dir, check_architecture, model_config, resolve_model, synthetic_shape
from .zero import deepcompile_asked, read_ds_config

CPU_ADAM_BUILD_MIN = "2-3"  # measured on the 2-core development machine
BUILDER_FILE = "dsnb-builder"  # in an op's build folder, beside torch's lock: see builder_lock
_CHECKED: set[str] = set()  # configs this process has already checked (a sweep's kernel sees each twice)


def pick_device() -> str:
    """cuda:<local rank>, or cpu (then DeepSpeed is told so, rather than guessing with a warning at every import)."""
    import torch

    if torch.cuda.is_available():
        return f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    return "cpu"


def device_name(device: str) -> str:
    """The GPU's name for a cuda device, else "cpu"."""
    if not device.startswith("cuda"):
        return "cpu"
    import torch

    return torch.cuda.get_device_name(device)


def this_machine() -> str:
    """This host and the device its runs train on: where a bench's or capacity map's interrupted runs may be kept."""
    import socket

    return f"{socket.gethostname()} {device_name(pick_device())}"


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", 1))


def run_world(cfg: RunConfig) -> int:
    """The processes cfg's run trains in: a launcher's WORLD_SIZE, else the num_gpus dsnb starts its launcher with."""
    return world_size() if "WORLD_SIZE" in os.environ else cfg.num_gpus


def is_rank0() -> bool:
    return int(os.environ.get("RANK", 0)) == 0


def gpu_ids(visible: str | None, count: int) -> list[str]:
    """The first `count` GPUs of a CUDA_VISIBLE_DEVICES value (unset: 0, 1, ...), as its entries."""
    ids = [g.strip() for g in visible.split(",") if g.strip()] if visible else [str(i) for i in range(count)]
    return ids[:count]


def pin_one_gpu(cfg: RunConfig) -> None:
    """Before CUDA starts: a one-process run gets one GPU, or the HF Trainer would spread it over every visible
    GPU with DataParallel (a launcher's ranks, with WORLD_SIZE set, each pick their own)."""
    if "WORLD_SIZE" not in os.environ and cfg.num_gpus == 1:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu_ids(os.environ.get("CUDA_VISIBLE_DEVICES"), 1)[0]


def check(cfg: RunConfig, device: str | None = None) -> None:
    """Everything that can be known before loading: raise ConfigError naming what to change."""
    check_environment()
    device = pick_device() if device is None else device
    key = json.dumps([cfg.to_dict(), device, world_size(), os.getcwd()] +  # relative paths are the folder's
                     [os.environ.get(name) for name in ("TORCH_CUDA_ARCH_LIST", "DSNB_CACHE")], sort_keys=True)
    if key in _CHECKED:
        return
    # before the GPU's free memory is read and the store opened: an orphan holds both (on the CPU, only its store)
    wait_for_orphans(None if device.startswith("cuda") else cfg.tracking_uri)
    check_device(cfg, device)
    check_store(cfg.tracking_uri)
    world = run_world(cfg)
    if cfg.samples_per_step(world) > cfg.num_samples:  # filled: rows, each of a sample or more (plan() counts them)
        unit = "rows" if cfg.padding == "filled" else "samples"
        raise ConfigError(f"num_samples is {cfg.num_samples} but one step takes batch_size x grad_accum x "
                          f"{world} process(es) = {cfg.samples_per_step(world)} {unit}; raise num_samples or "
                          "lower batch_size or grad_accum")
    if cfg.dataset not in ("squad", "korquad", "synthetic") and not os.path.isfile(cfg.dataset):
        if os.path.isdir(cfg.dataset):
            raise ConfigError(f"dataset {cfg.dataset!r} is a folder, not a file; give the data file inside it")
        raise ConfigError(f"dataset file {cfg.dataset!r} does not exist; check the path or use dataset=synthetic")
    if cfg.uses_nvme:
        check_nvme_path(cfg.nvme_path)
    if cfg.offload_optimizer != "none":  # DeepSpeed's CPU Adam: built at the run's start unless it is already
        from deepspeed.ops.op_builder import CPUAdamBuilder

        if not op_built(CPUAdamBuilder(), "CPU Adam"):
            print(f"dsnb: DeepSpeed builds its CPU Adam op first: about {CPU_ADAM_BUILD_MIN} minutes on 2 cores, once "
                  "per machine (python -m dsnb prepare builds it ahead)", flush=True)
    if cfg.zero_stage is not None:
        check_comm_lock()
    check_deepcompile(cfg, device)

    check_cache(cfg)
    if not cfg.model.startswith("synthetic:"):
        resolve_model(cfg.model)  # a missing local folder fails here; synthetic builds wait for the run
    check_architecture(cfg.model, model_config(cfg.model))
    check_host_ram(cfg, world, device)
    check_disk(cfg)
    _CHECKED.add(key)


def check_cache(cfg: RunConfig) -> None:
    """The folder a model is built or downloaded into can be written (DSNB_CACHE for synthetic shapes, the hub's cache
    for a hub id), unless what is needed is already there."""

    if cfg.model.startswith("synthetic:"):

        folder = os.path.join(cache_dir(), f"synthetic-v{SYNTHETIC_VERSION}")
        built = all(os.path.isfile(os.path.join(folder, part, name)) for part, name in
                    ((synthetic_shape(cfg.model), "config.json"), ("tokenizer", "tokenizer.json")))
        if not built:
            what = "DSNB_CACHE (where dsnb builds its synthetic models)"
            check_output_folder(cache_dir(), what)
            config = model_config(cfg.model)  # its weights, and 1 MB for the tokenizer and config files
            check_free_space(cache_dir(), total_params(config) * stored_bytes(config) / 2**20 + 1, what,
                             f"the {cfg.model} model it builds there once")
    elif not os.path.isdir(cfg.model):
        from huggingface_hub import constants

        if not constants.HF_HUB_OFFLINE:
            check_output_folder(constants.HF_HUB_CACHE, "the hub's cache (HF_HOME or HF_HUB_CACHE)")


def check_disk(cfg: RunConfig) -> None:
    """output_dir (checkpoints and the saved model) and a local store (its artifacts) can be written and have room."""

    check_output_folder(cfg.output_dir, "output_dir")
    if cfg.results_folder:
        check_output_folder(cfg.results_folder, "results_folder")
    config = model_config(cfg.model)
    runs_mb, store_mb = disk_mb(cfg, config, trainable_params(cfg, config))
    if not cfg.save_model:
        store_mb = 50.0
    db = sqlite_path(cfg.tracking_uri)
    places = [(cfg.output_dir, runs_mb, "output_dir")] + ([(os.path.dirname(os.path.abspath(db)), store_mb,
                                                            "tracking_uri's folder")] if db else [])
    devices: dict[int, float] = {}
    for path, need, _ in places:  # two places on one disk need room for both
        device = os.stat(next(d for d in _parents(os.path.abspath(path)) if os.path.exists(d))).st_dev
        devices[device] = devices.get(device, 0.0) + need
    for path, _, what in places:
        device = os.stat(next(d for d in _parents(os.path.abspath(path)) if os.path.exists(d))).st_dev
        check_free_space(path, devices[device], what)


ORPHAN_WAIT_S = 90  # an orphan stops itself within seconds (launch.watch_parent); one stuck this long is killed
PARENT_ENV = "DSNB_PARENT_PID"  # in a training process's environment: the pid of the dsnb that started it (ENVIRONMENT)


def alive(process) -> bool:
    """Whether a process (a pid, or a psutil.Process: then never another that took its pid) runs; one killed but not
    yet reaped by its parent is a zombie, gone all the same."""
    import psutil

    try:
        process = process if isinstance(process, psutil.Process) else psutil.Process(process)
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:  # ZombieProcess too
        return False


def orphans(tracking_uri: str | None = None) -> list:
    """This user's dsnb training processes on this host (python -m dsnb.child, torchrun's over them) whose dsnb is gone
    (killed with its kernel or terminal): each is stopping itself (launch.watch_parent), recording its run KILLED and
    freeing its GPU memory. Until it has, a run started here would share the GPU with it, and a run resumed from its
    record would race it for the record and the checkpoints. Another user's processes are theirs to judge.
    tracking_uri: only those logging into that store (writes_to), where the GPU is not what they share."""
    import psutil

    found = []
    for process in psutil.process_iter(["cmdline", "uids"]):
        command, uids = process.info["cmdline"] or [], process.info["uids"]
        if process.pid == os.getpid() or uids is None or uids.real != os.getuid() or \
                ("-m", "dsnb.child") not in zip(command, command[1:], strict=False):
            continue
        try:
            parent = int(process.environ().get(PARENT_ENV, "0"))
        except (psutil.Error, ValueError):
            continue
        if parent and not alive(parent) and (tracking_uri is None or writes_to(process, command, tracking_uri)):
            found.append(process)
    return found


def remove_left_folders() -> list[str]:
    """The launch folders (dsnb-* in the temporary folder: a variant's child.json, train.log and progress) left where a
    variant's processes were all killed at once (a SIGKILL to a sweep's whole process group, a kernel and its child
    OOM-killed together), which none of them could remove: removed where the parent named in its child.json has ended
    and no process runs from it. A folder without a readable child.json (being written) is left alone."""
    import psutil

    folders = glob.glob(os.path.join(tempfile.gettempdir(), "dsnb-*"))
    if not folders:
        return []
    used = set()
    for process in psutil.process_iter(["cmdline"]):
        used.update(os.path.dirname(arg) for arg in process.info["cmdline"] or [] if arg.endswith("child.json"))
    removed = []
    for folder in folders:
        try:
            with open(os.path.join(folder, "child.json")) as f:
                parent = int(json.load(f)["parent_pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not alive(parent) and folder not in used:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def writes_to(process, command: list[str], tracking_uri: str) -> bool:
    """Whether a training process may log into the store tracking_uri, as its child file's config says: the same
    SQLite file (a relative path read from the process's own folder), or a store of any other kind on either side (a
    server's address has many spellings). One whose file cannot be read is taken to; one whose file is gone is not:
    it removes its launch folder after its last write to its store."""
    import psutil

    try:
        cwd = process.cwd()
        with open(os.path.join(cwd, command[command.index("dsnb.child") + 1])) as f:
            theirs = sqlite_path(json.load(f)["config"]["tracking_uri"])
    except FileNotFoundError:
        return False
    except (psutil.Error, OSError, ValueError, LookupError, TypeError, AttributeError):
        return True
    ours = sqlite_path(tracking_uri)
    return theirs is None or ours is None or os.path.realpath(os.path.join(cwd, theirs)) == os.path.realpath(ours)


def wait_for_orphans(tracking_uri: str | None = None, timeout: float = ORPHAN_WAIT_S) -> list[int]:
    """Wait for this host's orphans (see orphans; tracking_uri: those of that store) to end, killing any still there
    after timeout; their pids."""
    import psutil

    waiting = orphans(tracking_uri)
    if waiting:
        print(f"dsnb: waiting for {len(waiting)} training process(es) of a dsnb that was stopped (pid "
              f"{', '.join(str(p.pid) for p in waiting)}) to record their run and end", file=sys.stderr, flush=True)
        if not gone(waiting, timeout):
            for process in waiting:
                with contextlib.suppress(psutil.Error):
                    process.kill()  # never another process that took its pid: psutil checks
            gone(waiting, 10)
    return [p.pid for p in waiting]


def gone(processes: list, seconds: float) -> bool:
    """Whether every one of processes has ended within seconds (psutil.wait_procs would wait out a zombie that is
    not this process's child)."""
    deadline = time.time() + seconds
    while any(alive(p) for p in processes):
        if time.time() > deadline:
            return False
        time.sleep(0.2)
    return True


def check_store(uri: str) -> None:
    """The MLflow store can be written: found within seconds, before any model loads (MLflow's own retries take
    minutes to give up on a server that does not answer)."""
    scheme = check_scheme(uri)
    if scheme == "sqlite":
        check_sqlite_store(uri)
    elif scheme in ("http", "https"):
        check_server(uri)
    else:
        check_database(uri, scheme)


def check_scheme(uri: str) -> str:
    """The URI's scheme; a bare path or file: URI (MLflow's file store) is refused, and so are an SQLite URI that
    SQLAlchemy and MLflow would read as two places (check_sqlite_uri) and a server's URI with a query."""
    from urllib.parse import urlparse

    scheme = urlparse(uri).scheme
    if scheme == "" and uri.endswith(".zip"):
        raise ConfigError(f"tracking_uri {uri} is a zip of a store: open it with dsnb.open_store({uri!r}) (notebook 03 "
                          "does), or unzip it and give its mlflow.db as sqlite:///...")
    if uri in ("databricks", "databricks-uc"):  # MLflow's names for a workspace, not a path
        raise ConfigError(f"tracking_uri {uri} (a Databricks workspace) is not a store dsnb runs against; use "
                          "sqlite:///mlflow.db, an http(s):// tracking server, or postgresql/mysql/mssql")
    if scheme in ("", "file"):
        raise ConfigError(f"tracking_uri {uri!r} is a file store, which MLflow 3 deprecates and refuses; "
                          f"use sqlite:///{uri if scheme == '' and uri.endswith('.db') else 'mlflow.db'} (or an "
                          "http:// tracking server)")
    if scheme == "sqlite":
        check_sqlite_uri(uri)
    if scheme in ("http", "https") and urlparse(uri).query:
        raise ConfigError(f"tracking_uri {uri} holds a query, which MLflow cannot use (it adds its API paths after the "
                          "URI); give a token as MLFLOW_TRACKING_TOKEN, or a user and password as "
                          "http://user:password@host")
    return scheme


def check_sqlite_uri(uri: str) -> None:
    """An SQLite URI whose file SQLAlchemy and MLflow agree on. SQLAlchemy, which opens the file, takes what follows a
    "?" as its options and decodes percent-escapes (sqlite:///a%3Fb/mlflow.db is the file a?b/mlflow.db), while MLflow
    makes the folder of the path as written (a%3Fb) and dsnb would check, export and show that one: so a query, a
    percent-escape, or a "?" in the absolute path (the working directory's name, for a relative one) is refused."""
    from urllib.parse import unquote

    if "?" in uri:
        raise ConfigError(f"tracking_uri {uri!r} holds a query ({uri[uri.index('?'):]!r}); give a plain file path "
                          "such as sqlite:///mlflow.db")
    path = sqlite_path(uri)
    if not path or path == ":memory:":  # named as such by check_sqlite_store
        return
    full = os.path.abspath(path)
    odd = re.search(r"%[0-9A-Fa-f]{2}|\?", full)
    if odd and odd.group() == "?":
        raise ConfigError(f"tracking_uri {uri!r}: the store's path {full} holds '?', which an SQLite URI cannot carry "
                          "(SQLAlchemy takes what follows as options); put the store in a folder without '?' in its "
                          "name")
    if odd:
        raise ConfigError(f"tracking_uri {uri!r}: SQLAlchemy reads {odd.group()} in the store's path ({full}) as "
                          f"{unquote(odd.group())!r} and MLflow as written, so they would use two places; write the "
                          "path without percent-escapes (a space or a letter needs none), in a folder whose name "
                          "holds none")


def check_sqlite_store(uri: str) -> None:
    path = sqlite_path(uri) or ""
    if path in (":memory:", "") and uri.rstrip("/").endswith(":memory:"):
        raise ConfigError(f"tracking_uri {uri!r} keeps the store in memory, so every run is lost when its process "
                          "ends; use a file such as sqlite:///mlflow.db")
    if not path or path.endswith("/"):
        raise ConfigError(f"tracking_uri {uri!r} names no database file; use e.g. sqlite:///mlflow.db")
    if os.path.isdir(path):
        raise ConfigError(f"tracking_uri {uri!r}: {path} is a folder; name the database file in it, e.g. "
                          f"sqlite:///{os.path.join(path, 'mlflow.db')}")
    check_path_names(path, "tracking_uri")
    folder = os.path.dirname(os.path.abspath(path))
    existing = next((d for d in _parents(folder) if os.path.exists(d)), "/")
    if not os.path.isdir(existing):
        raise ConfigError(f"tracking_uri {uri!r}: {existing} is a file, not a folder; pick a folder for the store")
    if not _writable(existing):
        raise ConfigError(f"tracking_uri {uri!r}: {existing} is not a folder dsnb can write to (read-only?); "
                          "pick a writable place for the store")
    if os.path.isfile(path):
        if not _is_sqlite(path):
            raise ConfigError(f"tracking_uri {uri!r}: {path} exists and is not an SQLite database; name another file")
        if os.path.getsize(path):
            check_complete(path)
            check_unlocked(uri, path)


def check_complete(db: str) -> None:
    """A ConfigError naming a store this MLflow cannot use as it is, with what to do: one whose creation or migration
    was cut short (tables half-made), one of an older schema (upgradable), one a newer MLflow made, or one of this
    schema that lacks a table or column (changed outside MLflow: MLflow opens it, then a run fails part way)."""
    from urllib.parse import quote

    # Read-write where it can be: a writer killed mid-transaction leaves a journal that its next reader must roll back
    # (a read-only connection fails on it: "attempt to write a readonly database").
    mode = "rw" if os.access(db, os.W_OK) and os.access(os.path.dirname(os.path.abspath(db)), os.W_OK) else "ro"
    try:
        with contextlib.closing(sqlite3.connect(f"file:{quote(os.path.abspath(db))}?mode={mode}", uri=True,
                                                timeout=20)) as con:
            columns = set(con.execute("SELECT m.name, p.name FROM sqlite_master AS m, pragma_table_xinfo(m.name) AS p "
                                      "WHERE m.type = 'table'"))  # xinfo: generated columns too
            tables = {table for table, _ in columns}
            runs = con.execute("SELECT COUNT(*) FROM runs").fetchone()[0] if "runs" in tables else 0
            version = con.execute("SELECT version_num FROM alembic_version").fetchone() \
                if "alembic_version" in tables else None
    except sqlite3.DatabaseError as e:
        if isinstance(e, sqlite3.OperationalError) and "locked" in str(e):  # MLflow's own wait is 20 s too
            raise ConfigError(f"{db} is locked by another program (one holding a transaction open for 20 s or more: a "
                              "database browser, a stuck process); close it and run again") from None
        raise ConfigError(f"{db} is not a readable MLflow store ({describe(e)}); give another tracking_uri, or move it "
                          "away (a run then creates a new store there)") from None
    if tables and not tables & {"alembic_version", "experiments", "runs"}:
        raise ConfigError(f"{db} is an SQLite database but not an MLflow store (none of MLflow's tables is in it); "
                          "give the store the runs were logged to, or another file for a new one")
    held = f"it holds {runs} run(s)" if runs else "it holds no runs"
    if version and not any(t.startswith("_alembic_tmp") for t in tables):
        import mlflow
        from alembic.script import ScriptDirectory
        from mlflow.store.db.utils import _get_alembic_config

        script = ScriptDirectory.from_config(_get_alembic_config(""))
        head = script.get_current_head()
        if version[0] == head:
            check_schema(db, columns, held)
            return
        if version[0] not in {r.revision for r in script.walk_revisions()}:
            raise ConfigError(f"{db} is an MLflow store of schema {version[0]}, made by a newer MLflow than this "
                              f"one ({mlflow.__version__}); pip install -U mlflow, or give another tracking_uri")
        if upgradable(db):
            raise ConfigError(f"{db} is an MLflow store of an older schema ({version[0]}; MLflow {mlflow.__version__} "
                              f"needs {head}) and {held}; upgrade it in place: cp {shlex.quote(db)} "
                              f"{shlex.quote(db + '.bak')} && mlflow db upgrade "
                              f"{shlex.quote('sqlite:///' + os.path.abspath(db))}")
    raise ConfigError(f"{db} is an MLflow store whose creation was interrupted (its tables are half-made; {held}); "
                      f"move it away (mv {shlex.quote(db)} {shlex.quote(db + '.broken')}) and run again, which creates "
                      "a new one")


def check_schema(db: str, columns: set[tuple[str, str]], held: str) -> None:
    """A store at this MLflow's schema holds every table and column of it, (table, column) pairs as SQLite lists
    them."""
    import mlflow.store.db.utils  # noqa: F401  (importing it registers every table MLflow makes)
    from mlflow.store.db.base_sql_model import Base

    tables = {table for table, _ in columns}
    gaps = []
    for name, table in sorted(Base.metadata.tables.items()):
        gaps += [f"table {name}"] if name not in tables else \
            [f"column {name}.{c.name}" for c in table.columns if (name, c.name) not in columns]
    if gaps:
        more = f" and {len(gaps) - 1} more" if len(gaps) > 1 else ""
        raise ConfigError(f"{db} is an MLflow store that lacks its {gaps[0]}{more} (changed outside MLflow; {held}); "
                          f"restore it from a copy, or move it away (mv {shlex.quote(db)} "
                          f"{shlex.quote(db + '.broken')}) and run again, which creates a new one")


def upgradable(db: str) -> bool:
    """Whether MLflow's migrations bring a copy of the store to the current schema (they fail on a store whose last
    migration was cut short part way: `table ... already exists`)."""
    import logging

    import sqlalchemy
    from mlflow.store.db.utils import _upgrade_db

    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, "copy.db")
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as src, \
                contextlib.closing(sqlite3.connect(copy)) as out:
            src.backup(out)
        engine = sqlalchemy.create_engine(f"sqlite:///{copy}")
        loggers = [logging.getLogger(name) for name in ("alembic", "mlflow.store.db.utils")]  # a trial: no notices
        levels = [logger.level for logger in loggers]
        for logger in loggers:
            logger.setLevel(logging.WARNING)
        try:
            _upgrade_db(engine)
            return True
        except Exception:  # alembic's and SQLAlchemy's errors alike: the migrations cannot finish
            return False
        finally:
            engine.dispose()
            for logger, level in zip(loggers, levels, strict=True):
                logger.setLevel(level)


def check_unlocked(uri: str, path: str, wait_s: float = 5.0) -> None:
    """No other program holds the store's write lock (a database browser with a transaction open, a stuck process):
    MLflow would wait, then fail the run mid-way."""
    try:
        con = sqlite3.connect(path, timeout=wait_s, isolation_level=None)
        try:
            con.execute("BEGIN IMMEDIATE")
            con.execute("ROLLBACK")
        finally:
            con.close()
    except sqlite3.OperationalError as e:
        if "locked" in str(e) or "busy" in str(e):
            raise ConfigError(f"tracking_uri {uri!r}: {path} is locked by another program (one holding a write "
                              f"transaction open for {wait_s:.0f} s or more); close it and run again") from None
        raise ConfigError(f"tracking_uri {uri!r}: {path} cannot be written ({describe(e)}); pick another "
                          "place for the store") from None


def check_server(uri: str) -> None:
    """An http(s) tracking server answers /health; a user and password in the URI (else MLFLOW_TRACKING_USERNAME and
    _PASSWORD, as a sweep's kernel gets them) are sent as basic auth, as MLflow's own requests send them."""
    import base64
    import urllib.request
    from urllib.parse import unquote, urlsplit, urlunsplit

    parts = urlsplit(uri)
    url = urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[-1])).rstrip("/") + "/health"
    request = urllib.request.Request(url)
    user, password = (unquote(parts.username or ""), unquote(parts.password or "")) if "@" in parts.netloc else \
        (os.environ.get("MLFLOW_TRACKING_USERNAME", ""), os.environ.get("MLFLOW_TRACKING_PASSWORD", ""))
    if user or password:
        request.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    try:
        urllib.request.urlopen(request, timeout=5)
    except OSError as e:
        raise ConfigError(f"tracking_uri {uri} does not answer ({describe(e)}); start the MLflow server "
                          "or use sqlite:///mlflow.db") from None


DB_DRIVERS = {"postgresql": ("psycopg2", "psycopg2-binary"), "mysql": ("pymysql", "pymysql"),
              "mssql": ("pyodbc", "pyodbc")}


def check_database(uri: str, scheme: str) -> None:
    """A database store MLflow supports, whose driver is installed and which answers."""
    dialect, _, driver = scheme.partition("+")
    if dialect not in DB_DRIVERS:
        raise ConfigError(f"tracking_uri {uri!r}: {scheme} is not a store MLflow takes; use sqlite:///mlflow.db, an "
                          "http(s):// server, or postgresql/mysql/mssql")
    module, package = DB_DRIVERS[dialect] if not driver else (driver, driver)
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise ConfigError(f"tracking_uri {uri!r} needs the database driver {module}, which is not installed; "
                          f"pip install {package}")
    import sqlalchemy

    try:
        engine = sqlalchemy.create_engine(uri, connect_args={"connect_timeout": 5} if dialect != "mssql" else {})
        with engine.connect():
            pass
    except Exception as e:  # the driver's own error types: all mean the store cannot be reached
        raise ConfigError(f"tracking_uri {uri} does not answer ({describe(e)}); check the database or use "
                          "sqlite:///mlflow.db") from None


def check_output_folder(path: str, what: str, empty: bool = False) -> None:
    """A folder dsnb creates or writes into: named, each part within the file-name limit, not a file, under a folder
    that can be written to; with empty, also new or empty (nothing in it is ever written over)."""
    if not path or not path.strip():
        raise ConfigError(f"{what} is empty; give a folder")
    check_path_names(path, what)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"{what} {path} is a file, not a folder; give a folder")
    if empty and os.path.isdir(path) and os.listdir(path):
        raise ConfigError(f"{what} {path} already exists and is not empty; give a new folder")
    check_writable_place(path, what)


STALE_STAGING_S = 3600  # a staged copy nothing has written for this long was left by a process stopped part way


def staging_path(dest: str) -> str:
    """A path beside dest that is dsnb's alone (hidden, with a random part: never a user's file), to write dest into
    whole before renaming it into place; the caller creates it exclusively. dsnb's staged copies of dest that a save,
    export or unzip killed part way left behind (nothing written in them for an hour) are removed first, so they do
    not pile up on Drive."""
    folder, name = os.path.split(os.path.abspath(dest.rstrip(os.sep)))
    for left in glob.glob(os.path.join(glob.escape(folder), f".{glob.escape(name)}.dsnb-*")):
        if time.time() - newest_write(left) > STALE_STAGING_S:
            shutil.rmtree(left, ignore_errors=True) if os.path.isdir(left) else os.remove(left)
    return os.path.join(folder, f".{name}.dsnb-{uuid.uuid4().hex[:12]}")


@contextlib.contextmanager
def staged(dest: str):
    """A path of dsnb's own beside dest (staging_path) for the block to write dest into, file or folder; renamed into
    place when the block ends, and gone whatever happens (a failure leaves nothing half-written behind)."""
    part = staging_path(dest)
    try:
        yield part
        os.replace(part, dest)
    finally:
        if os.path.isdir(part):
            shutil.rmtree(part, ignore_errors=True)
        elif os.path.lexists(part):
            os.remove(part)


def write_new(dest: str, data: str | bytes) -> str:
    """data written to dest whole, and never over a file: staged beside it (staging_path), synced, then linked into
    place, which fails where dest exists (another run finished into the same folder meanwhile): then to the first free
    "name-2.ext", "name-3.ext" ... beside it. A kill while writing leaves no part of dest. Returns the path written."""
    part = staging_path(dest)
    stem, ext = os.path.splitext(dest)
    try:
        with open(part, "xb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        for n in range(1, 1000):
            path = dest if n == 1 else f"{stem}-{n}{ext}"
            try:
                os.link(part, path)
                return path
            except FileExistsError:
                continue
            except OSError:  # a file system without hard links (some FUSE mounts): checked, then renamed
                if not os.path.lexists(path):
                    os.replace(part, path)
                    return path
        raise ConfigError(f"{dest} and 998 numbered copies beside it exist; give another folder")
    finally:
        if os.path.lexists(part):
            os.remove(part)


def newest_write(path: str) -> float:
    """The newest modification time of a file, or of a folder and everything in it."""
    times = [os.path.getmtime(path)]
    for root, dirs, files in os.walk(path):
        times += [os.path.getmtime(os.path.join(root, n)) for n in dirs + files]
    return max(times)


def check_output_file(path: str, what: str) -> None:
    """A new file dsnb writes: named, not a folder, not there yet (never written over), in a folder it can write."""
    if not path or not path.strip() or path.endswith(os.sep):
        raise ConfigError(f"{what} is {path!r}; give a file name such as dsnb_mlflow.zip")
    check_path_names(path, what)
    if os.path.isdir(path):
        raise ConfigError(f"{what} {path} is a folder; give a file name")
    if os.path.exists(path):
        raise ConfigError(f"{what} {path} already exists; give another file name or move it away")
    check_writable_place(path, what)


def check_writable_place(path: str, what: str) -> None:
    existing = next((d for d in _parents(os.path.abspath(path)) if os.path.exists(d)), "/")
    if not os.path.isdir(existing):
        raise ConfigError(f"{what} {path}: {existing} is a file, not a folder; give a path under a folder")
    if not _writable(existing):
        raise ConfigError(f"{what} {path}: {existing} cannot be written to (read-only?); give a writable place")


def check_free_space(path: str, need_mb: float, what: str,
                     writes: str = "its saved model, checkpoints and MLflow's copy") -> None:
    """The disk under path has room for what the run writes there (by default the saved model, its artifact copy,
    checkpoints)."""
    existing = next((d for d in _parents(os.path.abspath(path)) if os.path.exists(d)), "/")
    free_mb = shutil.disk_usage(existing).free / 2**20
    if free_mb < need_mb:
        raise ConfigError(f"{what} {path} has {free_mb:,.1f} MB free but this run writes about {need_mb:,.1f} MB there "
                          f"({writes}); free space or choose another place")


PATH_ROOM = 256  # bytes dsnb adds under a path it is given (run ids, checkpoint folders, artifact and file names)


def check_path_names(path: str, field: str) -> None:
    """Each part of a path fits the file system's name limit (255 bytes on most), and the whole path, with room for
    what dsnb writes under it, its path limit (PATH_MAX: 4096 bytes on Linux)."""
    if "\0" in path:  # no file system takes it (an sqlite URI's %00 decodes to it)
        raise ConfigError(f"{field}: the path {path!r} holds a NUL character, which no file name can; remove it")
    full = os.path.abspath(path)
    for part in full.split(os.sep):
        if len(part.encode()) > 255:
            raise ConfigError(f"{field}: the path's part {part[:40]!r}... is {len(part.encode())} bytes long, over the "
                              "file-name limit of 255; shorten it")
    existing = next(d for d in _parents(full) if os.path.exists(d))
    limit = os.pathconf(existing, "PC_PATH_MAX")
    if len(full.encode()) + PATH_ROOM > limit:
        raise ConfigError(f"{field}: the path {full[:40]!r}... is {len(full.encode())} bytes long and dsnb writes up "
                          f"to {PATH_ROOM} more under it, over the path limit of {limit}; give a shorter path")


def _parents(folder: str):
    while True:
        yield folder
        if os.path.dirname(folder) == folder:
            return
        folder = os.path.dirname(folder)


def _writable(folder: str) -> bool:
    try:
        with tempfile.NamedTemporaryFile(dir=folder):
            return True
    except OSError:
        return False


def _is_sqlite(path: str) -> bool:
    with open(path, "rb") as f:
        header = f.read(16)
    return header in (b"", b"SQLite format 3\x00")


def check_device(cfg: RunConfig, device: str) -> None:
    """Precision, GPU count and memory budget against this machine's devices."""
    import torch

    if cfg.quantization == "fp8":  # first: a T4 user is told about fp8 before being told to use fp16
        from . import fp8  # deferred: it loads torch at import

        fp8.check_device(device)
    if device == "cpu" and cfg.dtype == "fp16":
        preset = f" (the {cfg.preset} preset sets it)" if preset_fields(cfg.preset).get("dtype") == "fp16" else ""
        offline = "" if cfg.model.startswith("synthetic:") else " (or DSNB_OFFLINE=1 for the offline default)"
        raise ConfigError(f"dtype fp16 needs a GPU and this machine has none{preset}; use dtype bf16 or fp32{offline}")
    if device == "cpu" and cfg.attention == "flex":
        raise ConfigError("attention flex needs a GPU (torch's flex attention has no backward pass on the CPU); "
                          "use attention sdpa")
    # is_bf16_supported() says True on a T4 (compute capability 7.5), which emulates bf16 slowly: ask for 8.0.
    if device.startswith("cuda") and cfg.dtype == "bf16" and torch.cuda.get_device_capability(device) < (8, 0):
        raise ConfigError(f"dtype bf16 has no native support on {torch.cuda.get_device_name(device)} (compute "
                          "capability below 8.0: it would run emulated and slow); use dtype fp16")
    if device.startswith("cuda") and cfg.num_gpus > torch.cuda.device_count():
        raise ConfigError(f"num_gpus is {cfg.num_gpus} but this machine has {torch.cuda.device_count()} GPU(s); "
                          f"set num_gpus <= {torch.cuda.device_count()}")
    if cfg.memory_budget_gb:
        if device == "cpu":
            raise ConfigError("memory_budget_gb caps GPU memory and this machine has no GPU; set it to 0")
        total = torch.cuda.get_device_properties(device).total_memory / 2**30
        if cfg.memory_budget_gb > total * 1.05:  # a "15 GB" T4 shows 14.7 GiB: its own size is no error
            raise ConfigError(f"memory_budget_gb is {cfg.memory_budget_gb} but {torch.cuda.get_device_name(device)} "
                              f"has {total:.1f} GB; set at most {total:.0f}")


def check_host_ram(cfg: RunConfig, world: int, device: str, estimate: dict | None = None) -> None:
    """The estimated peak host RAM of this run's processes on this machine fits ram_budget_gb, else what is
    available now; refused (or, with host_ram_check warn, warned) before anything loads. Without a GPU the host also
    holds what the GPU estimate counts (weights, gradients, optimizer; with `estimate`, the plan's, activations and
    attention masks too: before the data is read, those are left out)."""
    import psutil


    config = model_config(cfg.model)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    trainable = trainable_params(cfg, config)
    on_gpu, early = device != "cpu", estimate is None  # early: before the data is read (preflight.check)
    need = host_ram_mb(cfg, config, trainable, world, mapped=False, on_gpu=on_gpu) * local / 1024
    resident = host_ram_mb(cfg, config, trainable, world, on_gpu=on_gpu) * local / 1024
    if not on_gpu:
        estimate = estimate or estimate_memory(cfg, config, trainable, 0, world, on_gpu=False)
        state = estimate["est_peak_gpu_mb"] * local / 1024
        need, resident = need + state, resident + state
    have = cfg.ram_budget_gb or psutil.virtual_memory().available / 2**30
    where = f"ram_budget_gb is {cfg.ram_budget_gb:g}" if cfg.ram_budget_gb else f"this machine has {have:.1f} GB free"
    if need > have:
        held = (" (without a GPU it holds the weights, gradients, optimizer and activations)" if not on_gpu else
                " (the offloaded optimizer states and weights live there)" if cfg.offload_optimizer != "none" or
                cfg.offload_param != "none" else "")
        mapped = (f"; {resident:.1f} GB resident while the weights file is read, whose pages the kernel can drop"
                  if resident - need >= 0.1 else "")  # the plan's figure
        message = f"this run needs about {need:.1f} GB of host RAM{held} but {where}{mapped}"
        if cfg.host_ram_check != "refuse" and early:  # the plan warns, with the data's activations
            return
        if cfg.host_ram_check == "refuse":
            raise ConfigError(f"{message}; use a smaller model, shorter max_length or batch, offload less, or set "
                              "host_ram_check warn to try anyway")
        print(f"dsnb: warning: {message}; trying anyway (host_ram_check warn)")
    elif resident > have and not early:
        print(f"dsnb: note: reading the weights file takes the resident memory to about {resident:.1f} GB while "
              f"{where}; its memory-mapped pages can be dropped by the kernel, so this should load")


def check_nvme_folder(path: str) -> None:
    """The NVMe folder exists, is a folder and can be written to."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"nvme_path {path!r} is a file, not a folder; give a folder on a fast local disk")
    if not os.path.isdir(path):
        raise ConfigError(f"nvme_path {path!r} does not exist; create it on a fast local disk or set nvme_path")
    if not _writable(path):
        raise ConfigError(f"nvme_path {path!r} is not writable; pick a folder you can write to")


def check_nvme_path(path: str) -> None:
    """The NVMe folder exists and is writable, and DeepSpeed's async I/O (libaio) can be built."""
    check_nvme_folder(path)
    from deepspeed.ops.op_builder import AsyncIOBuilder

    if not AsyncIOBuilder().is_compatible(verbose=False):
        raise ConfigError("NVMe offload needs libaio for DeepSpeed's async I/O: run `apt-get install libaio-dev` "
                          "(or use offload cpu)")
    if not op_built(AsyncIOBuilder(), "async I/O"):
        print("dsnb: DeepSpeed builds its async I/O op first (for NVMe): minutes on 2 cores, once per machine",
              flush=True)
    check_arch_list("NVMe I/O")


def check_arch_list(op: str) -> None:
    """DeepSpeed builds some ops at run time (async I/O, DeepCompile's) and reads each architecture in
    TORCH_CUDA_ARCH_LIST as digits ("9.0", "8.6+PTX"); an entry such as "9.0a" makes the build fail with a bare
    ValueError (seen on an H200 image)."""
    arch = os.environ.get("TORCH_CUDA_ARCH_LIST", "")
    bad = [a for a in re.split(r"[;\s]+", arch) if a and not re.fullmatch(r"\d+\.\d+(\+PTX)?", a)]
    if bad:
        raise ConfigError(f"TORCH_CUDA_ARCH_LIST holds {bad[0]!r}, which DeepSpeed cannot build its {op} op for; "
                          "set it to your GPU's compute capability, e.g. TORCH_CUDA_ARCH_LIST=9.0, or unset it")


def op_built(builder, what: str) -> bool:
    """Whether a DeepSpeed op is built (installed with DeepSpeed, or JIT-built here before); a build lock left by a
    killed build is taken over first."""
    import deepspeed.git_version_info as installed

    check_build_lock(builder, what)
    folder = build_folder(builder)
    return bool(installed.installed_ops.get(builder.name)) or os.path.isfile(os.path.join(folder, f"{builder.name}.so"))


def build_folder(builder) -> str:
    """Where torch JIT-builds the op (made if missing): its objects, its .so and torch's build lock, a file named
    `lock` that a build creates and removes when it ends."""
    from torch.utils.cpp_extension import _get_build_directory

    return _get_build_directory(builder.name, False)


@contextlib.contextmanager
def builder_lock(folder: str, wait: bool):
    """dsnb's own lock on a build folder, held while a dsnb process builds there: an flock (the kernel drops it when
    its holder dies, however it dies) on a file that names the holder's process id. Yields whether it is held (never
    False when wait)."""
    import fcntl

    with open(os.path.join(folder, BUILDER_FILE), "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not wait:
                yield False
                return
            f.seek(0)
            print(f"dsnb: process {f.read().strip() or '?'} is building in {folder}; waiting for it", flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        f.truncate(0)
        f.write(str(os.getpid()))
        f.flush()
        yield True


def working_in(folder: str) -> bool:
    """Whether a live process has `folder` as its working directory: torch runs ninja, and ninja the compilers, in
    the build folder, so a build whose python was killed alone still shows here until its compilers end."""
    folder = os.path.realpath(folder)
    for cwd in glob.glob("/proc/[0-9]*/cwd"):
        with contextlib.suppress(OSError):  # a process that ended, or one we may not look at
            if os.readlink(cwd) == folder:
                return True
    return False


LOCK_QUIET_S = 5  # torch's lock is taken over only this old, and with no process building there on two looks this far
# apart: a build that DeepSpeed starts by itself at a run's start holds no builder_lock, and between torch taking its
# lock and ninja starting (or ninja ending and torch letting the lock go) no process works in the folder for a moment


def take_over_lock(folder: str, what: str) -> bool:
    """Remove torch's build lock where no process builds in `folder` (call it holding builder_lock, so that no dsnb
    build is between taking torch's lock and starting ninja); False where a build is still under way."""
    lock = os.path.join(folder, "lock")
    if not os.path.exists(lock):
        return True
    for look in range(2):
        with contextlib.suppress(FileNotFoundError):
            if working_in(folder) or time.time() - os.path.getmtime(lock) < LOCK_QUIET_S:
                return False
        if look == 0:
            time.sleep(LOCK_QUIET_S)
    if not os.path.exists(lock):
        return True
    with contextlib.suppress(FileNotFoundError):
        os.remove(lock)
        print(f"dsnb: took over the build lock of DeepSpeed's {what} op, left by a build that was killed ({lock})",
              flush=True)
    return True


def check_build_lock(builder, what: str) -> None:
    """A build killed part way leaves torch's lock behind, and every later build would wait on it for ever without a
    word: where no process builds there any more, it is taken over at once; a build under way is left to finish."""
    folder = build_folder(builder)
    if not os.path.exists(os.path.join(folder, "lock")):
        return
    with builder_lock(folder, wait=False) as held:
        if not (held and take_over_lock(folder, what)):
            print(f"dsnb: another process is building DeepSpeed's {what} op; this run waits for it", flush=True)


def check_comm_lock() -> None:
    """DeepSpeed's CPU accelerator builds a shared-memory op for its collectives when a ZeRO run starts
    (deepspeed.comm's build_shm_op), with no word from dsnb: a lock left there by a build killed part way stalled every
    later ZeRO run on the CPU without a line, so it is taken over as CPU Adam's is. Other accelerators build none."""
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is not None:
        check_build_lock(builder, "shared-memory comm")


def prepare() -> None:
    """What a fresh machine (Colab) needs once after installing: the GPU reported, DeepSpeed's CPU Adam built (which
    the tutorial's offload variant uses) or, where it was built before, loaded to check it, with how long it took.
    Killed at any moment, the next prepare takes the build over (see check_build_lock)."""
    import torch

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        bf16 = "" if (props.major, props.minor) >= (8, 0) else " (no native bf16: use dtype fp16, or preset colab_t4)"
        print(f"GPU: {props.name}, {props.total_memory / 2**30:.1f} GB, compute capability {props.major}.{props.minor}"
              f"{bf16}")
    else:
        print("No GPU visible: on Colab pick Runtime > Change runtime type > GPU, or set DSNB_OFFLINE=1 to run offline "
              "on the CPU")
    import deepspeed.git_version_info as installed
    from deepspeed.ops.op_builder import CPUAdamBuilder

    builder = CPUAdamBuilder()
    if installed.installed_ops.get(builder.name):
        print("DeepSpeed's CPU Adam is built (installed with DeepSpeed)")
        return
    folder = build_folder(builder)
    library = os.path.join(folder, f"{builder.name}.so")
    with builder_lock(folder, wait=True):
        if not take_over_lock(folder, "CPU Adam"):
            print(f"dsnb: a build's compilers still run in {folder} (its python was killed); waiting for them to end",
                  flush=True)
            while not take_over_lock(folder, "CPU Adam"):
                time.sleep(1)
        before = os.path.getmtime(library) if os.path.isfile(library) else None
        if before is None:
            print(f"Building DeepSpeed's CPU Adam (optimizer offload needs it): about {CPU_ADAM_BUILD_MIN} minutes on "
                  "2 cores, once per machine ...", flush=True)
        started = time.perf_counter()
        builder.load(verbose=False)  # ninja rebuilds what a killed build left unfinished, then the op is imported
    took = time.perf_counter() - started
    rebuilt = before is None or os.path.getmtime(library) != before
    print(f"DeepSpeed's CPU Adam built in {took:.0f} s" if rebuilt else "DeepSpeed's CPU Adam is built (loaded)")


def check_nvme_space(path: str, needed_mb: float) -> None:
    """The NVMe folder has room for what this host's processes swap into it (a plan made alone checks the folder
    here too)."""
    check_nvme_folder(path)
    free_mb = shutil.disk_usage(path).free / 2**20
    if free_mb < needed_mb:
        def size(mb: float) -> str:  # a tiny synthetic model's offload is megabytes: "0.0 GB" would say nothing
            return f"{mb / 1024:.1f} GB" if mb >= 1024 else f"{mb:.0f} MB"

        raise ConfigError(f"nvme_path {path} has {size(free_mb)} free but this run offloads about {size(needed_mb)}; "
                          "free space there or set nvme_path to a larger disk")


def check_deepcompile(cfg: RunConfig, device: str) -> None:
    """DeepCompile, where asked for: not with parameter offload (it failed so on the H200), on a GPU only, and with a
    TORCH_CUDA_ARCH_LIST DeepSpeed can build its op for."""
    own = read_ds_config(cfg, run_world(cfg)) if cfg.ds_config_path else {}
    if cfg.zero_stage is None or not deepcompile_asked(cfg, own):
        return
    if cfg.offload_param != "none":  # measured: benchmarks/results/deepcompile_h200.md
        raise ConfigError(f"DeepSpeed's DeepCompile with offload_param {cfg.offload_param} failed on the H200 (its "
                          "parameter offload left the output layer's weight unallocated in the first compiled "
                          "forward; DeepSpeed 0.19.8, torch 2.11); set deepcompile false (and take "
                          "compile.deepcompile out of ds_config_path's JSON) or set offload_param none")
    if device == "cpu":
        raise ConfigError("DeepSpeed's DeepCompile needs a CUDA GPU (it builds a CUDA op); set deepcompile false "
                          "and take compile.deepcompile out of ds_config_path's JSON, or run on a GPU")
    check_arch_list("DeepCompile")
