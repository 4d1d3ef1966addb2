"""The DeepSpeed config builder against golden JSON files (UPDATE_GOLDEN=1 rewrites them after a deliberate change)."""
import json
import os
import pathlib

import pytest

from dsnb.config import OFFLINE, ConfigError, RunConfig
from dsnb.zero import check_batch_sizes, deepspeed_config, zero_section

GOLDEN = pathlib.Path(__file__).parent / "golden"

# The tutorial's four snippets, verbatim.
TUTORIAL_SNIPPETS = {
    "snippet1_zero1": ((1,), {"zero_optimization": {"stage": 1}}),
    "snippet2_zero2_offload_cpu": ((2, "cpu"), {"zero_optimization": {
        "stage": 2, "offload_optimizer": {"device": "cpu"}}}),
    "snippet3_zero3_param_nvme": ((3, "none", "nvme", "/local_nvme"), {"zero_optimization": {
        "stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/local_nvme"}}}),
    "snippet4_zero3_opt_cpu_param_nvme": ((3, "cpu", "nvme", "/local_nvme"), {"zero_optimization": {
        "stage": 3, "offload_optimizer": {"device": "cpu"},
        "offload_param": {"device": "nvme", "nvme_path": "/local_nvme"}}}),
}

VARIANTS = {
    "tutorial_zero2_offload_cpu": dict(strategy="zero2", offload_optimizer="cpu"),
    "zero0": dict(strategy="zero0"),
    "zero1": dict(strategy="zero1"),
    "zero1_offload_cpu": dict(strategy="zero1", offload_optimizer="cpu"),
    "zero2": dict(strategy="zero2", dtype="bf16"),
    "zero3": dict(strategy="zero3", quantization="none", lora_r=0, dtype="bf16"),
    "zero3_param_cpu": dict(strategy="zero3", offload_param="cpu", quantization="4bit", dtype="bf16"),
    "zero3_opt_cpu_param_cpu": dict(strategy="zero3", offload_optimizer="cpu", offload_param="cpu",
                                    quantization="none"),
    "zero3_opt_nvme_param_nvme": dict(strategy="zero3", offload_optimizer="nvme", offload_param="nvme",
                                      quantization="none", nvme_path="/mnt/nvme"),
    "zero3_opt_cpu_param_nvme_2gpu": dict(strategy="zero3", offload_optimizer="cpu", offload_param="nvme",
                                          quantization="none", world_size=2),
}


def golden(name, value):
    path = GOLDEN / f"{name}.json"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(json.dumps(value, indent=2) + "\n")
    return json.loads(path.read_text())


@pytest.mark.parametrize("name", TUTORIAL_SNIPPETS)
def test_tutorial_snippets_exactly(name):
    args, expected = TUTORIAL_SNIPPETS[name]
    built = zero_section(*args)
    assert built == expected == golden(name, built)
    assert json.dumps(built) == json.dumps(expected)  # same keys in the same order as the tutorial wrote them


@pytest.mark.parametrize("name", VARIANTS)
def test_full_configs_match_golden(name):
    changes = dict(VARIANTS[name])
    world = changes.pop("world_size", 1)
    built = deepspeed_config(RunConfig(**changes), world)
    assert built == golden(name, built)
    micro, accumulation = built["train_micro_batch_size_per_gpu"], built["gradient_accumulation_steps"]
    assert built["train_batch_size"] == micro * accumulation * world


def test_tutorial_config_has_its_settings():
    built = deepspeed_config(RunConfig(strategy="zero2", offload_optimizer="cpu"))
    zero = built["zero_optimization"]
    assert zero["stage"] == 2 and zero["offload_optimizer"] == {"device": "cpu"} and zero["contiguous_gradients"]
    assert built["fp16"]["enabled"] and built["train_batch_size"] == 8 and built["gradient_accumulation_steps"] == 4


def test_baseline_has_no_deepspeed_config():
    with pytest.raises(ValueError):
        deepspeed_config(RunConfig())


