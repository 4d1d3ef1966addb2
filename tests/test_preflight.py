import json
import os
import pathlib
import re
import subprocess
import time

import pytest

from dsnb.config import ConfigError
from dsnb.preflight import check_nvme_path, check_nvme_space


def test_nvme_path_checks(tmp_path):
    from deepspeed.ops.op_builder import AsyncIOBuilder

    if AsyncIOBuilder().is_compatible(verbose=False):  # setup.sh installs libaio where it can
        check_nvme_path(str(tmp_path))
    else:
        with pytest.raises(ConfigError, match="apt-get install libaio-dev"):
            check_nvme_path(str(tmp_path))
    with pytest.raises(ConfigError, match="does not exist"):
        check_nvme_path(str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="is not writable"):
        check_nvme_path("/proc")
    (tmp_path / "afile").write_text("")
    with pytest.raises(ConfigError, match="nvme_path '.*afile' is a file, not a folder"):
        check_nvme_path(str(tmp_path / "afile"))


def test_nvme_refuses_an_arch_list_deepspeed_cannot_build_for(tmp_path, monkeypatch):
    from deepspeed.ops.op_builder import AsyncIOBuilder

    if not AsyncIOBuilder().is_compatible(verbose=False):
        pytest.skip("libaio is missing here; the libaio message comes first")
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0;8.6+PTX 9.0")
    check_nvme_path(str(tmp_path))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0;9.0a")
    with pytest.raises(ConfigError, match="TORCH_CUDA_ARCH_LIST holds '9.0a'.*TORCH_CUDA_ARCH_LIST=9.0"):
        check_nvme_path(str(tmp_path))


def test_a_build_lock_left_by_a_killed_build_is_taken_over_at_once(tmp_path, monkeypatch, capsys):
    """torch's lock, left by a build killed minutes into it: taken over where no process builds in its folder; kept
    while one does (a process working there, as ninja and the compilers do), and while it is seconds old (a build
    DeepSpeed starts by itself holds no dsnb lock, and no process works in the folder before ninja starts)."""
    from deepspeed.ops.op_builder import CPUAdamBuilder

    from dsnb.preflight import check_build_lock

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    folder = tmp_path / "ext" / CPUAdamBuilder().name
    folder.mkdir(parents=True)
    (folder / "lock").touch()
    check_build_lock(CPUAdamBuilder(), "CPU Adam")
    assert (folder / "lock").exists() and "another process is building" in capsys.readouterr().out  # just made
    os.utime(folder / "lock", (time.time() - 120, time.time() - 120))
    building = subprocess.Popen(["sleep", "60"], cwd=folder)
    try:
        check_build_lock(CPUAdamBuilder(), "CPU Adam")
        assert (folder / "lock").exists() and "another process is building" in capsys.readouterr().out
    finally:
        building.kill()
        building.wait()
    check_build_lock(CPUAdamBuilder(), "CPU Adam")
    assert not (folder / "lock").exists() and "took over the build lock" in capsys.readouterr().out


def test_nvme_space_is_checked_against_what_the_run_offloads(tmp_path):
    check_nvme_space(str(tmp_path), needed_mb=1)
    with pytest.raises(ConfigError, match=r"GB free but this run offloads about .* set nvme_path to a larger disk"):
        check_nvme_space(str(tmp_path), needed_mb=2**40)


