"""The contract, fuzzed: every run-config field and every file dsnb reads (run YAML, sweep YAML, capacity YAML,
a DeepSpeed JSON, dataset files) either gives a valid config, or a ConfigError of one line naming the field or the
file (the CLI's exit 2), never another exception. The fast part runs by default; `-m slow` runs it deeper and
through the real command line (`python -m dsnb check`, machine checks and data reading included)."""
import json
import math

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dsnb.cli import build_config, main, parser
from dsnb.config import OFFLINE, RENAMED, ConfigError, RunConfig, field_names

FIELDS = field_names()
WEIRD_TEXT = ["", " ", "nan", "inf", "-inf", "1e400", "-1", "0", "2.5", "1e3", "true", "None", "zero9", "ü",
              "it's", "\"", "a,b,,c", "x" * 300, "../../etc", "sqlite:///", "synthetic:nope"]
NUMBERS = st.one_of(st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True), st.booleans())
VALUES = st.one_of(st.sampled_from(WEIRD_TEXT), NUMBERS, st.text(max_size=20),
                   st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
                   st.none())
SAFE = {"tracking_uri", "model", "dataset", "nvme_path", "ds_config_path", "output_dir"}  # reach disks/networks
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def outcome(build, named: list[str]):
    """Build; a ConfigError must be one line that names one of `named` (fields or files)."""
    try:
        cfg = build()
    except ConfigError as e:
        text = str(e)
        assert "\n" not in text and len(text) < 600, text
        assert any(n in text for n in named), (named, text)
        return None
    return cfg


def valid(cfg) -> None:
    """An accepted config is one RunConfig would accept again, field for field."""
    if isinstance(cfg, RunConfig):
        again = RunConfig(**cfg.to_dict())
        assert again == cfg
        for name in ("batch_size", "grad_accum", "max_length", "seed", "lora_r"):
            assert isinstance(getattr(cfg, name), int) and not isinstance(getattr(cfg, name), bool)
        assert all(math.isfinite(getattr(cfg, n)) for n in ("learning_rate", "epochs", "memory_budget_gb"))


@FUZZ
@given(st.dictionaries(st.sampled_from([f for f in FIELDS if f not in SAFE] + list(RENAMED) + ["learning_rat"]),
                       VALUES, max_size=4))
def test_fields_from_any_layer(values):
    valid(outcome(lambda: RunConfig.layered(values, offline=True), list(values)))


@FUZZ
@given(st.lists(st.tuples(st.sampled_from([f for f in FIELDS if f not in SAFE]),
                          st.sampled_from(WEIRD_TEXT + ["1", "8", "2e-4", "zero2", "cpu", "bf16", "packed"])),
                max_size=4))
def test_flags(pairs):
    argv = ["run", "--offline"] + [a for name, value in pairs for a in (f"--{name}", value)]
    named = [n for n, _ in pairs] + ["argument", "unrecognized", "expected"]
    valid(outcome(lambda: build_config(parser().parse_args(argv)), named))


def write(path, content) -> str:
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return str(path)


YAML_DOCS = st.one_of(
    st.dictionaries(st.sampled_from(FIELDS + ["junk", "variants", "base", "models", "budgets_gb"]), VALUES,
                    max_size=5).map(lambda d: yaml.safe_dump(d, allow_unicode=True)),
    st.sampled_from(["", "- a\n- b\n", "{unclosed: ", "a: [1, 2\n", "just text", "\t: x"]),
    st.binary(max_size=40))


@FUZZ
@given(YAML_DOCS)
def test_run_yaml(tmp_path_factory, doc):
    from dsnb.config import read_fields

    path = write(tmp_path_factory.mktemp("y") / "run.yaml", doc)
    valid(outcome(lambda: RunConfig.layered(read_fields(path), offline=True), [path] + FIELDS))


SWEEPS = st.fixed_dictionaries({}, optional={
    "notebook": st.sampled_from(["../no/such.ipynb", 5]), "base": VALUES,
    "variants": st.one_of(VALUES, st.lists(st.dictionaries(st.sampled_from(FIELDS + ["x"]), VALUES, max_size=3),
                                           max_size=3)),
    "output_dir": VALUES, "extra": VALUES}).map(lambda d: yaml.safe_dump(d, allow_unicode=True))


@FUZZ
@given(st.one_of(SWEEPS, YAML_DOCS))
def test_sweep_yaml(tmp_path_factory, doc):
    from dsnb.sweep import load_sweep

    path = write(tmp_path_factory.mktemp("s") / "sweep.yaml", doc)
    result = outcome(lambda: load_sweep(path, offline=True), [path])
    for cfg in (result[1] if result else []):
        valid(cfg)