def test_batch_size_mismatch_in_a_user_config():
    cfg = RunConfig(strategy="zero2")
    check_batch_sizes({"train_batch_size": 8, "gradient_accumulation_steps": "auto"}, cfg)
    with pytest.raises(ConfigError, match="train_batch_size is 8 .* give 16; set it to 16"):
        check_batch_sizes({"train_batch_size": 8}, cfg, world_size=2)
    with pytest.raises(ConfigError, match="train_batch_size is '16' \\(a string: JSON's numbers take no quotes\\)"):
        check_batch_sizes({"train_batch_size": "16"}, cfg, world_size=2)
    from dsnb.zero import check_precision

    with pytest.raises(ConfigError, match="bf16.enabled is the string 'false'; give JSON's false \\(no quotes\\)"):
        check_precision({"bf16": {"enabled": "false"}}, cfg.replace(dtype="fp32"))


def test_a_user_config_is_checked_for_the_processes_dsnb_starts_and_against_the_trainers_values(tmp_path, monkeypatch):
    """Before dsnb starts its launcher for num_gpus processes, a fixed train_batch_size is checked for all of them
    (16 for 2 x 8, not 1 x 8); an optimizer, scheduler or clipping value that differs from the Trainer's is refused in
    the check, before the run, where transformers would refuse it minutes in with a traceback."""
    from dsnb.preflight import check_deepcompile

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    path = tmp_path / "ds.json"
    cfg = RunConfig(**dict(OFFLINE, strategy="zero2", num_gpus=2, ds_config_path=str(path)))
    path.write_text(json.dumps({"train_batch_size": 16, "zero_optimization": {"stage": 2}}))
    check_deepcompile(cfg, "cpu")
    path.write_text(json.dumps({"train_batch_size": 8, "zero_optimization": {"stage": 2}}))
    with pytest.raises(ConfigError, match="train_batch_size is 8 .* on 2 device\\(s\\) give 16"):
        check_deepcompile(cfg, "cpu")
    cfg = cfg.replace(num_gpus=1, max_steps=6)
    fine = {"gradient_clipping": 1.0, "optimizer": {"type": "AdamW", "params": {"lr": 2e-4, "betas": [0.9, 0.999],
            "eps": 1e-8, "weight_decay": "auto"}}, "scheduler": {"type": "WarmupDecayLR", "params": {
            "warmup_max_lr": "auto", "warmup_num_steps": 1, "total_num_steps": 6}}}
    for change, said in ((("optimizer", "lr", 0.5), "optimizer.params.lr is 0.5 but the run's learning_rate is "
                                                    "0.0002; .* \"auto\" or 0.0002, or set learning_rate 0.5"),
                         (("optimizer", "betas", [0.9, 0.95]), "betas is \\[0.9, 0.95\\] but the Trainer's is "
                                                               "\\[0.9, 0.999\\]"),
                         (("scheduler", "total_num_steps", 10), "total_num_steps is 10 but the run's max_steps is 6"),
                         (("scheduler", "warmup_num_steps", 5), "warmup_num_steps is 5 but the Trainer's is 1 "
                                                                "\\(lr_warmup_steps 0: transformers asks at least "),
                         ((None, "gradient_clipping", 0.5), "gradient_clipping is 0.5 but the Trainer's is 1.0")):
        section, key, value = change
        doc = json.loads(json.dumps(fine))
        (doc[section]["params"] if section else doc)[key] = value
        path.write_text(json.dumps({**doc, "zero_optimization": {"stage": 2}}))
        with pytest.raises(ConfigError, match=said):
            check_deepcompile(cfg, "cpu")
    path.write_text(json.dumps({**fine, "zero_optimization": {"stage": 2}}))
    check_deepcompile(cfg, "cpu")
    with pytest.raises(ConfigError, match="warmup_num_steps is 1 but the run's lr_warmup_steps is 3; .* or 3, or set "
                                          "lr_warmup_steps 1"):
        check_deepcompile(cfg.replace(lr_warmup_steps=3), "cpu")


def test_nvme_parameter_buffers_hold_the_largest_weight():
    from dsnb.estimate import largest_weight
    from dsnb.model import model_config

    cfg = RunConfig(strategy="zero3", offload_optimizer="cpu", offload_param="nvme", quantization="none")
    # DeepSpeed's default
    assert deepspeed_config(cfg)["zero_optimization"]["offload_param"]["buffer_size"] == 100_000_000
    # The 1B shape's 128256 x 2048 embedding: DeepSpeed refused it with the default ("More elements ...").
    assert deepspeed_config(cfg, 1, 262_668_288)["zero_optimization"]["offload_param"]["buffer_size"] == 262_668_288
    # Weights kept for reuse hold their swap buffers: the 1B shape ran out of all 5 at step 2 on the H200.
    assert deepspeed_config(cfg)["zero_optimization"]["stage3_max_reuse_distance"] == 0
    assert "stage3_max_reuse_distance" not in deepspeed_config(cfg.replace(offload_param="cpu"))["zero_optimization"]
    tiny = RunConfig(**OFFLINE)
    assert largest_weight(model_config(tiny.model)) == 26_880  # synthetic:tiny's embedding, read from its config