def test_dsnb_check_says_the_nvme_folder_is_too_small_before_any_weight_loads(tmp_path, monkeypatch, capfd):
    """The space check is part of the plan: `dsnb check` and the notebook's plan cell say it, not only a run after its
    set-up. The folder's free space is what the file system reports (shutil.disk_usage: here, none left); what the run
    needs counts only what goes to NVMe, for every process of the host (two processes: each swaps half, both into the
    one folder). capfd: DeepSpeed's async I/O test build needs real file descriptors."""
    import shutil

    from deepspeed.ops.op_builder import AsyncIOBuilder

    from dsnb.cli import main

    if not AsyncIOBuilder().is_compatible(verbose=False):
        pytest.skip("libaio is missing here; its message comes first")
    folder = tmp_path / "nvme"
    folder.mkdir()
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=0) if str(p) == str(folder) else real(p))
    monkeypatch.chdir(tmp_path)
    shape = ["check", "--offline", "--model", "synthetic:llama-3.2-1b", "--lora_r", "0", "--quantization", "none",
             "--dtype", "bf16", "--host_ram_check", "warn", "--strategy", "zero3", "--offload_param", "nvme",
             "--nvme_path", str(folder)]

    def offloads(err: str) -> float:  # MB
        found = re.search(rf"nvme_path {folder} has 0 MB free but this run offloads about ([0-9.]+) (GB|MB)", err)
        assert found, err
        return float(found.group(1)) * (1024 if found.group(2) == "GB" else 1)

    needed = {}
    for processes in ("1", "2"):
        code = main([*shape, "--offload_optimizer", "nvme", "--num_gpus", processes])
        err = capfd.readouterr().err
        assert code == 2, err
        needed[processes] = offloads(err)
    assert needed["2"] == pytest.approx(needed["1"], rel=0.05) and needed["1"] > 1024
    # the optimizer's states in CPU RAM take no room on the disk: only the parameters (2 bytes each) go there
    assert main([*shape, "--offload_optimizer", "cpu"]) == 2
    assert 1024 < offloads(capfd.readouterr().err) < needed["1"]

def test_one_process_gets_one_gpu():
    from dsnb.preflight import gpu_ids

    assert gpu_ids(None, 1) == ["0"] and gpu_ids("3,5", 1) == ["3"] and gpu_ids(" 2, 7 ", 2) == ["2", "7"]


def test_bf16_is_refused_below_compute_capability_8(monkeypatch):
    """A T4 (7.5) emulates bf16 slowly while is_bf16_supported() says True: dsnb asks for fp16 instead. No T4 here,
    so torch's answers about the GPU are those a T4 gives; the check itself is dsnb's real one."""
    import torch

    from dsnb.config import RunConfig
    from dsnb.preflight import check_device

    gpu = {"get_device_capability": lambda device=None: (7, 5), "get_device_name": lambda device=None: "Tesla T4",
           "device_count": lambda: 1, "is_bf16_supported": lambda *a, **k: True}
    for name, answer in gpu.items():
        monkeypatch.setattr(torch.cuda, name, answer)
    with pytest.raises(ConfigError, match="dtype bf16 has no native support on Tesla T4 .*use dtype fp16"):
        check_device(RunConfig(dtype="bf16"), "cuda:0")
    check_device(RunConfig(dtype="fp16"), "cuda:0")  # the T4's precision passes
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    check_device(RunConfig(dtype="bf16"), "cuda:0")  # an A100 or newer


def test_deepcompile_is_refused_on_the_cpu_by_either_switch(tmp_path, monkeypatch):
    """DeepCompile builds a CUDA op: asked for by the deepcompile field or by the user's own DeepSpeed JSON, a CPU run
    stops before loading, saying what to change; the same run without it passes."""
    import json

    from dsnb.config import OFFLINE, RunConfig
    from dsnb.preflight import check
    from dsnb.zero import deepspeed_config

    cfg = RunConfig(**dict(OFFLINE, strategy="zero3", quantization="none", padding="bucket", torch_compile=True,
                           tracking_uri=f"sqlite:///{tmp_path}/mlflow.db"))
    check(cfg, "cpu")
    with pytest.raises(ConfigError, match="DeepCompile needs a CUDA GPU.*set deepcompile false"):
        check(cfg.replace(deepcompile=True), "cpu")
    own = tmp_path / "ds.json"
    own.write_text(json.dumps({**deepspeed_config(cfg), "compile": {"deepcompile": True}}))
    with pytest.raises(ConfigError, match="take compile.deepcompile out of ds_config_path's JSON"):
        check(cfg.replace(ds_config_path=str(own)), "cpu")
    # with parameters in CPU RAM it failed on the H200: refused first
    with pytest.raises(ConfigError, match="DeepCompile with offload_param cpu failed on the H200.*offload_param none"):
        check(cfg.replace(offload_param="cpu", offload_optimizer="cpu", deepcompile=True), "cpu")
    monkeypatch.setenv("DSNB_DEEPCOMPILE", "1")  # the switch it replaced is named, not ignored
    with pytest.raises(ConfigError, match="DSNB_DEEPCOMPILE is no longer read: set the run-config field deepcompile"):
        check(cfg, "cpu")


