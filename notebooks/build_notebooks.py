"""Write the notebooks' cells from one place, so every parameters cell lists RunConfig's fields and defaults.

    python notebooks/build_notebooks.py          # rewrite the three notebooks (outputs cleared)
    DSNB_OFFLINE=1 python notebooks/build_notebooks.py --execute   # and run them with papermill, keeping outputs

The committed notebooks carry the outputs of the --execute run: nbval compares the cells marked
NBVAL_CHECK_OUTPUT against them.
"""
import os
import sys
import tomllib

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from dsnb.config import RunConfig, field_docs

HERE = os.path.dirname(os.path.abspath(__file__))
# Where the project is published, named once, in pyproject.toml's [project.urls]: the Colab badges open its notebooks
# there, and the setup cell installs dsnb from it unless an upload or DSNB_SOURCE says otherwise.
with open(os.path.join(HERE, "..", "pyproject.toml"), "rb") as f:
    REPOSITORY = tomllib.load(f)["project"]["urls"]["Repository"]
REPO = REPOSITORY.removeprefix("https://github.com/")
SOURCE = f"git+{REPOSITORY}"


def badge(name):
    url = f"https://colab.research.google.com/github/{REPO}/blob/main/notebooks/{name}"
    return f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({url})"


def setup(read_only: bool = False) -> str:
    """The setup cell: on Colab only, dsnb and only what the runtime lacks, then (unless read_only) CPU Adam, each
    step's lines shown as they come; a runtime without a GPU is told how to switch before anything installs. Its
    source: DSNB_SOURCE, else a dsnb wheel or zip uploaded to /content, else one on Drive (mounted first, since a new
    runtime after a disconnect has not mounted it yet), else the project's repository."""
    gpu = "" if read_only else """
    import torch
    if not torch.cuda.is_available() and not os.environ.get("DSNB_OFFLINE"):
        raise SystemExit("No GPU in this runtime: on Colab, Runtime > Change runtime type > T4 GPU; on Kaggle, Settings"
                         " > Accelerator > GPU T4 x2 (and Internet on); then run all again")"""
    what = "what reading a store needs" if read_only else "what this runtime lacks"
    then = "" if read_only else ", then builds DeepSpeed's CPU Adam once"
    steps = '["dsnb.install", "--read"]' if read_only else '["dsnb.install"]'
    return f"""# Colab and Kaggle only (elsewhere run `bash setup.sh` once): dsnb, then only {what} (their own
# torch, transformers, datasets ... stay where their versions serve dsnb){then}. Log: dsnb_setup.log.
DSNB_SOURCE = ""  # empty: a dsnb .whl or .zip uploaded to /content (Kaggle: an input), else MyDrive, else {SOURCE}
import glob, os, subprocess, sys
colab = bool(os.environ.get("COLAB_RELEASE_TAG"))
if (colab or os.environ.get("KAGGLE_KERNEL_RUN_TYPE")) and not os.path.isfile("dsnb_setup.log"):{gpu}
    source = DSNB_SOURCE or os.environ.get("DSNB_SOURCE")
    # dsnb's wheel (dsnb-0.1.0-...whl) or the repository's zip (dsnb-main.zip), not what dsnb writes (dsnb_mlflow.zip)
    found = lambda *folders: sorted(p for f in folders for p in glob.glob(f + "/dsnb*.*")
                                    if p.endswith((".whl", ".zip")) and not os.path.basename(p).startswith("dsnb_"))
    uploads = found("/content", "/kaggle/input/*")
    if colab and not (source or uploads):  # one kept on Drive: a new runtime has not mounted it yet
        from google.colab import drive
        drive.mount("/content/drive")
        uploads = found("/content/drive/MyDrive")
    source = source or (uploads[-1] if uploads else "{SOURCE}")
    print(f"installing dsnb from {{source}}, then {what} ...", flush=True)
    env, log = {{**os.environ, "PIP_ROOT_USER_ACTION": "ignore", "GIT_TERMINAL_PROMPT": "0"}}, ""
    for step in (["pip", "install", "-q", "--disable-pip-version-check", "--no-deps", source], {steps}):
        run = subprocess.Popen([sys.executable, "-m", *step], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env=env)
        for line in run.stdout:  # as they come: the build takes minutes
            print(line, end="")
            log += line
        if run.wait():
            open("dsnb_setup_failed.log", "w").write(log)
            raise SystemExit(f"dsnb could not be set up from {{source}}: upload a dsnb wheel or the repository's zip "
                             "to /content, or set DSNB_SOURCE; then run again (dsnb_setup_failed.log says why)")
    open("dsnb_setup.log", "w").write(log)  # written once every step succeeded: a failed setup runs again
    print(f"dsnb set up from {{source}}")"""


