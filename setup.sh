#!/usr/bin/env bash
# One command sets dsnb up for development: torch (only if absent, so Colab's or your CUDA build stays), the
# pinned requirements and the tests' tools, dsnb itself (editable), and a Jupyter kernel for papermill and nbval.
set -euo pipefail
cd "$(dirname "$0")"
python3 -c "import torch" 2>/dev/null || python3 -m pip install -q "torch==2.13.0"
# NVMe offload (ZeRO-Infinity) goes through libaio; without it dsnb says so when NVMe is asked for.
if ! ldconfig -p 2>/dev/null | grep -q libaio && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  (apt-get install -y -qq libaio-dev >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq libaio-dev >/dev/null 2>&1)) \
    || echo "libaio-dev could not be installed: NVMe offload unavailable (CPU offload works)"
fi
python3 -m pip install -q -r requirements-dev.txt
python3 -m pip install -q --no-deps -e .
python3 -m ipykernel install --user --name python3 >/dev/null
python3 -c "import dsnb, torch, deepspeed; print('dsnb ready: torch', torch.__version__, '| CUDA GPU:', torch.cuda.is_available())"