def test_deepcompile_refuses_an_arch_list_deepspeed_cannot_build_for(tmp_path, monkeypatch):
    """On a GPU whose image sets TORCH_CUDA_ARCH_LIST=9.0a (an H200 here), DeepCompile's op build died in the run
    with a bare ValueError; preflight now says what to set first (torch answers as one H200 does)."""
    import torch

    from dsnb.config import OFFLINE, RunConfig
    from dsnb.preflight import check

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    cfg = RunConfig(**dict(OFFLINE, strategy="zero3", quantization="none", padding="bucket", torch_compile=True,
                           tracking_uri=f"sqlite:///{tmp_path}/mlflow.db", deepcompile=True))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    check(cfg, "cuda")
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0a")
    with pytest.raises(ConfigError, match="TORCH_CUDA_ARCH_LIST holds '9.0a'.*DeepCompile.*TORCH_CUDA_ARCH_LIST=9.0"):
        check(cfg, "cuda")
    check(cfg.replace(deepcompile=False), "cuda")  # without DeepCompile nothing is built: no refusal


def test_the_host_ram_check_on_the_cpu_leaves_out_gpu_only_buffers():
    """Without a GPU the host holds what the GPU would, but not DeepSpeed's ZeRO-2 reduce buckets as the GPU's
    allocator counts them (5e8 elements, two under offload: 3.7 GB in fp32): on the CPU only the pages gradients
    fill are resident. A tiny ZeRO-2 + offload run passes a 1.5 GB budget, and one too large for it is still refused."""
    from dsnb.config import OFFLINE, RunConfig
    from dsnb.preflight import check_host_ram

    cfg = RunConfig(**dict(OFFLINE, strategy="zero2", offload_optimizer="cpu", ram_budget_gb=1.5))
    check_host_ram(cfg, 1, "cpu")
    with pytest.raises(ConfigError, match="ram_budget_gb"):
        check_host_ram(cfg.replace(ram_budget_gb=0.01), 1, "cpu")


@pytest.fixture(scope="module")
def whole_store(tmp_path_factory):
    """A store as this MLflow makes it (dsnb's own creation)."""
    from dsnb.tracking import mlflow_client

    db = tmp_path_factory.mktemp("store") / "mlflow.db"
    mlflow_client(f"sqlite:///{db}").search_experiments()
    return db


@pytest.mark.integration  # MLflow's migrations make the store: 10-20 s on 2 busy cores
@pytest.mark.parametrize("change, named", [
    ("DROP TABLE params", "lacks its table params"),
    ("ALTER TABLE runs DROP COLUMN artifact_uri", "lacks its column runs.artifact_uri"),
])
def test_a_store_of_this_schema_that_lacks_a_table_or_column_is_named(whole_store, tmp_path, change, named):
    import shutil
    import sqlite3

    from dsnb.preflight import check_complete

    check_complete(str(whole_store))  # whole: nothing to say (every table and column, generated ones too)
    db = tmp_path / "mlflow.db"
    shutil.copy(whole_store, db)
    with sqlite3.connect(db) as con:
        con.execute(change)
    with pytest.raises(ConfigError, match=f"is an MLflow store that {named} .*it holds no runs.*move it away"):
        check_complete(str(db))