OFFLINE_NOTE = ("**Offline default.** With `DSNB_OFFLINE=1` in the environment (CI, an air-gapped box, a GPU "
                "without a hub), parameters left at their defaults take dsnb's offline values instead: the "
                "synthetic Llama `synthetic:tiny` and the synthetic SQuAD-format set, a short fp32 run. Values "
                "you set (here or through papermill) always win. The first dsnb cell prints which defaults apply.")

T4_NOTE = """**On Colab's free T4**, set `preset = "colab_t4"`. Against the tutorial it changes how the same work runs,
not what is compared: fp16 as the tutorial trains (a T4 has no native bf16, and dsnb refuses it emulated), each batch
padded to a multiple of 64 tokens instead of 512 (the loss is the same, since padding is masked; the tutorial's
padding made most of each step padding), GPU memory capped at what a T4 holds and host RAM checked against Colab's
12.7 GB before anything loads, and a checkpoint every 10 minutes. **Survive a disconnect:** set `results_folder =
"/content/drive/MyDrive/dsnb"`; the first dsnb cell mounts Drive, the MLflow store and the checkpoints live there, and
running the notebook again after a disconnect keeps the finished runs and resumes the rest from their checkpoints;
once the pair has finished, it is shown as recorded and nothing trains again.
The plan below says how long the pair will take on this GPU before anything trains.

**On Kaggle's free 2 x T4** (Settings > Accelerator > GPU T4 x2, Internet on), set `preset = "kaggle_t4x2"`: the same,
each variant on both GPUs (one process each: ZeRO's sharding, not only its offload, can pay there), and
`results_folder = "/kaggle/working/dsnb"`, the folder Kaggle keeps with the notebook's saved version; the hub token
comes from Add-ons > Secrets (`HF_TOKEN`). `dsnb.advise(cfg)` ranks what fits the pair before anything trains."""


FIRST = ["preset", "results_folder"]  # what a Colab user sets first, at the top of every parameters cell


def parameters_cell(names=None):
    """The parameters cell: `names` (every RunConfig field unless given) after FIRST, each with its default and doc."""
    defaults, docs = RunConfig().to_dict(), field_docs()
    names = FIRST + [name for name in names or defaults if name not in FIRST]
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
questions drawn from all of SQuAD's validation split (reading the passage, as SQuAD asks: the tutorial's
closed-book text stays as `prompt = "eos"`), and every run lands in MLflow with its whole config.

{T4_NOTE}

