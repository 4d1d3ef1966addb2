"""Which comparison compare() continues or shows, read from a real MLflow store: an interrupted one is continued (its
finished runs kept), a finished one is shown as recorded and trains nothing (again=True measures it afresh), another
spelling of results_folder finds the same one, and a run lost before its first heartbeat blocks nothing. The whole
path, kill and rerun included, runs in tests/test_colab.py and tests/test_resume.py."""
import socket
import time

import pytest

from dsnb.compare import compare, newest_comparison, quality_check, reuse
from dsnb.config import OFFLINE, ConfigError, RunConfig, tutorial_pair
from dsnb.tracking import STALE_S, create_run, finish, mlflow_client


def pair_jobs(cfg, repeats=1):
    return [c.replace(repeat=i) for i in range(repeats) for c in tutorial_pair(cfg)]


def record(jobs, statuses, comparison="abc"):
    """Runs of these jobs in the store, ended with these statuses, as compare() tags them."""
    ids = [create_run(c, tags={"comparison": comparison, "repeat": str(c.repeat)}) for c in jobs]
    for run_id, c, status in zip(ids, jobs, statuses, strict=True):
        finish(run_id, c.tracking_uri, status)
    return ids


def test_an_interrupted_comparison_is_continued_and_another_configs_never(tmp_path):
    cfg = RunConfig(**dict(OFFLINE, repeats=1, tracking_uri=f"sqlite:///{tmp_path}/mlflow.db"))
    jobs = pair_jobs(cfg)
    assert newest_comparison(cfg, jobs) == (None, {})  # an empty store: a new comparison
    record(jobs, ["FINISHED", "KILLED"])  # a kernel killed mid-run
    other = cfg.replace(learning_rate=1e-3)  # another config's comparison is never continued for this one
    assert newest_comparison(other, pair_jobs(other)) == (None, {})
    comparison, runs = newest_comparison(cfg, jobs)
    assert comparison == "abc" and {k: r.info.status for k, r in runs.items()} == {
        ("Without_DeepSpeed", "0"): "FINISHED", ("With_DeepSpeed", "0"): "KILLED"}


def test_a_finished_comparison_is_shown_under_any_spelling_of_its_folder_and_trains_nothing(tmp_path, monkeypatch,
                                                                                           capsys):
    """Run all again after the pair finished (a new runtime, the store on Drive): the comparison's runs come back as
    they were recorded, whatever follows them, under results_folder "dsnb", "dsnb/" or "./dsnb"; nothing trains."""
    monkeypatch.chdir(tmp_path)
    first = RunConfig.layered(dict(OFFLINE, repeats=1, results_folder="dsnb"))
    ids = record(pair_jobs(first), ["FINISHED", "FAILED"])
    mlflow_client(first.tracking_uri).set_tag(ids[1], "failure", "oom")  # a variant out of memory is an answer too
    for spelling in ("dsnb/", "./dsnb", str(tmp_path / "dsnb")):
        cfg = RunConfig.layered(dict(OFFLINE, repeats=1, results_folder=spelling))
        results = compare(cfg)
        assert [r.run_id for r in results] == ids and all(r.skipped for r in results)
        assert "this comparison (abc) had finished" in capsys.readouterr().out
    runs = mlflow_client(first.tracking_uri).search_runs(["1"])
    assert len(runs) == 2  # nothing new in the store


def test_asking_for_more_repeats_runs_only_the_repeats_a_comparison_lacks(tmp_path):
    cfg = RunConfig(**dict(OFFLINE, repeats=1, tracking_uri=f"sqlite:///{tmp_path}/mlflow.db"))
    record(pair_jobs(cfg), ["FINISHED", "FINISHED"])
    more = cfg.replace(repeats=3)
    comparison, runs = newest_comparison(more, pair_jobs(more, 3))
    assert comparison == "abc" and set(runs) == {("Without_DeepSpeed", "0"), ("With_DeepSpeed", "0")}


