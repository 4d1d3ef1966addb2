"""What the reports say about runs, read back from a real MLflow store: answers joined on the question, the same-work
check over every field that sets the work, and speed verdicts that name a busy machine and their false-alarm rate."""
import io
import json
import os

import mlflow

from dsnb.config import NOT_WORK, OFFLINE, WORK_FIELDS, RunConfig, field_names
from dsnb.data import question_key
from dsnb.report import answers, power, questions_needed, same_answers, same_work, verdict
from dsnb.tracking import RunResult, create_run, log_json, mlflow_client


def logged(workdir, name, metrics, rows=None, params=None, **changes) -> RunResult:
    """A finished run as training leaves it: its config as params, its metrics and answers.json."""
    cfg = RunConfig(**dict(OFFLINE, tracking_uri=f"sqlite:///{workdir}/mlflow.db", run_name=name, **changes))
    run_id = create_run(cfg)
    client = mlflow_client(cfg.tracking_uri)
    client.log_batch(run_id, metrics=[mlflow.entities.Metric(k, v, 0, 0) for k, v in metrics.items()])
    for key, value in {"eval_task": "reading the passage", "eval_set": "abc123", "data_fingerprint": "d1",
                       "train_math": "m1", **(params or {})}.items():
        client.log_param(run_id, key, value)
    client.log_metric(run_id, "loss", 2.0, step=1)
    if rows is not None:
        with mlflow.start_run(run_id=run_id):
            log_json(rows, "answers.json")
    client.set_terminated(run_id)
    return RunResult.read(cfg.tracking_uri, run_id)


def rows(ids, after, before="x"):
    return [{"set": "eval", "id": i, "question": f"question {i}?", "gold": [f"gold {i}"], "before": before,
             "after": a, "after_em": float(a == f"gold {i}")} for i, a in zip(ids, after, strict=True)]


def test_answers_are_joined_on_the_question_and_shown_whole(workdir):
    long = "a long answer " * 20
    first = logged(workdir, "first", {}, rows(["q1", "q2", "q3"], ["gold q1", long, "no"]))
    second = logged(workdir, "second", {}, rows(["q3", "q1"], ["gold q3", "nope"]))  # other order, fewer questions
    third = logged(workdir, "third", {}, rows(["q4"], ["gold q4"]))
    styled = answers([first, second, third, None])
    table = styled.data
    assert list(table["question"]) == ["question q1?", "question q2?", "question q3?", "question q4?"]
    assert list(table["second: after"]) == ["nope", "(not asked)", "gold q3", "(not asked)"]
    assert list(table["first: after"])[1] == long  # never cut short
    assert "white-space: pre-wrap" in styled.to_html()
    assert len(answers([first, second], n=2).data) == 2


def test_same_work_compares_every_field_that_sets_the_work(workdir):
    assert set(WORK_FIELDS) | set(NOT_WORK) == set(field_names()) and not set(WORK_FIELDS) & set(NOT_WORK)
    for field, value in (("prompt", "eos"), ("eval_samples", 8), ("quantization", "none"), ("dtype", "bf16"),
                         ("lora_r", 8), ("lr_warmup_steps", 3), ("scoring", "squad")):
        base = logged(workdir / field, "base", {})
        other = logged(workdir / field, "other", {}, **{field: value})
        text = same_work([base, other])
        assert text.splitlines()[0].strip().startswith(f"config: DIFFERENT {field}"), (field, text)
    a, b = logged(workdir / "same", "a", {}), logged(workdir / "same", "b", {}, strategy="zero2",
                                                     offload_optimizer="cpu")
    assert "same in all" in same_work([a, b])  # DeepSpeed is how it runs, not what it trains


def logged_by_an_earlier_dsnb(workdir, name, missing: str, **changes) -> RunResult:
    """logged's run as a dsnb before the field `missing` existed leaves it: no param for that field."""
    from mlflow.entities import Param

    from dsnb.tracking import logged_params

    cfg = RunConfig(**dict(OFFLINE, tracking_uri=f"sqlite:///{workdir}/mlflow.db", run_name=name, **changes))
    client = mlflow_client(cfg.tracking_uri)
    experiment = client.get_experiment_by_name(cfg.experiment) or client.get_experiment(
        client.create_experiment(cfg.experiment))
    run_id = client.create_run(experiment.experiment_id, run_name=name).info.run_id
    params = {**{k: v for k, v in logged_params(cfg).items() if k != missing}, "eval_task": "reading the passage",
              "eval_set": "abc123", "data_fingerprint": "d1", "train_math": "m1"}
    client.log_batch(run_id, params=[Param(k, v) for k, v in params.items()])
    client.log_metric(run_id, "loss", 2.0, step=1)
    client.set_terminated(run_id)
    return RunResult.read(cfg.tracking_uri, run_id)