{OFFLINE_NOTE}"""),
        new_code_cell(setup()),
        new_markdown_cell("## Parameters\nEvery name is a `dsnb.RunConfig` field; papermill overrides them "
                          "(`papermill --help-notebook` lists them)."),
        parameters_cell(),
        new_markdown_cell("## The run config\nValidated before anything loads: a bad value stops here with "
                          "what to change, in one line."),
        checked("import dsnb\n\ncfg = dsnb.from_notebook(globals())"),
        new_markdown_cell("## What the runs will take\nThe data is read and checked, GPU memory and host RAM are "
                          "estimated, and the time on this GPU is given (with faster settings where the pair would "
                          "take over an hour), before any model downloads."),
        new_code_cell("print(dsnb.preview(cfg))"),
        new_markdown_cell("## Which setup fits, and which is fastest\nEvery variant of this task worth trying on a GPU "
                          "(no DeepSpeed, ZeRO 1-3, offload, 8-bit, 4-bit, full fine-tuning, micro-batch sizes, the "
                          "compiled loop), ranked by predicted time for the whole run, with predicted GPU memory and "
                          "host RAM, whether it fits, and the command that runs it; only the model's config is read. "
                          "`advise_gpu`: the GPU to advise for (empty: this runtime's); under `kaggle_t4x2`, the "
                          "pair of them."),
        new_code_cell('advise_gpu = "T4"  # @param ["", "T4", "L4", "A100", "H100", "H200"]\n'
                      "dsnb.advise(cfg, gpu=advise_gpu)"),
        new_markdown_cell("## Train both variants, each in its own process\nA bar per variant and per step with the "
                          "loss, and what the run is doing (downloading, loading) from its first second; short runs "
                          "are repeated (`repeats`), interleaved. A failed variant is recorded as a FAILED run and the "
                          "next one still runs. Run again after a disconnect, this cell keeps what finished and "
                          "resumes the rest."),
        new_code_cell("results = dsnb.compare(cfg)"),
        new_markdown_cell("## Side by side, read back from MLflow\nThe tutorial's metrics first "
                          "(`gpu_memory_used_mb` is its GPUtil after-minus-before reading), then peak memory from "
                          "the allocator and NVML (a run on the CPU records no GPU figure: a blank cell, and no row "
                          "where no run had a GPU), steady-state throughput, MFU and the held-out scores. With "
                          "repeats: medians, [lowest-highest], and which ratios are within the run-to-run spread."),
        new_code_cell("dsnb.compare_table(results)"),
        new_markdown_cell("## The verdict\nEach difference with its p-value (how often runs that differ only by chance "
                          "look like this); a speed measured while other work used the machine is called unreliable."),
        new_code_cell("print(dsnb.verdict(results))"),
        new_markdown_cell("## Did both runs do the same work?\nEvery field that sets the work, the same held-out "
                          "questions, final losses that agree, and held-out answers compared question by question "
                          "(a paired test that calls equal skill different at most 5% of the time)."),
        checked("print(dsnb.same_work(results).splitlines()[0])"),
        new_code_cell("print(dsnb.same_work(results))"),
        new_markdown_cell("## Plots\nAlso logged to each run as `comparison.png`."),
        new_code_cell("dsnb.plot_runs(results)"),
        new_markdown_cell("## Does training teach the model? A quality check\nSeparate from the comparison, so it "
                          "stays quick: `synthetic:small` learns to answer from dsnb's synthetic passages (capitals "
                          "and years, in Korean and English) in a few minutes on a CPU, asked 72 questions that no "
                          "training row holds. With the real model and SQuAD, the table above already holds the "
                          "held-out scores of SQuAD's validation questions."),
        new_code_cell("quality = dsnb.quality_check(cfg)\nprint(dsnb.quality_verdict(quality))"),
        checked("print(dsnb.quality_verdict(quality).splitlines()[0])"),
        new_markdown_cell("## Ask the trained model\nType a question (and the passage it should read); the answer "
                          "streams as it is generated. This asks the comparison's first run (without DeepSpeed); "
                          "offline, where that model is a random tiny one, the quality check's model instead."),
        new_code_cell('question = "본문에 따르면 대한민국의 수도는 어디인가요?"  # @param {type:"string"}\n'
                      'passage = "대한민국의 수도는 서울이다. 그 도시의 가장 오래된 대학교는 1398년에 문을 열었다."  '
                      '# @param {type:"string"}\n'
                      'answer = dsnb.ask(dsnb.model_to_ask(cfg, results, quality), question, passage)'),
        new_markdown_cell("## Keep the trained model\nThe tutorial run's adapter as a folder that peft and "
                          "transformers load, with its model card; `merge` folds the LoRA weights into the base model "
                          "(dsnb checks the host RAM first and writes down how far the merged model's logits moved). "
                          "`hub_repo` (owner/name) pushes it, private, with the token in Colab's Secrets (`HF_TOKEN`, "
                          "the key icon on the left) or `$HF_TOKEN`; it is never printed or logged."),
        new_code_cell('merge = False  # @param {type:"boolean"}\nhub_repo = ""  # @param {type:"string"}\n'
                      "folder = dsnb.keep(results[0], merge=merge, push_to=hub_repo)"),
        new_markdown_cell("## Take the results with you\nColab's disk goes with its runtime (unless `results_folder` "
                          "is on Drive): this zips the store (SQLite file and artifacts) and downloads it. Open it in "
                          "notebook 03 (`tracking_uri = \"dsnb_mlflow.zip\"`). On Colab the MLflow UI opens below, "
                          "inside the notebook; elsewhere the command that opens it is printed (it listens on "
                          "127.0.0.1 only, since it has no login: do not bind it to 0.0.0.0 as the tutorial did)."),
        new_code_cell("print(dsnb.download_store(cfg.tracking_uri))\ndsnb.show_ui(cfg.tracking_uri)"),
        new_markdown_cell("## The trained models answer\nThe held-out questions, before training and after, joined on "
                          "the question: the tutorial's pair (offline, a random tiny model: no sense yet) and the "
                          "quality check's model (`eval_samples = 0` skips both the answers and the check)."),
        new_code_cell("dsnb.answers(results + [quality], n=8)"),
    ]


def notebook_02():
    return [
        new_markdown_cell(f"""# One variant: any ZeRO stage and offload
{badge("02_zero_stages.ipynb")}

One execution trains one variant in its own process and records it as one MLflow run; Run all again
(after a disconnect, say) keeps it where it finished and resumes it where it was interrupted. Set the
parameters (for example `strategy = "zero3"`, `offload_param = "cpu"`), or let papermill run it once
per variant: `python -m dsnb sweep -f variants/sweep_zero_stages.yaml`.

{OFFLINE_NOTE}

