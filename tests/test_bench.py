"""The bench: its variants as a YAML file like the other variant sets, one of them run alone, and regressions named."""
import pytest

from dsnb.bench import BENCH_FILE, bench_configs, bench_variants
from dsnb.cli import build_config, parser
from dsnb.config import ConfigError


def test_the_bench_variants_file_holds_the_recipes_it_names():
    base, variants = bench_variants()
    assert base == {"model": "synthetic:llama-3.2-3b", "dataset": "synthetic", "num_samples": 1000}
    assert list(variants)[:3] == ["tutorial", "tutorial_zero2_offload", "fast"] and variants["tutorial"] == {}
    gpu, cpu = bench_configs(False, 3, 10, "sqlite:///x.db"), bench_configs(True, 3, 10, "sqlite:///x.db")
    fast = gpu["fast"]
    assert (fast.quantization, fast.dtype, fast.padding, fast.batch_size * fast.grad_accum) == ("none", "bf16",
                                                                                                  "longest", 8)
    assert gpu["tutorial"].batch_size * gpu["tutorial"].grad_accum == 8  # the same effective batch as the tutorial
    assert (gpu["fast"].untimed_steps, gpu["fast"].max_steps) == (3, 13)
    assert cpu["throughput_compiled"].dtype == "fp32" and cpu["throughput_compiled"].attention == "sdpa"


def test_one_variant_of_a_file_runs_alone_with_flags_on_top():
    def config(*argv):
        return build_config(parser().parse_args(["check", *argv]))

    cfg = config("-f", BENCH_FILE, "--variant", "full_zero3_offload_15gb", "--max_steps", "4")
    assert (cfg.model, cfg.lora_r, cfg.strategy, cfg.offload_param, cfg.batch_size, cfg.max_steps) == (
        "synthetic:llama-3.2-3b", 0, "zero3", "cpu", 32, 4)
    with pytest.raises(ConfigError, match="holds several variants: pick one with --variant \\(tutorial, "):
        config("-f", BENCH_FILE)
    with pytest.raises(ConfigError, match="--variant fastest is not in .*bench.yaml; use tutorial, "):
        config("-f", BENCH_FILE, "--variant", "fastest")
    with pytest.raises(ConfigError, match="give the file with -f"):
        config("--variant", "fast")


def test_a_variants_file_with_a_wrong_shape_is_named(tmp_path):
    bad = {"extra.yaml": ("base: {}\nvariants: {a: {}}\nnotes: x\n", "notes is not a key of a variants file"),
           "field.yaml": ("variants: {a: {learning_rat: 1}}\n", "a: learning_rat is not a run-config field"),
           "empty.yaml": ("variants: {}\n", "needs base .* and variants"),
           "plain.yaml": ("strategy: zero2\n", "holds one variant's fields, not named variants")}
    for name, (text, message) in bad.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(ConfigError, match=message):
            bench_variants(str(tmp_path / name)) if name != "plain.yaml" else build_config(
                parser().parse_args(["check", "-f", str(tmp_path / name), "--variant", "a"]))
    with pytest.raises(ConfigError, match="missing.yaml' does not exist"):
        bench_variants(str(tmp_path / "missing.yaml"))


def test_bench_regressions_are_named():
    from dsnb.bench import regressions

    def result(ratio, finished=3, pair=(30, 40)):
        rows = [{"name": "tutorial", "ratio_to_tutorial": 1.0, "finished": 3, "repeats": 3, "wall_seconds": pair[0]},
                {"name": "tutorial_zero2_offload", "ratio_to_tutorial": 0.9, "finished": 3, "repeats": 3,
                 "wall_seconds": pair[1]},
                {"name": "fast", "ratio_to_tutorial": ratio, "finished": finished, "repeats": 3, "wall_seconds": 9}]
        return {"variants": rows}

    committed = result(2.6)
    assert regressions(result(2.0), committed) == []
    assert regressions(result(1.2), committed) == ["fast: 1.20x the tutorial's recipe, committed 2.60x"]
    assert regressions(result(2.6, finished=2), committed) == ["fast: 2/3 runs finished"]
    assert "tutorial pair took 400 s" in regressions(result(2.6, pair=(200, 200)), committed)[0]


def test_a_baseline_that_trained_other_samples_is_not_compared():
    """A ratio to the tutorial's recipe measured on other samples (another prompt: 44 against 81 real tokens a
    sample) says nothing of a regression: the check says so instead of naming one."""
    from dsnb.bench import regressions

    def result(ratio, tokens, tutorial_tokens=None):
        rows = [{"name": "tutorial", "ratio_to_tutorial": 1.0, "samples_per_second": 10.0,
                 "tokens_per_second": 10.0 * (tutorial_tokens or tokens)},
                {"name": "fast", "ratio_to_tutorial": ratio, "samples_per_second": 10.0 * ratio,
                 "tokens_per_second": 10.0 * ratio * tokens}]
        return {"variants": [dict(r, finished=2, repeats=2, wall_seconds=9) for r in rows]}

    committed = result(5.0, 44.0)
    assert regressions(result(2.0, 44.5), committed) == ["fast: 2.00x the tutorial's recipe, committed 5.00x"]
    problems = regressions(result(2.0, 81.0), committed)
    assert len(problems) == 2 and all("not compared: 81.0 real tokens a sample against the baseline's 44.0" in p
                                      for p in problems)
    # the tutorial alone trained other samples: every ratio's reference moved
    [fast] = [p for p in regressions(result(5.0, 44.0, tutorial_tokens=81.0), committed) if p.startswith("fast")]
    assert "for tutorial, the ratios' reference" in fast


