"""MLflow tracking: a SQLite store in the working directory, one run per variant, nothing lost.

    run_id = create_run(cfg)              # the parent process opens the run (RUNNING) ...
    with tracked_run(cfg, run_id):        # ... the variant's own process logs into it, FAILED on error
        ...
    export_store("sqlite:///mlflow.db", "dsnb_mlflow.zip")
    ui_command("sqlite:///mlflow.db")     # mlflow ui bound to 127.0.0.1
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import platform
import re
import shlex
import signal
import socket
import sqlite3
import sys
import tempfile
import time
import traceback
import zipfile
from importlib import metadata

from .config import PLACES, RENAMED, ConfigError, RunConfig, describe, predated, redact, sqlite_path
from .metrics import oom_counter, read_oom_count
from .preflight import (alive, check_complete, check_output_file, check_scheme, check_sqlite_uri, staged,
                        wait_for_orphans)

ARTIFACT_DIR = "mlartifacts"  # beside the SQLite file, so the store is one folder to zip
# MLflow's "Downloading artifacts" bars tell a notebook user nothing (dsnb reads small files back); yours, if set, stay.
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
PACKAGES = ("torch", "transformers", "peft", "accelerate", "deepspeed", "bitsandbytes", "datasets", "mlflow",
            "mlflow-skinny", "tokenizers", "GPUtil", "nvidia-ml-py", "papermill", "dsnb")


@dataclasses.dataclass
class RunResult:
    """One variant's MLflow run, as every runner (run_variant, run_all, sweeps, bench) returns it and every
    report reads it."""

    run_id: str
    name: str
    status: str  # FINISHED | FAILED | KILLED | RUNNING, as the store holds it
    tracking_uri: str
    metrics: dict
    returncode: int | None = None  # the training process's exit code; None where no process ran
    wall_seconds: float | None = None  # the training process, start to end
    notebook: str | None = None  # a sweep variant's executed notebook
    skipped: bool = False  # a sweep variant that had already finished

    @classmethod
    def read(cls, tracking_uri: str, run_id: str, **extra) -> "RunResult":
        """The run as the store holds it now."""
        run = mlflow_client(tracking_uri).get_run(run_id)
        return cls(run_id, run.info.run_name, run.info.status, tracking_uri, dict(run.data.metrics), **extra)


def resolve_uri(uri: str) -> str:
    """The URI MLflow is given: a sqlite:/// URI with an absolute path (MLflow caches stores by URI string, so a
    relative one would keep writing to the first working directory's file after a chdir: a notebook's, a test's), and an
    http(s) URI without its user and password, which go to MLflow as MLFLOW_TRACKING_USERNAME and _PASSWORD (its
    documented way), so that no URL MLflow prints or stores holds them."""
    db = sqlite_path(uri)
    if db is not None:
        return f"sqlite:///{os.path.abspath(db)}"
    return without_credentials(uri)


def without_credentials(uri: str) -> str:
    """An http(s) URI without its user and password, which go into this process's environment as
    MLFLOW_TRACKING_USERNAME and _PASSWORD (a process it starts, a sweep's kernel, inherits them); other URIs as they
    are."""
    from urllib.parse import unquote, urlsplit, urlunsplit

    parts = urlsplit(uri)
    if parts.scheme in ("http", "https") and "@" in parts.netloc:
        os.environ["MLFLOW_TRACKING_USERNAME"] = unquote(parts.username or "")
        os.environ["MLFLOW_TRACKING_PASSWORD"] = unquote(parts.password or "")
        return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))
    return uri


def mlflow_client(uri: str):
    """An MlflowClient for `uri` (see resolve_uri); a new SQLite store is created whole first."""
    from mlflow import MlflowClient

    uri = resolve_uri(uri)
    init_store(uri)
    return MlflowClient(uri)


def existing_store(uri: str) -> str:
    """uri, if it names a store that is there and whole: commands that only read (save, export, ui, notebook 03) must
    not create an empty one where a path is mistyped, nor take another file for one."""

    check_scheme(uri)
    db = sqlite_path(uri)
    if db is not None and not (os.path.isfile(db) and os.path.getsize(db)):
        empty = " (an empty file)" if os.path.isfile(db) else ""
        raise ConfigError(f"tracking_uri {uri}: there is no store at {os.path.abspath(db)}{empty}; give the store the "
                          "runs were logged to (python -m dsnb ui --tracking_uri ... shows it)")
    if db is not None:
        check_complete(db)
        relocate_store(db)
    return uri


_READY: set[str] = set()  # stores this process has already seen created
STOPPED: list[str] = []  # runs this process (or its children) ended KILLED on an interrupt, for the message after


def init_store(uri: str) -> None:
    """A new SQLite store is made whole or not at all: migrated in a file of its own beside the database, then renamed
    into place, under a file lock (two processes migrating one fresh file collide; a process stopped while MLflow
    creates the tables would leave them half-made). An existing store that is half-made is named, with what to do."""
    db = sqlite_path(uri)
    if db is None or uri in _READY:
        return
    check_sqlite_uri(uri)  # a path SQLAlchemy would read apart from this one: never a file made elsewhere
    import fcntl
    import glob
    import logging

    logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)  # "Creating initial MLflow database tables"

    folder = os.path.dirname(os.path.abspath(db))
    if os.path.isfile(db) and os.path.getsize(db) and not os.access(folder, os.W_OK):
        check_complete(db)  # a store on a read-only place is only read: no lock beside it (none could be made)
        _READY.add(uri)
        return
    os.makedirs(folder, exist_ok=True)
    with open(db + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for left in glob.glob(glob.escape(db) + ".creating-*"):  # a creation killed part way (the lock is ours now)
            os.remove(left)
        if os.path.isfile(db) and os.path.getsize(db):
            check_complete(db)
            relocate_store(db)
        else:
            create_store(db)
    _READY.add(uri)


@contextlib.contextmanager
def one_at_a_time(uri: str, what: str, progress: bool = True):
    """While the block runs, no other dsnb process runs `what` (a comparison, a bench, ...) on this SQLite store: two
    started at once after a kill both found the killed run and both trained every job again. The second waits (and
    says so), then finds what the first finished. A store where no lock can be taken (a server's, a read-only or
    lockless file system) runs as before."""
    import fcntl

    db = sqlite_path(uri)
    try:
        if db:
            os.makedirs(os.path.dirname(os.path.abspath(db)), exist_ok=True)
        lock = open(f"{db}.{what.replace(' ', '_')}.lock", "a") if db else None  # noqa: SIM115 (held for the block)
    except OSError:
        lock = None
    if lock is None:
        yield
        return
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if progress:
                print(f"dsnb: another dsnb process is running a {what} on {db}; this one waits for it to end, then "
                      "keeps what it finished", flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        except OSError:  # the file system takes no locks
            pass
        yield


def relocate_store(db: str) -> None:
    """A store whose folder was moved or copied (results_folder renamed, a Drive folder copied) still names the old
    folder's artifacts (MLflow records them as absolute paths): its held-out answers were read from there, or not at
    all, and a run resumed into it wrote its files back there. Where the store's own folder holds the artifacts (or the
    old one is gone), every location under the old folder's ARTIFACT_DIR is rewritten to this folder's, and said."""
    root = os.path.dirname(os.path.abspath(db))
    here = os.path.join(root, ARTIFACT_DIR)
    if not os.access(root, os.W_OK):
        return
    with contextlib.closing(sqlite3.connect(db, timeout=20)) as con:
        try:
            locations = [row[0] for row in con.execute("SELECT DISTINCT artifact_location FROM experiments")]
        except sqlite3.OperationalError:  # no experiments table yet
            return
        moved = set()
        for location in locations:
            path = (location or "").removeprefix("file://")
            old, name = os.path.split(path.rstrip("/"))
            if os.path.isabs(path) and name == ARTIFACT_DIR and os.path.realpath(old) != os.path.realpath(root) and (
                    os.path.isdir(here) or not os.path.isdir(path)):  # not another spelling of this folder
                moved.add(old)
        for old in sorted(moved):
            try:
                for table, column in (("experiments", "artifact_location"), ("runs", "artifact_uri")):
                    for prefix in (f"file://{old}/{ARTIFACT_DIR}", f"{old}/{ARTIFACT_DIR}"):
                        con.execute(f"UPDATE {table} SET {column} = ? || substr({column}, ?) WHERE {column} = ? OR "
                                    f"substr({column}, 1, ?) = ?", (here, len(prefix) + 1, prefix, len(prefix) + 1,
                                                                     prefix + "/"))
                con.commit()
            except sqlite3.OperationalError as e:  # a read-only file, a writer holding it: read as it is, and said
                print(f"dsnb: the store {db} was made in {old} and names its runs' files there; they could not be "
                      f"pointed to {here} ({e})", file=sys.stderr)
                return
            print(f"dsnb: the store {db} was made in {old}; its runs' files are now read and written in {here}",
                  file=sys.stderr)


def create_store(db: str) -> None:
    from mlflow import MlflowClient

    part = f"{db}.creating-{os.getpid()}"
    try:
        MlflowClient(f"sqlite:///{part}").search_experiments(max_results=1)  # MLflow creates and migrates the tables
        with open(part, "rb") as f:
            os.fsync(f.fileno())
        os.replace(part, db)
    finally:
        if os.path.exists(part):
            os.remove(part)


def experiment_id(cfg: RunConfig) -> str:
    """Point MLflow at cfg's store and return cfg.experiment's id, creating it beside the database."""
    import mlflow

    uri = resolve_uri(cfg.tracking_uri)
    init_store(uri)
    mlflow.set_tracking_uri(uri)
    exp = mlflow.get_experiment_by_name(cfg.experiment)
    if exp is not None and exp.lifecycle_stage == "deleted":
        # Deleted in the UI (it only moves to the trash): restore it rather than fail on every later command.
        mlflow_client(uri).restore_experiment(exp.experiment_id)
        print(f"dsnb: experiment {cfg.experiment!r} had been deleted in MLflow; restored it with its runs "
              "(to start afresh instead, set experiment to a new name)", file=sys.stderr)
    if exp is not None:
        return exp.experiment_id
    db = sqlite_path(cfg.tracking_uri)
    location = None
    if db is not None:
        location = os.path.join(os.path.dirname(os.path.abspath(db)), ARTIFACT_DIR)
    try:
        return mlflow.create_experiment(cfg.experiment, artifact_location=location)
    except mlflow.exceptions.MlflowException:  # created meanwhile by a concurrent sweep
        return mlflow.get_experiment_by_name(cfg.experiment).experiment_id


def create_run(cfg: RunConfig, tags: dict | None = None, run_id: str | None = None) -> str:
    """Open a RUNNING run named for cfg (or take the open run `run_id`), log the whole config as params. A run taken
    (resumed, or opened by a sweep) keeps the params it has: same_config found it under another spelling of where runs
    are kept, or another count of repeats, and MLflow refuses a param's value changed."""
    from mlflow.entities import Param, RunTag

    experiment = experiment_id(cfg)
    client = mlflow_client(cfg.tracking_uri)
    params = {**logged_params(cfg), **input_digests(cfg)}
    opened = run_id is None
    if opened:
        mark_stale_runs(client)
    try:
        with uninterrupted():  # in interrupts_after_writes: a run opened gets its config before an interrupt
            if opened:
                run_id = client.create_run(experiment, run_name=cfg.name, tags=owner()).info.run_id
            else:
                params = {k: v for k, v in params.items() if k not in client.get_run(run_id).data.params}
            client.log_batch(run_id, params=[Param(k, v) for k, v in params.items()],
                             tags=[RunTag(k, str(v)) for k, v in (tags or {}).items()])
    except BaseException as e:  # the caller never gets the run: end it here, as what stopped it
        if opened and run_id is not None:
            interrupted = isinstance(e, KeyboardInterrupt)
            with contextlib.suppress(Exception):
                client.set_tag(run_id, "failure", "interrupted" if interrupted else type(e).__name__)
                finish(run_id, cfg.tracking_uri, "KILLED" if interrupted else "FAILED")
        raise
    return run_id


