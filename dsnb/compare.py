"""The tutorial's comparison: its two variants, repeated where short, each run in its own process, and the offline check
that training teaches. Run again, a comparison is never trained twice.

    results = compare(cfg)           # Without_DeepSpeed, With_DeepSpeed, cfg.runs_each times each, interleaved
    quality = quality_check(cfg)     # synthetic:small reads the synthetic passages (the quality preset)

A comparison's runs share a tag (comparison) and each knows its place in it (its config's repeat). compare() finds the
newest comparison of the same config in the store (config.PLACES aside: another spelling of results_folder is the same
comparison): it keeps every run of it that ended (FINISHED, or FAILED: a variant that ran out of memory is an answer
too), resumes each interrupted one from its last checkpoint (one without a checkpoint runs again, its KILLED record kept
beside it), runs the repeats it lacks, and says what it did. A comparison that had finished is shown as it was
recorded, so a notebook run again after a disconnect trains nothing that finished; compare(cfg, again=True) (the CLI's
--again) measures it afresh as a new comparison. quality_check() keeps its finished run the same way.
"""
from __future__ import annotations

import os
import shutil
import uuid

from . import tracking
from .config import ConfigError, RunConfig, tutorial_pair
from .launch import SWEEP_RUN_ENV, run_all, run_variant
from .tracking import RunResult, mlflow_client


def compare(cfg: RunConfig, progress: bool = True, again: bool = False) -> list[RunResult]:
    """The tutorial's pair, each variant run cfg.runs_each times (repeat 0, 1, ...), interleaved so drift on a shared
    machine hits both alike; report.compare_table and report.verdict pool the repeats. Continues, or shows, the newest
    comparison of the same config unless again (module docstring); one comparison at a time on a store (a second
    waits, then keeps what the first finished)."""
    with tracking.one_at_a_time(cfg.tracking_uri, "comparison", progress):
        return _compare(cfg, progress, again)


def _compare(cfg: RunConfig, progress: bool, again: bool) -> list[RunResult]:
    jobs = [c.replace(repeat=i) for i in range(cfg.runs_each) for c in tutorial_pair(cfg)]
    comparison, earlier = newest_comparison(cfg, jobs) if not again else (None, {})
    if comparison is None:
        comparison = uuid.uuid4().hex[:12]
    elif all(run_ended(earlier.get(key(c))) for c in jobs):
        say(progress, f"this comparison ({comparison}) had finished: its {len(jobs)} runs are shown as they were "
                      "recorded, nothing is trained again (compare(cfg, again=True), or --again, measures it afresh)")
    kept, resumes, cfgs, tags = {}, [], [], []
    for place, c in enumerate(jobs):
        which = f"{c.name} (run {c.repeat + 1} of {cfg.runs_each}: repeat {c.repeat})"  # the field counts from 0
        result, resume = reuse(c, earlier.get(key(c)), progress, which)
        if result is not None:
            kept[place] = result
            continue
        cfgs.append(c)
        tags.append({"repeat": str(c.repeat), "comparison": comparison})
        resumes.append(resume)
    fresh = iter(run_all(cfgs, progress=progress, tags=tags, resumes=resumes) if cfgs else [])
    return [kept[place] if place in kept else next(fresh) for place in range(len(jobs))]


def key(c: RunConfig) -> tuple[str, str]:
    return c.name, str(c.repeat)


def run_ended(run) -> bool:
    """Whether a run's record is final: FINISHED, or FAILED out of memory (what it measured is the answer: it does not
    fit). Another failure (a hub out of reach, a full disk) may not recur: that run is resumed or run again."""
    return run is not None and (run.info.status == "FINISHED" or
                                run.info.status == "FAILED" and run.data.tags.get("failure") == "oom")


