"""benchmarks/peers.py counts what each peer trained: the samples and real tokens of exactly the timed steps.

Its figures stand beside dsnb's in the bench table, so the counts are checked against the data they came from:
the quick test on the collator the HF Trainer peer uses, the slow one through a whole (compiled, CPU) Trainer run.
"""
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PEERS = ROOT / "benchmarks" / "peers.py"
sys.path.insert(0, str(PEERS.parent))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = tmp_path_factory.mktemp("peers") / "data.json"
    subprocess.run([sys.executable, str(PEERS), "data", "--model", "synthetic:tiny", "--num_samples", "16",
                    "--out", str(out)], check=True, cwd=ROOT, capture_output=True)
    return out, json.loads(out.read_text())


def test_the_data_is_dsnbs_unpadded_samples_with_a_loadable_model_and_tokenizer(data):
    from transformers import AutoConfig, AutoTokenizer

    _, d = data
    lengths = [len(ids) for ids in d["input_ids"]]
    assert len(lengths) == 16 and len(set(lengths)) > 1  # each sample its own length: no padding stored
    tokenizer = AutoTokenizer.from_pretrained(d["model"])
    assert all(ids[-1] == tokenizer.eos_token_id for ids in d["input_ids"])
    assert AutoConfig.from_pretrained(d["model"]).model_type == "llama"
    folder = Path(d["model"])  # the weights linked from dsnb's cache, the tokenizer written beside them, not into it
    assert (folder / "model.safetensors").is_symlink() and not (folder / "tokenizer.json").is_symlink()


def test_the_counter_counts_real_tokens_of_padded_batches_not_the_padding(data):
    from transformers import AutoTokenizer, DataCollatorForSeq2Seq

    import peers

    _, d = data
    tokenizer = AutoTokenizer.from_pretrained(d["model"])
    counter = peers.Counter(DataCollatorForSeq2Seq(tokenizer, padding="longest", label_pad_token_id=-100))
    features = [{"input_ids": ids, "labels": ids} for ids in d["input_ids"][:5]]
    batch = counter(features)
    assert batch["input_ids"].numel() > sum(len(f["input_ids"]) for f in features)  # padded ...
    assert counter.batches == [(5, sum(len(f["input_ids"]) for f in features))]  # ... and the padding not counted


def test_a_failed_peer_is_a_row_with_its_error(tmp_path):
    import peers

    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"peer": "unsloth", "batch": 8, "packed": False, "status": "FAILED",
                                "error": "NotImplementedError: no GPU"}) + "\n")
    row = peers.table([str(path)]).splitlines()[-1]
    assert row.startswith("| unsloth | 8 | - | - | - | - | - | - | - | - | FAILED: NotImplementedError: no GPU")


def test_a_peer_stopped_by_the_calls_time_limit_is_recorded_failed_with_why(data, tmp_path):
    path, _ = data
    out = tmp_path / "r.jsonl"
    peer = subprocess.Popen([sys.executable, str(PEERS), "run", "hf_compile", "--data", str(path), "--out", str(out)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(8)  # loading or compiling, as a 10-minute call's `timeout` finds a slow peer
    peer.terminate()
    assert peer.wait(timeout=60) == 1
    record = json.loads(out.read_text())
    assert record["status"] == "FAILED" and "time limit" in record["error"], record


@pytest.mark.slow
def test_the_hf_trainer_peer_times_exactly_its_timed_steps(data, tmp_path):
    path, d = data
    out = tmp_path / "r.jsonl"
    subprocess.run([sys.executable, str(PEERS), "run", "hf_compile", "--data", str(path), "--out", str(out),
                    "--batch", "4", "--untimed", "1", "--steps", "3"], check=True, cwd=ROOT, capture_output=True)
    record = json.loads(out.read_text())
    assert record["status"] == "FINISHED", record
    batches = record["batches"]
    # 4 steps of 4 are one epoch of the 16 samples: every sample's tokens counted once, no padding among them
    assert [n for n, _ in batches] == [4, 4, 4, 4]
    assert sum(t for _, t in batches) == sum(len(ids) for ids in d["input_ids"])
    assert (record["samples"], record["real_tokens"]) == (12, sum(t for _, t in batches[1:]))
    assert record["tokens_per_second"] == pytest.approx(record["real_tokens"] / record["seconds"])
    # each timed step's own time: the 3 steps tile the window, and its median and slowest are theirs
    steps = record["step_ms"]
    assert len(steps) == 3 and sum(steps) == pytest.approx(1000 * record["seconds"]) and min(steps) > 0
    assert (record["median_step_ms"], record["slowest_step_ms"]) == (sorted(steps)[1], max(steps))