@contextlib.contextmanager
def tracked_run(cfg: RunConfig, run_id: str | None = None):
    """The active MLflow run for this process (resumed by id, else new); FAILED if the block raises."""
    import mlflow

    run_id = run_id or create_run(cfg)
    experiment_id(cfg)
    with mlflow.start_run(run_id=run_id) as run:  # start_run ends it FAILED when the block raises
        yield run


def search(client, experiment_ids: list[str], filter_string: str = "", order_by: list[str] | None = None) -> list:
    """Every run matching a filter of fixed attributes (never a user's value: names and paths are compared in
    Python, since a quote in one would break MLflow's filter syntax), all pages."""
    runs, token = [], None
    while True:
        page = client.search_runs(experiment_ids, filter_string, max_results=1000, order_by=order_by,
                                  page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def logged_params(cfg: RunConfig) -> dict[str, str]:
    """The whole config as MLflow params (text), credentials in URIs masked."""
    return {k: redact(str(v)) for k, v in cfg.to_dict().items()}


# The files a run's fields name by path, whose content a field's text does not pin: a comparison, sweep or run_once
# finds a run again only where these are what it trained on (a data file rewritten under the same name is new work)
DIGESTS = {"dataset": "dataset_digest", "ds_config_path": "ds_config_digest", "model": "model_digest"}


def input_digests(cfg: RunConfig) -> dict[str, str]:
    """A digest of each local file or folder a field names (the data file's bytes, a DeepSpeed JSON's, a model folder's
    config.json with its files' names and sizes), as params, by DIGESTS' names; a hub id, "synthetic" or an empty
    field has none."""
    found = {}
    for field, param in DIGESTS.items():
        path = getattr(cfg, field)
        if not path or (field == "dataset" and path in ("squad", "korquad", "synthetic")) or not os.path.exists(path):
            continue  # a hub id or a built-in set, even where a folder of its name is in the working folder
        with contextlib.suppress(OSError):  # unreadable: the run's own checks say so, in their words
            found[param] = _digest(path)
    return found


@functools.lru_cache(maxsize=64)
def _digest_of(path: str, stamp: tuple) -> str:
    import hashlib

    h = hashlib.sha256()
    if os.path.isdir(path):  # a model folder: its own files (not a download tool's dot-folders), config.json's bytes
        for name in sorted(os.listdir(path)):
            file = os.path.join(path, name)
            if name.startswith(".") or not os.path.isfile(file):
                continue
            h.update(f"{name} {os.path.getsize(file)}\n".encode())
            if name == "config.json":
                with open(file, "rb") as f:
                    h.update(f.read())
    else:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:16]