def reuse(c: RunConfig, run, progress: bool, label: str) -> tuple[RunResult | None, tuple[str, str] | None]:
    """(the run kept as it is, or None; else the (run id, checkpoint) to resume it from, or None to run anew).

    A run that ended (run_ended) is kept; one interrupted or failed otherwise resumes from its newest checkpoint; one
    that stopped before its first checkpoint (or had trained every step) runs again, its record kept and its folder
    removed (nothing in it can be resumed). A run still running elsewhere is an error."""
    if run is None:
        return None, None
    if run.info.status == "RUNNING":
        raise ConfigError(f"run {run.info.run_name} ({run.info.run_id}) is still running on "
                          f"{run.data.tags.get('dsnb.host', 'another machine')}; wait for it to end (or stop it) and "
                          f"run again (a run whose machine is gone is marked KILLED {tracking.STALE_S} s after its "
                          "last heartbeat)")
    if run_ended(run):
        say(progress, f"{label}: kept its {run.info.status} run {run.info.run_id}")
        return RunResult.read(c.tracking_uri, run.info.run_id, skipped=True), None
    why = run.data.tags.get("failure") or run.info.status.lower()
    try:
        checkpoint = tracking.last_checkpoint(run, c)
    except ConfigError:  # it had trained every step: its record stays, and the job runs again
        say(progress, f"{label}: its run {run.info.run_id} ({why}) had trained every step (kept); it runs again")
        return None, None
    if checkpoint:
        say(progress, f"{label}: resumes its run {run.info.run_id} ({why}) from {os.path.basename(checkpoint)}")
        return None, (run.info.run_id, checkpoint)
    shutil.rmtree(os.path.join(c.output_dir, run.info.run_id), ignore_errors=True)
    say(progress, f"{label}: its run {run.info.run_id} ({why}) stopped before a checkpoint (kept); it runs again")
    return None, None


def newest_comparison(cfg: RunConfig, jobs: list[RunConfig]) -> tuple[str | None, dict]:
    """(the id of the newest comparison in cfg's store with a run of these jobs' configs, its runs by (name,
    repeat)); (None, {}) where there is none."""
    experiment = tracking.experiment_id(cfg)
    client = mlflow_client(cfg.tracking_uri)
    tracking.mark_stale_runs(client)
    wanted = {key(c): c for c in jobs}
    runs = tracking.search(client, [experiment], order_by=["attributes.start_time DESC"])
    newest = next((r.data.tags["comparison"] for r in runs if r.data.tags.get("comparison")
                   and (c := wanted.get((r.info.run_name, r.data.params.get("repeat")))) is not None
                   and tracking.same_config(r, c)), None)
    if newest is None:
        return None, {}
    found: dict = {}
    for run in reversed(runs):  # oldest first: a job run twice (a restart) counts its newest run
        if run.data.tags.get("comparison") == newest:
            found[run.info.run_name, run.data.params.get("repeat")] = run
    return newest, found


def say(progress: bool, text: str) -> None:
    if progress:
        print(f"dsnb: {text}", flush=True)


def quality_check(cfg: RunConfig, progress: bool = True, again: bool = False) -> RunResult | None:
    """The offline check that training teaches (the quality preset: synthetic:small learns to answer from the
    synthetic passages, asked questions no training row holds), logged to cfg's store and experiment; None where
    cfg.eval_samples is 0. It shares cfg's results_folder, so the model keep saves of it lands there too. Its newest
    finished run of the same config is kept (unless again), an interrupted one resumed from its checkpoint."""
    if not cfg.eval_samples:
        return None
    quality = RunConfig.layered({"preset": "quality", "tracking_uri": cfg.tracking_uri, "experiment": cfg.experiment,
                                 "output_dir": cfg.output_dir, "results_folder": cfg.results_folder})
    with tracking.one_at_a_time(quality.tracking_uri, "quality check", progress):
        run = None if again else newest_run(quality)
        result, resume = reuse(quality, run, progress, quality.name)
        return result or run_variant(quality, progress=progress, resume=resume)


def run_once(cfg: RunConfig, again: bool = False, progress: bool = True) -> RunResult:
    """A notebook's one variant (notebook 02) as compare treats each of its pair: its newest run of cfg kept where it
    ended (finished, or out of GPU memory), resumed from its checkpoint where it was interrupted, else run; so Run all
    after a disconnect, or once more, trains no finished work again. again=True measures it afresh. Under a sweep,
    which opened the run and decides what runs, the variant just runs."""
    if os.environ.get(SWEEP_RUN_ENV):
        return run_variant(cfg, progress=progress)
    with tracking.one_at_a_time(cfg.tracking_uri, "notebook variant", progress):
        kept, resume = reuse(cfg, None if again else newest_run(cfg, {ONCE_TAG: "1"}), progress, cfg.name)
        return kept or run_variant(cfg, progress=progress, tags={ONCE_TAG: "1"}, resume=resume)


ONCE_TAG = "notebook_variant"  # run_once's runs: a notebook's variant, not a comparison's, a sweep's or a bench's


def newest_run(cfg: RunConfig, tags: dict | None = None):
    """The newest run named like cfg and started with cfg (config.PLACES aside), and holding tags where given, or
    None."""
    client = mlflow_client(cfg.tracking_uri)
    tracking.mark_stale_runs(client)
    runs = tracking.search(client, [tracking.experiment_id(cfg)], order_by=["attributes.start_time DESC"])
    return next((r for r in runs if r.info.run_name == cfg.name and tracking.same_config(r, cfg) and
                 all(r.data.tags.get(k) == v for k, v in (tags or {}).items())), None)