def test_staged_copies_left_by_a_killed_save_are_cleared_and_live_ones_kept(tmp_path):
    """A save, export or unzip killed part way leaves its hidden staged copy beside the destination (on Drive, where
    they would pile up): the next staging of that destination removes those nothing has written in for an hour, and
    leaves a fresh one (another process's, writing now) and every other file."""
    from dsnb.preflight import staging_path

    stale, live = tmp_path / ".adapter-1.dsnb-aaaaaaaaaaaa", tmp_path / ".adapter-1.dsnb-bbbbbbbbbbbb"
    for folder in (stale, live):
        folder.mkdir()
        (folder / "adapter_model.safetensors").write_bytes(b"x")
    old = time.time() - 7200
    for path in (stale / "adapter_model.safetensors", stale):
        os.utime(path, (old, old))
    (tmp_path / ".adapter-1.partial").mkdir()  # a user's, not dsnb's
    new = staging_path(str(tmp_path / "adapter-1"))
    assert not stale.exists() and live.exists() and (tmp_path / ".adapter-1.partial").exists()
    assert os.path.basename(new).startswith(".adapter-1.dsnb-") and not os.path.exists(new)



def fake_trainer(parent_pid: int, seconds: float = 60, arg: str = "-m", cwd=None) -> subprocess.Popen:
    """A process that looks as a dsnb training process does to orphans() (python ... -m dsnb.child FILE, the pid of
    the dsnb that started it in its environment), sleeping; arg "" leaves out the -m (a grep for the word). Its
    child.json is read from cwd (none there: it cannot be read)."""
    import sys

    return subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})", *[a for a in [arg] if a],
                             "dsnb.child", "child.json"], env={**os.environ, "DSNB_PARENT_PID": str(parent_pid)},
                            cwd=cwd)


def test_on_the_cpu_a_run_waits_only_for_the_orphans_of_its_own_store(tmp_path, monkeypatch):
    """Without a GPU to share, an orphan matters to a run only if it may log into the run's store: another SQLite
    store's orphan (another comparison's) is neither waited for nor killed at the limit. A store is one file however
    it is named (relative to each process's folder); a server's orphan, or one whose child file cannot be read, is
    waited for by every store; one whose child file is gone (removed after its last write) by none."""
    from dsnb.preflight import orphans

    for name, store in (("mine", "sqlite:///../mine/mlflow.db"), ("other", "sqlite:///mlflow.db"),
                        ("server", "http://user:secret@host:5000")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "child.json").write_text(json.dumps({"config": {"tracking_uri": store}}))
    (tmp_path / "unreadable").mkdir()
    (tmp_path / "unreadable" / "child.json").write_text("{")
    (tmp_path / "ended").mkdir()
    started = {name: fake_trainer(a_pid_that_is_gone(), cwd=tmp_path / name)
               for name in ("mine", "other", "server", "unreadable", "ended")}
    monkeypatch.chdir(tmp_path)
    try:
        time.sleep(0.5)
        ours = {p.pid: name for name, p in started.items()}
        found = lambda uri: sorted(ours[p.pid] for p in orphans(uri) if p.pid in ours)  # noqa: E731
        assert found("sqlite:///mine/mlflow.db") == ["mine", "server", "unreadable"]
        assert found(f"sqlite:///{tmp_path}/other/mlflow.db") == ["other", "server", "unreadable"]
        assert found("http://localhost:5000/") == ["mine", "other", "server", "unreadable"]
        assert found(None) == ["ended", "mine", "other", "server", "unreadable"]  # on a GPU: every orphan shares it
    finally:
        for process in started.values():
            process.kill()
            process.wait()


def a_pid_that_is_gone() -> int:
    ended = subprocess.Popen(["true"])
    ended.wait()
    return ended.pid


def test_only_this_users_training_processes_whose_dsnb_is_gone_are_waited_for():
    """orphans(): a training process whose dsnb is gone is one; one whose dsnb runs (this process: run_all's children
    side by side, torchrun's ranks) is not, nor a command that only names dsnb.child, nor another user's process."""
    from dsnb.preflight import orphans

    started = [fake_trainer(os.getpid()), fake_trainer(a_pid_that_is_gone(), arg="")]
    if os.getuid() == 0:  # root can start a process as another user (a shell: this Python may be root's alone)
        started.append(subprocess.Popen(["sh", "-c", "sleep 60; true", "-m", "dsnb.child", "child.json"], user=65534,
                                        env={"DSNB_PARENT_PID": str(a_pid_that_is_gone())}, start_new_session=True))
    orphan = fake_trainer(a_pid_that_is_gone())
    try:
        time.sleep(0.5)
        assert [p.pid for p in orphans() if p.pid in {q.pid for q in started + [orphan]}] == [orphan.pid]
    finally:
        for process in started + [orphan]:
            os.killpg(process.pid, 9) if process.args[0] == "sh" else process.kill()
            process.wait()