def _digest(path: str) -> str:
    """A file's digest is kept while its time and size stay (a data file is read once a process); a folder's is read
    again each time (a file written inside leaves the folder's own time as it was)."""
    if os.path.isdir(path):
        return _digest_of.__wrapped__(path, ())
    stat = os.stat(path)
    return _digest_of(os.path.realpath(path), (stat.st_mtime_ns, stat.st_size))


def same_config(run, cfg: RunConfig) -> bool:
    """Whether an MLflow run was started with cfg (its other params are measurements): every field but where runs are
    kept (config.PLACES: another spelling of results_folder finds the same runs) and how many repeats a comparison
    asks for (which changes no run). A field the run has no param for (it was made by an earlier dsnb, before the
    field existed) counts as the field's default: a new runtime that installs a newer dsnb finds the finished runs
    again, unless cfg sets the new field otherwise (or the field then meant otherwise: config.predated). A run with no
    config logged at all (killed as it opened) is nobody's."""
    params = run.data.params
    if "model" not in params:
        return False
    # a run that logged a field since renamed (config.RENAMED) predates the rule: every field must be there
    read = params if RENAMED.keys() & params.keys() else params_then(params)
    if not all(read.get(k) == v for k, v in logged_params(cfg).items() if k not in (*PLACES, "repeats")):
        return False
    # a file named by the same path but changed since (a run of an earlier dsnb logged no digest: taken as it is)
    return all(params.get(k, v) == v for k, v in input_digests(cfg).items())


@functools.cache
def default_params() -> dict[str, str]:
    """Every field's default as a logged param (same_config's reading of a field a run has no param for)."""
    return logged_params(RunConfig())


def params_then(params: dict[str, str]) -> dict[str, str]:
    """A run's params with each field it predates (logged by an earlier dsnb) as that field then was: its default, or
    what config.predated says. A run with no config logged at all (killed as it opened) keeps none (same_config)."""
    if "model" not in params:
        return dict(params)
    return {**default_params(), **predated(params), **params}


HEARTBEAT_S = 30  # a training process tags its run this often (dsnb.alive), so a run whose machine is gone shows
STALE_S = 120  # ... and a RUNNING run not tagged for this long has lost its process (a Colab runtime that ended)


def mark_stale_runs(client) -> list[str]:
    """Mark KILLED the RUNNING runs whose process is gone: on this host, its pid has ended; anywhere (a Colab runtime
    that ended, its store on Drive), its heartbeat stopped more than STALE_S ago. A run is tagged alive when it opens
    and beats from then on (launch.run_variant's process beats while its child loads and trains), so a run lost before
    its training process first beat is found too; a run of an older dsnb without the tag counts from its start. A
    process killed but not yet waited for by its own parent (a zombie) has ended (preflight.alive)."""
    wait_for_orphans(client.tracking_uri)  # a run whose training process is still ending is judged once it has
    stale, claimed = [], {}  # claimed: the out-of-memory kills put down to a run so far, by counter
    host = socket.gethostname()
    experiments = [e.experiment_id for e in client.search_experiments()]
    for run in search(client, experiments, "attributes.status = 'RUNNING'") if experiments else []:
        tags = run.data.tags
        gone = tags.get("dsnb.host") == host and tags.get("dsnb.pid") and not alive(int(tags["dsnb.pid"]))
        silent = time.time() - float(tags.get("dsnb.alive", run.info.start_time / 1000)) > STALE_S
        if gone or silent:
            why = f"process {tags.get('dsnb.pid')} ended" if gone else \
                f"its process on {tags.get('dsnb.host')} stopped reporting"
            why += " without closing this run"
            client.set_tag(run.info.run_id, "failure", "killed")
            if tags.get("dsnb.host") == host and (guess := _lost_to_oom(tags, claimed)):
                client.set_tag(run.info.run_id, "oom", "host RAM")  # KILLED, not FAILED: a guess is not a verdict
                why += guess
                print(f"dsnb: run {run.info.run_id} ({run.info.run_name}) is recorded KILLED: {why}", file=sys.stderr)
            client.set_tag(run.info.run_id, "error", why)
            client.set_terminated(run.info.run_id, status="KILLED")
            stale.append(run.info.run_id)
    return stale


def oom_guess(tags: dict) -> str | None:
    """The memory mark_stale_runs guessed a lost run ran out of (it tagged the run failure=killed and oom), or None."""
    return tags["oom"] if tags.get("failure") == "killed" and "oom" in tags else None


