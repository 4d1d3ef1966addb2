#!/usr/bin/env bash
# One command sets dsnb up for development: torch (only if absent, so Colab's or your CUDA build stays), the
# pinned requirements and the tests' tools, dsnb itself (editable), and a Jupyter kernel for papermill and nbval.
set -euo pipefail
cd "$(dirname "$0")"
python3 -c "import torch" 2>/dev/null || python3 -m pip install -q "torch==2.13.0"
# Debian's packages, where apt-get can install them (root): libaio for NVMe offload (ZeRO-Infinity; without it dsnb
# says so when NVMe is asked for); chromium and its driver for the MLflow UI test in a real browser (tests/test_ui.py);
# bindfs for the FUSE mount that stands in for Colab's Drive (tests/test_colab.py). Tests that need one say so and skip.
missing=()
ldconfig -p 2>/dev/null | grep -q libaio || missing+=(libaio-dev)
command -v chromium >/dev/null || missing+=(chromium)
command -v chromedriver >/dev/null || missing+=(chromium-driver)
command -v bindfs >/dev/null || missing+=(bindfs fuse3)
if [ ${#missing[@]} -gt 0 ] && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  (apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 \
    || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1)) \
    || echo "could not install ${missing[*]}: NVMe offload, the browser test or the FUSE test will say so"
fi
python3 -m pip install -q -r requirements-dev.txt
python3 -m pip install -q --no-deps -e .
python3 -m ipykernel install --user --name python3 >/dev/null
python3 -c "import dsnb, torch, deepspeed; print('dsnb ready: torch', torch.__version__, '| CUDA GPU:', torch.cuda.is_available())"
