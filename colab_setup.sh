#!/usr/bin/env bash
# Colab (or any machine whose torch is already installed, e.g. a CUDA workstation): dsnb and only what it needs
# to run, never replacing the installed torch, then DeepSpeed's CPU Adam built once (python -m dsnb prepare).
#   bash colab_setup.sh                      # from a checkout
#   DSNB_SOURCE=<pip source> bash colab_setup.sh   # a git URL, a wheel or a zip of the repository
# The notebooks' setup cell runs the same two steps on Colab (DSNB_SOURCE there defaults to the project's URL).
set -uo pipefail
cd "$(dirname "$0")"
source=${DSNB_SOURCE:-.}
started=$SECONDS
torch_version=$(python3 -c "import torch; print(torch.__version__)" 2>/dev/null) \
  || { echo "torch is missing: install the build for your CUDA first"; exit 1; }
# NVMe offload (ZeRO-Infinity) goes through libaio; without it only CPU offload works.
if ! ldconfig -p 2>/dev/null | grep -q libaio && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  (apt-get install -y -qq libaio-dev >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq libaio-dev >/dev/null 2>&1)) \
    || echo "libaio-dev could not be installed: NVMe offload will be unavailable (CPU offload still works)"
fi
# Pinning the installed torch keeps every requirement from pulling another build.
python3 -m pip install -q "$source" "torch==$torch_version" || { echo "pip could not install dsnb from $source"; exit 1; }
echo "dsnb installed from $source in $((SECONDS - started)) s; torch $torch_version kept"
python3 -m dsnb prepare || exit 1
echo "ready in $((SECONDS - started)) s"
