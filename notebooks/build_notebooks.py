"""Write the notebooks' cells from one place, so every parameters cell lists RunConfig's fields and defaults.

    python notebooks/build_notebooks.py          # rewrite the three notebooks (outputs cleared)
    DSNB_OFFLINE=1 python notebooks/build_notebooks.py --execute   # and run them with papermill, keeping outputs

The committed notebooks carry the outputs of the --execute run: nbval compares the cells marked
NBVAL_CHECK_OUTPUT against them.
"""
import os
import sys

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from dsnb.config import RunConfig, field_docs

HERE = os.path.dirname(os.path.abspath(__file__))
# Where the project is published: the Colab badges open its notebooks there, and the setup cell installs dsnb from
# it unless DSNB_SOURCE says otherwise. Change it here (and rebuild) if you publish elsewhere.
REPO = "dsnb-dev/dsnb"
SOURCE = f"git+https://github.com/{REPO}"


def badge(name):
    url = f"https://colab.research.google.com/github/{REPO}/blob/main/notebooks/{name}"
    return f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({url})"


SETUP = f"""# Colab only (elsewhere run `bash setup.sh` once): install dsnb and what it needs, keeping Colab's
# torch, then build DeepSpeed's CPU Adam once. DSNB_SOURCE is anything pip installs: the project's git URL
# (below), a wheel, or the repository's .zip uploaded to /content. The log is kept in dsnb_setup.log.
import os, subprocess, sys, time
DSNB_SOURCE = os.environ.get("DSNB_SOURCE", "{SOURCE}")
if os.environ.get("COLAB_RELEASE_TAG") and not os.path.isfile("dsnb_setup.log"):
    import torch
    started, log = time.time(), []
    for step in (["pip", "install", "-q", DSNB_SOURCE, f"torch=={{torch.__version__}}"], ["dsnb", "prepare"]):
        child = subprocess.Popen([sys.executable, "-m", *step], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
        for line in child.stdout:
            print(line, end="")
            log.append(line)
        if child.wait():
            open("dsnb_setup_failed.log", "w").writelines(log)
            raise RuntimeError(f"{{' '.join(step)}} failed after {{time.time() - started:.0f}} s; "
                               "its last lines:\\n" + "".join(log[-20:]))
    open("dsnb_setup.log", "w").writelines(log)
    print(f"dsnb set up from {{DSNB_SOURCE}} in {{time.time() - started:.0f}} s")"""

OFFLINE_NOTE = ("**Offline default.** With `DSNB_OFFLINE=1` in the environment (CI, an air-gapped box, a GPU "
                "without a hub), parameters left at their defaults take dsnb's offline values instead: the "
                "synthetic Llama `synthetic:tiny` and the synthetic SQuAD-format set, a short fp32 run. Values "
                "you set (here or through papermill) always win. The first dsnb cell prints which defaults apply. "
                "**On Colab's free T4**, set `preset = \"colab_t4\"`: fp16 (a T4 has no native bf16), a 15 GB GPU "
                "cap and a 12.7 GB host-RAM check before anything loads.")


def parameters_cell(names=None):
    defaults, docs = RunConfig().to_dict(), field_docs()
    names = names or list(defaults)
    lines = [f"{name}: {type(defaults[name]).__name__} = {defaults[name]!r}  # {docs[name]}" for name in names]
    cell = new_code_cell("\n".join(lines))
    cell.metadata["tags"] = ["parameters"]
    return cell


def checked(source):
    """A code cell whose output nbval compares with the committed one."""
    return new_code_cell("# NBVAL_CHECK_OUTPUT\n" + source)