def test_a_run_of_an_earlier_dsnb_reads_each_field_it_predates_as_that_field_then_was(workdir):
    """A comparison read again after an upgrade: the earlier run logged no param for a field added since. It does the
    new run's work where the field then meant its default (lr_warmup_steps, fp8_fast_accum outside fp8), and not
    where it meant otherwise: fp8 accumulated in fp32 (fp8_fast_accum none) and its LM head was bf16 (fp8_head false)
    before those fields; run_config reads it so."""
    from dsnb.publish import run_config, saved_config

    older = logged_by_an_earlier_dsnb(workdir / "a", "older", "lr_warmup_steps")
    assert "same in all" in same_work([older, logged(workdir / "a", "newer", {})])
    older = logged_by_an_earlier_dsnb(workdir / "b", "older", "fp8_fast_accum")
    assert "same in all" in same_work([older, logged(workdir / "b", "newer", {})])
    fp8 = dict(quantization="fp8", dtype="bf16")
    older = logged_by_an_earlier_dsnb(workdir / "c", "older", "fp8_fast_accum", **fp8)
    text = same_work([older, logged(workdir / "c", "newer", {}, **fp8)])
    assert text.splitlines()[0].strip().startswith("config: DIFFERENT fp8_fast_accum ['both', 'none']"), text
    assert "same in all" in same_work([older, logged(workdir / "c", "exact", {}, **fp8, fp8_fast_accum="none")])
    run = mlflow_client(older.tracking_uri).get_run(older.run_id)
    assert run_config(run).fp8_fast_accum == "none"
    saved = {k: v for k, v in RunConfig(**dict(OFFLINE, **fp8)).to_dict().items() if k != "fp8_fast_accum"}
    assert saved_config({"config": saved}).fp8_fast_accum == "none"  # a folder an earlier dsnb saved
    assert saved_config({"config": {**saved, "fp8_fast_accum": "both"}}).fp8_fast_accum == "both"
    # the LM head was bf16 in every fp8 run before fp8_head: such a run is not a new default run's work
    older = logged_by_an_earlier_dsnb(workdir / "d", "older", "fp8_head", **fp8)
    text = same_work([older, logged(workdir / "d", "newer", {}, **fp8)])
    assert text.splitlines()[0].strip().startswith("config: DIFFERENT fp8_head ['False', 'True']"), text
    assert "same in all" in same_work([older, logged(workdir / "d", "bf16head", {}, **fp8, fp8_head=False)])
    assert run_config(mlflow_client(older.tracking_uri).get_run(older.run_id)).fp8_head is False
    assert saved_config({"config": {k: v for k, v in saved.items() if k != "fp8_head"}}).fp8_head is False
    # a run killed as it opened logged no config: nobody's work, not the defaults' (beside a run of the defaults that
    # failed before its data was made, so no fingerprint tells them apart either)
    from mlflow.entities import Param

    from dsnb.tracking import logged_params

    client = mlflow_client(older.tracking_uri)
    bare, default = (client.create_run(run.info.experiment_id, run_name=name).info.run_id for name in ("bare", "dflt"))
    client.log_batch(default, params=[Param(k, v) for k, v in logged_params(RunConfig()).items()])
    for run_id in (bare, default):
        client.set_terminated(run_id, "FAILED")
    text = same_work([RunResult.read(older.tracking_uri, bare), RunResult.read(older.tracking_uri, default)])
    assert text.splitlines()[0].strip().startswith("config: DIFFERENT"), text


def test_held_out_answers_are_judged_paired_and_all_zero_is_no_signal(workdir):
    ids = [f"q{i}" for i in range(64)]
    right = [f"gold {i}" for i in ids]
    base = logged(workdir, "base", {}, rows(ids, right))
    worse = logged(workdir, "worse", {}, rows(ids, right[:20] + ["no"] * 44))
    assert "DIFFER (p = 0.000" in same_work([base, worse])
    nothing = [logged(workdir / "zero", name, {}, rows(ids, ["no"] * 64)) for name in ("a", "b")]
    text = same_work(nothing)
    assert "no signal: every answer of both variants scored 0" in text and "agree" not in text.split("held-out")[-1]


def keyed(questions, after):
    """answers.json rows of questions given as (id, passage, question), keyed as training keys them."""
    out = []
    for (qid, passage, question), answer in zip(questions, after, strict=True):
        row = {"id": qid, "context": passage, "question": question, "answers": {"text": [passage.split()[0]]}}
        out.append({"set": "eval", "key": question_key(row), "id": qid, "question": question,
                    "gold": row["answers"]["text"], "before": "", "after": answer, "after_em": 0.0})
    return out


def test_answers_never_put_one_questions_answer_under_anothers(workdir):
    """Positional ids ("8" in two files) and one question text over four passages are different questions: joined on
    the question itself (id, passage and text), each keeps its own row and a run not asked it shows "(not asked)"."""
    lima = logged(workdir, "lima", {}, keyed([("8", "Lima district 8", "Which district?")], ["Lima"]))
    seoul = logged(workdir, "seoul", {}, keyed([("8", "Seoul district 8", "Which district?")], ["Seoul"]))
    table = answers([lima, seoul]).data
    assert list(table["lima: after"]) == ["Lima", "(not asked)"] and list(table["seoul: after"]) == ["(not asked)",
                                                                                                      "Seoul"]
    same_text = [("", f"passage {i} text", "What is it?") for i in range(4)]
    four = logged(workdir, "four", {}, keyed(same_text, ["a", "b", "c", "d"]))
    assert list(answers([four]).data["four: after"]) == ["a", "b", "c", "d"]
    assert same_answers([{"k": 1.0}], [{"j": 1.0}])["questions"] == 0  # no shared question: nothing is paired


