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


def test_the_configuration_page_lists_every_field_with_its_default_and_doc():
    """docs/configuration.md's table is the docstrings' (a new field or a changed default shows there)."""
    page = (pathlib.Path(__file__).parent.parent / "docs" / "configuration.md").read_text()
    defaults = RunConfig().to_dict()
    for name, doc in field_docs().items():
        text = " ".join(doc.split()).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
        assert f"| `{name}` | `{defaults[name]!r}` | {text} |" in page, name


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
    for text, said in (("offload_optimizer: no\n", "offload_optimizer is False; expected text \\(in YAML an "
                                                  "unquoted yes/no, on/off or true/false is a boolean"),
                       ("run_name: 2024-01-01\n", "is a date, not text: quote it, run_name: '2024-01-01'")):
        bad.write_text(text)
        with pytest.raises(ConfigError, match=said):
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


def test_yaml_merge_keys_share_fields_in_every_kind_of_file_and_a_key_given_twice_is_still_refused(tmp_path):
    """YAML's merge key (`<<: *common`) is YAML's own way to share fields: a field file, a variants file and a sweep
    file take it, a key the mapping sets beside it overrides the merged one, and a key given twice stays an error."""
    from dsnb.config import read_variant, read_variants
    from dsnb.sweep import load_sweep

    fields = tmp_path / "fields.yaml"
    fields.write_text("<<: {dtype: fp32, max_steps: 3}\nmax_steps: 5\n")
    assert (RunConfig.from_yaml(str(fields)).dtype, RunConfig.from_yaml(str(fields)).max_steps) == ("fp32", 5)
    variants = tmp_path / "variants.yaml"
    variants.write_text("base: &common {dtype: fp32, max_steps: 2}\nvariants:\n  a: &a {<<: *common, lora_r: 8}\n"
                        "  b: {<<: [*a, *common], max_steps: 4}\n")
    base, named, _ = read_variants(str(variants))
    assert named["a"] == {"dtype": "fp32", "max_steps": 2, "lora_r": 8}
    assert read_variant(str(variants), "b") == {"dtype": "fp32", "max_steps": 4, "lora_r": 8}
    notebook = pathlib.Path(__file__).parents[1] / "notebooks" / "02_zero_stages.ipynb"
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(f"notebook: {notebook}\nbase: {{quantization: none}}\nvariants:\n"
                     "  - &zero2 {run_name: z2, strategy: zero2}\n  - {<<: *zero2, run_name: z2cpu, "
                     "offload_optimizer: cpu}\n")
    _, cfgs, _ = load_sweep(str(sweep), offline=True)
    assert [(c.run_name, c.strategy, c.offload_optimizer) for c in cfgs] == [("z2", "zero2", "none"),
                                                                            ("z2cpu", "zero2", "cpu")]
    for text, twice in (("a: &a {x: 1}\nb: {<<: *a, max_steps: 1, max_steps: 2}\n", "'max_steps' is given twice"),
                        ("a: &a {x: 1}\nb: {<<: *a, <<: *a}\n", "'<<' is given twice"),
                        ("base: {dtype: fp32, dtype: bf16}\nvariants: {a: {}}\n", "'dtype' is given twice"),
                        ("? [a, b]\n: 1\n", "a key is list \\['a', 'b'\\]; a run-config key is a field's name"),
                        ("{quantization: none}: 1\n", "a key is dict")):
        variants.write_text(text)
        with pytest.raises(ConfigError, match=twice):
            read_variants(str(variants))


def test_a_file_nested_deeper_than_the_reader_goes_is_named(tmp_path):
    deep = tmp_path / "deep.yaml"
    deep.write_text("max_steps: " + "[" * 20000 + "\n")
    with pytest.raises(ConfigError, match="deep.yaml is nested too deeply to read"):
        RunConfig.from_yaml(str(deep))


def test_checkpoint_minutes_asked_of_a_compiled_run_is_refused_and_its_default_left_unused():
    """The compiled loop keeps no checkpoints: a checkpoint_minutes asked of it says so, naming the field, as
    checkpoint_steps does; the default, which colab_t4 repeats, is not asked (its header's compiled run must load)."""
    compiled = dict(quantization="none", padding="bucket", torch_compile=True)
    with pytest.raises(ConfigError, match=r"checkpoint_minutes is 5.0 but torch_compile needs 0 \(the compiled loop "
                                          "keeps no checkpoints"):
        RunConfig(**compiled, checkpoint_minutes=5)
    with pytest.raises(ConfigError, match="checkpoint_minutes is 30.0"):
        RunConfig.layered({"preset": "colab_t4", **compiled, "checkpoint_minutes": 30})
    assert RunConfig.layered({"preset": "colab_t4", **compiled}).checkpoint_minutes == 10
    assert RunConfig(**compiled, checkpoint_minutes=0).torch_compile