{T4_NOTE}"""),
        new_code_cell(setup()),
        new_markdown_cell("## Parameters"),
        parameters_cell(),
        new_markdown_cell("## The run config"),
        checked("import dsnb\n\ncfg = dsnb.from_notebook(globals())"),
        new_code_cell("print(dsnb.preview(cfg))"),
        new_markdown_cell("## Train"),
        new_code_cell("result = dsnb.run_once(cfg)  # kept, or resumed, where it ran before (again=True: afresh)"),
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

Reads the newest run of each name, with the other repeats of its comparison, from an MLflow experiment (from
notebooks 01 and 02, `python -m dsnb compare` or a sweep) and compares them against the baseline.
`memory_budget_gb` is the GPU you are sizing for: 15 for a T4, 22 for an L4, 40 or 80 for an A100. In a new
Colab runtime, upload the `dsnb_mlflow.zip` that notebook 01 downloaded (the Files pane) and set
`tracking_uri = "dsnb_mlflow.zip"`."""),
        new_code_cell(setup(read_only=True)),
        new_markdown_cell("## Parameters"),
        parameters_cell(["tracking_uri", "experiment", "memory_budget_gb"]),
        new_markdown_cell("## The runs\nThe newest run of each name in the experiment, with the other repeats of "
                          "its comparison (the table pools them: median [lowest-highest]), from `results_folder`'s "
                          "store (Drive is mounted first) or `tracking_uri` (an uploaded zip too). The quality check's "
                          "runs train another model on other data, so they are left out of the comparison."),
        new_code_cell("import dsnb\n\ncfg = dsnb.from_notebook(globals(), check=False)\n"
                      "runs = dsnb.compared_runs(cfg)\ndsnb.compare_table(runs)"),
        new_markdown_cell("## In words\nEach variant against the first: speed and memory against the repeats' "
                          "spread, the held-out answers question by question, and what a figure cannot mean here (a "
                          "busy machine, runs on the CPU, a random synthetic model)."),
        new_code_cell("print(dsnb.verdict(runs))"),
        new_markdown_cell("## Memory saved and speed lost against the baseline\nMedians of each variant's repeats; "
                          "the memory saved (`..._saved_share`) is a share of the baseline's peak (0.25: a quarter "
                          "less; below 0: more), "
                          "`speed_ratio` the variant's samples/s over the baseline's; `speed_vs_spread` says whether "
                          "the speed differs by more than the repeats' spread (the rank test's p: how often runs that "
                          "differ only by chance split so); the note says where a variant trains other work than the "
                          "baseline, or was timed on a busy machine."),
        new_code_cell("dsnb.savings_table(runs)"),
        new_code_cell("dsnb.plot_runs(runs, log=False)"),
        new_markdown_cell("## The fastest variant that fits the budget\nPeak GPU memory as NVML saw it "
                          "(the CUDA context included), against `memory_budget_gb`, by the median of each variant's "
                          "repeats; runs on the CPU measured no GPU memory, so none is judged against it."),
        new_code_cell("print(dsnb.best_for_budget(runs, cfg.memory_budget_gb))"),
        new_markdown_cell("## Every run in MLflow's UI\nOn Colab it opens below, inside the notebook (served from this "
                          "runtime on 127.0.0.1); elsewhere the command that opens it for this store is printed."),
        new_code_cell("dsnb.show_ui(cfg.tracking_uri)"),
    ]


NOTEBOOKS = {"01_deepspeed_vs_baseline.ipynb": notebook_01, "02_zero_stages.ipynb": notebook_02,
             "03_compare_runs.ipynb": notebook_03}


def notebook(name: str):
    """The notebook `name` as this file writes it, outputs empty."""
    nb = new_notebook(cells=NOTEBOOKS[name]())
    nb.metadata.update(kernelspec={"name": "python3", "display_name": "Python 3", "language": "python"},
                       language_info={"name": "python"})
    if name != "03_compare_runs.ipynb":  # the Colab badge opens a T4 runtime (notebook 03 only reads a store)
        nb.metadata.update(accelerator="GPU", colab={"provenance": [], "gpuType": "T4"},
                           kaggle={"accelerator": "nvidiaTeslaT4", "isGpuEnabled": True, "isInternetEnabled": True,
                                   "language": "python", "sourceType": "notebook"})
    if name == "03_compare_runs.ipynb":
        nb.cells[3].source = nb.cells[3].source.replace("memory_budget_gb: float = 0.0",
                                                        "memory_budget_gb: float = 15.0")
    return nb


def main():
    for name in NOTEBOOKS:
        nbformat.write(notebook(name), os.path.join(HERE, name))
    if "--execute" in sys.argv:
        import tempfile

        import papermill

        with tempfile.TemporaryDirectory() as tmp:  # a fresh MLflow store, so 03 sees only these runs
            for name in NOTEBOOKS:  # in order: 03 compares the runs that 01 and 02 made
                papermill.execute_notebook(os.path.join(HERE, name), os.path.join(HERE, name), cwd=tmp,
                                           kernel_name="python3")


if __name__ == "__main__":
    main()
