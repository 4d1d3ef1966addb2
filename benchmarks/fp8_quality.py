"""Does LoRA on fp8 base weights learn what it learns on bf16 ones? Held-out exact match and F1 on the quality task.

    python benchmarks/fp8_quality.py --out DIR [--repeats 4]     # on a GPU with FP8 matmuls (gpu_runs.sh fp8quality)
    python benchmarks/fp8_quality.py --table DIR/fp8_quality.json  # the table again, from the file the run wrote

The quality preset trains synthetic:small in full from random weights; a LoRA run on a random model cannot learn
(its frozen random embeddings), so this first trains a base: the quality preset for BASE_STEPS steps in fp32 (exact
match about 0.14 on the 72 held-out questions), saved. Then LoRA (r 16 on every Linear, no dropout) from that base in
bf16 for the preset's 150 steps, with the base weights in bf16 (`--quantization none`) and in fp8 (`--quantization
fp8`), repeats interleaved (repeat r seeds adapters, data order and sampling alike for both). Each run is its own
`python -m dsnb run`, so each arm is exactly what a user runs. On the CPU `--quantizations none` rehearses the bf16
arm (fp8 is refused there).

The verdict is dsnb's paired held-out test (report.same_answers: each question's exact match averaged over an arm's
repeats, an exact sign-flip test; false-alarm rate at equal skill at most 5%), with its power; F1 and the loss curves
beside it."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

BASE_STEPS = 60
EXPERIMENT = "dsnb_fp8_quality"
LORA = ["--lora_r", "16", "--lora_alpha", "32", "--lora_dropout", "0", "--lora_targets", "all-linear",
        "--dtype", "bf16", "--save_model", "false", "--logging_steps", "10"]


def dsnb_run(args: list[str], log: str) -> int:
    """One `python -m dsnb run` in its own process, its output to log; its exit code."""
    with open(log, "w") as f:
        return subprocess.run([sys.executable, "-m", "dsnb", "run", "--preset", "quality", "--experiment", EXPERIMENT,
                               *args], stdout=f, stderr=subprocess.STDOUT).returncode


def newest(client, name: str):
    """The newest FINISHED run called name in EXPERIMENT."""
    experiment = client.get_experiment_by_name(EXPERIMENT)
    runs = client.search_runs([experiment.experiment_id], f"attributes.run_name = '{name}' and "
                              "attributes.status = 'FINISHED'", order_by=["attributes.start_time DESC"])
    if not runs:
        sys.exit(f"no finished run {name} in {EXPERIMENT}: see its log")
    return runs[0]


def record(client, run) -> dict:
    """What the table needs of a run: its arm, repeat, scores, per-question exact match and loss curve."""
    from dsnb.report import answer_rows, loss_curve
    from dsnb.tracking import params_then

    m, fp8 = run.data.metrics, run.data.params.get("quantization") == "fp8"
    return {"name": run.info.run_name, "run_id": run.info.run_id, "quantization": run.data.params.get("quantization"),
            # which accumulation the fp8 arm took, and whether its LM head was fp8 (fp8_head; the json of earlier
            # calls lacks it: their heads were bf16)
            "fp8_fast_accum": params_then(run.data.params)["fp8_fast_accum"] if fp8 else None,
            "fp8_head": params_then(run.data.params)["fp8_head"] if fp8 else None,
            "repeat": int(run.data.params.get("repeat", 0)), "status": run.info.status,
            "exact_match_before": m.get("eval_exact_match_before"), "f1_before": m.get("eval_f1_before"),
            "exact_match": m.get("eval_exact_match"), "f1": m.get("eval_f1"), "questions": m.get("eval_questions"),
            "samples_per_second": m.get("samples_per_second"),
            "per_question": {r["key"]: float(r["after_em"]) for r in answer_rows(client, run) if "after_em" in r},
            "loss_curve": list(zip(*loss_curve(client, run.info.run_id), strict=True))}


def measure(out: str, repeats: int, quantizations: list[str], tracking_uri: str) -> dict:
    from dsnb.tracking import mlflow_client

    os.makedirs(out, exist_ok=True)
    started = time.time()
    print(f"base: the quality preset for {BASE_STEPS} steps, saved", flush=True)
    code = dsnb_run(["--max_steps", str(BASE_STEPS), "--run_name", "fp8q_base", "--tracking_uri", tracking_uri],
                    os.path.join(out, "fp8q_base.log"))
    if code:
        sys.exit(f"the base run failed (exit {code}): see {os.path.join(out, 'fp8q_base.log')}")
    client = mlflow_client(tracking_uri)
    base = newest(client, "fp8q_base")
    base_model = client.download_artifacts(base.info.run_id, "model")
    print(f"  exit {code}, {time.time() - started:.0f} s; the base model: {base_model}", flush=True)
    runs = []
    for repeat in range(repeats):
        for q in quantizations:
            name = f"lora_{'bf16' if q == 'none' else q}"
            t0 = time.time()
            code = dsnb_run(["--model", base_model, *LORA, "--quantization", q, "--repeat", str(repeat), "--run_name",
                             name, "--tracking_uri", tracking_uri], os.path.join(out, f"{name}_{repeat}.log"))
            print(f"{name} repeat {repeat}: exit {code}, {time.time() - t0:.0f} s", flush=True)
            if code == 0:
                runs.append(record(client, newest(client, name)))
    result = {"base": record(client, base), "base_steps": BASE_STEPS, "lora": LORA, "runs": runs,
              "seconds": round(time.time() - started, 1)}
    with open(os.path.join(out, "fp8_quality.json"), "w") as f:
        json.dump(result, f, indent=1)
    return result


def table(result: dict) -> str:
    from dsnb.report import ALPHA, same_answers

    arms: dict[str, list[dict]] = {}
    for r in result["runs"]:
        arms.setdefault(r["quantization"], []).append(r)
    base = result["base"]
    lines = [f"Base: the quality preset (synthetic:small, full fine-tuning in fp32) for {result['base_steps']} steps: "
             f"exact match {base['exact_match']:.3f}, F1 {base['f1']:.3f} on {base['questions']:.0f} held-out "
             f"questions. LoRA from it: `{' '.join(result['lora'])}`, the preset's 150 steps, each run its own "
             f"`python -m dsnb run`; {result['seconds']:.0f} s in all.", "",
             "| run | base weights | repeat | exact match before | after | F1 before | after | final loss |",
             "|---|---|---|---|---|---|---|---|"]
    for r in sorted(result["runs"], key=lambda r: (r["quantization"] != "none", r["repeat"])):
        lines.append(f"| {r['name']} | {'bf16' if r['quantization'] == 'none' else r['quantization']} | {r['repeat']} "
                     f"| {r['exact_match_before']:.3f} | {r['exact_match']:.3f} | {r['f1_before']:.3f} | "
                     f"{r['f1']:.3f} | {r['loss_curve'][-1][1]:.4f} |")
    lines += ["", "| base weights | runs | exact match, mean [min-max] | F1, mean [min-max] |", "|---|---|---|---|"]
    for q, runs in arms.items():
        em, f1 = [r["exact_match"] for r in runs], [r["f1"] for r in runs]
        lines.append(f"| {'bf16' if q == 'none' else q} | {len(runs)} | {statistics.mean(em):.3f} [{min(em):.3f}-"
                     f"{max(em):.3f}] | {statistics.mean(f1):.3f} [{min(f1):.3f}-{max(f1):.3f}] |")
    if "none" in arms and len(arms) > 1:
        lines.append("")
        for q in (q for q in arms if q != "none"):
            test = same_answers([r["per_question"] for r in arms["none"]], [r["per_question"] for r in arms[q]])
            said = "DIFFER" if test["p"] < ALPHA else "agree"
            lines.append(f"- Held-out exact match, paired over {test['questions']} questions (each question's mean "
                         f"over an arm's repeats): {q} {test['b']:.3f} vs bf16 {test['a']:.3f}, p = {test['p']:.3f}: "
                         f"**{said}** (at equal skill the test says DIFFER at most {ALPHA:.0%} of the time); it "
                         f"detects a 10-point difference at least {test['power']:.0%} of the time on these questions.")
            gaps = []
            for a in arms["none"]:
                b = next((r for r in arms[q] if r["repeat"] == a["repeat"]), None)
                if b:
                    ref = dict(a["loss_curve"])
                    gaps += [loss / ref[step] - 1 for step, loss in b["loss_curve"] if ref.get(step)]
            if gaps:
                lines.append(f"- Loss, {q} against bf16 at the same step and repeat: largest gap "
                             f"{max(gaps, key=abs):+.2%}, mean {statistics.mean(gaps):+.2%} over {len(gaps)} logged "
                             "steps.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="fp8_quality")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--quantizations", default="none,fp8")
    parser.add_argument("--tracking_uri", default="")
    parser.add_argument("--table", help="a fp8_quality.json this script wrote: print its table")
    a = parser.parse_args()
    if a.table:
        print(table(json.load(open(a.table))))
        return
    uri = a.tracking_uri or f"sqlite:///{os.path.abspath(os.path.join(a.out, 'mlflow.db'))}"
    print(table(measure(a.out, a.repeats, a.quantizations.split(","), uri)))


if __name__ == "__main__":
    main()