def test_an_orphan_that_ended_as_a_zombie_is_gone(tmp_path):
    """The wait for an orphan ends once it has ended, even where its own parent never reaps it: a zombie that is not
    this process's child, which psutil.wait_procs would wait out. (wait_for_orphans itself is not called here: it
    would wait for, and at its limit kill, other tests' orphans too.) The orphan ends once it has been found."""
    import sys

    import psutil

    from dsnb.preflight import gone, orphans

    found = tmp_path / "found"
    keeper = subprocess.Popen([sys.executable, "-c", f"""
import os, subprocess, sys, time
wait = "import os, time\\nwhile not os.path.exists({str(found)!r}): time.sleep(0.05)"
child = subprocess.Popen([sys.executable, "-c", wait, "-m", "dsnb.child", "child.json"],
                         env={{**os.environ, "DSNB_PARENT_PID": "{a_pid_that_is_gone()}"}})
print(child.pid, flush=True)
time.sleep(120)
"""], stdout=subprocess.PIPE, text=True)
    try:
        ending = int(keeper.stdout.readline())
        deadline, orphan = time.time() + 60, None
        while orphan is None and time.time() < deadline:
            orphan = next((p for p in orphans() if p.pid == ending), None)
            time.sleep(0.1)
        assert orphan is not None
        found.touch()
        started = time.time()
        assert gone([orphan], 30) and time.time() - started < 10
        assert psutil.Process(ending).status() == psutil.STATUS_ZOMBIE
    finally:
        found.touch()  # never left waiting: it would be an orphan of every later test
        keeper.kill()
        keeper.wait()


def test_write_new_writes_whole_never_over_a_file_and_leaves_nothing_half_written(tmp_path, monkeypatch):
    """bench's and capacity's result files: a file that appeared meanwhile (another bench into the same --out) is
    kept, this result lands beside it numbered; a write that fails part way leaves no file and no staged part."""
    from dsnb.preflight import write_new

    dest = tmp_path / "nvidia_h200.json"
    assert write_new(str(dest), '{"a": 1}') == str(dest) and dest.read_text() == '{"a": 1}'
    assert write_new(str(dest), '{"b": 2}') == str(tmp_path / "nvidia_h200-2.json")
    assert dest.read_text() == '{"a": 1}' and (tmp_path / "nvidia_h200-2.json").read_text() == '{"b": 2}'
    assert write_new(str(tmp_path / "map.png"), b"\x89PNG") == str(tmp_path / "map.png")

    def no_links(src, dst):  # a file system without hard links (some FUSE mounts): checked, then renamed
        raise PermissionError(1, "Operation not permitted")

    with monkeypatch.context() as m:
        m.setattr(os, "link", no_links)
        assert write_new(str(tmp_path / "fuse.md"), "a") == str(tmp_path / "fuse.md")
        assert write_new(str(tmp_path / "fuse.md"), "b") == str(tmp_path / "fuse-2.md")
    assert (tmp_path / "fuse.md").read_text() == "a" and (tmp_path / "fuse-2.md").read_text() == "b"
    for made in ("fuse.md", "fuse-2.md"):
        (tmp_path / made).unlink()

    def interrupted(fd):  # Ctrl-C after the bytes are written, before they are synced and published
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_new(str(tmp_path / "cut.md"), "x" * 10)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["map.png", "nvidia_h200-2.json", "nvidia_h200.json"]