def continue_jobs(kind: str, jobs: list[tuple[str, RunConfig]], machine: str, progress: bool = True, gpus: int = 1,
                  tags: list[dict] | None = None) -> tuple[list[RunResult], str]:
    """Run a bench's or capacity map's jobs ((key, config) each), keeping what an interrupted invocation of the same
    jobs measured on this machine (host and GPU), as many GPUs side by side, with this dsnb's code: its runs that
    ended (finished, or out of memory) are kept, the others run again; returns every result in order and, where runs
    were kept, a line that says so (its results were not written, so nothing of it was shown). An invocation with a
    run still running (another one, alive now) is not continued. mark_written(kind, results) then closes the
    invocation: a later one starts afresh."""
    if not jobs:  # every variant refused on this machine
        return [], ""
    machine = f"{machine}; {gpus} side by side; dsnb {code_fingerprint()}"
    client = mlflow_client(jobs[0][1].tracking_uri)
    tracking.mark_stale_runs(client)
    invocations: dict[str, dict] = {}  # newest first, each {job: its newest run}
    written = set()  # one run tagged is enough: a kill while mark_written tagged leaves the rest untagged
    for run in tracking.search(client, sorted({tracking.experiment_id(c) for _, c in jobs}),
                               order_by=["attributes.start_time DESC"]):
        tag = run.data.tags
        if f"{kind}_written" in tag:
            written.add(tag.get(f"{kind}_invocation"))
        elif tag.get(f"{kind}_invocation") and tag.get(f"{kind}_machine") == machine:
            invocations.setdefault(tag[f"{kind}_invocation"], {}).setdefault(tag.get(f"{kind}_job"), run)
    invocations = {i: runs for i, runs in invocations.items() if i not in written}
    invocation, kept = next(((i, runs) for i, runs in invocations.items()
                             if all(r.info.status != "RUNNING" for r in runs.values())), (None, {}))
    places = {i for i, (key, c) in enumerate(jobs) if (run := kept.get(key)) is not None and run_ended(run)
              and run.info.run_name == c.name and tracking.same_config(run, c)}
    invocation = invocation if places else uuid.uuid4().hex[:12]
    todo = [i for i in range(len(jobs)) if i not in places]
    mine = [{**(tags[i] if tags else {}), f"{kind}_invocation": invocation, f"{kind}_job": jobs[i][0],
             f"{kind}_machine": machine} for i in todo]
    note = ""
    if places:
        note = (f"{len(places)} of {len(jobs)} runs were measured by an interrupted invocation of this {kind} on this "
                f"machine ({invocation}) and kept; the other {len(todo)} ran now")
        say(progress, f"{kind}: continues {note}")
    fresh = iter(run_all([jobs[i][1] for i in todo], progress=progress, gpus=gpus, tags=mine) if todo else [])
    results = [kept_result(jobs[i][1].tracking_uri, kept[jobs[i][0]]) if i in places else next(fresh)
               for i in range(len(jobs))]
    return results, note


def kept_result(tracking_uri: str, run) -> RunResult:
    """A kept run as its runner returned it, its wall time the run's own start to end."""
    wall = (run.info.end_time - run.info.start_time) / 1000 if run.info.end_time else None
    return RunResult.read(tracking_uri, run.info.run_id, skipped=True, wall_seconds=wall)


def code_fingerprint() -> str:
    """A digest of dsnb's code (its modules and shipped YAML): runs measured by other code are not continued."""
    import hashlib

    digest = hashlib.sha1()
    folder = os.path.dirname(os.path.abspath(__file__))
    for name in sorted(os.listdir(folder)):
        if name.endswith((".py", ".yaml")):
            with open(os.path.join(folder, name), "rb") as f:
                digest.update(name.encode() + f.read())
    return digest.hexdigest()[:12]


def mark_written(kind: str, results: list[RunResult], where: str) -> None:
    """Tag every run of the invocations of results with where its results were written: whole, never continued."""
    if not results:
        return
    client = mlflow_client(results[0].tracking_uri)
    runs = [client.get_run(r.run_id) for r in results]
    ids = {run.data.tags.get(f"{kind}_invocation") for run in runs} - {None}
    experiments = sorted({run.info.experiment_id for run in runs})
    for run in tracking.search(client, experiments):
        if run.data.tags.get(f"{kind}_invocation") in ids:
            client.set_tag(run.info.run_id, f"{kind}_written", where)