CAPACITIES = st.fixed_dictionaries({}, optional={
    "models": st.one_of(VALUES, st.lists(st.sampled_from(["synthetic:tiny", "synthetic:x", 3]), max_size=2)),
    "budgets_gb": st.one_of(VALUES, st.lists(st.one_of(NUMBERS, st.text(max_size=3)), max_size=3)),
    "base": VALUES, "variants": st.one_of(VALUES, st.dictionaries(st.text(max_size=4), VALUES, max_size=2)),
    "skip": VALUES}).map(lambda d: yaml.safe_dump(d, allow_unicode=True))


@FUZZ
@given(st.one_of(CAPACITIES, YAML_DOCS))
def test_capacity_yaml(tmp_path_factory, doc):
    from dsnb.capacity import load_capacity

    path = write(tmp_path_factory.mktemp("c") / "capacity.yaml", doc)
    result = outcome(lambda: load_capacity(path), [path])
    for _, _, cfg in (result[1] if result else []):
        valid(cfg)


JSON_DOCS = st.one_of(
    st.dictionaries(st.sampled_from(["train_batch_size", "train_micro_batch_size_per_gpu",
                                     "gradient_accumulation_steps", "zero_optimization", "x"]),
                    st.one_of(VALUES, st.just("auto")), max_size=4).map(json.dumps),
    st.sampled_from(["", "[]", "{", "null", "3", "\"auto\""]), st.binary(max_size=20))


@FUZZ
@given(JSON_DOCS)
def test_deepspeed_json(tmp_path_factory, doc):
    from dsnb.preflight import read_ds_config

    path = write(tmp_path_factory.mktemp("j") / "ds.json", doc)
    cfg = RunConfig(strategy="zero2", ds_config_path=path)
    result = outcome(lambda: read_ds_config(cfg), [path])
    assert result is None or isinstance(result, dict)


ROWS = st.lists(st.dictionaries(st.sampled_from(["question", "answers", "answer", "context", "id"]),
                                st.one_of(VALUES, st.fixed_dictionaries({"text": VALUES})), max_size=4),
                min_size=1, max_size=4)


@FUZZ
@given(st.one_of(ROWS.map(lambda rows: "\n".join(json.dumps(r) for r in rows)),
                 st.binary(max_size=60), st.sampled_from(["", "\n\n", "{\"question\": 1}", "not json"])),
       st.integers(1, 5))
@example(doc='{"question": null, "answers": {"": 0, "\\u0000": 0}}', n=1)  # keys Arrow takes for one (a CI run's find)
def test_dataset_files(tmp_path_factory, doc, n):
    from dsnb.data import load_records

    path = write(tmp_path_factory.mktemp("d") / "data.jsonl", doc)
    cfg = RunConfig(**dict(OFFLINE, dataset=path, num_samples=n))
    rows = outcome(lambda: load_records(cfg), [path, "num_samples"])
    for row in rows or []:
        assert isinstance(row["question"], str) and row["question"].strip()
        assert isinstance(row["answers"]["text"], list) and all(isinstance(t, str) for t in row["answers"]["text"])


COMMAND_LINES = st.lists(st.tuples(st.sampled_from(FIELDS), st.sampled_from(WEIRD_TEXT + ["1", "8", "zero3", "cpu"])),
                         max_size=3)


def check_command_line(tmp_path_factory, capsys, pairs):
    """`python -m dsnb check` (in this process): exit 0, or exit 2 with one line and no traceback."""
    import os

    folder = tmp_path_factory.mktemp("cli")
    old = os.getcwd()
    os.chdir(folder)
    try:
        code = main(["check", "--offline"] + [a for name, value in pairs for a in (f"--{name}", value)])
    finally:
        os.chdir(old)
    err = capsys.readouterr().err.strip().splitlines()
    assert code in (0, 2), err
    if code == 2:
        assert len(err) == 1 and err[0].startswith("dsnb: error: ") and "Traceback" not in err[0], err


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(COMMAND_LINES)
def test_the_command_line_end_to_end(tmp_path_factory, capsys, pairs):
    check_command_line(tmp_path_factory, capsys, pairs)


@pytest.mark.slow
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(COMMAND_LINES)
def test_the_command_line_deeply(tmp_path_factory, capsys, pairs):
    check_command_line(tmp_path_factory, capsys, pairs)
