#!/usr/bin/env bash
# One command sets dsnb up: torch (only if absent, so Colab's or your CUDA build stays), the pinned
# requirements, dsnb itself, and a Jupyter kernel for papermill and nbval.
set -euo pipefail
cd "$(dirname "$0")"
python3 -c "import torch" 2>/dev/null || python3 -m pip install -q "torch==2.13.0"
python3 -m pip install -q -r requirements.txt
python3 -m pip install -q --no-deps -e .
python3 -m ipykernel install --user --name python3 >/dev/null
python3 -c "import dsnb, torch, deepspeed; print('dsnb ready: torch', torch.__version__, '| CUDA GPU:', torch.cuda.is_available())"
