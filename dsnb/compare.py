"""The tutorial's comparison: its two variants, repeated where short, each run in its own process, and the offline check
that training teaches. Run again after an interruption, a comparison continues where it stopped.

    results = compare(cfg)           # Without_DeepSpeed, With_DeepSpeed, cfg.runs_each times each, interleaved
    quality = quality_check(cfg)     # synthetic:small reads the synthetic passages (the quality preset)

A comparison's runs share a tag (comparison) and know their place in it (repeat). compare() finds the newest
comparison of the same config in the store: if some of its runs never finished (a Colab runtime that ended, a kernel
killed), it keeps the finished ones, resumes each interrupted one from its last checkpoint (a run without one runs
again, the interrupted record kept beside it), and says what it did; once every run of it has finished, compare()
starts a new comparison.
"""
from __future__ import annotations

import uuid

from . import tracking
from .config import ConfigError, RunConfig, tutorial_pair
from .launch import run_all, run_variant
from .tracking import RunResult, mlflow_client


def compare(cfg: RunConfig, progress: bool = True) -> list[RunResult]:
    """The tutorial's pair, each variant run cfg.runs_each times, interleaved so drift on a shared machine hits
    both alike; report.compare_table and report.verdict pool the repeats. Continues an interrupted comparison of the
    same config (module docstring)."""
    pair, n = tutorial_pair(cfg), cfg.runs_each
    jobs = [(i, c) for i in range(n) for c in pair]
    comparison, earlier = unfinished_comparison(cfg, jobs)
    kept, resumes, cfgs, tags = {}, [], [], []
    for place, (i, c) in enumerate(jobs):
        run = earlier.get((c.name, str(i)))
        if run is not None and run.info.status in ("FINISHED", "FAILED"):
            kept[place] = RunResult.read(c.tracking_uri, run.info.run_id, skipped=True)
            say(progress, f"{c.name} (repeat {i + 1}): kept its {run.info.status} run {run.info.run_id}")
            continue
        try:
            checkpoint = tracking.last_checkpoint(run, c) if run is not None else None
        except ConfigError:  # it had trained every step: its record stays, and the job runs again
            checkpoint = None
        if run is not None:
            say(progress, f"{c.name} (repeat {i + 1}): " + (
                f"resumes its interrupted run {run.info.run_id} from {checkpoint.rsplit('/', 1)[-1]}" if checkpoint
                else f"its run {run.info.run_id} stopped before a checkpoint (kept, KILLED); it runs again"))
        cfgs.append(c)
        tags.append({"repeat": str(i), "comparison": comparison})
        resumes.append((run.info.run_id, checkpoint) if checkpoint else None)
    fresh = iter(run_all(cfgs, progress=progress, tags=tags, resumes=resumes) if cfgs else [])
    return [kept[place] if place in kept else next(fresh) for place in range(len(jobs))]


def unfinished_comparison(cfg: RunConfig, jobs: list) -> tuple[str, dict]:
    """(the comparison id to run under, its runs so far by (name, repeat)): the newest comparison of these jobs'
    configs in cfg's store if any of its runs has not finished, else a new id and no runs."""
    experiment = tracking.experiment_id(cfg)
    client = mlflow_client(cfg.tracking_uri)
    tracking.mark_stale_runs(client)
    wanted = {c.name: c for _, c in jobs}
    newest = None
    for run in tracking.search(client, [experiment], order_by=["attributes.start_time DESC"]):
        c = wanted.get(run.info.run_name)
        if run.data.tags.get("comparison") and c is not None and tracking.same_config(run, c):
            newest = run.data.tags["comparison"]
            break
    if newest is None:
        return uuid.uuid4().hex[:12], {}
    runs: dict = {}
    for run in tracking.search(client, [experiment], order_by=["attributes.start_time ASC"]):
        if run.data.tags.get("comparison") == newest:  # a job run twice (a restart): its newest run counts
            runs[run.info.run_name, run.data.tags.get("repeat")] = run
    for run in runs.values():
        if run.info.status == "RUNNING":
            raise ConfigError(f"run {run.info.run_name} ({run.info.run_id}) of this comparison is still running on "
                              f"{run.data.tags.get('dsnb.host', 'another machine')}; wait for it to end (or stop it) "
                              "and run again")
    done = all(runs.get((c.name, str(i))) is not None and runs[c.name, str(i)].info.status in ("FINISHED", "FAILED")
               for i, c in jobs)
    return (uuid.uuid4().hex[:12], {}) if done else (newest, runs)


def say(progress: bool, text: str) -> None:
    if progress:
        print(f"dsnb: {text}", flush=True)


def quality_check(cfg: RunConfig, progress: bool = True) -> RunResult | None:
    """The offline check that training teaches (the quality preset: synthetic:small learns to answer from the
    synthetic passages, asked questions no training row holds), logged to cfg's store and experiment; None where
    cfg.eval_samples is 0."""
    if not cfg.eval_samples:
        return None
    return run_variant(RunConfig.layered({"preset": "quality", "tracking_uri": cfg.tracking_uri,
                                          "experiment": cfg.experiment, "output_dir": cfg.output_dir}),
                       progress=progress)