def _lost_to_oom(tags: dict, claimed: dict) -> str:
    """Why a run whose process ended unseen (a `dsnb run`, which trains in its own process) was likely taken by the
    kernel's out-of-memory killer: its memory cgroup's kill count, as its process tagged it at its last heartbeat, has
    risen since, by a kill not yet put down to another run; else "". A guess: a kill of another process of the cgroup
    in the seconds before its end, or after it before this start, reads the same."""
    count, _, counter = tags.get("dsnb.oom_kills", "").partition(" ")
    if not re.fullmatch(r"[0-9]+", count) or ".." in counter or not re.fullmatch(
            r"/sys/fs/cgroup/[\w./@:\\-]*memory\.(events|oom_control)", counter):
        return ""  # not tagged (an older dsnb, no counter), or not a counter of this kind: never read
    now = read_oom_count(counter)
    if now is None or now - int(count) <= claimed.get(counter, 0):
        return ""
    claimed[counter] = claimed.get(counter, 0) + 1
    return (f"; meanwhile the kernel's out-of-memory killer took {now - int(count)} process(es) of its memory cgroup, "
            f"likely this one: {HOST_OOM}")


_OPEN: dict = {}  # the main thread's store transactions open now, begun inside a block: id -> weak reference
_PENDING: list = []  # the interrupt held back: (signum, the handler it goes to, when it came)
_DEPTH = [0, 0]  # interrupts_after_writes blocks active; uninterrupted sections active
HOLD_MAX_S = 45  # an interrupt held this long goes through (more than two of MLflow's 20 s busy waits)


@contextlib.contextmanager
def interrupts_after_writes():
    """While the block runs, an interrupt (SIGINT, and SIGTERM where this process handles it in Python) that comes
    while the main thread is inside a database transaction begun in the block (SQLAlchemy's: every MLflow store call
    but its schema checks) or an `uninterrupted` section is delivered when that ends.
    Raised mid-write, an interrupt left the interrupted connection holding SQLite's lock for as long as its traceback
    lived: the failure's own record, written while handling it, then failed "database is locked" (the run stayed
    RUNNING, its reason and what it measured lost). An interrupt is held HOLD_MAX_S at most (a write waiting on
    another process's lock, a transaction left open), then goes through. Off the main thread (no signal arrives
    there) it does nothing."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _watch_sessions()
    saved = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        previous = signal.getsignal(signum)
        # the default action (SIGTERM's: the process ends, its locks with it) is left alone, and so is an enclosing
        # block's handler (wrapped twice, the outer would hold again what the inner let go after HOLD_MAX_S)
        if callable(previous) and getattr(previous, "func", None) is not _after_writes:
            saved[signum] = signal.signal(signum, functools.partial(_after_writes, previous))
    _DEPTH[0] += 1
    try:
        yield
    finally:
        _DEPTH[0] -= 1
        for signum, handler in saved.items():
            signal.signal(signum, handler)
        if not _DEPTH[0]:
            _OPEN.clear()
            held, _PENDING[:] = list(_PENDING), []
            for signum, previous, _ in held[:1]:  # held to the block's end (by a section): delivered now
                previous(signum, None)


@contextlib.contextmanager
def uninterrupted():
    """Inside interrupts_after_writes, hold an interrupt until the block ends: several writes that must land together
    (a run opened and given its config), not one without the other. Off the main thread it does nothing."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _DEPTH[1] += 1
    try:
        yield
    finally:
        _DEPTH[1] -= 1
        _deliver()


def _busy() -> bool:
    for key, ref in list(_OPEN.items()):
        transaction = ref()
        if transaction is None or transaction._transaction_is_closed():
            _OPEN.pop(key, None)
    return bool(_OPEN) or _DEPTH[1] > 0


def _after_writes(previous, signum, frame) -> None:
    if _busy() and (not _PENDING or time.monotonic() - _PENDING[0][2] < HOLD_MAX_S):
        if not _PENDING:
            _PENDING.append((signum, previous, time.monotonic()))
            _resend_after(signum, HOLD_MAX_S)
        return
    _PENDING.clear()
    previous(signum, frame)


def _resend_after(signum: int, seconds: float) -> None:
    """The held interrupt again after seconds, so one held too long goes through without a second Ctrl-C (a parent
    gone sends one)."""
    import threading

    def resend():
        if _PENDING and _PENDING[0][0] == signum:
            os.kill(os.getpid(), signum)

    timer = threading.Timer(seconds + 0.5, resend)
    timer.daemon = True
    timer.start()


def _deliver() -> None:
    """The held interrupt, if any, once nothing holds it: to the handler it came to, in this thread (the main)."""
    if _PENDING and not _busy():
        signum, previous, _ = _PENDING[0]
        _PENDING.clear()
        previous(signum, None)


@functools.cache
def _watch_sessions() -> None:
    """Track the main thread's store transactions (every MLflow store call but its schema checks runs in a SQLAlchemy
    session) begun inside a block; when one ends (after its commit or rollback, its connection back in the pool),
    deliver the interrupt that waited for it."""
    import threading
    import weakref

    from sqlalchemy import event
    from sqlalchemy.orm import Session

    def begun(session, transaction, connection):
        if _DEPTH[0] and threading.current_thread() is threading.main_thread():
            while transaction.parent is not None:
                transaction = transaction.parent
            _OPEN[id(transaction)] = weakref.ref(transaction)

    def ended(session, transaction):
        if transaction.parent is None and threading.current_thread() is threading.main_thread():
            _OPEN.pop(id(transaction), None)
            _deliver()

    event.listen(Session, "after_begin", begun)
    event.listen(Session, "after_transaction_end", ended)


@contextlib.contextmanager
def heartbeat(run_id: str | None, tracking_uri: str):
    """While the block runs, tag the run dsnb.alive (the time) every HEARTBEAT_S seconds from a thread: a run whose
    process dies with its machine is then known to be gone (mark_stale_runs), wherever its store is read; and the
    out-of-memory killer's count as of this beat (owner's dsnb.oom_kills)."""
    import threading

    from mlflow.entities import RunTag

    if run_id is None:
        yield
        return
    client, stop = mlflow_client(tracking_uri), threading.Event()

    def beat():
        while not stop.is_set():
            with contextlib.suppress(Exception):  # a store busy for a moment: the next beat will do
                client.log_batch(run_id, tags=[RunTag(k, v) for k, v in owner().items() if k != "dsnb.pid"])
            stop.wait(HEARTBEAT_S)

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


def reopen_run(run_id: str, tracking_uri: str) -> None:
    """A KILLED run that is resumed: RUNNING again, owned by this process (alive now: its heartbeat follows)."""
    client = mlflow_client(tracking_uri)
    own(client, run_id)
    client.update_run(run_id, status="RUNNING")