def test_answers_over_two_stores_show_both_and_say_so(workdir):
    one = logged(workdir / "one", "run", {}, rows(["q1"], ["gold q1"]))
    two = logged(workdir / "two", "run", {}, rows(["q1"], ["no"]))
    styled = answers([one, two])
    assert list(styled.data.columns)[2:] == ["run [store 1]: before", "run [store 1]: after",
                                             "run [store 2]: before", "run [store 2]: after"]
    assert list(styled.data["run [store 2]: after"]) == ["no"]
    assert "runs from store 1 (sqlite:///" in styled.caption and str(workdir / "two") in styled.caption


def test_same_work_sees_what_was_trained_and_asked_by_content(workdir):
    """A data file changed at the same path, or a DeepSpeed JSON's own optimizer: every field reads the same, the
    content does not."""
    for key in ("data_fingerprint", "eval_set", "train_math"):
        base = logged(workdir / key, "base", {})
        other = logged(workdir / key, "other", {}, params={key: "changed"})
        assert same_work([base, other]).splitlines()[0].strip().startswith(f"config: DIFFERENT {key}"), key


def test_the_held_out_verdict_states_its_power_at_a_ten_point_difference(workdir):
    ids = [f"q{i}" for i in range(64)]
    half = [f"gold {i}" if n % 2 else "no" for n, i in enumerate(ids)]
    a = logged(workdir, "a", {}, rows(ids, half))
    b = logged(workdir, "b", {}, rows(ids, half[1:] + half[:1]))
    text = same_work([a, b])
    line = next(x for x in text.splitlines() if x.strip().startswith("held-out:"))
    assert "at 64 questions this test detects a 10-point difference in exact match at least" in line, line
    scores = [{q: float(n % 2) for n, q in enumerate(ids)}], [{q: float(n % 3 == 0) for n, q in enumerate(ids)}]
    at64 = power(*scores, ids, 64)
    assert 0.05 < at64 < 0.5  # far from sure at 64 questions
    needed = questions_needed(*scores, ids)
    assert power(*scores, ids, needed) >= 0.8 > power(*scores, ids, needed // 2)
    assert f"about {needed:,} questions would detect it 80% of the time" in line


def test_runs_that_measured_nothing_still_plot(workdir):
    """A run killed before it measured anything (no memory figure at all) leaves its panels empty, not a traceback."""
    from dsnb.report import plot_runs

    image = plot_runs([logged(workdir, "killed early", {})], log=False)
    assert image.data[:4] == b"\x89PNG"


def test_ranges_apart_with_too_few_runs_are_not_called_larger_than_the_spread(workdir):
    """Two runs a side whose ranges do not overlap split so by chance a third of the time: no verdict of "larger than
    the spread" (its false-alarm rate is 10%) in the comparison's words, the savings table or the pick for a budget."""
    from dsnb.report import FALSE_ALARM, best_for_budget, rank_test_p, savings_table

    idle = dict(host_other_cores=0.02, host_cores=16.0, peak_cpu_rss_mb=1000.0)
    base = [logged(workdir, "Without_DeepSpeed", dict(idle, samples_per_second=10.0 + i)) for i in range(2)]
    fast = [logged(workdir, "With_DeepSpeed", dict(idle, samples_per_second=20.0 + i)) for i in range(2)]
    assert rank_test_p([10.0, 11.0], [20.0, 21.0]) > FALSE_ALARM  # 1/3: the case this test is about
    text = verdict(base + fast)
    assert "larger than" not in text, text
    assert "split that way by chance 33% of the time: too few to tell from the run-to-run spread" in text, text
    assert savings_table(base + fast)["speed_vs_spread"].iloc[-1] == "too few runs to tell from the spread (p = 0.33)"
    assert "Without_DeepSpeed is not told apart from it: too few runs" in best_for_budget(base + fast, 15)
    third = logged(workdir, "With_DeepSpeed", dict(idle, samples_per_second=22.0))
    fourth = logged(workdir, "Without_DeepSpeed", dict(idle, samples_per_second=12.0))
    assert "larger than the run-to-run spread (p = 0.10" in verdict(base + fast + [third, fourth])


def test_a_speed_verdict_on_a_busy_machine_says_it_is_unreliable(workdir):
    idle = dict(host_other_cores=0.02, host_cores=16.0, peak_cpu_rss_mb=1000.0)
    base = [logged(workdir, "Without_DeepSpeed", dict(idle, samples_per_second=10.0 + i)) for i in range(3)]
    fast = [logged(workdir, "With_DeepSpeed", dict(idle, samples_per_second=20.0 + i)) for i in range(3)]
    text = verdict(base + fast)
    assert "larger than the run-to-run spread (p = 0.10" in text and "UNRELIABLE" not in text
    busy = logged(workdir / "busy", "With_DeepSpeed", dict(idle, samples_per_second=21.0, host_other_cores=3.0))
    calm = logged(workdir / "busy", "Without_DeepSpeed", dict(idle, samples_per_second=10.0))
    text = verdict([calm, busy])
    assert "UNRELIABLE: 1 of the 2 runs was timed on a busy machine (other processes used up to 3.0 of its 16" in text
    # one run crowded by other processes, another by the hypervisor: the most of each is said, whichever run it was
    stolen = logged(workdir / "stolen", "With_DeepSpeed", dict(idle, samples_per_second=21.0, host_steal_share=0.3))
    text = verdict([calm, busy, stolen])
    assert ("2 of the 3 runs were timed on a busy machine (other processes used up to 3.0 of its 16 cores, the "
            "hypervisor took up to 30% of its CPU time)") in text, text
    # every other place that reads speeds says it too: the fastest within a budget, and the savings table's row
    from dsnb.report import best_for_budget, savings_table

    assert best_for_budget([calm, busy], 9).endswith("But UNRELIABLE: 1 of the 2 runs was timed on a busy machine "
                                                     "(other processes used up to 3.0 of its 16 cores), so rerun on an "
                                                     "idle machine before choosing by speed.")
    assert "UNRELIABLE" not in best_for_budget(base + fast, 9)
    from dsnb.report import compare_table

    rows = list(compare_table([calm, busy]).index)
    assert "samples_per_second (UNRELIABLE: busy machine, see host_other_cores and host_steal_share)" in rows, rows
    assert "samples_per_second" in compare_table(base + fast).index
    from PIL import Image

    from dsnb.report import plot_runs

    def titles(runs):
        return Image.open(io.BytesIO(plot_runs(runs, log=False).data)).text["Description"]

    busy_title = "steady-state samples/s\nUNRELIABLE: 1 of the 2 runs timed on a busy machine (hatched) |"
    assert busy_title in titles([calm, busy])
    assert "UNRELIABLE" not in titles(base + fast)
    from matplotlib.figure import Figure

    from dsnb.report import busy_bars, grouped, load_runs

    groups = grouped(load_runs([calm, busy]))
    speeds = Figure().subplots().bar(range(len(groups)), [1.0] * len(groups))
    assert busy_bars(speeds, groups).startswith("\nUNRELIABLE: 1 of the 2 runs")
    assert [bar.get_hatch() for bar in speeds.patches] == [None if name == "Without_DeepSpeed" else "//"
                                                           for name in groups]
    # the figure logged to the runs says it too
    plot_runs([calm, busy])
    logged_png = mlflow.artifacts.download_artifacts(run_id=busy.run_id, artifact_path="comparison.png",
                                                     tracking_uri=busy.tracking_uri)
    assert busy_title in Image.open(logged_png).text["Description"]
    notes = savings_table([calm, busy])["note"]
    assert notes["Without_DeepSpeed"] == "" and notes["With_DeepSpeed"] == ("timed on a busy machine: other processes "
                                                                            "used 3.0 of its 16 cores")


def test_a_busy_machine_is_measured_during_the_timed_steps():
    """host_load over two snapshots: another process's busy loop shows as other cores. The test asserts only what it
    measures, on however busy a machine: the spinner's CPU time is read inside the window the snapshots bound, and the
    window lasts until the spinner has had a second of CPU, however few cores the machine spares it (a shared CI
    machine once gave it 0.175); host_load's other cores over that window must hold all of that second."""
    import os
    import subprocess
    import sys
    import time

    import psutil

    from dsnb.metrics import host_load, host_snapshot

    def cpu(process) -> float:
        return sum(process.cpu_times()[:2])

    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        process = psutil.Process(spinner.pid)
        start = host_snapshot()
        spun, deadline = -cpu(process), time.monotonic() + 120  # read after the window opens
        while spun + cpu(process) < 1.0 and time.monotonic() < deadline:
            time.sleep(0.05)
        spun += cpu(process)  # read before it closes
        end = host_snapshot()
    finally:
        spinner.kill()
    assert spun >= 1.0, f"the machine gave the spinner {spun:.2f} s of CPU in 120 s"
    busy = host_load(start, end)
    ticks = 10 / os.sysconf("SC_CLK_TCK")  # /proc/stat and a process's times count whole ticks, a few fields each
    assert busy["host_other_cores"] * (end[3] - start[3]) >= spun - ticks, (spun, end[3] - start[3], busy)
    assert json.dumps(busy)  # plain numbers, loggable as metrics


def test_the_best_run_for_a_budget_follows_the_capacity_maps_rule(workdir):
    """best_for_budget and the capacity map judge alike: a run whose tensors fit but whose NVML peak does not is
    "tight", never the pick; a failed run never is."""
    from dsnb.report import best_for_budget

    fast_tight = logged(workdir, "fast_tight", {"samples_per_second": 9.0, "peak_gpu_allocated_mb": 14_000.0,
                                                "peak_gpu_nvml_mb": 16_000.0})
    slow_fits = logged(workdir, "slow_fits", {"samples_per_second": 3.0, "peak_gpu_allocated_mb": 9_000.0,
                                              "peak_gpu_nvml_mb": 10_000.0})
    failed = logged(workdir, "failed_fastest", {"samples_per_second": 99.0, "peak_gpu_allocated_mb": 1_000.0})
    mlflow_client(failed.tracking_uri).set_terminated(failed.run_id, status="FAILED")  # a run that failed is no pick
    pick = best_for_budget([fast_tight, slow_fits, failed], 15)
    assert pick.startswith("Fastest within 15 GB: slow_fits (3 samples/s"), pick
    assert best_for_budget([fast_tight, slow_fits], 16).startswith("Fastest within 16 GB: fast_tight")
    assert best_for_budget([fast_tight], 9) == "No finished run fits in 9 GB."
    on_cpu = logged(workdir, "on_cpu", {"samples_per_second": 5.0, "peak_cpu_rss_mb": 900.0})  # took nothing from a GPU
    assert best_for_budget([on_cpu], 9) == ("No run measured GPU memory (they trained on the CPU), so none is judged "
                                            "against 9 GB; the fastest here: on_cpu (5 samples/s, one run).")


def test_a_store_read_back_keeps_every_repeat_of_the_newest_comparison(workdir):
    """find_runs (notebook 03) returns each name's newest run with the other repeats of its comparison, not one of
    them; the savings table and the pick for a budget use their medians and say whether a difference is larger than
    their spread. An older comparison of the same names, and a run made alone, stay out."""
    from dsnb.report import best_for_budget, find_runs, savings_table

    def comparison(tag, speeds, memory):
        for repeat, (base, zero) in enumerate(speeds):
            for name, strategy, speed in (("Without_DeepSpeed", "baseline", base), ("With_DeepSpeed", "zero2", zero)):
                run = logged(workdir, name, {"samples_per_second": speed, "peak_gpu_allocated_mb": memory[name],
                                             "peak_gpu_nvml_mb": memory[name] + 500}, strategy=strategy)
                client = mlflow_client(run.tracking_uri)
                client.set_tag(run.run_id, "comparison", tag)
                client.set_tag(run.run_id, "repeat", str(repeat))

    memory = {"Without_DeepSpeed": 9000.0, "With_DeepSpeed": 6000.0}
    comparison("old", [(99.0, 1.0)] * 3, memory)
    failed = logged(workdir, "Without_DeepSpeed", {"samples_per_second": 1.0}, strategy="baseline")  # before its first
    for key, value in (("comparison", "new"), ("repeat", "0")):  # checkpoint: the job ran again, its record kept
        mlflow_client(failed.tracking_uri).set_tag(failed.run_id, key, value)
    mlflow_client(failed.tracking_uri).set_terminated(failed.run_id, "FAILED")
    comparison("new", [(10.0, 6.0), (12.0, 7.0), (11.0, 20.0)], memory)  # the last repeat: the one newest of its name
    uri = f"sqlite:///{workdir}/mlflow.db"
    runs = find_runs(uri, "DeepSpeed_Comparison")
    assert sorted(r.metrics["samples_per_second"] for r in runs) == [6.0, 7.0, 10.0, 11.0, 12.0, 20.0]
    table = savings_table(runs)
    assert list(table["runs"]) == [3, 3] and table.loc["With_DeepSpeed", "samples_per_second"] == 7.0
    assert abs(table.loc["With_DeepSpeed", "speed_ratio"] - 7.0 / 11.0) < 1e-9
    assert table.loc["With_DeepSpeed", "speed_vs_spread"] == "within the spread (p = 0.70)"  # 3 vs 3 ranks, exact
    assert abs(table.loc["With_DeepSpeed", "gpu_memory_saved_share"] - 1 / 3) < 1e-9
    pick = best_for_budget(runs, 15)
    assert pick.startswith("Fastest within 15 GB: Without_DeepSpeed (11 samples/s, median of 3 runs, peak 9.3 GB).")
    assert "With_DeepSpeed is not told apart from it: within the spread (p = 0.70)." in pick, pick
    assert best_for_budget(runs, 9).startswith("Fastest within 9 GB: With_DeepSpeed (7 samples/s, median of 3")
    logged(workdir, "With_DeepSpeed", {"samples_per_second": 50.0, "peak_gpu_allocated_mb": 6000.0}, strategy="zero2")
    alone = find_runs(uri, "DeepSpeed_Comparison")  # a run made alone is newest of its name now: it stands alone
    assert sorted(r.metrics["samples_per_second"] for r in alone) == [10.0, 11.0, 12.0, 50.0]
    assert savings_table(alone).loc["With_DeepSpeed", "speed_vs_spread"] == "one run: no spread measured"
    assert best_for_budget(alone, 15).endswith("Next: Without_DeepSpeed; one run of one of them, so no run-to-run "
                                               "spread tells them apart.")


def test_untimed_steps_beyond_the_run_say_the_throughput_includes_start_up():
    """A run whose untimed steps reach past its last step has no steady state: its throughput covers every step, and
    throughput_includes_startup says so, whether the untimed steps end at the last step or beyond it."""
    from dsnb.data import BatchLog
    from dsnb.metrics import StepTimer

    for untimed, startup in ((1, 0.0), (2, 1.0), (5, 1.0)):
        batches = BatchLog(lambda features: features)
        timer = StepTimer("cpu", untimed, batches)
        for step in range(3):
            if step:
                batches([{"input_ids": [1, 2], "attention_mask": [1, 1]}])
                timer.consume()
            timer.mark(step)
        figures = timer.throughput(gather=False)
        assert figures["throughput_includes_startup"] == startup, (untimed, figures)
        assert figures["timed_steps"] == (1 if untimed == 1 else 2)


def test_the_table_shows_what_was_recorded_and_no_ratio_of_the_machines_load(workdir):
    """A metric no run recorded has no row (the recall scores of runs that read the passage, GPU memory where every
    run trained on the CPU), a variant that did not record it a blank cell, and the host's load is shown beside each
    variant but never as a ratio (one near-zero reading over another is no finding)."""
    from dsnb.report import compare_table

    cpu = {"peak_cpu_rss_mb": 900.0}  # what a run on the CPU records: no GPU figure
    load = {"host_steal_share": 0.01}
    a = logged(workdir, "a", {"samples_per_second": 10.0, "host_other_cores": 1e-12, "eval_exact_match": 0.5, **cpu,
                              **load})
    b = logged(workdir, "b", {"samples_per_second": 8.0, "host_other_cores": 0.03, "eval_exact_match": 0.5, **cpu,
                              **load})
    table = compare_table([a, b])
    assert "recall_exact_match" not in table.index and "host_other_cores" in table.index
    assert "peak_gpu_allocated_mb" not in table.index and "peak_gpu_nvml_mb" not in table.index  # no GPU: no 0 MB row
    c = logged(workdir, "c", {"samples_per_second": 9.0, "peak_gpu_allocated_mb": 4723.0, "peak_gpu_nvml_mb": 0.0})
    gpu = compare_table([a, c])  # one GPU run: its peak shows beside the CPU run's blank cell, never a 0
    assert gpu.loc["peak_gpu_allocated_mb", "c"] == "4,723" and gpu.loc["peak_gpu_allocated_mb", "a"] == ""
    assert gpu.loc["peak_gpu_nvml_mb", "c"] == "0" and gpu.loc["peak_gpu_allocated_mb", "c / a"] == ""  # a GPU's 0
    assert table.loc["host_other_cores", "b / a"] == "" and table.loc["samples_per_second", "b / a"] == "0.80x"
    assert table.loc["host_steal_share", "b / a"] == ""  # the hypervisor's share beside it, as a caveat too
    d, e = (logged(workdir, n, {"samples_per_second": 9.0, "mfu": 0.01, **cpu}, params={"device": "cpu"}) for n in "de")
    assert "mfu (of the CPU's nominal fp32 peak, assumed)" in compare_table([d, e]).index  # on the CPU: which peak
    gpu = logged(workdir, "f", {"mfu": 0.4, "peak_gpu_allocated_mb": 900.0}, params={"device": "cuda:0"})
    assert "mfu" in compare_table([d, gpu]).index


def test_mfu_beside_an_fp8_run_says_it_is_of_bf16s_peak_in_the_table(workdir):
    """MFU is model FLOPs over the GPU's dense bf16 peak; fp8 weights' matmuls peak at twice that, so where a table
    holds an fp8 run its MFU row says the figure is bf16-equivalent (and a table of bf16 runs keeps its plain label)."""
    from dsnb.bench import FP8_MARK, markdown, summarize
    from dsnb.report import compare_table

    speed = {"samples_per_second": 10.0, "tokens_per_second": 900.0, "mfu": 0.5, "step_time_ms": 30.0, "loss": 6.0}
    a = logged(workdir, "bf16", speed, quantization="none", dtype="bf16")
    b = logged(workdir, "fp8", dict(speed, mfu=0.62), quantization="fp8", dtype="bf16")
    c = logged(workdir, "bf16_again", speed, quantization="none", dtype="bf16")
    assert "mfu" in compare_table([a, c]).index
    fp8 = compare_table([a, b])
    assert "mfu" not in fp8.index and fp8.loc[[i for i in fp8.index if i.startswith("mfu (of bf16's peak; fp8")][0],
                                              "fp8"] == "0.62"
    rows = [dict(summarize(r.name, [r]), ratio_to_tutorial=1.0, quantization=q) for r, q in ((a, "none"), (b, "fp8"))]
    text = markdown({"gpu": "cpu", "command": "python -m dsnb bench", "untimed_steps": 3, "timed_steps": 10,
                     "mfu_convention": "6N", "variants": rows})
    assert f"| 62.00%{FP8_MARK} |" in text and "| 50.00% |" in text
    assert f"{FP8_MARK} fp8 weights: of bf16's peak" in text


def test_mfu_on_a_cpu_divides_by_one_nominal_peak_not_a_rate_measured_per_run(tmp_path):
    """A CPU has no datasheet peak in dsnb's table. A matmul rate measured per run swung 3x with the machine's load, so
    one comparison's MFU ratio (0.51x) disagreed with its speed ratio (0.72x): the peak is the CPU's nominal one,
    read from /proc/cpuinfo (threads x clock x FLOP a cycle of its widest vector unit), and what it does not say is
    assumed and labelled so."""
    import torch

    from dsnb.metrics import cpu_peak_flops, peak_flops

    info, none = tmp_path / "cpuinfo", str(tmp_path / "no_clock")
    for vendor, flags, per_cycle in (("GenuineIntel", "flags\t\t: fpu sse2 avx avx2 fma avx512f", 64),
                                     ("AuthenticAMD", "flags\t\t: fpu sse2 avx avx2 fma avx512f", 32),
                                     ("AuthenticAMD", "flags\t\t: fpu sse2 avx avx2 fma", 32),
                                     ("GenuineIntel", "flags\t\t: fpu sse2", 16), ("", "Features\t: fp asimd", 16)):
        info.write_text(f"processor\t: 0\nvendor_id\t: {vendor}\ncpu MHz\t\t: 2500.000\n{flags}\n\n"
                        f"processor\t: 1\ncpu MHz\t\t: 1200.000\n{flags}\n")
        flops, source = cpu_peak_flops(1, str(info), none)
        assert flops == 2.5e9 * per_cycle and source.startswith("nominal fp32: 1 threads x 2.50 GHz x "
                                                                f"{per_cycle} FLOP a cycle"), (flops, source)
        assert "assumed" not in source
    (tmp_path / "clock").write_text("3100000\n")  # the kernel's highest clock, in kHz, over the cores' current MHz
    assert cpu_peak_flops(1, str(info), str(tmp_path / "clock"))[0] == 3.1e9 * 16
    info.write_text("cpu MHz\t\t: unknown\nflags\t\t: avx2 fma\n")  # a field that does not parse is passed by
    assert cpu_peak_flops(1, str(info), none) == (2e9 * 32, "nominal fp32: 1 threads x 2.00 GHz x 32 FLOP a cycle "
                                                  "(AVX2 FMA); clock assumed, not reported")
    assert cpu_peak_flops(1, none, none)[1].endswith("(128-bit); clock and vector unit assumed, not reported")
    assert cpu_peak_flops(10**6, str(info), none)[0] == len(os.sched_getaffinity(0)) * 2e9 * 32  # cores it may use
    # a run's peak is that figure, not a matmul timed while whatever else the machine runs runs
    assert peak_flops("cpu") == cpu_peak_flops(torch.get_num_threads())


def test_a_moved_store_reads_and_writes_its_own_files(workdir):
    """A results folder moved (renamed, copied to Drive) keeps its runs' files: MLflow names them by absolute path, so
    the moved store read its held-out answers from the old folder (gone: the verdict's held-out line vanished) and a
    resumed run wrote back there. Opened, the store names its own folder's files."""
    import os

    from dsnb.report import answers, find_runs

    store = workdir / "res"
    store.mkdir()
    logged(store, "a", {}, rows(["q1", "q2"], ["gold q1", "no"]))
    moved = workdir / "res_moved"
    os.rename(store, moved)
    uri = f"sqlite:///{moved}/mlflow.db"
    [run] = find_runs(uri, "DeepSpeed_Comparison")
    client = mlflow_client(uri)
    assert client.get_run(run.run_id).info.artifact_uri.startswith(str(moved / "mlartifacts"))
    assert client.get_experiment_by_name("DeepSpeed_Comparison").artifact_location == str(moved / "mlartifacts")
    assert list(answers([run]).data["a: after"]) == ["gold q1", "no"]


def test_the_comparison_table_gives_each_held_out_exact_match_its_interval(workdir):
    """The table's held-out exact match carries its 95% interval over the questions asked (Wilson's: 54 of 72 right
    is 0.64-0.84), as a run's summary and card do; a 0.75 on 8 questions is told apart from one on 72."""
    from dsnb.report import compare_table

    scores = dict(eval_exact_match=0.75, eval_f1=0.8, eval_exact_match_before=0.0, samples_per_second=1.0)
    many = logged(workdir, "many", dict(scores, eval_questions=72.0))
    few = logged(workdir, "few", dict(scores, eval_questions=8.0))
    table = compare_table([many, few])
    row = next(i for i in table.index if i.startswith("eval_exact_match ("))
    assert table.loc[row, "many"] == "0.75 (95% 0.64-0.84)" and table.loc[row, "few"] == "0.75 (95% 0.41-0.93)"
    assert table.loc[row, "few / many"] == "1.00x"


def test_a_comparison_says_where_runs_trained_other_work_or_on_the_cpu(workdir):
    """The savings table's note names the fields that set the work where a variant differs from the baseline (full
    fine-tuning against LoRA: its ratios are not of the DeepSpeed settings alone); the verdict says that runs on the
    CPU tell nothing of a GPU's figures, and says nothing of the kind for GPU runs."""
    from dsnb.report import savings_table

    idle = dict(host_other_cores=0.02, host_cores=16.0, peak_cpu_rss_mb=1000.0, samples_per_second=10.0)
    cpu = {"device": "cpu"}
    base = logged(workdir, "Without_DeepSpeed", idle, params=cpu, strategy="baseline")
    same = logged(workdir, "With_DeepSpeed", idle, params=cpu, strategy="zero2", offload_optimizer="cpu")
    full = logged(workdir, "full", idle, params=cpu, strategy="zero2", lora_r=0, quantization="none")
    notes = savings_table([base, same, full])["note"]
    assert notes["With_DeepSpeed"] == "" and notes["full"].startswith(
        "other work than Without_DeepSpeed (quantization none vs 8bit, lora_r 0 vs 16): its ratios are not of the "
        "DeepSpeed settings alone"), notes
    assert "on the CPU: these speeds and memory figures are of this machine's processes" in verdict([base, same])
    gpu = {"device": "cuda:0"}
    on_gpu = [logged(workdir / "gpu", n, idle, params=gpu, strategy=s) for n, s in (("a", "baseline"), ("b", "zero2"))]
    assert "on the CPU" not in verdict(on_gpu)


def test_the_tables_ratio_marks_and_labels_follow_the_verdicts_rule(workdir):
    """The ratio column marks what the verdict cannot tell apart (ranges that overlap; ranges apart with too few runs),
    and the whole-call rows say that compiling is in them; an interrupt's words name what sent it."""
    from dsnb.report import compare_table
    from dsnb.tracking import interruption

    idle = dict(host_other_cores=0.02, host_cores=16.0, train_runtime_sec=5.0)
    base = [logged(workdir, "a", dict(idle, samples_per_second=10.0 + i)) for i in range(2)]
    fast = [logged(workdir, "b", dict(idle, samples_per_second=20.0 + i)) for i in range(2)]
    table = compare_table(base + fast)
    assert table.loc["samples_per_second", "b / a"] == "1.95x (too few runs to tell)"  # 20.5 / 10.5
    assert "train_runtime_sec (the whole training call: first steps and compiling included)" in table.index
    assert interruption(KeyboardInterrupt()) == "interrupted (Ctrl-C)"
    assert interruption(KeyboardInterrupt("SIGTERM")) == "interrupted: SIGTERM"


def test_reports_read_each_run_from_its_own_store_count_it_once_and_refuse_nothing_to_read(workdir):
    """Runs from two stores: each run's losses and answers come from its own store (same_work counted the second run's
    losses in the first store: "1, 0 records"; plot_runs failed). A run listed twice is one measurement, not two
    repeats with a spread; None (a skipped quality check) is left out; nothing to read, or a value of the wrong kind,
    is said in one line."""
    import pytest

    from dsnb.config import ConfigError
    from dsnb.report import answers, best_for_budget, compare_table, load_runs, plot_runs, quality_verdict

    idle = dict(host_other_cores=0.02, host_cores=16.0, peak_cpu_rss_mb=1000.0, samples_per_second=10.0)
    one = logged(workdir / "one", "Without_DeepSpeed", idle, rows=rows([1, 2], ["gold 1", "x"]))
    two = logged(workdir / "two", "With_DeepSpeed", idle, rows=rows([1, 2], ["gold 1", "gold 2"]))
    assert "logged losses: 1 records a run" in same_work([one, two])
    assert plot_runs([one, two], log=False).data[:4] == b"\x89PNG"
    assert "held-out" in verdict([one, two])
    assert [r.info.run_id for r in load_runs([one, None, one, two])] == [one.run_id, two.run_id]
    assert compare_table([one, one, two]).loc["runs"].tolist()[:2] == ["1", "1"]
    assert "Without_DeepSpeed" in best_for_budget([one], 0)  # 0: the whole GPU
    for call, message in ((lambda: verdict([]), "no runs to report on"), (lambda: plot_runs([None]), "no runs to"),
                          (lambda: best_for_budget([one], float("nan")), "memory_budget_gb is nan"),
                          (lambda: quality_verdict([one]), "takes the one run quality_check returned"),
                          (lambda: best_for_budget([one], "15"), "memory_budget_gb is '15'"),
                          (lambda: answers([one], n="8"), "n is '8'")):
        with pytest.raises(ConfigError, match=message):
            call()


def test_notebook_03_on_a_folder_without_a_store_says_so_and_makes_none(tmp_path):
    """compared_runs (notebook 03) on a results folder holding no store: one line, no empty store made there (it made
    one, then raised ValueError: no runs)."""
    import pytest

    from dsnb.config import ConfigError
    from dsnb.notebook import compared_runs

    folder = tmp_path / "nowhere"
    folder.mkdir()
    with pytest.raises(ConfigError, match="there is no store at"):
        compared_runs(RunConfig(**dict(OFFLINE, tracking_uri=f"sqlite:///{folder}/mlflow.db")))
    assert list(folder.iterdir()) == []
    # a store whose experiment holds only a run still going: said so, not an empty list for the tables to refuse
    cfg = RunConfig(**dict(OFFLINE, tracking_uri=f"sqlite:///{folder}/mlflow.db"))
    create_run(cfg)
    with pytest.raises(ConfigError, match="holds no finished or failed run; run a variant first"):
        compared_runs(cfg)
