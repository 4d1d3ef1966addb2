"""Read runs back from MLflow: side-by-side tables, plots, and which variant fits a GPU budget.

    runs = results                                   # RunResults from run_all / run_variant / sweeps, or:
    runs = find_runs(uri, experiment)                # the newest run of each name, with its repeats
    compare_table(runs)                              # metrics as rows, runs as columns, ratios to the first
    plot_runs(runs)                                  # memory, throughput, runtime, loss curves; PNG logged to each run
    savings_table(runs); best_for_budget(runs, 15)

Plots are drawn on matplotlib Figures of their own, so your pyplot backend and figures are left alone.
"""
from __future__ import annotations

import io
import numbers

from .config import WORK_FIELDS, ConfigError, redact
from .data import eval_task
from .metrics import Budget, busy_host, fit, gpu_taken_mb, mfu_text, scores_text, synthetic_note, wilson
from .tracking import RunResult, existing_store, mlflow_client, oom_guess, params_then, search, ui_command

# The tutorial's metrics first, then the ones that measure what it meant to.
METRICS = ["gpu_memory_used_mb", "train_runtime_sec", "train_samples_per_second", "train_steps_per_second",
           "train_loss", "peak_gpu_allocated_mb", "peak_gpu_reserved_mb", "peak_gpu_nvml_mb", "peak_cpu_rss_mb",
           "samples_per_second", "tokens_per_second", "mfu", "eval_exact_match_before", "eval_exact_match", "eval_f1",
           "eval_tokens_per_second", "recall_exact_match", "host_other_cores", "host_steal_share"]
SPEEDS = ("train_runtime_sec", "train_samples_per_second", "train_steps_per_second", "samples_per_second",
          "tokens_per_second", "mfu", "eval_tokens_per_second")  # the rows a busy machine makes unreliable
# the machine's load while a run was timed (other processes' cores, the hypervisor's share): a caveat, not its property
NO_RATIO = {"host_other_cores", "host_steal_share"}
ALPHA = 0.05  # the false-alarm rate of same_work's held-out test at equal skill (at most: the test is exact)
EFFECT, POWER = 0.10, 0.80  # the held-out difference whose detection rate (power) is stated beside the test's verdict,
# and the rate at which the number of questions that would detect it is given (searched up to MOST_QUESTIONS)
MOST_QUESTIONS = 16384
FINGERPRINTS = ("eval_set", "data_fingerprint", "train_math", "scoring_mode")  # what same_work compares too


def given(runs: list[RunResult]) -> list[RunResult]:
    """The runs a report reads: None left out (a quality check that was skipped), each run once (listed twice, it is
    one measurement, not two repeats); none at all refused."""
    unique = list({r.run_id: r for r in runs if r is not None}.values())
    if not unique:
        raise ConfigError("no runs to report on: give the results of compare, run_once or find_runs")
    return unique


class RunsClient:
    """An MLflow client for runs from any number of stores: each call that names a run goes to that run's own store
    (a comparison of runs from two stores read each run's losses and answers from the first store before)."""

    def __init__(self, runs: list[RunResult]):
        self.stores = {r.run_id: r.tracking_uri for r in runs}

    def __getattr__(self, name: str):
        def call(run_id: str, *args, **kwargs):
            return getattr(mlflow_client(self.stores[run_id]), name)(run_id, *args, **kwargs)
        return call


def load_runs(runs: list[RunResult]) -> list:
    """The MLflow runs behind results, as the store holds them now (given: each once, no None)."""
    return [mlflow_client(r.tracking_uri).get_run(r.run_id) for r in given(runs)]


def find_runs(tracking_uri: str, experiment: str, statuses=("FINISHED", "FAILED")) -> list[RunResult]:
    """The newest run of each name in an experiment, with the other repeats of the comparison (or bench, capacity map)
    that made it, each job's newest record: a variant's repeats share its name, and reading one of them would drop the
    others and their spread. Oldest first."""
    client = mlflow_client(existing_store(tracking_uri))
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise ConfigError(f"experiment {experiment!r} has no runs in {redact(tracking_uri)}; run a variant first, or "
                          "give the experiment the runs were logged to")
    found = [r for r in search(client, [exp.experiment_id], order_by=["attributes.start_time DESC"])
             if r.info.status in statuses]
    newest, jobs = {}, {}
    for run in found:  # newest first
        newest.setdefault(run.info.run_name, run)
        jobs.setdefault((run.info.run_name, invocation(run), job(run)), run)  # a job run again: its newest record
    chosen = [r for r in found if r is newest[r.info.run_name] or invocation(r) is not None and invocation(r) ==
              invocation(newest[r.info.run_name]) and jobs[r.info.run_name, invocation(r), job(r)] is r]
    if not chosen:
        raise ConfigError(f"experiment {experiment!r} in {redact(tracking_uri)} holds no finished or failed run; run a "
                          "variant first")
    return [RunResult(r.info.run_id, r.info.run_name, r.info.status, tracking_uri, dict(r.data.metrics))
            for r in sorted(chosen, key=lambda r: r.info.start_time)]


def invocation(run) -> tuple[str, str] | None:
    """What ties a run to the other repeats one command made: compare's comparison tag, or the bench's or capacity
    map's invocation tag (compare.continue_jobs); None for a run made alone."""
    tags = run.data.tags
    key = "comparison" if "comparison" in tags else next((k for k in sorted(tags) if k.endswith("_invocation")), None)
    return None if key is None else (key, tags[key])