def owner() -> dict[str, str]:
    """The tags that make a run this process's, alive now (mark_stale_runs reads them), with the out-of-memory
    killer's count in its memory cgroup now, where it can be read (_lost_to_oom)."""
    tags = {"dsnb.host": socket.gethostname(), "dsnb.pid": str(os.getpid()), "dsnb.alive": str(int(time.time()))}
    if counter := oom_counter():
        tags["dsnb.oom_kills"] = f"{counter[1]} {counter[0]}"
    return tags


def own(client, run_id: str) -> None:
    from mlflow.entities import RunTag

    client.log_batch(run_id, tags=[RunTag(k, v) for k, v in owner().items()])


def mark_resumed(run_id: str, tracking_uri: str, checkpoint: str) -> None:
    """A run resumed from checkpoint: its record as if never interrupted but for the tag `resumed` (which says from
    where, and what had stopped it): the interruption's failure and error tags go, and so does its traceback
    (error.txt), where the store's artifacts are local files."""
    client = mlflow_client(tracking_uri)
    own(client, run_id)  # `dsnb run --resume` reopens it here, not through reopen_run
    run = client.get_run(run_id)
    tags = run.data.tags
    why = (tags.get("error") or tags.get("failure") or "a stop").split("; ")[0]  # its first clause: resumes add up
    guess = oom_guess(tags)
    note = f"from {os.path.basename(checkpoint)} after: {why}" + (f" (likely out of {guess})" if guess else "")
    for key in ("failure", "error", "notebook_error", "oom"):
        if key in tags:
            client.delete_tag(run_id, key)
    client.set_tag(run_id, "resumed", f"{tags['resumed']}; {note}" if "resumed" in tags else note)
    local = local_artifacts(run.info.artifact_uri)
    if local and os.path.isfile(os.path.join(local, "error.txt")):
        os.remove(os.path.join(local, "error.txt"))


def local_artifacts(artifact_uri: str) -> str | None:
    """The folder of a run's artifacts where it is on this machine's disk (a file: URI or a path), else None."""
    from urllib.parse import unquote, urlsplit

    parts = urlsplit(artifact_uri)
    if parts.scheme == "file":
        return unquote(parts.path)
    return artifact_uri if not parts.scheme and os.path.isabs(artifact_uri) else None


def finish(run_id: str, tracking_uri: str, status: str) -> None:
    """Mark a run ended (FINISHED, FAILED or KILLED) if its process could not."""
    client = mlflow_client(tracking_uri)
    if client.get_run(run_id).info.status == "RUNNING":
        client.set_terminated(run_id, status=status)
    if status == "KILLED":
        STOPPED.append(run_id)


HOST_OOM = ("host RAM ran out: the kernel's out-of-memory killer stopped this run's training process; offload less to "
            "the CPU (offload_optimizer/offload_param none), a smaller model or batch, or a machine with more RAM "
            "(`dsnb advise` estimates host RAM)")


def record_host_oom(run_id: str, tracking_uri: str, peak_mb: float | None) -> None:
    """A run whose training process the kernel's out-of-memory killer stopped: FAILED out of memory, as one that ran
    out of GPU memory is (a comparison keeps it: it does not fit this machine), saying it was host RAM, with the peak
    resident memory its process had reached where it could log none."""
    client = mlflow_client(tracking_uri)
    run = client.get_run(run_id)
    if peak_mb and peak_mb > run.data.metrics.get("peak_cpu_rss_mb", 0):  # an earlier pass's may be logged, lower
        client.log_metric(run_id, "peak_cpu_rss_mb", peak_mb)
    if run.data.tags.get("failure") != "oom":  # a rank that ran out of GPU memory first said so itself
        client.set_tag(run_id, "failure", "oom")
        client.set_tag(run_id, "oom", "host RAM")
        client.set_tag(run_id, "error", HOST_OOM)
    if run.info.status != "FAILED":
        client.set_terminated(run_id, status="FAILED")


def what_was_recorded(tracking_uri: str, run_id: str | None) -> str:
    """In words, what the store holds of a run that failed: never claim a record that is not there."""
    if run_id is None:
        return "another rank records it"
    try:
        status = mlflow_client(tracking_uri).get_run(run_id).info.status
    except Exception as e:  # the store itself is what failed
        return f"nothing could be read back from {tracking_uri} ({describe(e)})"
    if status == "RUNNING":
        return (f"its MLflow run {run_id} could not be closed and still shows RUNNING "
                "(the next dsnb start marks it KILLED)")
    return f"it is recorded as a {status} MLflow run ({run_id}) with its error"


def read_json(path: str) -> dict:
    """A JSON object from a file dsnb wrote ({} where it is missing or cut short)."""
    try:
        with open(path) as f:
            value = json.load(f)
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def log_json(obj, name: str) -> None:
    """Log a JSON-serialisable object as an artifact of the active run."""
    import mlflow

    mlflow.log_text(json.dumps(obj, indent=2, default=str), name)


def environment(device: str) -> dict:
    """Package versions and the machine (GPU/CPU) a run used; no environment variables."""
    import torch

    env = {"python": sys.version.split()[0], "platform": platform.platform(), "processor": platform.processor(),
           "cpu_count": os.cpu_count(), "device": device, "world_size": int(os.environ.get("WORLD_SIZE", 1)),
           "cpu_threads": torch.get_num_threads(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
           "packages": {}}
    for name in PACKAGES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            env["packages"][name] = metadata.version(name)
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(device)
        env.update(gpu=props.name, gpu_memory_mb=props.total_memory // 2**20, cuda=torch.version.cuda,
                   gpu_count=torch.cuda.device_count())
    return env


def export_store(tracking_uri: str, dest: str) -> str:
    """Zip a SQLite store and its artifacts into `dest`, a new file (never written over; nothing half-written is left
    where the zip cannot be finished: a full disk, say).

    Artifact locations are rewritten to paths relative to the store's folder in the zipped copy, so
    `mlflow ui` started in the unzipped folder finds every artifact on another machine.
    """

    db = sqlite_path(existing_store(tracking_uri))
    if db is None:
        raise ConfigError(f"tracking_uri {tracking_uri} is not an SQLite store; export works on sqlite:/// stores")
    check_output_file(dest, "the zip")
    root = os.path.dirname(os.path.abspath(db))
    artifacts = os.path.join(root, ARTIFACT_DIR)
    if os.path.realpath(dest).startswith(os.path.realpath(artifacts) + os.sep):  # also through a symlink
        raise ConfigError(f"the zip {dest} would sit inside the store's own artifacts ({artifacts}) and so hold "
                          "itself; write it elsewhere")
    os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)  # -o results/store.zip: its folder made
    try:
        with staged(dest) as part, tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(dest))) as tmp:
            copy = os.path.join(tmp, "mlflow.db")
            with contextlib.closing(sqlite3.connect(db)) as src, contextlib.closing(sqlite3.connect(copy)) as out:
                src.backup(out)
                prefixes = (f"file://{root}/", f"{root}/")
                for table, column in (("experiments", "artifact_location"), ("runs", "artifact_uri")):
                    for prefix in prefixes:
                        out.execute(f"UPDATE {table} SET {column} = substr({column}, ?) WHERE {column} LIKE ?",
                                    (len(prefix) + 1, prefix + "%"))
                out.commit()
            with zipfile.ZipFile(part, "x", zipfile.ZIP_DEFLATED) as zf:
                zf.write(copy, "mlflow.db")
                for folder, _, files in os.walk(artifacts):
                    for name in files:
                        path = os.path.join(folder, name)
                        zf.write(path, os.path.relpath(path, root))
    except (sqlite3.DatabaseError, OSError) as e:
        raise export_error(e, db, dest) from None
    return dest