def notebook_01():
    return [
        new_markdown_cell(f"""# DeepSpeed vs. the baseline: the tutorial's experiment, measured
{badge("01_deepspeed_vs_baseline.ipynb")}

**ZeRO** splits training state across data-parallel GPUs instead of copying it to each: stage 1 splits
the optimizer state, stage 2 also the gradients, stage 3 also the parameters (fetched when needed).
**Offload** moves optimizer state (and at stage 3 the parameters) to CPU RAM or NVMe, trading GPU memory
for PCIe or disk traffic.

This notebook runs the tutorial's comparison: LoRA fine-tuning of an 8-bit Llama-3.2-3B
(`Bllossom/llama-3.2-Korean-Bllossom-3B`) on SQuAD's first 1,000 rows, once without DeepSpeed and once
with ZeRO-2 and the optimizer offloaded to the CPU. Unlike the tutorial, each run gets its own process
(no leftover memory), peak memory comes from the allocator and NVML, throughput counts real tokens, short
runs are repeated so a difference can be told from run-to-run noise, the trained model answers held-out
questions (SQuAD's exact match and F1), and every run lands in MLflow with its whole config.

{OFFLINE_NOTE}"""),
        new_code_cell(SETUP),
        new_markdown_cell("## Parameters\nEvery name is a `dsnb.RunConfig` field; papermill overrides them "
                          "(`papermill --help-notebook` lists them)."),
        parameters_cell(),
        new_markdown_cell("## The run config\nValidated before anything loads: a bad value stops here with "
                          "what to change."),
        checked("import dsnb\n\ncfg = dsnb.from_notebook(globals())"),
        new_markdown_cell("## What the runs will take\nThe data is read and checked, and GPU memory and host RAM "
                          "are estimated, before any model downloads."),
        new_code_cell("print(dsnb.preview(cfg))"),
        new_markdown_cell("## Train both variants, each in its own process\nA bar per variant and per step with the "
                          "loss; short runs are repeated (`repeats`), interleaved. A failed variant is recorded as a "
                          "FAILED run and the next one still runs."),
        new_code_cell("results = dsnb.compare(cfg)"),
        new_markdown_cell("## Side by side, read back from MLflow\nThe tutorial's metrics first "
                          "(`gpu_memory_used_mb` is its GPUtil after-minus-before reading), then peak memory from "
                          "the allocator and NVML, steady-state throughput, MFU and the held-out scores. With "
                          "repeats: medians, [lowest-highest], and which ratios are within the run-to-run spread."),
        new_code_cell("dsnb.compare_table(results)"),
        new_code_cell("print(dsnb.verdict(results))"),
        new_markdown_cell("## Did both runs do the same work?\nSame data, seed and steps, final losses and held-out "
                          "scores that agree: otherwise the comparison means nothing."),
        checked("print(dsnb.same_work(results))"),
        new_markdown_cell("## Plots\nAlso logged to each run as `comparison.png`."),
        new_code_cell("dsnb.plot_runs(results)"),
        new_markdown_cell("## Does training teach the model? A quality check\nSeparate from the comparison, so it "
                          "stays quick: `synthetic:small` learns dsnb's synthetic facts (capitals and years, in "
                          "Korean and English) in about a minute on a CPU, then answers 72 paraphrased questions "
                          "that no training row holds. With the real model and SQuAD, the table above already "
                          "holds the held-out scores of SQuAD's validation questions."),
        new_code_cell("quality = dsnb.quality_check(cfg)\nprint(dsnb.quality_verdict(quality))"),
        checked("print(dsnb.quality_verdict(quality).splitlines()[0])"),
        new_markdown_cell("## Keep the trained model\nThe tutorial run's adapter (or, trained in full, its model) as "
                          "a folder that peft and transformers load; `merge=True` folds the LoRA weights into the "
                          "base model. "
                          "`python -m dsnb save --run_id ... --push_to you/name` uploads it (with your token)."),
        new_code_cell("folder = dsnb.save_model(results[0], f\"adapter-{results[0].run_id[:8]}\")\nprint(folder)"),
        new_markdown_cell("## Take the results with you\nColab's disk goes with its runtime: this zips the store "
                          "(SQLite file and artifacts) and downloads it (`drive_folder=` also copies it to a mounted "
                          "Google Drive). Open it in notebook 03 (`tracking_uri = \"dsnb_mlflow.zip\"`), or unzip it "
                          "and run the command printed below: MLflow's UI listens on 127.0.0.1 only, since it has "
                          "no login (do not bind it to 0.0.0.0 as the tutorial did)."),
        new_code_cell("print(dsnb.download_store(cfg.tracking_uri))\nprint(dsnb.ui_command(\"sqlite:///mlflow.db\"))"),
        new_markdown_cell("## The trained models answer\nThe first three held-out questions, before training and "
                          "after: the tutorial's pair (offline, a random tiny model: no sense yet) and the quality "
                          "check's model (`eval_samples = 0` skips both the answers and the check)."),
        new_code_cell("dsnb.answers(results + [quality])"),
    ]


