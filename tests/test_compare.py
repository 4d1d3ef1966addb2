"""Which comparison compare() continues, read from a real MLflow store: an interrupted one is continued (its finished
runs kept), a finished one starts a new one. The whole path, kill and rerun included, runs in tests/test_colab.py and
tests/test_resume.py."""
import pytest

from dsnb.compare import unfinished_comparison
from dsnb.config import OFFLINE, ConfigError, RunConfig, tutorial_pair
from dsnb.tracking import create_run, finish, mlflow_client


def test_an_interrupted_comparison_is_continued_and_a_finished_one_starts_anew(tmp_path):
    cfg = RunConfig(**dict(OFFLINE, repeats=1, tracking_uri=f"sqlite:///{tmp_path}/mlflow.db"))
    jobs = [(0, c) for c in tutorial_pair(cfg)]
    fresh, runs = unfinished_comparison(cfg, jobs)
    assert runs == {} and len(fresh) == 12  # an empty store: a new comparison
    without, with_ds = (create_run(c, tags={"comparison": "abc", "repeat": "0"}) for _, c in jobs)
    finish(without, cfg.tracking_uri, "FINISHED")
    finish(with_ds, cfg.tracking_uri, "KILLED")  # a kernel killed mid-run
    other = cfg.replace(learning_rate=1e-3)  # another config's comparison is never continued for this one
    assert unfinished_comparison(other, [(0, c) for c in tutorial_pair(other)])[1] == {}
    comparison, runs = unfinished_comparison(cfg, jobs)
    assert comparison == "abc" and {k: r.info.status for k, r in runs.items()} == {
        ("Without_DeepSpeed", "0"): "FINISHED", ("With_DeepSpeed", "0"): "KILLED"}
    mlflow_client(cfg.tracking_uri).set_terminated(with_ds, status="FINISHED")  # the resumed run finished
    comparison, runs = unfinished_comparison(cfg, jobs)
    assert comparison not in ("abc", fresh) and runs == {}  # every run finished: run again, a new comparison


def test_a_comparison_whose_run_is_still_running_elsewhere_waits(tmp_path):
    cfg = RunConfig(**dict(OFFLINE, repeats=1, tracking_uri=f"sqlite:///{tmp_path}/mlflow.db"))
    jobs = [(0, c) for c in tutorial_pair(cfg)]
    create_run(jobs[0][1], tags={"comparison": "abc", "repeat": "0"})  # this process: alive, so not stale
    with pytest.raises(ConfigError, match="is still running on"):
        unfinished_comparison(cfg, jobs)