def export_error(error: Exception, db: str, dest: str) -> ConfigError:
    """What stopped an export: a store that cannot be read, or dest that cannot be written (a full disk; SQLite says
    so while it copies the store beside dest)."""
    full_disk = getattr(error, "sqlite_errorname", "") == "SQLITE_FULL" or "disk is full" in str(error)  # 3.10 lacks
    if isinstance(error, sqlite3.DatabaseError) and not full_disk:  # the error name
        return ConfigError(f"{db} is not a readable MLflow store ({describe(error)}); nothing was exported")
    full = "No space left on device: " if isinstance(error, sqlite3.DatabaseError) else ""
    return ConfigError(f"could not write {dest} ({full}{describe(error)}); free space there or give -o another place")


def download_store(tracking_uri: str, drive_folder: str = "") -> str:
    """Export the store to a zip beside it (in the store's folder: results_folder's, on Drive, where the run has one)
    that nothing else holds (dsnb_mlflow.zip, else dsnb_mlflow-2.zip, ...) and hand it over: Colab downloads it; with
    drive_folder (a mounted Google Drive folder) a copy goes there too. Returns the zip."""
    import shutil

    db = sqlite_path(existing_store(tracking_uri))
    folder = os.path.dirname(os.path.abspath(db)) if db is not None else "."  # export names a server store's error
    dest, n = os.path.join(folder, "dsnb_mlflow.zip"), 1
    while os.path.exists(dest) or drive_folder and os.path.exists(os.path.join(drive_folder, os.path.basename(dest))):
        n += 1
        dest = os.path.join(folder, f"dsnb_mlflow-{n}.zip")
    export_store(tracking_uri, dest)
    if drive_folder:
        os.makedirs(drive_folder, exist_ok=True)
        copy = os.path.join(drive_folder, os.path.basename(dest))
        with staged(copy) as part:
            shutil.copy(dest, part)
    if "COLAB_RELEASE_TAG" in os.environ:
        try:
            from google.colab import files
        except ImportError:  # Colab's variable without Colab (a rehearsal): the zip stays where it is
            return dest
        files.download(dest)
    return dest


ZIP_MARKER = ".dsnb_zip"  # in a folder open_store unzipped: the zip's digest (_digest)


def is_server(uri: str) -> bool:
    """An http(s) tracking server's URI: it serves MLflow's UI itself."""
    return uri.startswith(("http://", "https://"))


def zip_marker(folder: str) -> str:
    """The digest of the zip open_store unzipped into folder ("" where it left none: an earlier dsnb's)."""
    with contextlib.suppress(OSError), open(os.path.join(folder, ZIP_MARKER)) as f:
        return f.read().strip()
    return ""


def open_store(tracking_uri: str) -> str:
    """A store to read: a zip from download_store (uploaded to a new runtime, say) is unzipped beside itself once
    (into a folder of its name, which must be new, empty or that store; another zip uploaded under the same name into
    a folder of its own) and its SQLite file used; any other URI is returned as it is."""

    if not tracking_uri.endswith(".zip"):
        return tracking_uri
    if not os.path.isfile(tracking_uri):
        raise ConfigError(f"{tracking_uri} does not exist; upload dsnb_mlflow.zip first (Colab: the Files pane)")
    folder, ident = tracking_uri[:-4], _digest(tracking_uri)  # cached while its size and time stay
    if os.path.isfile(os.path.join(folder, "mlflow.db")) and zip_marker(folder) != ident:  # another zip uploaded
        folder += f"-{ident[:8]}"  # under the same name (or one an earlier dsnb unzipped, unmarked): unzipped apart
        print(f"dsnb: {tracking_uri} is not the zip unzipped into {tracking_uri[:-4]} before; unzipping it into "
              f"{folder}")
    if not os.path.isfile(os.path.join(folder, "mlflow.db")):
        if os.path.exists(folder) and not (os.path.isdir(folder) and not os.listdir(folder)):
            raise ConfigError(f"{folder} exists and holds no mlflow.db, so {tracking_uri} cannot be unzipped there; "
                              "move it away, or unzip the store elsewhere and give its mlflow.db (sqlite:///...)")
        try:
            with staged(folder) as part, zipfile.ZipFile(tracking_uri) as zf:
                if "mlflow.db" not in zf.namelist():
                    raise ConfigError(f"{tracking_uri} holds no mlflow.db; give a zip that dsnb export or "
                                      "download_store made")
                zf.extractall(part)
                with open(os.path.join(part, ZIP_MARKER), "w") as f:  # which zip this is: a new upload told apart
                    f.write(ident)
        except zipfile.BadZipFile as e:
            raise ConfigError(f"{tracking_uri} is not a readable zip ({describe(e)}); upload it again (an upload cut "
                              "short looks like this)") from None
    return f"sqlite:///{os.path.abspath(folder)}/mlflow.db"


def show_ui(tracking_uri: str, port: int = 5000):
    """The MLflow UI for this store: on Colab, started here on 127.0.0.1 and shown inside the notebook (Colab serves a
    kernel port in an output frame; nothing is exposed to the network); elsewhere, the command that opens it."""
    uri = resolve_uri(existing_store(open_store(tracking_uri)))
    try:
        from google.colab import output
    except ImportError:
        output = None
    if output is None or is_server(uri):  # elsewhere, or a server with its own UI
        print(f"Open the runs side by side: {ui_command(uri, port=port)}")
        return None
    port = free_port(port)  # a UI already serving another store there (notebook 01's, say) would be framed instead
    print(f"starting the MLflow UI on port {port} (a minute or more on 2 cores) ...", flush=True)
    server, answered = start_ui(uri, port)
    if not answered:  # a frame of a port nobody serves is a blank box: say why, and how to open it instead
        why = f"it exited with code {server.returncode}" if server.poll() is not None else \
            f"it did not answer in {UI_WAIT_S} s"
        if server.poll() is None:  # stopped: a rerun of the cell starts another, and two would share 2 cores
            os.killpg(server.pid, signal.SIGTERM)
        with open(ui_log(port), errors="replace") as log:
            tail = " | ".join(log.read().strip().splitlines()[-3:])
        print(f"The MLflow UI did not start ({why}{': ' + tail if tail else ''}); its log: {ui_log(port)}. "
              f"Run this cell again, or open it with: {ui_command(uri, port=port)}")
        return None
    return output.serve_kernel_port_as_iframe(port, height=800)


