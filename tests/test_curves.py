"""One short loss curve per training path, pinned as torchtune pins its recipes': the HF Trainer's loop with and without
DeepSpeed, and dsnb's compiled loop with and without it, four steps of synthetic:tiny on the CPU, each in one fresh
process. The four paths give the same curve (to 1e-6 here); a change to what any of them computes moves it."""
import json
import subprocess
import sys

import pytest

# Measured on the 2-core development machine (torch 2.13 CPU, transformers 5.24, DeepSpeed 0.19.8); the steps fall
# by about 2.5e-3 each, twenty times the tolerance.
PINNED = [6.043347, 6.040223, 6.037685, 6.035880]
TOLERANCE = 1e-4
SCRIPT = r"""
import json, sys
from dsnb.config import OFFLINE, RunConfig
from dsnb.report import loss_curve
from dsnb.tracking import create_run, mlflow_client
from dsnb.planning import Reporter
from dsnb.train import train

class Quiet(Reporter):
    def say(self, text):
        pass

common = dict(OFFLINE, quantization="none", max_steps=4, logging_steps=1, learning_rate=1e-3, batch_size=2,
              grad_accum=2, num_samples=4, eval_samples=0, lora_dropout=0.0, padding="bucket", save_model=False,
              tracking_uri=sys.argv[1], checkpoint_minutes=0)  # the same 4 samples every step: the loss must fall
curves = {}
for name, changes in (("trainer", {}), ("trainer_zero2", {"strategy": "zero2"}),
                      ("compiled", {"torch_compile": True}),
                      ("compiled_zero2", {"torch_compile": True, "strategy": "zero2"})):
    cfg = RunConfig(**common, **changes, run_name=name)
    run_id = create_run(cfg)
    train(cfg, run_id, reporter=Quiet())
    curves[name] = loss_curve(mlflow_client(cfg.tracking_uri), run_id)[1]
print(json.dumps(curves))
"""


def test_every_training_path_keeps_its_pinned_curve(tmp_path):
    done = subprocess.run([sys.executable, "-c", SCRIPT, f"sqlite:///{tmp_path}/mlflow.db"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    curves = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(curves) == {"trainer", "trainer_zero2", "compiled", "compiled_zero2"}
    for name, curve in curves.items():
        assert curve == pytest.approx(PINNED, abs=TOLERANCE), name