def test_no_per_step_host_sync_where_nothing_needs_it():
    """overlap_comm synchronizes the device after each backward: kept where there is a reduction (several GPUs), a
    copy to an offloaded optimizer, or ZeRO-3's fetches to overlap (ZeRO-1 leaves it to DeepSpeed: off). bf16 drops
    ZeRO-1/2's overflow check (no loss scale to adjust; ZeRO-3 reads it only in fp16), fp16 keeps its loss scaler's."""
    def built(world=1, **changes):
        return deepspeed_config(RunConfig(**{"strategy": "zero2", "dtype": "bf16", **changes}), world)

    assert built()["zero_optimization"]["overlap_comm"] is False
    assert all(built(world, **changes)["zero_optimization"]["overlap_comm"]
               for world, changes in ((2, {}), (1, {"offload_optimizer": "cpu"}),
                                      (1, {"strategy": "zero3", "quantization": "none"})))
    assert "overlap_comm" not in built(2, strategy="zero1")["zero_optimization"]
    assert built()["bf16"] == built(strategy="zero1")["bf16"] == {"enabled": True, "check_grad_overflow": False}
    assert built(strategy="zero3", quantization="none")["bf16"] == {"enabled": True}
    assert built(dtype="fp16")["bf16"] == {"enabled": False} and built(dtype="fp16")["fp16"] == {"enabled": True}


def test_your_deepspeed_json_with_a_key_given_twice_or_nested_too_deep_is_named(tmp_path):
    """A key given twice in one object of ds_config_path's JSON (readers keep the last, silently: here the second
    stage) is refused naming it, as in YAML files; so is JSON nested deeper than Python's reader goes."""
    from dsnb.zero import read_ds_config

    path = tmp_path / "ds.json"
    cfg = RunConfig(strategy="zero2", ds_config_path=str(path))
    path.write_text('{"zero_optimization": {"stage": 2, "overlap_comm": true}, "gradient_clipping": 1.0}')
    assert read_ds_config(cfg)["gradient_clipping"] == 1.0
    path.write_text('{"zero_optimization": {"stage": 2, "overlap_comm": true, "stage": 3}}')
    with pytest.raises(ConfigError, match=f"ds_config {path}: the key 'stage' is given twice in one object"):
        read_ds_config(cfg)
    path.write_text('{"gradient_clipping": 1.0, "zero_optimization": {}, "gradient_clipping": 0.5}')
    with pytest.raises(ConfigError, match="the key 'gradient_clipping' is given twice"):
        read_ds_config(cfg)
    path.write_text('{"a": ' * 5000 + "1" + "}" * 5000)
    with pytest.raises(ConfigError, match=f"ds_config {path} is nested too deeply to read; give a DeepSpeed config"):
        read_ds_config(cfg)
    path.write_text('{"zero_optimization": ')
    with pytest.raises(ConfigError, match=f"ds_config {path} is not a DeepSpeed config .*JSONDecodeError"):
        read_ds_config(cfg)


