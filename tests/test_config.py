import pathlib

import pytest

from dsnb.config import OFFLINE, ConfigError, RunConfig, field_docs, field_names


def test_defaults_are_the_tutorials():
    cfg = RunConfig()
    assert (cfg.model, cfg.quantization, cfg.dtype) == ("Bllossom/llama-3.2-Korean-Bllossom-3B", "8bit", "fp16")
    assert (cfg.lora_r, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_targets) == (16, 16, 0.05, "q_proj,v_proj")
    assert (cfg.batch_size, cfg.grad_accum, cfg.learning_rate, cfg.epochs) == (2, 4, 2e-4, 5.0)
    assert (cfg.num_samples, cfg.max_length, cfg.padding) == (1000, 512, "max_length")
    assert (cfg.experiment, cfg.tracking_uri) == ("DeepSpeed_Comparison", "sqlite:///mlflow.db")


def test_every_field_is_documented():
    assert set(field_docs()) == set(field_names())


@pytest.mark.parametrize("changes, field", [
    (dict(strategy="zero4"), "strategy"),
    (dict(offload_optimizer="disk"), "offload_optimizer"),
    (dict(strategy="baseline", offload_optimizer="cpu"), "strategy"),
    (dict(strategy="zero0", offload_optimizer="cpu"), "offload_optimizer"),
    (dict(strategy="zero2", offload_param="cpu"), "offload_param"),
    (dict(strategy="zero2", offload_optimizer="nvme"), "offload_optimizer"),
    (dict(strategy="zero3", quantization="8bit"), "quantization"),
    (dict(lora_r=0, quantization="4bit"), "quantization"),
    (dict(batch_size=0), "batch_size"),
    (dict(grad_accum=-1), "grad_accum"),
    (dict(learning_rate=0), "learning_rate"),
    (dict(num_samples="many"), "num_samples"),
    (dict(lora_dropout=1.5), "lora_dropout"),
    (dict(max_length=2.5), "max_length"),
    (dict(save_model="maybe"), "save_model"),
    (dict(batch_size=True), "batch_size"),
    (dict(num_gpus=0), "num_gpus"),
    (dict(torch_compile=True), "quantization"),  # bitsandbytes' 8-bit kernels under compile
    (dict(torch_compile=True, quantization="none", dtype="bf16", padding="longest", strategy="zero2"), "padding"),
    (dict(torch_compile=True, quantization="none", dtype="bf16", padding="longest"), "padding"),
    (dict(torch_compile=True, quantization="4bit", dtype="fp16", padding="bucket"), "quantization"),
    (dict(torch_compile=True, quantization="none", dtype="bf16", padding="bucket", num_gpus=2), "num_gpus"),
    (dict(torch_compile=True, quantization="none", dtype="bf16", padding="bucket", checkpoint_steps=5),
     "checkpoint_steps"),
    (dict(attention="flash"), "attention"),
    (dict(phase_times=True), "phase_times"),  # DeepSpeed's timers: the baseline runs without DeepSpeed
    (dict(attention="flex", torch_compile=True, quantization="none", dtype="bf16", padding="bucket"), "attention"),
    (dict(attention="flex", quantization="none", dtype="bf16", padding="packed"), "attention"),  # not compiled
    (dict(attention="flex", quantization="none", dtype="bf16", padding="filled"), "attention"),  # not compiled
    (dict(attention="flex", torch_compile=True, quantization="none", dtype="bf16", padding="packed",
          strategy="zero2"), "attention"),
])
def test_rejected_combinations_name_the_field(changes, field):
    with pytest.raises(ConfigError) as err:
        RunConfig(**changes)
    assert str(err.value).startswith(field), str(err.value)


@pytest.mark.parametrize("padding", ["packed", "filled", "max_length", "bucket"])
def test_flex_attention_takes_packed_or_filled_rows_in_the_compiled_loop_without_deepspeed(padding):
    flex = dict(attention="flex", torch_compile=True, quantization="none", dtype="bf16", padding=padding)
    if padding not in ("packed", "filled"):  # padded batches have no blocks to skip
        with pytest.raises(ConfigError, match="flex is for packed rows in the compiled loop"):
            RunConfig(**flex)
        return
    cfg = RunConfig(**flex)
    assert cfg.name == "baseline_lora16_bf16_compiled_flex"  # in the run's name: it changes how the step runs
    with pytest.raises(ConfigError, match="flex is for packed rows in the compiled loop"):
        RunConfig(**dict(flex, torch_compile=False))
    with pytest.raises(ConfigError, match="flex has been measured without DeepSpeed only"):
        RunConfig(**dict(flex, strategy="zero2"))


def test_strings_from_the_command_line_are_coerced():
    cfg = RunConfig(batch_size="8", learning_rate="1e-4", save_model="false", epochs="2")
    assert (cfg.batch_size, cfg.learning_rate, cfg.save_model, cfg.epochs) == (8, 1e-4, False, 2.0)