def free_port(port: int) -> int:
    """port, or the next one above it that nothing on 127.0.0.1 listens on."""
    while True:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                port += 1


# Where Colab's proxy serves a kernel port (the Host and the Origin it passes on): <port>-<runtime>.<region>.prod.
# colab.dev, and before it <...>.colab.googleusercontent.com.
COLAB_PROXY_HOSTS = ("*.prod.colab.dev", "*.colab.googleusercontent.com")


def ui_server_command(tracking_uri: str, port: int) -> list[str]:
    """The `mlflow ui` that show_ui starts: bound to 127.0.0.1 only; answering the Host header of Colab's proxy
    (MLflow 3 answers any other than localhost's with 403 "Invalid Host header") and its pages' POSTs from the proxy's
    origin (the run search is one; MLflow blocks cross-origin writes); and with no X-Frame-Options, since Colab shows it
    in a frame of another origin (MLflow's default SAMEORIGIN leaves that frame blank). One worker: MLflow's default
    of 4 took twice as long to answer on 2 cores, for one reader (UI_ENV keeps its job runner off)."""
    hosts = ["localhost", "localhost:*", "127.0.0.1", "127.0.0.1:*", *COLAB_PROXY_HOSTS]
    return [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", tracking_uri, "--host", "127.0.0.1",
            "--port", str(port), "--workers", "1", "--allowed-hosts", ",".join(hosts),
            "--cors-allowed-origins", ",".join(f"https://{host}" for host in COLAB_PROXY_HOSTS),
            "--x-frame-options", "NONE"]


# MLflow 3's job runner (GenAI scorers and the like, which the UI of a training store never runs) starts 8 processes
# beside the server: 1.8 GB resident on a machine whose training may need all of its RAM (a T4 runtime has 12.7 GB).
UI_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
UI_WAIT_S = 180  # how long show_ui waits for `mlflow ui` to answer (a loaded 2-core machine took over a minute)


def ui_log(port: int) -> str:
    """Where the output of the `mlflow ui` that start_ui starts on `port` goes."""
    return os.path.join(tempfile.gettempdir(), f"dsnb_mlflow_ui_{port}.log")


def ui_answers(port: int) -> bool:
    import urllib.request

    try:  # a loaded 2-core machine can take seconds to answer once the server is up
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10):
            return True
    except OSError:
        return False