def test_your_deepspeed_jsons_offload_agrees_with_the_runs_fields_or_is_refused_saying_what_to_set(tmp_path, capsys,
                                                                                                  monkeypatch):
    """Offload in ds_config_path's JSON that the run's fields do not say was run unchecked and logged as none: ZeRO-2
    with parameters "offloaded" (DeepSpeed ignores it) finished as if it worked, and an NVMe folder that does not
    exist met DeepSpeed minutes in. The JSON and the fields must agree, so the fields' own checks and record hold;
    the tutorial's snippets run with the fields they mean."""
    import shutil

    from dsnb.cli import main
    from dsnb.zero import read_ds_config

    monkeypatch.chdir(tmp_path)

    golden = os.path.join(os.path.dirname(__file__), "golden")
    snippet = dict(ds_config_path=os.path.join(golden, "snippet2_zero2_offload_cpu.json"), quantization="none")
    assert read_ds_config(RunConfig(strategy="zero2", offload_optimizer="cpu", **snippet))
    with pytest.raises(ConfigError, match="offload_optimizer.device is 'cpu' but the run's offload_optimizer is "
                                          "'none'; set offload_optimizer cpu in the run too"):
        read_ds_config(RunConfig(strategy="zero2", **snippet))
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme",
                                                                                    "nvme_path": f"{nvme}/"}}}))
    cfg = RunConfig(strategy="zero3", quantization="none", ds_config_path=str(path), offload_param="nvme",
                    nvme_path=str(nvme))
    assert read_ds_config(cfg)["zero_optimization"]["offload_param"]["device"] == "nvme"  # a trailing / is the same
    with pytest.raises(ConfigError, match=f"offload_param.nvme_path is '{nvme}/' but the run's nvme_path is "
                                          "'/elsewhere'; give the same folder in both"):
        read_ds_config(cfg.replace(nvme_path="/elsewhere"))
    assert read_ds_config(cfg.replace(nvme_path="nvme"))  # relative to the working folder (tmp_path): the same one
    path.write_text(json.dumps({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}}))
    with pytest.raises(ConfigError, match="offload_param.nvme_path is missing \\(DeepSpeed has no default folder\\); "
                                          f"give the run's nvme_path, '{nvme}'"):
        read_ds_config(cfg)
    # DeepSpeed's older switches, which it still reads as CPU offload
    for old, key in (("cpu_offload", "offload_optimizer"), ("cpu_offload_param", "offload_param")):
        path.write_text(json.dumps({"zero_optimization": {"stage": 3, old: True}}))
        with pytest.raises(ConfigError, match=f"zero_optimization.{old} is true but the run's {key} is 'none'; set "
                                              f"{key} cpu in the run too"):
            read_ds_config(RunConfig(strategy="zero3", quantization="none", ds_config_path=str(path)))
        assert read_ds_config(RunConfig(strategy="zero3", quantization="none", ds_config_path=str(path),
                                        **{key: "cpu"}))
    # through the command line, before anything loads: the JSON's ZeRO-2 parameter offload and a missing NVMe folder
    path.write_text(json.dumps({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}}))
    flags = ["run", "--offline", "--quantization", "none", "--ds_config_path", str(path)]
    for extra, message in ((["--strategy", "zero2"], "offload_param.device is 'cpu' but the run's offload_param is "
                                                     "'none'; set offload_param cpu"),
                           (["--strategy", "zero2", "--offload_param", "cpu"], "offload_param needs strategy zero3")):
        assert main(flags + extra) == 2 and message in capsys.readouterr().err
    shutil.rmtree(nvme)
    path.write_text(json.dumps({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme",
                                                                                    "nvme_path": str(nvme)}}}))
    assert main(flags + ["--strategy", "zero3", "--offload_param", "nvme", "--nvme_path", str(nvme)]) == 2
    assert f"nvme_path '{nvme}' does not exist" in capsys.readouterr().err
    assert not (tmp_path / "mlflow.db").exists()  # refused before a run opened


def test_a_deepspeed_json_without_its_zero_section_is_refused_before_loading_and_one_without_batch_keys_runs(tmp_path):
    """A misspelt or malformed zero_optimization failed minutes in, inside accelerate or DeepSpeed (an AttributeError,
    'Please specify the ZeRO optimization config'): refused when read, saying what to write; batch sizes left out
    are the run's ("auto"), as DeepSpeed needs one of them."""
    from dsnb.zero import read_ds_config

    path = tmp_path / "ds.json"
    cfg = RunConfig(**dict(OFFLINE, strategy="zero2", quantization="none", ds_config_path=str(path)))
    for text, said in (('{"train_batch_size": "auto", "zero_optimisation": {"stage": 2}}',
                        "no zero_optimization section \\('zero_optimisation' is not its spelling\\)"),
                       ('{"zero_optimization": 2}', "zero_optimization is 2, not a section of settings"),
                       ('{"bf16": {"enabled": "auto"}}', "no zero_optimization section;")):
        path.write_text(text)
        with pytest.raises(ConfigError, match=f"{said}.*strategy zero2 needs one, e.g. "):
            read_ds_config(cfg)
    path.write_text('{"zero_optimization": {"stage": 2}}')
    config = read_ds_config(cfg)
    assert {k: config[k] for k in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                                   "train_batch_size")} == dict.fromkeys(("train_micro_batch_size_per_gpu",
                                                                          "gradient_accumulation_steps",
                                                                          "train_batch_size"), "auto")
