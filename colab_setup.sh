#!/usr/bin/env bash
# Colab (or any CUDA box with torch already installed): dsnb's pinned requirements without replacing the
# installed torch, a GPU check, libaio for NVMe offload, and DeepSpeed's environment report.
#   bash colab_setup.sh
set -uo pipefail
cd "$(dirname "$0")"
python3 -c "import torch" 2>/dev/null || { echo "torch is missing: install the build for your CUDA first"; exit 1; }
before=$(python3 -c "import torch; print(torch.__version__)")
if command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; then :; else
  echo "No GPU visible: on Colab pick Runtime > Change runtime type > GPU, or set DSNB_OFFLINE=1 to run offline on the CPU"
fi
# NVMe offload (ZeRO-Infinity) goes through libaio; without it only CPU offload works.
if ! ldconfig -p 2>/dev/null | grep -q libaio; then
  (apt-get install -y -qq libaio-dev >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq libaio-dev >/dev/null 2>&1)) \
    || echo "libaio-dev could not be installed: NVMe offload will be unavailable (CPU offload still works)"
fi
python3 -m pip install -q -r requirements.txt || exit 1
python3 -m pip install -q --no-deps -e . || exit 1
after=$(python3 -c "import torch; print(torch.__version__)")
[ "$before" = "$after" ] || { echo "torch changed from $before to $after: a requirement pulled another build"; exit 1; }
echo "torch $after kept"
ds_report 2>/dev/null | sed -n '/DeepSpeed general environment info/,$p' || true