def job(run) -> str | None:
    """Which job of its invocation a run did (a comparison's repeat, a bench's or map's job): a job run again after a
    failure leaves its earlier record beside the new one."""
    tags = run.data.tags
    return tags.get("repeat") or next((tags[k] for k in sorted(tags) if k.endswith("_job")), None)


def _names(runs) -> list[str]:
    names = []
    for run in runs:
        name = run.info.run_name
        names.append(f"{name} ({run.info.run_id[:6]})" if name in names else name)
    return names


def grouped(loaded: list) -> dict[str, list]:
    """MLflow runs by run name (a variant's repeats share one), in the order the names first appear."""
    groups: dict[str, list] = {}
    for run in loaded:
        groups.setdefault(run.info.run_name, []).append(run)
    return groups


def summary(group: list, key: str, finished_only: bool = False) -> tuple[float, float, float] | None:
    """(median, min, max) of a metric over a variant's finished runs (all its runs if none finished, unless
    finished_only: a failed run's speed is of the steps it made)."""
    import statistics

    done = [r for r in group if r.info.status == "FINISHED"] or ([] if finished_only else group)
    values = [v for r in done if (v := r.data.metrics.get(key)) is not None and v == v]
    return (statistics.median(values), min(values), max(values)) if values else None


def _number(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def status_label(run) -> str:
    """A run's status, and for one out of memory, which memory (a run the host's out-of-memory killer stopped is tagged
    oom=host RAM; KILLED so tagged: a run whose own process ended unseen while the killer took one of its cgroup's)."""
    if run.info.status == "FAILED" and run.data.tags.get("failure") == "oom":
        return f"FAILED: out of {run.data.tags.get('oom', 'memory')}"
    if run.info.status == "KILLED" and (guess := oom_guess(run.data.tags)):  # gone while the killer struck: likely
        return f"KILLED: likely out of {guess}"
    return run.info.status


def compare_table(runs: list[RunResult]):
    """Metrics as rows, variants as columns (a variant's repeats pooled: median [min-max]), and each variant's
    ratio of medians to the first, marked where it is within the run-to-run spread. A metric no run recorded (the
    recall scores of runs that read the passage; GPU memory where every run trained on the CPU) has no row, and a
    variant that did not record it has a blank cell; the host's load is the machine's, not the variant's, so it has no
    ratio."""
    import pandas as pd

    loaded = load_runs(runs)
    groups = grouped(loaded)
    columns = {}
    for name, group in groups.items():
        cells = ["/".join(sorted({status_label(r) for r in group})), str(len(group))]
        for key in METRICS:
            s = summary(group, key)
            cells.append("" if s is None else _number(s[0]) + (f" [{_number(s[1])}-{_number(s[2])}]"
                                                                if len(group) > 1 and s[1] != s[2] else "")
                         + score_interval(group, key, s))
        columns[name] = cells
    names = list(groups)
    for name in names[1:]:
        cells = ["", ""]
        for key in METRICS:
            a, b = summary(groups[name], key), summary(groups[names[0]], key)
            ratio = a and b and b[0] and key not in NO_RATIO
            cells.append(_ratio(a, b, finished_values(groups[name], key), finished_values(groups[names[0]], key))
                         if ratio else "")
        columns[f"{name} / {names[0]}"] = cells
    tasks = eval_tasks(loaded)
    fp8 = any(r.data.params.get("quantization") == "fp8" for r in loaded)
    labels = {"mfu": "mfu (of bf16's peak; fp8 weights: bf16-equivalent, fp8's own peak is 2x)"} if fp8 else {}
    # the whole training call, compiling and untimed steps included: samples_per_second is the steady state
    labels.update({key: f"{key} (the whole training call: first steps and compiling included)"
                   for key in ("train_runtime_sec", "train_samples_per_second", "train_steps_per_second")})
    if all(r.data.params.get("device") == "cpu" for r in loaded):  # trained on the CPU: metrics.mfu_text
        labels["mfu"] = "mfu (of the CPU's nominal fp32 peak, assumed)"
    if busy_runs(loaded):  # every speed row, not only the verdict's line, says its runs shared the machine
        labels.update({key: f"{labels.get(key, key)} (UNRELIABLE: busy machine, see host_other_cores and "
                            "host_steal_share)" for key in SPEEDS})
    index = [f"{key} ({tasks})" if key.startswith("eval_exact") or key == "eval_f1" else labels.get(key, key)
             for key in METRICS]
    table = pd.DataFrame(columns, index=["status", "runs"] + index)
    return table[(table != "").any(axis=1)]


def score_interval(group: list, key: str, s: tuple | None) -> str:
    """Beside a held-out or recall exact match (the median of a variant's runs): its 95% interval over the questions
    asked (metrics.wilson), as each run's summary and card give it."""
    if s is None or key not in ("eval_exact_match", "recall_exact_match"):
        return ""
    asked = summary(group, key.replace("exact_match", "questions"))
    return " (95% {:.2f}-{:.2f})".format(*wilson(s[0], asked[0])) if asked and asked[0] else ""


def eval_tasks(loaded: list) -> str:
    """What the runs' held-out scores measure (their eval_task) and how they were scored (scoring_mode: F1 over words
    or characters, never the two averaged), as a label."""
    return " / ".join(sorted({r.data.params.get("eval_task", "held-out") + (
        f"; {r.data.params['scoring_mode']} scoring" if "scoring_mode" in r.data.params else "") for r in loaded}))


def _ratio(a: tuple, b: tuple, mine: list[float], theirs: list[float]) -> str:
    """The ratio of medians, marked where the repeats cannot tell it from their spread (the verdict's rule)."""
    ratio = f"{a[0] / b[0]:.2f}x"
    kind, _ = spread_verdict(mine, theirs)
    return ratio + {"within": " (within spread)", "too few": " (too few runs to tell)"}.get(kind, "")


def rank_test_p(a: list[float], b: list[float]) -> float:
    """Two-sided exact p-value of the Mann-Whitney rank test: how often runs from one distribution split as unevenly
    as a and b do. Ranges that do not overlap give its smallest value, 2 m! n! / (m + n)!: 0.10 with 3 runs each, 0.03
    with 4."""
    import itertools
    import math

    values, m = a + b, len(a)

    def u(first: set) -> float:
        return sum((values[i] > values[j]) + 0.5 * (values[i] == values[j])
                   for i in first for j in range(len(values)) if j not in first)

    centre, observed = m * len(b) / 2, u(set(range(m)))
    splits = list(itertools.combinations(range(len(values)), m)) if math.comb(len(values), m) <= 20000 else None
    if splits is None:  # large samples: the normal approximation
        sd = math.sqrt(m * len(b) * (len(values) + 1) / 12)
        return math.erfc(abs(observed - centre) / sd / math.sqrt(2)) if sd else 1.0
    extreme = sum(abs(u(set(s)) - centre) >= abs(observed - centre) - 1e-9 for s in splits)
    return extreme / len(splits)


def verdict(runs: list[RunResult]) -> str:
    """In words, for speed, memory and quality: each variant against the first. Speed and memory: "larger than the
    run-to-run spread" where the repeats' ranges do not overlap (an exact rank test's p-value is given: that wording's
    false-alarm rate), and unreliable where the machine was busy while a run was timed; held-out answers: the paired
    test of same_work."""
    runs = given(runs)
    client = RunsClient(runs)
    groups = grouped(load_runs(runs))
    names = list(groups)
    lines = []
    on_gpu = any((summary(g, "peak_gpu_allocated_mb") or (0,))[0] for g in groups.values())
    memory = "peak_gpu_allocated_mb" if on_gpu else "peak_cpu_rss_mb"
    busy = busy_runs([r for g in groups.values() for r in g])
    if len(names) > 1 and all(r.data.params.get("device") == "cpu" for g in groups.values() for r in g):
        lines.append("on the CPU: these speeds and memory figures are of this machine's processes; ZeRO and offload "
                     "have no GPU memory to save here and their costs differ on a GPU, so they tell nothing of a GPU's "
                     "figures (run on a GPU for those)")
    for name in names[1:]:
        for key, what in (("samples_per_second", "samples/s"), (memory, memory.replace("_", " "))):
            line = spread_line(groups[name], groups[names[0]], key, what, name, names[0])
            if line and key == "samples_per_second" and busy:
                line += f"; but UNRELIABLE: {busy}, so rerun on an idle machine before reading it as a finding"
            if line:
                lines.append(line)
        held = held_out_line(client, groups[names[0]], groups[name], names[0], name)
        if held:
            lines.append(held)
    return "\n".join(lines)


# The false-alarm rate a "larger than the spread" verdict is held to: the rank test's p at most this. Ranges that do not
# overlap give p = 0.10 with 3 runs a side, 0.33 with 2: too few runs cannot tell a difference from chance, and say so.
FALSE_ALARM = 0.10


def spread_verdict(a: list[float], b: list[float]) -> tuple[str, float | None]:
    """Two sets of repeats' values against each other: ("one run", None) where a side has one, else ("within" where
    their ranges overlap, "larger" where they do not and the exact rank test's p is at most FALSE_ALARM, "too few"
    where they do not but so few runs split that way by chance more often than that) and the p."""
    if min(len(a), len(b)) < 2:
        return "one run", None
    p = rank_test_p(a, b)
    if min(a) <= max(b) and min(b) <= max(a):
        return "within", p
    return ("larger" if p <= FALSE_ALARM + 1e-9 else "too few"), p


def too_few_text(a: list, b: list, p: float) -> str:
    return (f"their ranges do not overlap, but {len(a)} and {len(b)} runs split that way by chance {p:.0%} of the "
            f"time: too few to tell from the run-to-run spread (3 each hold that to {FALSE_ALARM:.0%})")


def spread_line(group: list, base: list, key: str, what: str, name: str, base_name: str) -> str:
    a, b = summary(group, key), summary(base, key)
    if a is None or b is None:
        return ""
    values = [finished_values(g, key) for g in (group, base)]  # a failed run's speed is of the steps it made
    line = f"{what}: {name} {_number(a[0])} vs {base_name} {_number(b[0])}" + (f" ({a[0] / b[0]:.2f}x)" if b[0] else "")
    kind, p = spread_verdict(*values)
    if kind == "one run":
        pairs = ((name, values[0]), (base_name, values[1]))
        single = [f"{'one run' if v else 'no finished run'} of {n}" for n, v in pairs if len(v) < 2]
        who = "one run each" if single == [f"one run of {name}", f"one run of {base_name}"] else " and ".join(single)
        return line + f"; {who}, so no run-to-run spread was measured: repeat before reading it as a finding"
    counts = f"{len(values[0])} and {len(values[1])} runs"
    if kind == "within":
        return line + f"; medians of {counts}, and their ranges overlap: within the run-to-run spread (p = {p:.2f})"
    ranges = f"; medians of {counts}, ranges {_number(a[1])}-{_number(a[2])} and {_number(b[1])}-{_number(b[2])}: "
    if kind == "too few":
        return line + ranges + too_few_text(*values, p) + ": repeat before reading it as a finding"
    return line + ranges + (f"larger than the run-to-run spread (p = {p:.2f}: runs that differ only by chance split "
                            "this way that often)")


def busy_runs(loaded: list) -> str:
    """In words, the runs that were timed while the machine was busy (other processes' CPU time, or the hypervisor
    taking it), or "" where none was."""
    worst = [m for m in (run.data.metrics for run in loaded) if busy_host(m)]
    if not worst:
        return ""
    # the most either took in any busy run, in busy_host's words, "up to" since the other runs took less
    most = {key: max(m.get(key, 0.0) for m in worst) for key in ("host_other_cores", "host_steal_share")}
    return (f"{len(worst)} of the {len(loaded)} runs {'was' if len(worst) == 1 else 'were'} timed on a busy machine ("
            + busy_host({**worst[0], **most}, up_to="up to ") + ")")


def run_summary(metrics: dict, cfg, run_id: str | None) -> str:
    """What a person reads when a run ends: steady-state speed, peaks, loss, scores, and how to open the run (every
    metric is in MLflow, and with --verbose)."""

    m = metrics
    head = f"{cfg.name}" + (f" (run {run_id})" if run_id else "") + ": finished"
    lines = [head]
    if "samples_per_second" in m:
        note = " (start-up included: no step was left untimed)" if m.get("throughput_includes_startup") else ""
        lines.append(f"  speed    {m['samples_per_second']:.4g} samples/s, {m.get('tokens_per_second', 0):,.0f} real "
                     f"tokens/s over {m.get('timed_steps', 0):.0f} timed steps{note}; {mfu_text(m, cfg.quantization)}")
    if busy := busy_host(m):
        lines.append(f"  note     {busy} meanwhile: the speed is not this run's alone")
    gpu = (f"GPU {m['peak_gpu_allocated_mb'] / 1024:.2f} GB allocated ({m['peak_gpu_nvml_mb'] / 1024:.2f} GB by NVML), "
           if "peak_gpu_allocated_mb" in m else "")  # a CPU run measured none
    lines.append(f"  peaks    {gpu}host {m.get('peak_cpu_rss_mb', 0) / 1024:.2f} GB resident")
    if "train_loss" in m:
        lines.append(f"  loss     {m['train_loss']:.4g} (the mean over the steps)")
    for name, label in (("eval", f"held-out ({eval_task(cfg)})"), ("recall", "recall (trained questions)")):
        if f"{name}_exact_match" in m:
            lines.append(f"  {label} {scores_text(m, name)}" + synthetic_note(cfg.model, cfg.preset))
    lines.append(f"  open it  {ui_command(cfg.tracking_uri)}   (every metric: there, or --verbose)")
    return "\n".join(lines)


def format_table(table) -> str:
    def fmt(value):
        if isinstance(value, float):
            return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
        return "" if value is None else str(value)

    return table.map(fmt).to_string()


def loss_curve(client, run_id: str) -> tuple[list[int], list[float]]:
    """(steps, losses) of a run's curve; a step written twice (a resumed run retrains the steps after its checkpoint)
    counts once, as its newest record."""
    newest = {m.step: m.value for m in sorted(client.get_metric_history(run_id, "loss"), key=lambda m: m.timestamp)}
    steps = sorted(newest)
    return steps, [newest[step] for step in steps]


def same_work(runs: list[RunResult], loss_tolerance: float = 0.05) -> str:
    """Whether the runs did the same work: every run-config field that sets what is trained and asked is the same
    (config.WORK_FIELDS), and so is what they trained and asked by content (FINGERPRINTS: the training samples' tokens,
    the held-out questions with their passages and answers, the optimizer, schedule and clipping, a user's DeepSpeed
    JSON's included), the final losses agree within loss_tolerance (relative;
    a tolerance, not a test: variants doing the same work measured within 1% of each other), and the held-out answers
    of each variant against the first's, question by question, differ by no more than chance (same_answers: an exact
    paired test whose false-alarm rate at equal skill is at most ALPHA)."""

    runs = given(runs)
    client = RunsClient(runs)
    loaded = load_runs(runs)
    different = []
    params = [params_then(run.data.params) for run in loaded]  # a field a run's dsnb predates: as it then was
    for key in (*WORK_FIELDS, *FINGERPRINTS):
        values = {p.get(key) for p in params}
        if len(values) > 1:
            different.append(f"{key} {sorted(map(str, values))}")
    lines = [f"{'config':>14}: " + ("DIFFERENT " + "; ".join(different) if different else
                                    f"same in all {len(WORK_FIELDS)} fields that set the work, the same training "
                                    "samples, held-out questions, optimizer, schedule and clipping")]
    losses = [loss_curve(client, run.info.run_id)[1] for run in loaded]
    finals = [c[-1] for c in losses if c]
    counts = sorted({len(c) for c in losses})
    lines.append(f"{'logged losses':>14}: " + (f"{counts[0]} records a run" if len(counts) == 1 else
                                               f"{', '.join(str(len(c)) for c in losses)} records, run by run"))
    if finals:
        spread = max(finals) - min(finals)
        agreed = "agree" if spread <= loss_tolerance * max(abs(min(finals)), 1e-9) else "DIFFER"
        lines.append(f"{'final loss':>14}: {', '.join(f'{x:.2f}' for x in finals)} ({agreed} within "
                     f"{loss_tolerance:.0%})")
    groups = grouped(loaded)
    names = list(groups)
    for name in names[1:]:
        line = held_out_line(client, groups[names[0]], groups[name], names[0], name)
        if line:
            lines.append(f"{'held-out':>14}: {line.split(': ', 1)[1]}")
    return "\n".join(lines)


def answer_rows(client, run) -> list[dict]:
    """The held-out questions a run answered (its answers.json), each with its key: the question itself
    (data.question_key: id, passage and question text together), or for a run of an older dsnb, its id, question and
    gold answers."""
    import json

    try:
        with open(client.download_artifacts(run.info.run_id, "answers.json")) as f:
            rows = json.load(f)
    except Exception:  # a run with eval_samples 0, or one that failed before answering
        return []
    return [{**r, "key": r.get("key") or json.dumps([r.get("id"), r["question"], r.get("gold")], ensure_ascii=False)}
            for r in rows if r.get("set", "eval") == "eval"]


def answer_scores(client, run) -> dict[str, float]:
    """Each held-out question's exact match after training, by its key (answer_rows)."""
    return {r["key"]: float(r["after_em"]) for r in answer_rows(client, run) if "after_em" in r}


def sign_flip_p(diffs: list[int]) -> float:
    """Two-sided exact p-value that paired differences this far from 0 arise by chance: each difference's sign is a
    coin toss at equal skill (the sign-flip, or exact permutation, test; McNemar's exact test with one run each)."""
    counts = {0: 1}
    for d in (abs(x) for x in diffs if x):
        nxt: dict[int, int] = {}
        for total, ways in counts.items():
            for signed in (d, -d):
                nxt[total + signed] = nxt.get(total + signed, 0) + ways
        counts = nxt
    observed, everything = abs(sum(diffs)), sum(counts.values())
    return sum(w for total, w in counts.items() if abs(total) >= observed) / everything


def same_answers(a: list[dict[str, float]], b: list[dict[str, float]]) -> dict:
    """The paired held-out test (paired_test) with its power: the test's floor of power at an EFFECT difference on
    these questions, and the questions that would reach POWER (power, questions_needed)."""
    test = paired_test(a, b)
    if test["questions"]:
        asked = test.pop("asked")
        test |= {"power": power(a, b, asked, len(asked)), "needed": questions_needed(a, b, asked)}
    return test


def paired_test(a: list[dict[str, float]], b: list[dict[str, float]]) -> dict:
    """a and b are two variants' repeats, each {question: exact match}. On the questions both were asked, each
    variant's mean over its repeats; the p-value that they differ this much by chance (sign_flip_p on integer
    differences). {"questions", "asked", "a", "b", "p", "signal"}; signal False where every answer scored the same (all
    0, say: nothing to tell the variants apart)."""
    asked = sorted(set.intersection(*(set(r) for r in a + b))) if a and b else []
    if not asked:
        return {"questions": 0}
    ra, rb = len(a), len(b)
    diffs = [round(sum(r[q] for r in a) * rb - sum(r[q] for r in b) * ra) for q in asked]
    every = {r[q] for r in a + b for q in asked}
    mean = lambda runs: sum(r[q] for r in runs for q in asked) / (len(runs) * len(asked))  # noqa: E731
    return {"questions": len(asked), "asked": asked, "a": mean(a), "b": mean(b), "p": sign_flip_p(diffs),
            "signal": len(every) > 1}


def power(a: list[dict], b: list[dict], asked: list, n: int, effect: float = EFFECT, seed: int = 0) -> float:
    """A floor on how often the paired test (same_answers, at ALPHA) would call two variants different whose exact
    match differs by `effect`, on n questions like these: each question keeps its difficulty (its mean exact match over
    every run of a and b), one variant effect/2 below it and the other above (within 0 and 1); each variant's repeats
    are counted as one run (their answers can be nearly the same: more independent repeats only add power); n
    questions drawn from these (all of them, in order, where n is their number). A simulation with a fixed seed (the
    sign test's p-value by its normal approximation with continuity correction), so the same runs give the same
    figure."""
    import math

    import numpy as np

    rng = np.random.default_rng(seed)
    sims = max(200, min(2000, 4_000_000 // n))  # fewer draws of many questions: memory, not precision, bounds them
    runs = a + b
    level = np.array([sum(r[q] for r in runs) / len(runs) for q in asked])
    level = np.broadcast_to(level if n == len(level) else rng.choice(level, size=(sims, n)), (sims, n))
    right_a = rng.random((sims, n)) < np.clip(level - effect / 2, 0, 1)
    right_b = rng.random((sims, n)) < np.clip(level + effect / 2, 0, 1)
    plus, minus = (right_b & ~right_a).sum(axis=1), (right_a & ~right_b).sum(axis=1)
    z = np.maximum(np.abs(plus - minus) - 1, 0) / np.sqrt(np.maximum(plus + minus, 1))
    return float(np.mean(np.vectorize(math.erfc)(z / math.sqrt(2)) < ALPHA))


def questions_needed(a: list[dict], b: list[dict], asked: list, goal: float = POWER,
                     most: int = MOST_QUESTIONS) -> int | None:
    """The fewest held-out questions like these (power's model) at which the test detects an EFFECT difference with
    probability `goal`, to the nearest step of a doubling search refined by halves; None beyond `most`."""
    n, found = 32, None
    while n <= most:
        if power(a, b, asked, n) >= goal:
            found = n
            break
        n *= 2
    if found is None:
        return None
    low = found // 2
    while found - low > max(8, found // 16):  # refine between the last miss and the first hit
        mid = (low + found) // 2
        low, found = (low, mid) if power(a, b, asked, mid) >= goal else (mid, found)
    return found


def held_out_line(client, base: list, group: list, base_name: str, name: str) -> str:
    """The paired held-out comparison in words, labelled with what the questions measure (eval_task)."""
    test = same_answers([answer_scores(client, r) for r in base if r.info.status == "FINISHED"],
                        [answer_scores(client, r) for r in group if r.info.status == "FINISHED"])
    if not test["questions"]:
        return ""
    task = group[0].data.params.get("eval_task", "held-out")
    what = f"held-out exact match ({task})"
    if not test["signal"]:
        return (f"{what}: no signal: every answer of both variants scored {test['a']:.0f} on the {test['questions']} "
                "questions, so they cannot tell the variants apart"
                + synthetic_note(group[0].data.params.get("model"), group[0].data.params.get("preset")))
    head = f"{what}: {name} {test['b']:.2f} vs {base_name} {test['a']:.2f}, paired over {test['questions']} questions" \
        + synthetic_note(group[0].data.params.get("model"), group[0].data.params.get("preset"))
    needed = f"about {test['needed']:,} questions would" if test["needed"] else \
        f"even {MOST_QUESTIONS:,} questions would not"
    power_note = (f"; at {test['questions']} questions this test detects a {EFFECT * 100:.0f}-point difference in "
                  f"exact match at least {test['power']:.0%} of the time ({needed} detect it {POWER:.0%} of the time: "
                  "raise eval_samples)")
    if test["p"] < ALPHA:
        return head + (f": DIFFER (p = {test['p']:.3f} < {ALPHA}: at equal skill this happens {ALPHA:.0%} of the time)"
                       + power_note)
    return head + f": agree (p = {test['p']:.2f}; a real difference smaller than the questions can show may remain)" \
        + power_note


def busy_bars(speeds, groups: dict) -> str:
    """The speed panel says what the table and the verdict say: a variant with a run timed on a busy machine has its
    bar hatched gray; the words for the panel's title ("" where no run was busy)."""
    runs = [r for g in groups.values() for r in g]
    busy = sum(bool(busy_host(r.data.metrics)) for r in runs)
    for bar, group in zip(speeds.patches, groups.values(), strict=True):
        if any(busy_host(r.data.metrics) for r in group):
            bar.set(hatch="//", facecolor="tab:gray")
    return f"\nUNRELIABLE: {busy} of the {len(runs)} runs timed on a busy machine (hatched)" if busy else ""


def plot_runs(runs: list[RunResult], log: bool = True):
    """Four panels: peak memory, throughput and held-out exact match per variant (medians, bars from the lowest
    to the highest repeat), and every run's loss curve; a variant timed on a busy machine has its speed bar hatched
    (busy_bars). The PNG, the panels' titles in its Description text, is logged to every run."""
    from IPython.display import Image
    from matplotlib.figure import Figure

    runs = given(runs)
    client = RunsClient(runs)
    loaded = load_runs(runs)
    groups = grouped(loaded)
    fig = Figure(figsize=(12, 8))
    axes = fig.subplots(2, 2)
    x = list(range(len(groups)))

    def bars(ax, key, width=0.8, offset=0.0, scale=1.0, **style):
        nan = float("nan")  # a variant that did not record key: no bar, rather than one of 0
        stats = [summary(g, key) or (nan, nan, nan) for g in groups.values()]
        heights = [m / scale for m, _, _ in stats]
        errors = [[(m - lo) / scale for m, lo, _ in stats], [(hi - m) / scale for m, _, hi in stats]]
        return ax.bar([i + offset for i in x], heights, width, yerr=errors, capsize=3, **style)

    memory = [("peak_gpu_allocated_mb", "GPU allocator peak"), ("peak_gpu_nvml_mb", "GPU NVML peak"),
              ("gpu_memory_used_mb", "GPUtil after-before (tutorial)"), ("peak_cpu_rss_mb", "CPU RSS peak")]
    memory = [m for m in memory if any(m[0] in r.data.metrics for r in loaded)]  # a CPU run has no GPU figures
    width = 0.8 / max(1, len(memory))  # none where every run failed before it measured anything
    for i, (key, label) in enumerate(memory):
        bars(axes[0, 0], key, width, (i - (len(memory) - 1) / 2) * width, 1024, label=label)
    if memory:
        axes[0, 0].legend(fontsize=8)
    speed = busy_bars(bars(axes[0, 1], "samples_per_second", color="tab:green"), groups)
    bars(axes[1, 0], "eval_exact_match", color="tab:purple")
    titles = ("peak memory (GB)", "steady-state samples/s" + speed,
              f"held-out exact match after training ({eval_tasks(loaded)})")
    for ax, title in zip((axes[0, 0], axes[0, 1], axes[1, 0]), titles, strict=True):
        ax.set(title=title, xticks=x, xticklabels=list(groups), xlim=(-0.5, len(x) - 0.5))  # a bar left out too
        ax.tick_params(axis="x", labelrotation=15, labelsize=8)
    if speed:
        axes[0, 1].title.set_color("tab:red")
    for name, run in zip(_names(loaded), loaded, strict=True):
        axes[1, 1].plot(*loss_curve(client, run.info.run_id), marker="o", label=name)
    axes[1, 1].set(title="training loss", xlabel="optimizer step")
    axes[1, 1].legend(fontsize=8)
    fig.tight_layout()
    buffer = io.BytesIO()
    # the panels' titles in the PNG's own text: what a screen reader, or a test, reads of it
    png = {"format": "png", "dpi": 100, "metadata": {"Description": " | ".join(titles + ("training loss",))}}
    fig.savefig(buffer, **png)
    if log:
        for run in loaded:
            client.log_figure(run.info.run_id, fig, "comparison.png", save_kwargs=png)
    return Image(buffer.getvalue())


def answers(runs: list[RunResult], n: int | None = None):
    """The held-out questions with their gold answers and each variant's answers before and after training, joined on
    the question itself (answer_rows: id, passage and question text together) from the runs' answers.json: any number
    of runs, from any number of stores; a question a run was not asked shown as "(not asked)", never one run's answer
    under another's question; n: the first n questions. Shown whole, as a table whose cells wrap (a pandas Styler;
    .data is the DataFrame), captioned with how many questions every run was asked and, where the runs come from
    several stores, which."""
    import pandas as pd

    if n is not None and (isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1):
        raise ConfigError(f"n is {n!r}; give how many questions to show, a whole number, or None for all")
    runs = given(runs)  # a skipped quality check is None
    table: dict[str, dict] = {}
    columns: list[str] = []
    stores = list(dict.fromkeys(r.tracking_uri for r in runs))
    asked_by: list[set] = []
    for store in stores:
        client = mlflow_client(store)
        for name, group in grouped(load_runs([r for r in runs if r.tracking_uri == store])).items():
            run = next((r for r in group if r.info.status == "FINISHED"), group[0])
            rows = answer_rows(client, run)
            if not rows:  # a run with eval_samples 0, or one that failed before answering
                continue
            label = name if len(stores) == 1 else f"{name} [store {stores.index(store) + 1}]"
            columns += [f"{label}: before", f"{label}: after"]
            asked_by.append({r["key"] for r in rows})
            for r in rows:
                gold = ", ".join(r["gold"]) or "(none)"
                entry = table.setdefault(r["key"], {"question": r["question"], "gold": gold})
                for when in ("before", "after"):
                    entry[f"{label}: {when}"] = r.get(when, "")
    frame = pd.DataFrame(list(table.values()), columns=["question", "gold", *columns]).fillna("(not asked)")
    every = len(set.intersection(*asked_by)) if asked_by else 0
    caption = f"{len(frame)} questions, {every} of them asked of every run shown"
    if len(stores) > 1:
        caption += "; runs from " + ", ".join(f"store {i + 1} ({redact(u)})" for i, u in enumerate(stores))
    frame = frame.head(n) if n else frame
    return frame.style.set_properties(**{"white-space": "pre-wrap", "text-align": "left"}).hide(axis="index") \
        .set_caption(caption)


def quality_verdict(result: RunResult | None) -> str:
    """Whether training taught the model, in words: exact match before and after on what the held-out questions
    measure (eval_task), and with a closed-book prompt on the trained questions (recall)."""
    if result is None:
        return "No quality check: eval_samples is 0"
    if not isinstance(result, RunResult):
        raise ConfigError(f"quality_verdict takes the one run quality_check returned, not {type(result).__name__}")
    m = result.metrics
    if "eval_exact_match" not in m:
        return f"{result.name}: no held-out scores ({result.status})"
    run = mlflow_client(result.tracking_uri).get_run(result.run_id)
    task = run.data.params.get("eval_task", "held-out")
    learned = m.get("recall_exact_match", m["eval_exact_match"]) - m.get(
        "recall_exact_match_before", m.get("eval_exact_match_before", 0.0))
    which = "trained questions' (recall)" if "recall_exact_match" in m else "held-out"
    taught = "yes" if learned > 0.5 else "no"
    lines = [f"Training taught the model ({which} exact match rose by more than 0.5): {taught}",
             f"held-out, {task}: {scores_text(m, 'eval')} no training row holds"
             + synthetic_note(run.data.params.get("model"), run.data.params.get("preset"))]
    if "recall_exact_match" in m:
        lines.append(f"recall (trained questions): {scores_text(m, 'recall')}")
    return "\n".join(lines)


def savings_table(runs: list[RunResult], baseline: str | None = None):
    """Memory saved and speed lost by each variant relative to the baseline (the first run of strategy baseline, else
    the first): medians over a variant's repeats, how many, and whether the speed difference is larger than their
    run-to-run spread (the verdict's rank test and false-alarm rate). Memory is the GPU allocator's peak, or where no
    run had a GPU, the process's resident memory (a CPU run: offload cannot save GPU memory there, the column says so).
    A variant timed on a busy machine says so in its note (busy_host), its speed not its own."""
    import pandas as pd

    groups = grouped(load_runs(runs))
    names = list(groups)
    base = baseline if baseline is not None else next(
        (n for n, g in groups.items() if g[0].data.params.get("strategy") == "baseline"), names[0])
    if base not in groups:
        raise ConfigError(f"baseline {base!r} is none of the runs' names: {', '.join(names)}")
    on_gpu = any(summary(g, "peak_gpu_allocated_mb") for g in groups.values())
    memory = "peak_gpu_allocated_mb" if on_gpu else "peak_cpu_rss_mb"
    saved = "gpu_memory_saved_share" if on_gpu else "host_rss_saved_share (no GPU)"
    rows = []
    for name, group in groups.items():
        peak, base_peak = summary(group, memory), summary(groups[base], memory)
        speed, base_speed = (summary(g, "samples_per_second", finished_only=True) for g in (group, groups[base]))
        busy = [busy_host(r.data.metrics) for r in group if busy_host(r.data.metrics)]
        other = work_difference(group, groups[base]) if name != base else ""
        rows.append({"run": name, "status": "/".join(sorted({status_label(r) for r in group})), "runs": len(group),
                     memory: peak and peak[0],
                     saved: 1 - peak[0] / base_peak[0] if peak and base_peak and base_peak[0] else None,
                     "samples_per_second": speed and speed[0],
                     "speed_ratio": speed[0] / base_speed[0] if speed and base_speed and base_speed[0] else None,
                     "speed_vs_spread": "" if name == base else "no finished run" if not (speed and base_speed)
                     else against_spread(group, groups[base], "samples_per_second"),
                     "note": "; ".join(filter(None, [
                         f"other work than {base} ({other}): its ratios are not of the DeepSpeed settings alone"
                         if other else "",
                         f"timed on a busy machine: {busy[0]}" + (f" ({len(busy)} of its {len(group)} runs)"
                                                                  if len(group) > 1 else "") if busy else ""]))})
    return pd.DataFrame(rows).set_index("run")


def work_difference(group: list, base: list) -> str:
    """The fields that set the work (config.WORK_FIELDS: the model, what is trained, the data, batch and steps) where a
    variant's runs differ from the baseline's, in words ("" where none does)."""
    mine, theirs = (params_then(g[0].data.params) for g in (group, base))
    return ", ".join(f"{key} {mine.get(key)} vs {theirs.get(key)}" for key in WORK_FIELDS
                     if mine.get(key) != theirs.get(key))


def finished_values(group: list, key: str) -> list[float]:
    """key's values over the group's finished runs (a failed run's speed is of the steps it made), NaN left out."""
    return [v for r in group if r.info.status == "FINISHED" and (v := r.data.metrics.get(key)) is not None and v == v]


def against_spread(group: list, base: list, key: str) -> str:
    """Whether a variant's metric differs from the baseline's by more than their repeats' spread, with the rank test's
    p-value (the rate at which runs that differ only by chance split as these do); one run a side measures none."""
    a, b = finished_values(group, key), finished_values(base, key)
    kind, p = spread_verdict(a, b)
    if kind == "one run":
        return "one run: no spread measured"
    if kind == "too few":
        return f"too few runs to tell from the spread (p = {p:.2f})"
    return f"{'within' if kind == 'within' else 'larger than'} the spread (p = {p:.2f})"


def best_for_budget(runs: list[RunResult], memory_budget_gb: float) -> str:
    """The fastest variant that fits the budget, by the capacity map's rule (metrics.RULES: its NVML peak, context
    included, at most the budget, in every run of it), by the median of its repeats, and whether the runner-up is
    within their run-to-run spread. Runs on the CPU measured no GPU memory: none is judged against a GPU's budget."""
    import statistics

    if isinstance(memory_budget_gb, bool) or not isinstance(memory_budget_gb, numbers.Real) or \
            not memory_budget_gb >= 0:
        raise ConfigError(f"memory_budget_gb is {memory_budget_gb!r}; give the GPU memory budget in GB, a number (0: "
                          "the whole GPU)")
    groups, budget = grouped(load_runs(runs)), Budget(memory_budget_gb)
    done = {n: g for n, g in groups.items() if finished_values(g, "samples_per_second")}
    states = {n: {fit(r.info.status, r.data.metrics, budget) for r in g if r.info.status in ("FINISHED", "FAILED")}
              for n, g in done.items()}
    cpu = bool(done) and all(s == {"no GPU"} for s in states.values())
    fits = [n for n, s in states.items() if s == ({"no GPU"} if cpu else {"fits"})]
    if not fits:
        return f"No finished run fits in {memory_budget_gb:g} GB."
    ranked = sorted(fits, key=lambda n: statistics.median(finished_values(done[n], "samples_per_second")),
                    reverse=True)
    name, group = ranked[0], done[ranked[0]]
    speeds = finished_values(group, "samples_per_second")
    speed = statistics.median(speeds)
    runs_of = f"median of {len(speeds)} runs" if len(speeds) > 1 else "one run"
    if cpu:
        text = (f"No run measured GPU memory (they trained on the CPU), so none is judged against {memory_budget_gb:g} "
                f"GB; the fastest here: {name} ({speed:.3g} samples/s, {runs_of}).")
    else:
        peak = max(gpu_taken_mb(r.data.metrics) for r in group if r.info.status == "FINISHED")
        text = (f"Fastest within {memory_budget_gb:g} GB: {name} ({speed:.3g} samples/s, {runs_of}, peak "
                f"{peak / 1024:.1f} GB).")
    if len(ranked) > 1:
        close = against_spread(done[ranked[1]], group, "samples_per_second")
        if close.startswith(("within", "too few")):
            text += f" {ranked[1]} is not told apart from it: {close}."
        elif close.startswith("one run"):
            text += f" Next: {ranked[1]}; one run of one of them, so no run-to-run spread tells them apart."
    busy = busy_runs([r for n in fits for r in done[n]])  # the runs the choice was made among
    return text + (f" But UNRELIABLE: {busy}, so rerun on an idle machine before choosing by speed." if busy else "")