def test_repeats_are_seeded_apart_and_every_variants_repeat_alike(tmp_path):
    cfg = RunConfig(**dict(OFFLINE, repeats=3))
    jobs = pair_jobs(cfg, 3)
    assert [(c.name, c.run_seed) for c in jobs] == [(n, 42 + i) for i in range(3)
                                                    for n in ("Without_DeepSpeed", "With_DeepSpeed")]
    with pytest.raises(ConfigError, match="repeat is 2, which takes seed \\+ repeat past"):
        RunConfig(seed=2**32 - 2, repeat=2)


def test_a_run_still_running_elsewhere_waits_and_one_lost_before_its_first_heartbeat_blocks_nothing(tmp_path):
    cfg = RunConfig(**dict(OFFLINE, repeats=1, tracking_uri=f"sqlite:///{tmp_path}/mlflow.db"))
    jobs = pair_jobs(cfg)
    [alive] = record(jobs[:1], ["RUNNING"])
    client = mlflow_client(cfg.tracking_uri)
    client.set_tag(alive, "dsnb.host", "another-runtime")  # a live run on another machine: its heartbeat is fresh
    with pytest.raises(ConfigError, match="is still running on another-runtime"):
        compare(cfg)
    # that machine died before its run's process first beat: the tag set when the run opened goes stale
    client.set_tag(alive, "dsnb.alive", str(int(time.time()) - STALE_S - 1))
    comparison, runs = newest_comparison(cfg, jobs)
    run = runs["Without_DeepSpeed", "0"]
    assert comparison == "abc" and run.info.status == "KILLED" and run.data.tags["failure"] == "killed"
    assert socket.gethostname() != "another-runtime"


def test_a_finished_quality_check_is_kept(tmp_path, capsys):
    cfg = RunConfig(**dict(OFFLINE, tracking_uri=f"sqlite:///{tmp_path}/mlflow.db", output_dir=str(tmp_path / "runs")))
    quality = RunConfig.layered({"preset": "quality", "tracking_uri": cfg.tracking_uri, "experiment": cfg.experiment,
                                 "output_dir": cfg.output_dir})
    run_id = create_run(quality)
    finish(run_id, cfg.tracking_uri, "FINISHED")
    kept = quality_check(cfg)
    assert kept.run_id == run_id and kept.skipped and f"kept its FINISHED run {run_id}" in capsys.readouterr().out


def test_a_failed_run_is_kept_only_where_its_failure_is_an_answer(tmp_path, capsys):
    """Out of memory is the answer (the variant does not fit): kept. Another failure (a hub out of reach, a full disk)
    may not recur: the comparison is not finished, and that job runs again (from its checkpoint where it left one)."""
    cfg = RunConfig(**dict(OFFLINE, repeats=1, tracking_uri=f"sqlite:///{tmp_path}/mlflow.db",
                           output_dir=str(tmp_path / "runs")))
    without, with_ds = pair_jobs(cfg)
    client = mlflow_client(cfg.tracking_uri)
    ids = record([without, with_ds], ["FAILED", "FAILED"])
    client.set_tag(ids[0], "failure", "oom")
    client.set_tag(ids[1], "failure", "OSError")
    comparison, runs = newest_comparison(cfg, [without, with_ds])
    kept, resume = reuse(without, runs["Without_DeepSpeed", "0"], True, "without")
    assert kept.run_id == ids[0] and resume is None
    kept, resume = reuse(with_ds, runs["With_DeepSpeed", "0"], True, "with")
    assert kept is None and resume is None and "with: its run" in capsys.readouterr().out  # no checkpoint: anew
    checkpoint = tmp_path / "runs" / ids[1] / "checkpoint-2"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text('{"global_step": 2, "max_steps": 8}')
    assert reuse(with_ds, runs["With_DeepSpeed", "0"], True, "with") == (None, (ids[1], str(checkpoint)))