@pytest.mark.parametrize("uri, kept", [
    ("http://me:p@ss-SECRET@host:5000/x", "http://***@host:5000/x"),  # an unencoded @: up to the last one
    ("http://me:pa'ss\"SECRET@host", "http://***@host"),  # quotes in the password
    ("https://SECRET@host/api", "https://***@host/api"),  # a token as the user
    ("postgresql+psycopg2://me:SECRET@db:5432/mlflow", "postgresql+psycopg2://***@db:5432/mlflow"),
    ("https://host/x?token=SECRET&run=1", "https://host/x?token=***&run=1"),
    ("https://host/?access_token=SECRET", "https://host/?access_token=***"),
    ("https://host/?password=SECRET#top", "https://host/?password=***#top"),
    ("https://host/?a=1&key=SECRET;api_key=SECRET", "https://host/?a=1&key=***;api_key=***"),
    ("https://host/b?sv=1&sig=SECRET&X-Amz-Credential=SECRET", "https://host/b?sv=1&sig=***&X-Amz-Credential=***"),
])
def test_every_form_of_credentials_in_a_uri_is_masked(uri, kept):
    from dsnb.config import redact

    assert redact(uri) == kept
    for shown in (redact(f"tracking_uri {uri!r} does not answer"), str(ConfigError(f"tracking_uri {uri} is bad")),
                  "".join(ConfigError(repr(uri))._render_traceback_())):
        assert "SECRET" not in shown, shown
    assert redact("http://127.0.0.1:5000 and mail me@example.org") == "http://127.0.0.1:5000 and mail me@example.org"


def test_a_home_in_any_field_that_names_a_place_is_the_home_not_a_folder_named_tilde(monkeypatch, tmp_path):
    """~ as a shell reads it, in every field that names a file or folder and in a SQLite store's path: before, the
    store's became a "./~" folder in the working folder while output_dir's was the home, and the data file's was not
    found."""
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = RunConfig(dataset="~/f.json", tracking_uri="sqlite:///~/p.db", output_dir="~/r", nvme_path="~/d",
                    model="~/models/mine", profile="~/prof.yaml", strategy="zero2", ds_config_path="~/ds.json",
                    torch_compile=True, quantization="none")
    assert (cfg.dataset, cfg.output_dir, cfg.nvme_path, cfg.model, cfg.profile, cfg.ds_config_path) == tuple(
        str(tmp_path / p) for p in ("f.json", "r", "d", "models/mine", "prof.yaml", "ds.json"))
    assert cfg.tracking_uri == f"sqlite:///{tmp_path}/p.db"
    assert RunConfig.layered({"results_folder": "~/dsnb"}).tracking_uri == f"sqlite:///{tmp_path}/dsnb/mlflow.db"


def test_a_folder_where_a_file_is_wanted_and_a_file_where_a_folder_is_are_named_as_such(tmp_path):
    """Each says what it is and what to give (before: "does not exist", or the store's path blamed on tracking_uri);
    a tab in YAML is placed by line and column, with what to write instead."""
    from dsnb.config import read_yaml
    from dsnb.preflight import check
    from dsnb.zero import read_ds_config

    folder = tmp_path / "d.json"
    folder.mkdir()
    with pytest.raises(ConfigError, match="dataset '.*d.json' is a folder, not a file; give the data file inside it"):
        check(RunConfig(**dict(OFFLINE, dataset=str(folder))))
    with pytest.raises(ConfigError, match="ds_config '.*d.json' is a folder, not a file"):
        read_ds_config(RunConfig(**dict(OFFLINE, quantization="none", strategy="zero2", ds_config_path=str(folder))))
    with pytest.raises(ConfigError, match="is a folder, not a file; give the path to a YAML file"):
        read_yaml(str(folder))
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match="results_folder is '.*f', a file, not a folder"):
        RunConfig.layered({"results_folder": str(tmp_path / "f")})
    (tmp_path / "t.yaml").write_text("lora_r:\t8\n")
    with pytest.raises(ConfigError, match="line 1, column 8: .* \\(a tab cannot indent or separate YAML; use"):
        read_yaml(str(tmp_path / "t.yaml"))


def test_lora_targets_written_with_spaces_name_the_same_layers():
    """"q_proj, v_proj" is "q_proj,v_proj": peft took " v_proj" for no layer and failed after the model loaded, and the
    two spellings compared as different work."""
    assert RunConfig(lora_targets=" q_proj, v_proj ").lora_targets == "q_proj,v_proj"
    assert RunConfig(lora_targets="all-linear").lora_targets == "all-linear"