def start_ui(tracking_uri: str, port: int, wait_s: float = UI_WAIT_S):
    """ui_server_command started in a session of its own (it outlives the cell), its output in ui_log(port): (the
    server, whether it answered), once it answers, exits, or wait_s passed."""
    import subprocess

    with open(ui_log(port), "w") as log:
        server = subprocess.Popen(ui_server_command(tracking_uri, port), stdout=log, env={**os.environ, **UI_ENV},
                                  stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + wait_s
    while time.time() < deadline and server.poll() is None:
        if ui_answers(port):
            return server, True
        time.sleep(0.5)
    return server, False


def ui_command(tracking_uri: str, host: str = "127.0.0.1", port: int = 5000) -> str:
    """The command that opens the MLflow UI on this machine only (no auth: keep it off the network), for the store in
    use: shell-quoted, a relative SQLite path made absolute, credentials masked; for a tracking server, its address."""
    if is_server(tracking_uri):
        return f"{redact(tracking_uri)} (the tracking server's own UI: open it in a browser)"
    db = sqlite_path(tracking_uri)
    uri = f"sqlite:///{os.path.abspath(db)}" if db is not None else redact(tracking_uri)
    return f"mlflow ui --backend-store-uri {shlex.quote(uri)} --host {host} --port {port}"


def resumable_run(cfg: RunConfig) -> tuple[str, str]:
    """(run id, last checkpoint) of the newest FAILED or KILLED run named like cfg's that left a checkpoint, unless a
    run of cfg finished after it (that work is done: resuming the older one would train it again)."""
    experiment = experiment_id(cfg)
    client = mlflow_client(cfg.tracking_uri)
    mark_stale_runs(client)
    runs = search(client, [experiment], "attributes.status != 'RUNNING'", order_by=["attributes.start_time DESC"])
    for run in (r for r in runs if r.info.run_name == cfg.name):
        if run.info.status == "FINISHED":
            if same_config(run, cfg):
                raise ConfigError(f"nothing to resume: run {cfg.name} ({run.info.run_id}) finished, and its record "
                                  "stands; run without --resume to measure it again")
            continue
        checkpoint = last_checkpoint(run, cfg)
        if checkpoint:
            return run.info.run_id, checkpoint
    raise ConfigError(f"nothing to resume: no failed or killed run named {cfg.name} with a checkpoint under "
                      f"{cfg.output_dir}/ (set checkpoint_steps to save them); run without --resume")


CHECKPOINT_FILES = "dsnb_files.json"  # in each checkpoint, written last: every file's size, checked before a resume


def list_files(checkpoint: str) -> None:
    """Into a checkpoint about to be published: the size of each of its files (CHECKPOINT_FILES)."""
    sizes = {os.path.relpath(os.path.join(root, name), checkpoint): os.path.getsize(os.path.join(root, name))
             for root, _, names in os.walk(checkpoint) for name in names}
    with open(os.path.join(checkpoint, CHECKPOINT_FILES), "w") as f:
        json.dump(sizes, f)


def unreadable(checkpoint: str) -> str | None:
    """Why a published checkpoint cannot be resumed from (a file missing or of another size than written, its state
    unreadable: a machine that died as a synced file system flushed it, a hand that removed a file), or None."""
    listed = os.path.join(checkpoint, CHECKPOINT_FILES)
    sizes = read_json(listed) if os.path.exists(listed) else {}  # older checkpoints have no list: their state alone
    if os.path.exists(listed) and not sizes:
        return f"{CHECKPOINT_FILES} is unreadable"
    for name, size in sizes.items():
        path = os.path.join(checkpoint, name)
        if not os.path.isfile(path) or os.path.getsize(path) != size:
            return f"{name} is {os.path.getsize(path) if os.path.isfile(path) else 'missing'} bytes, {size} written"
    if "global_step" not in read_json(os.path.join(checkpoint, "trainer_state.json")):
        return "trainer_state.json is missing or unreadable"
    return None


def last_checkpoint(run, cfg: RunConfig) -> str | None:
    """The run's newest complete checkpoint under cfg.output_dir, if it has one; a ConfigError where the run was
    started with another config, or its checkpoint leaves nothing to train. A checkpoint that cannot be resumed from
    (unreadable) is moved aside to unreadable-checkpoint-N (a name that neither a resume nor the Trainer's rotation,
    which takes any "checkpoint-N..." for step N, counts), said on stderr, and never tried again: the run's older one,
    if any, is taken, else none (a comparison trains the variant afresh; run --resume finds nothing to resume)."""
    from transformers.trainer_utils import get_last_checkpoint

    folder = os.path.join(cfg.output_dir, run.info.run_id)
    checkpoint = get_last_checkpoint(folder) if os.path.isdir(folder) else None
    if not checkpoint:
        return None
    if not same_config(run, cfg):
        raise ConfigError(f"run {cfg.name} ({run.info.run_id}) was started with another config, or a file it names "
                          "(its data, DeepSpeed JSON or model folder) has changed since; resume it with the same "
                          "fields and files, or drop --resume to start afresh")
    why = unreadable(checkpoint)
    if why:
        base = os.path.join(folder, "unreadable-" + os.path.basename(checkpoint))
        aside = next(p for n in range(1, 1000) if not os.path.lexists(p := base + (f"-{n}" if n > 1 else "")))
        try:
            os.replace(checkpoint, aside)
        except OSError as e:
            raise ConfigError(f"run {cfg.name} ({run.info.run_id}) cannot resume from {checkpoint}: {why}; and it "
                              f"could not be moved aside ({describe(e)}): move or delete it, then run again") from None
        print(f"dsnb: run {cfg.name} ({run.info.run_id}) cannot resume from {checkpoint}: {why}; moved aside to "
              f"{aside}", file=sys.stderr)
        return last_checkpoint(run, cfg)
    state = read_json(os.path.join(checkpoint, "trainer_state.json"))
    if state.get("max_steps") and state.get("global_step", 0) >= state["max_steps"]:
        raise ConfigError(f"run {cfg.name} ({run.info.run_id}) had trained all {state['max_steps']} steps when "
                          f"it stopped ({checkpoint}): nothing is left to train, and its recorded numbers stay "
                          f"as they are ({run.info.status}); run without --resume to measure it afresh")
    return checkpoint


class Curve:
    """The loss curve (loss, grad_norm and learning_rate at each logged step) of run_id, written in batches: one
    write per `records` logged steps or `seconds`, whichever comes first, on write(), and as a `with` block ends.

        with Curve(run_id, uri) as curve:   # training; the rest is written at the end, also when it raises
            curve(step, {"loss": ..., "grad_norm": ..., "learning_rate": ...})

    One write per logged step cost 7-8 ms on an idle 2-core machine and 25-34 ms beside the test suite
    (`python benchmarks/mlflow_writes.py`): more than a compiled step, so logging every step made the run measure
    its logging. One batch of 32 steps costs about two single writes.
    """

    KEYS = ("loss", "grad_norm", "learning_rate")

    def __init__(self, run_id: str, tracking_uri: str, records: int = 32, seconds: float = 30.0):
        self.run_id, self.client = run_id, mlflow_client(tracking_uri)
        self.records, self.seconds = records, seconds
        self.pending: list = []
        self.steps = 0
        self.written = time.monotonic()
        self.stored_through = 0  # a resumed run: the steps its stopped process wrote, which are not written again

    def __call__(self, step: int, logs: dict) -> None:
        from mlflow.entities import Metric

        if step <= self.stored_through:
            return
        now = int(time.time() * 1000)
        self.pending += [Metric(k, float(v), now, step) for k, v in logs.items() if k in self.KEYS]
        self.steps += 1
        if self.steps >= self.records or time.monotonic() - self.written >= self.seconds:
            self.write()

    def resume(self, checkpoint_step: int) -> dict[int, float]:
        """For a run resumed from the checkpoint of checkpoint_step: the loss of each step up to it that the store holds
        (a step written twice, by an older dsnb: its newest record). The steps after it that the stopped process wrote
        are the steps this one trains again, from the same checkpoint: they are not written a second time."""
        records = sorted(self.client.get_metric_history(self.run_id, "loss"), key=lambda m: m.timestamp)
        self.stored_through = max((m.step for m in records), default=0)
        return {m.step: m.value for m in records if m.step <= checkpoint_step}

    def write(self) -> None:
        """Write what is held."""
        if self.pending:
            self.client.log_batch(self.run_id, metrics=self.pending)
        self.pending, self.steps, self.written = [], 0, time.monotonic()

    def __enter__(self) -> Curve:
        return self

    def __exit__(self, kind, error, trace) -> None:
        if kind is None:
            self.write()
        else:  # a curve that cannot be written must not hide the error that ended the run
            with contextlib.suppress(Exception):
                self.write()


def interruption(error: KeyboardInterrupt) -> str:
    """An interrupt in words: what stopped the run (SIGTERM, its parent gone or interrupted), not the exception's name
    alone (Ctrl-C raises KeyboardInterrupt with no text)."""
    return f"interrupted: {describe(error, 500).removeprefix('KeyboardInterrupt: ')}" if str(error) else \
        "interrupted (Ctrl-C)"


def record_failure(error: BaseException, measured: dict) -> None:
    """What a failed run measured, why it failed (oom, interrupted or the error's type) and its traceback, on
    the active run. An interrupt (Ctrl-C, SIGTERM, the parent gone) ends the run KILLED, any other error FAILED."""
    import mlflow
    import torch

    mlflow.log_metrics(measured)
    oom = isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error).lower()
    interrupted = isinstance(error, KeyboardInterrupt)
    failure = "oom" if oom else "interrupted" if interrupted else type(error).__name__
    mlflow.set_tags({"failure": failure, "error": interruption(error) if interrupted else describe(error, 500)})
    mlflow.log_text(redact("".join(traceback.format_exception(error))), "error.txt")
    if interrupted:
        STOPPED.append(mlflow.active_run().info.run_id)
        mlflow.end_run("KILLED")
