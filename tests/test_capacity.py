"""The capacity map on the CPU: real runs of synthetic:tiny, judged against budgets, table and picture."""
import pytest

from dsnb.capacity import capacity_table, fastest_fitting, load_capacity, run_capacity
from dsnb.config import ConfigError, RunConfig
from dsnb.metrics import Budget, fit
from dsnb.tracking import RunResult

SPEC = """# python -m dsnb capacity -f capacity.yaml --offline
models: [synthetic:llama-3.2-1b]
budgets_gb: [0.5, 1]
base: {max_steps: 3, logging_steps: 1, save_model: false}
variants:
  lora: {quantization: none, dtype: bf16}  # offline: fp32 (bf16 is emulated on the CPU), the table says so
  full_zero2: {quantization: none, lora_r: 0, strategy: zero2, offload_optimizer: cpu}
  broken: {quantization: none, lora_targets: no_such_module}
"""


def test_fit_rules():
    m = {"peak_gpu_allocated_mb": 700.0, "peak_gpu_nvml_mb": 900.0, "peak_cpu_rss_mb": 14_000.0}
    assert fit("FINISHED", m, Budget(1)) == "fits"
    assert fit("FINISHED", m, Budget(0.8)) == "tight"  # tensors fit, the allocator's cache does not
    assert fit("FINISHED", m, Budget(0.5)) == "no"
    assert fit("FAILED", m, Budget(80)) == "failed"
    colab = Budget(15, 12.7, "Colab T4")  # the GPU would do, the host RAM would not
    assert fit("FINISHED", m, colab) == "no RAM" and fit("FINISHED", m, Budget(15, 16)) == "fits"
    assert fit("FINISHED", {"peak_cpu_rss_mb": 900.0}, Budget(1)) == "no GPU"  # on the CPU: nothing to judge by


def test_capacity_file_errors(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("models: [synthetic:tiny]\nbudgets_gb: []\nvariants: {a: {}}\n")
    with pytest.raises(ConfigError, match="budgets_gb"):
        load_capacity(str(path))
    path.write_text("models: [synthetic:tiny]\nbudgets_gb: [15]\nvariants: {a: {strategy: zero9}}\n")
    with pytest.raises(ConfigError, match="synthetic:tiny a: strategy"):
        load_capacity(str(path))
    # a typo in skip would run the cell it meant to skip: refused, with the cell it likely meant
    path.write_text("models: [synthetic:tiny]\nbudgets_gb: [15]\nvariants: {lora: {}, full: {lora_r: 0}}\n"
                    "skip: [synthetic:tiny fulll]\n")
    for offline in (False, True):
        with pytest.raises(ConfigError, match="skip entry 'synthetic:tiny fulll' names no cell .*did you mean "
                                              "'synthetic:tiny full'"):
            load_capacity(str(path), offline=offline)
    # the project's own map names its cells right, and skips them
    import pathlib

    cells = load_capacity(str(pathlib.Path(__file__).parent.parent / "variants" / "capacity_map.yaml"))[1]
    assert cells and not [(m, v) for m, v, _ in cells if m == "synthetic:llama-3.1-8b" and v.startswith("full")]


def test_capacity_only_picks_cells(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("models: [synthetic:tiny, synthetic:llama-3.2-1b]\nbudgets_gb: [15]\n"
                    "variants: {a: {}, b: {lora_r: 0, quantization: none}}\nskip: [synthetic:tiny b]\n")
    assert [(m, v) for m, v, _ in load_capacity(str(path))[1]] == \
        [("synthetic:tiny", "a"), ("synthetic:llama-3.2-1b", "a"), ("synthetic:llama-3.2-1b", "b")]
    assert [(m, v) for m, v, _ in load_capacity(str(path), only="b")[1]] == [("synthetic:llama-3.2-1b", "b")]
    assert [(m, v) for m, v, _ in load_capacity(str(path), only="a,llama-3.2-1b")[1]] == \
        [("synthetic:llama-3.2-1b", "a")]
    with pytest.raises(ConfigError, match="'c' is neither a variant nor a model"):
        load_capacity(str(path), only="a,c")
    with pytest.raises(ConfigError, match="leaves no cell"):
        run_capacity(str(path), only="synthetic:tiny,b")


@pytest.mark.integration
def test_capacity_map_runs_every_cell_and_keeps_going(workdir):
    (workdir / "capacity.yaml").write_text(SPEC)
    table, fastest, png = run_capacity("capacity.yaml", offline=True, out_dir="out", progress=False)
    assert list(table["variant"]) == ["lora", "full_zero2", "broken"] and set(table["model"]) == {"synthetic:tiny"}
    assert list(table["status"]) == ["FINISHED", "FINISHED", "FAILED"]
    assert (table["samples_per_second"][:2] > 0).all()
    assert table["peak_allocated_gb"].isna().all() and (table["peak_host_gb"][:2] > 0).all()  # no GPU: no 0 GB
    assert list(table.loc[2, ["0.5 GB", "1 GB"]]) == ["failed", "failed"]
    # No GPU here: no cell is judged against a GPU's budget; the fastest of each kind on this CPU is named as such
    assert list(table.loc[:1, "0.5 GB"]) == ["no GPU", "no GPU"] and list(table["dtype"]) == ["fp32"] * 3
    assert list(table["training"]) == ["LoRA", "full", "LoRA"]
    assert list(fastest["fastest_variant"]) == ["lora", "full_zero2"] and set(fastest["budget"]) == {"no GPU"}
    assert png[:4] == b"\x89PNG"
    report = (workdir / "out" / "capacity.md").read_text()
    assert "python -m dsnb capacity -f capacity.yaml --offline" in report and "| full_zero2 |" in report
    assert "Each cell is one run: no run-to-run spread is measured" in report
    with pytest.raises(ConfigError, match="exists"):  # never over an earlier map
        run_capacity("capacity.yaml", offline=True, out_dir="out", progress=False)
    rows = capacity_table([("m", "x", RunConfig())], [RunResult("r", "x", "FINISHED", "", {
        "samples_per_second": 3.0, "peak_gpu_allocated_mb": 2048.0, "peak_gpu_nvml_mb": 3072.0})], [Budget(2.5)])
    assert rows.loc[0, "2.5 GB"] == "tight" and fastest_fitting(rows, [Budget(2.5)])["fastest_variant"][0] is None