def test_a_run_found_under_another_spelling_of_its_folder_is_taken_as_it_is(tmp_path, monkeypatch):
    """A comparison found under results_folder "dsnb/" (first "dsnb") or another count of repeats resumes into its
    run: the run keeps the params it has (MLflow refuses a param's value changed), and takes the ones it lacks."""
    monkeypatch.chdir(tmp_path)
    first = RunConfig.layered(dict(OFFLINE, repeats=1, results_folder="dsnb"))
    [run_id] = record(pair_jobs(first)[:1], ["KILLED"])
    client = mlflow_client(first.tracking_uri)
    again = RunConfig.layered(dict(OFFLINE, repeats=3, results_folder="./dsnb/")).replace(
        strategy="baseline", run_name="Without_DeepSpeed")
    assert create_run(again, tags={"comparison": "abc"}, run_id=run_id) == run_id
    params = client.get_run(run_id).data.params
    assert params["results_folder"] == "dsnb" and params["repeats"] == "1"


def test_a_comparison_of_a_data_file_since_rewritten_is_not_found_again(tmp_path):
    """The same path, other content (a data file, a DeepSpeed JSON, a model folder's config.json rewritten): the runs of
    the earlier content are another comparison, never shown or continued as this one's; the same content, touched or
    copied back, is found again."""
    import json
    import os

    from dsnb.data import synthetic_squad

    data = tmp_path / "d.jsonl"
    rows = synthetic_squad(40)
    data.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows))
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 2}, "train_batch_size": "auto"}))
    cfg = RunConfig(**dict(OFFLINE, repeats=1, dataset=str(data), tracking_uri=f"sqlite:///{tmp_path}/mlflow.db"))
    jobs = pair_jobs(cfg)
    record(jobs, ["FINISHED", "FINISHED"])
    assert newest_comparison(cfg, jobs)[0] == "abc"
    os.utime(data)  # touched, the same bytes: the same comparison
    assert newest_comparison(cfg, jobs)[0] == "abc"
    data.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows[::-1]))  # other content, same path
    assert newest_comparison(cfg, jobs) == (None, {})
    data.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows))  # the first content back
    assert newest_comparison(cfg, jobs)[0] == "abc"
    from dsnb.tracking import same_config

    with_ds = cfg.replace(strategy="zero2", ds_config_path=str(ds))
    run = mlflow_client(cfg.tracking_uri).get_run(create_run(with_ds))
    assert same_config(run, with_ds)
    ds.write_text(json.dumps({"zero_optimization": {"stage": 2}, "train_batch_size": "auto", "gradient_clipping": 0.5}))
    assert not same_config(run, with_ds)


def test_a_model_folders_digest_reads_its_own_files_and_a_run_without_digests_is_taken_as_it_is(tmp_path, monkeypatch):
    """A local model folder's digest changes with its config.json or a weight file's size, not with a download tool's
    dot-folder; a built-in set's name is never digested from a folder of that name; a run an earlier dsnb logged
    (no digest) is found again."""
    from dsnb.tracking import input_digests, same_config

    monkeypatch.chdir(tmp_path)
    model = tmp_path / "mine"
    model.mkdir()
    (model / "config.json").write_text('{"hidden_size": 8}')
    (model / "model.safetensors").write_bytes(b"x" * 10)
    cfg = RunConfig(**dict(OFFLINE, model=str(model), tracking_uri=f"sqlite:///{tmp_path}/mlflow.db"))
    first = input_digests(cfg)["model_digest"]
    (model / ".cache").mkdir()
    (model / ".cache" / "download.metadata").write_text("new")
    assert input_digests(cfg)["model_digest"] == first
    (model / "config.json").write_text('{"hidden_size": 16}')
    assert input_digests(cfg)["model_digest"] != first
    (tmp_path / "synthetic").mkdir()  # a folder named like the built-in set
    assert "dataset_digest" not in input_digests(cfg)
    run_id = create_run(cfg)
    client = mlflow_client(cfg.tracking_uri)
    assert same_config(client.get_run(run_id), cfg)
    (model / "model.safetensors").write_bytes(b"x" * 11)
    assert not same_config(client.get_run(run_id), cfg)
    from mlflow.entities import Param

    from dsnb.tracking import logged_params

    older = client.create_run(client.get_run(run_id).info.experiment_id, run_name=cfg.name).info.run_id
    client.log_batch(older, params=[Param(k, v) for k, v in logged_params(cfg).items()])  # an earlier dsnb: no digest
    assert same_config(client.get_run(older), cfg)