def test_yaml_unknown_key_and_wrong_type(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("strategy: zero2\nbatchsize: 4\n")
    with pytest.raises(ConfigError, match="batchsize is not a run-config field"):
        RunConfig.from_yaml(str(bad))
    bad.write_text("batch_size: [1, 2]\n")
    with pytest.raises(ConfigError, match="batch_size"):
        RunConfig.from_yaml(str(bad))
    good = tmp_path / "good.yaml"
    good.write_text("strategy: zero3\noffload_param: cpu\nquantization: none\n")
    assert RunConfig.from_yaml(str(good), lora_r=0).zero_stage == 3


def test_offline_preset_is_valid_and_derived_names_differ():
    cfg = RunConfig(**OFFLINE)
    names = {cfg.replace(**c).derived_name() for c in (
        {}, dict(strategy="zero2", offload_optimizer="cpu"), dict(strategy="zero3", offload_param="cpu",
                                                                   quantization="4bit"))}
    assert len(names) == 3


@pytest.mark.parametrize("path", sorted((pathlib.Path(__file__).parent.parent / "variants").glob("*.yaml")),
                         ids=lambda p: p.name)
def test_every_shipped_variant_file_loads_and_names_its_command(path):
    from dsnb.sweep import load_sweep

    first = open(path).readline()
    assert first.startswith("# python -m dsnb "), first
    if "sweep" in first:
        _, cfgs, _ = load_sweep(str(path), offline=True)
        assert len(cfgs) >= 2
    elif "capacity" in first:
        from dsnb.capacity import load_capacity

        budgets, cells = load_capacity(str(path))
        assert budgets and len(cells) >= 2
        assert all(cfg.model == model for model, _, cfg in cells)
    else:
        RunConfig.from_yaml(str(path))


@pytest.mark.parametrize("changes, message", [
    (dict(batch_size="2.5"), "batch_size is 2.5; expected an integer"),  # never rounded to 2
    (dict(lora_r=0.5), "lora_r is 0.5; expected an integer"),  # never 0, which would mean full fine-tuning
    (dict(learning_rate="nan"), "learning_rate is nan; expected a finite number"),
    (dict(epochs=float("inf")), "epochs is inf; expected a finite number"),
    (dict(memory_budget_gb="-inf"), "memory_budget_gb is -inf; expected a finite number"),
    (dict(seed=-1), "seed is -1; use a seed from 0 to 4294967295"),
    (dict(seed=2**32), "seed is 4294967296"),
    (dict(max_length=2**40), "max_length is 1099511627776; it must be at most 2147483647"),
    (dict(lora_targets="q_proj,,v_proj"), "lora_targets is 'q_proj,,v_proj'"),
    (dict(experiment=" "), "experiment is empty"),
    (dict(run_name="a\nb"), "run_name holds a character that cannot be printed ('\\n')"),
    (dict(preset="t4"), "preset is 't4'; use one of colab_t4, kaggle_t4x2, quality"),
    (dict(warmup_steps=3), "warmup_steps is now untimed_steps"),
    (dict(ds_config="x.json"), "ds_config is now ds_config_path"),
])
def test_values_outside_what_the_libraries_take_are_refused(changes, message):
    with pytest.raises(ConfigError) as err:
        RunConfig.layered(changes)
    assert str(err.value).startswith(message), str(err.value)


def test_layering_keeps_an_explicit_default_and_puts_the_preset_under_the_layers():
    # Set on purpose, the tutorial's fp16 stays fp16 under the offline default (which would say fp32).
    assert RunConfig.layered({"dtype": "fp16"}, offline=True).dtype == "fp16"
    assert RunConfig.layered({}, offline=True).dtype == "fp32"
    cfg = RunConfig.layered({"preset": "colab_t4"}, {"memory_budget_gb": 12})
    assert (cfg.dtype, cfg.memory_budget_gb, cfg.ram_budget_gb, cfg.padding) == ("fp16", 12.0, 12.7, "bucket")
    quality = RunConfig.layered({"preset": "quality"}, offline=True)  # the preset wins over the offline default
    assert (quality.model, quality.lora_r, quality.max_steps) == ("synthetic:small", 0, 150)
    assert (cfg.name, RunConfig(run_name="x").name) == (cfg.derived_name(), "x")
    assert RunConfig(batch_size=4, grad_accum=2).samples_per_step(3) == 24
    assert (RunConfig(max_steps=8).runs_each, RunConfig().runs_each, RunConfig(repeats=5).runs_each) == (3, 1, 5)


@pytest.mark.parametrize("path", sorted((pathlib.Path(__file__).parent.parent / "dsnb" / "presets").glob("*.yaml")),
                         ids=lambda p: p.name)
def test_every_preset_is_valid_and_names_its_command(path):
    assert "python -m dsnb " in path.read_text()
    RunConfig.layered({"preset": path.stem})


def test_a_notebook_keeps_what_papermill_injected_even_at_its_default():
    from dsnb.notebook import explicit_parameters

    parameters = "dtype: str = 'fp16'  # ...\nbatch_size: int = 2  # ...\nlora_r: int = 16"
    namespace = {**RunConfig().to_dict(), "batch_size": 8, "_ih": ["", parameters, "# Parameters\ndtype = 'fp16'\n"]}
    assert explicit_parameters(namespace) == {"dtype": "fp16", "batch_size": 8}
    namespace["_ih"].append("warmup_steps = 3")
    with pytest.raises(ConfigError, match="warmup_steps is now untimed_steps"):
        explicit_parameters(namespace)