def notebook_02():
    return [
        new_markdown_cell(f"""# One variant: any ZeRO stage and offload
{badge("02_zero_stages.ipynb")}

One execution trains one variant in its own process and records it as one MLflow run. Set the
parameters (for example `strategy = "zero3"`, `offload_param = "cpu"`), or let papermill run it once
per variant: `python -m dsnb sweep -f variants/sweep_zero_stages.yaml`.

{OFFLINE_NOTE}"""),
        new_code_cell(SETUP),
        new_markdown_cell("## Parameters"),
        parameters_cell(),
        new_markdown_cell("## The run config"),
        checked("import dsnb\n\ncfg = dsnb.from_notebook(globals())"),
        new_code_cell("print(dsnb.preview(cfg))"),
        new_markdown_cell("## Train"),
        new_code_cell("result = dsnb.run_variant(cfg)"),
        checked("print(result.name, result.status)"),
        new_markdown_cell("## What it cost, and what it learned"),
        new_code_cell("dsnb.compare_table([result])"),
        new_code_cell("dsnb.plot_runs([result])"),
        new_code_cell("dsnb.answers([result])"),
    ]


def notebook_03():
    return [
        new_markdown_cell(f"""# Compare runs: memory saved, speed lost, and what fits your GPU
{badge("03_compare_runs.ipynb")}

Reads the newest run of each name from an MLflow experiment (from notebooks 01 and 02, `python -m dsnb
compare` or a sweep) and compares them against the baseline. `memory_budget_gb` is the GPU you
are sizing for: 15 for a T4, 22 for an L4, 40 or 80 for an A100. In a new Colab runtime, upload the
`dsnb_mlflow.zip` that notebook 01 downloaded (the Files pane) and set `tracking_uri = "dsnb_mlflow.zip"`."""),
        new_code_cell(SETUP),
        new_markdown_cell("## Parameters"),
        parameters_cell(["tracking_uri", "experiment", "memory_budget_gb"]),
        new_markdown_cell("## The runs"),
        new_code_cell("import dsnb\n\nruns = dsnb.find_runs(dsnb.open_store(tracking_uri), experiment)\n"
                      "dsnb.compare_table(runs)"),
        new_markdown_cell("## Memory saved and speed lost against the baseline"),
        new_code_cell("dsnb.savings_table(runs)"),
        new_code_cell("dsnb.plot_runs(runs, log=False)"),
        new_markdown_cell("## The fastest variant that fits the budget\nPeak GPU memory as NVML saw it "
                          "(the CUDA context included), against `memory_budget_gb`."),
        new_code_cell("print(dsnb.best_for_budget(runs, memory_budget_gb))"),
    ]


NOTEBOOKS = {"01_deepspeed_vs_baseline.ipynb": notebook_01, "02_zero_stages.ipynb": notebook_02,
             "03_compare_runs.ipynb": notebook_03}


def main():
    for name, build in NOTEBOOKS.items():
        nb = new_notebook(cells=build())
        nb.metadata.update(kernelspec={"name": "python3", "display_name": "Python 3", "language": "python"},
                           language_info={"name": "python"})
        if name == "03_compare_runs.ipynb":
            nb.cells[3].source = nb.cells[3].source.replace("memory_budget_gb: float = 0.0",
                                                            "memory_budget_gb: float = 15.0")
        nbformat.write(nb, os.path.join(HERE, name))
    if "--execute" in sys.argv:
        import tempfile

        import papermill

        with tempfile.TemporaryDirectory() as tmp:  # a fresh MLflow store, so 03 sees only these runs
            for name in NOTEBOOKS:  # in order: 03 compares the runs that 01 and 02 made
                papermill.execute_notebook(os.path.join(HERE, name), os.path.join(HERE, name), cwd=tmp,
                                           kernel_name="python3")


if __name__ == "__main__":
    main()
