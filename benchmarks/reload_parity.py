"""Saved models reloaded against their runs' own numbers: each folder's model (an adapter on its base, loaded as the
run trained it: 8-bit or 4-bit where it was) asked the fixed probe again, beside the probe_logit_norm its run logged.

    python benchmarks/reload_parity.py sqlite:///mlflow.db adapter-*     # one JSON line a folder
"""
import json
import os
import sys

from dsnb.evaluate import probe_logit_norm
from dsnb.publish import load_saved
from dsnb.tracking import mlflow_client

client = mlflow_client(sys.argv[1])
for folder in sys.argv[2:]:
    with open(os.path.join(folder, "dsnb_run.json")) as f:
        saved = json.load(f)
    run = client.get_run(saved["run_id"])
    logged = run.data.metrics["probe_logit_norm"]
    model, tokenizer = load_saved(folder)
    again = probe_logit_norm(model, tokenizer)
    print(json.dumps({"folder": folder, "run": run.info.run_name, "quantization": saved["config"]["quantization"],
                      "dtype": saved["config"]["dtype"], "logged": logged, "reloaded": again,
                      "relative": abs(again - logged) / logged}), flush=True)