def test_a_run_that_builds_a_deepspeed_op_says_so_before_its_silent_minutes(tmp_path, monkeypatch, capfd):
    """CPU Adam (optimizer offload) and async I/O (NVMe) are compiled at a run's start, minutes on 2 cores without a
    line from DeepSpeed: where the op is not built yet, the check before the run says that it comes; once built,
    nothing."""
    from deepspeed.ops.op_builder import AsyncIOBuilder  # its test build needs real file descriptors: capfd

    from dsnb.config import OFFLINE, RunConfig
    from dsnb.preflight import build_folder, check

    import deepspeed.git_version_info as installed

    if not AsyncIOBuilder().is_compatible(verbose=False):
        pytest.skip("libaio is missing here; its message comes first")
    if installed.installed_ops.get("cpu_adam") or installed.installed_ops.get("async_io"):
        pytest.skip("this DeepSpeed was installed with its ops built: nothing is built at a run's start")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "extensions"))  # where torch keeps built ops: none yet
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    cfg = RunConfig(**dict(OFFLINE, strategy="zero3", quantization="none", offload_optimizer="cpu",
                           offload_param="nvme", nvme_path=str(nvme), tracking_uri=f"sqlite:///{tmp_path}/m.db"))
    check(cfg, "cpu")
    said = capfd.readouterr().out
    assert "DeepSpeed builds its CPU Adam op first" in said and "DeepSpeed builds its async I/O op first" in said
    for name in ("cpu_adam", "async_io"):
        pathlib.Path(build_folder(type("B", (), {"name": name})()), f"{name}.so").write_bytes(b"")
    check(cfg.replace(seed=cfg.seed + 1), "cpu")  # another config: each is checked once a process
    assert "builds its" not in capfd.readouterr().out


def test_a_lock_left_in_deepspeeds_comm_op_is_taken_over_before_a_zero_run(tmp_path, monkeypatch, capsys):
    """DeepSpeed builds its shared-memory comm op at every ZeRO run's start on the CPU, by itself: a build killed part
    way (a CI stopped) left torch's lock there, and each later ZeRO run waited on it without a word. The check before
    a ZeRO run takes it over; the baseline, which does not build it, leaves it."""
    from deepspeed.accelerator import get_accelerator

    from dsnb.config import OFFLINE, RunConfig
    from dsnb.preflight import check

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    lock = tmp_path / "ext" / get_accelerator().create_op_builder("ShareMemCommBuilder").name / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    os.utime(lock, (time.time() - 120, time.time() - 120))
    cfg = RunConfig(**dict(OFFLINE, tracking_uri=f"sqlite:///{tmp_path}/m.db"))
    check(cfg.replace(strategy="baseline", offload_optimizer="none"), "cpu")
    assert lock.exists()
    check(cfg.replace(strategy="zero2", offload_optimizer="none"), "cpu")
    assert not lock.exists() and "took over the build lock of DeepSpeed's shared-memory comm op" in \
        capsys.readouterr().out


def test_launch_folders_left_by_a_group_killed_at_once_are_removed_and_live_ones_kept(tmp_path, monkeypatch):
    """A variant's launch folder (dsnb-* in the temporary folder) whose parent and child were SIGKILLed together is
    removed at the next launch; one whose parent lives, one a process still runs from, and one being written stay."""
    import sys
    import tempfile

    from dsnb.preflight import remove_left_folders

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    ended = subprocess.Popen(["true"])
    ended.wait()

    def folder(name, parent):
        path = tmp_path / name
        path.mkdir()
        if parent is not None:
            (path / "child.json").write_text(json.dumps({"parent_pid": parent, "run_id": "x"}))
            (path / "train.log").write_text("step 1\n")
        return path

    dead, live, writing = folder("dsnb-dead", ended.pid), folder("dsnb-live", os.getpid()), folder("dsnb-new", None)
    running = folder("dsnb-running", ended.pid)  # its parent gone, its child still stopping itself
    other = folder("other-dead", ended.pid)  # not a launch folder
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(running / "child.json")])
    try:
        assert remove_left_folders() == [str(dead)]
        assert not dead.exists() and live.exists() and writing.exists() and running.exists() and other.exists()
    finally:
        child.kill()
        child.wait()
    assert remove_left_folders() == [str(running)]