def test_the_bench_table_leaves_a_peak_no_run_measured_blank():
    """Runs on the CPU record no GPU peak: their cells say "-", not 0 MB."""
    from dsnb.bench import markdown, summarize
    from dsnb.tracking import RunResult

    cpu = {"samples_per_second": 3.0, "tokens_per_second": 90.0, "mfu": 0.01, "step_time_ms": 30.0, "loss": 6.0,
           "peak_cpu_rss_mb": 900.0}
    row = dict(summarize("tutorial", [RunResult("r", "tutorial", "FINISHED", "", cpu, wall_seconds=9.0)]),
               ratio_to_tutorial=1.0)
    assert row["peak_gpu_allocated_mb"] is None and row["peak_cpu_rss_mb"] == 900.0
    text = markdown({"gpu": "cpu", "command": "python -m dsnb bench --offline", "untimed_steps": 3, "timed_steps": 10,
                     "mfu_convention": "6N", "variants": [row]})
    assert "| tutorial | 3 [3-3] | 90 | 1.00% | 30 | - | - | 6.000 | 1.0x | 1/1 |" in text, text


@pytest.mark.integration
def test_an_installed_dsnb_carries_its_bench_and_presets(tmp_path):
    """The wheel pip builds from the repository (as the Colab setup cell installs it) holds the bench's variants and
    the presets, so `python -m dsnb bench` and `--preset` work outside a clone."""
    import pathlib
    import subprocess
    import sys
    import zipfile

    root = pathlib.Path(__file__).parent.parent
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                           str(tmp_path), str(root)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    names = set(zipfile.ZipFile(next(tmp_path.glob("dsnb-*.whl"))).namelist())
    assert {"dsnb/bench.yaml", "dsnb/presets/colab_t4.yaml", "dsnb/presets/quality.yaml"} <= names


def test_a_variant_this_machine_cannot_run_is_listed_with_why_and_the_rest_run(tmp_path, monkeypatch):
    """fp8 weights on the CPU (no FP8 matmuls): the bench lists the variant as not run here, with preflight's reason,
    instead of stopping every variant at the pre-flight; a baseline that measured it says it was not compared."""
    from dsnb.bench import markdown, regressions, run_bench

    monkeypatch.chdir(tmp_path)
    result = run_bench(offline=True, repeats=1, untimed=1, steps=1, only=["throughput_fp8_compiled"],
                       out_dir=str(tmp_path / "out"), tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    [row] = result["variants"]
    assert row["repeats"] == row["finished"] == 0 and "needs a GPU with FP8 matmuls" in row["not_run"], row
    assert "Not run on this machine: throughput_fp8_compiled: quantization fp8 needs a GPU" in markdown(result)
    assert (tmp_path / "out" / "cpu.json").exists()
    assert regressions(result, {"variants": [{"name": "throughput_fp8_compiled"}]}) == []
    measured = {"variants": [{"name": "throughput_fp8_compiled", "finished": 3, "ratio_to_tutorial": 9.0}]}
    assert regressions(result, measured) == [f"throughput_fp8_compiled: not run on this machine, so not compared "
                                             f"({row['not_run']})"]


@pytest.mark.integration
def test_a_bench_killed_part_way_keeps_what_it_finished_when_run_again(tmp_path):
    """The bench killed outright after its first variant finished (a session's limit): run again on the same machine,
    it keeps that run and measures only the rest, and says so beside its table (it measured everything again); once
    its result is written (a run of it tagged so, if not all), a bench run again starts afresh."""
    import json
    import shutil
    import subprocess
    import sys
    import time

    import mlflow
    from conftest import kill_tree

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    command = [sys.executable, "-m", "dsnb", "bench", "--offline", "--repeats", "2", "--untimed", "1", "--steps", "1",
               "--only", "tutorial", "--out", "out", "--tracking_uri", uri]  # two repeats: a median over a kept run
    bench = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client, first, deadline = None, None, time.time() + 600
    while bench.poll() is None and time.time() < deadline:
        if (tmp_path / "mlflow.db").exists():
            client = client or mlflow.MlflowClient(uri)
            runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
            first = next((r for r in runs if r.info.run_name == "tutorial" and r.info.status == "FINISHED"), None)
            if first:
                kill_tree(bench.pid)
                break
        time.sleep(0.2)
    bench.wait()
    assert first is not None and not (tmp_path / "out").exists()

    again = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "bench: continues 1 of 2 runs were measured by an interrupted invocation" in again.stdout, again.stdout
    result = json.loads((tmp_path / "out" / "cpu.json").read_text())
    assert result["continued"].startswith("1 of 2 runs") and "ratios mix the two" in \
        (tmp_path / "out" / "cpu.md").read_text()
    [row] = result["variants"]
    assert row["finished"] == 2 and row["wall_seconds"] > 0, row
    runs = client.search_runs([first.info.experiment_id])
    finished = [r.info.run_id for r in runs if r.info.status == "FINISHED"]
    assert len(finished) == 2 and first.info.run_id in finished  # kept, not run again; beside it a killed one if begun
    before = len(runs)

    shutil.move(tmp_path / "out", tmp_path / "earlier")  # written: a bench run again now measures afresh
    # ... even where a kill while its runs were tagged written left one untagged
    client.delete_tag(finished[0], "bench_written")
    fresh = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert fresh.returncode == 0 and "continues" not in fresh.stdout, fresh.stdout[-3000:]
    assert "continued" not in json.loads((tmp_path / "out" / "cpu.json").read_text())
    assert len(client.search_runs([first.info.experiment_id])) == before + 2
