#!/usr/bin/env bash
# Colab (or any machine whose torch is already installed, e.g. a CUDA workstation): the notebooks' setup cell as a
# script. dsnb itself without its dependencies, then `python -m dsnb.install`: only the requirements this machine
# lacks, every installed package (torch, transformers, pyarrow, ...) pinned where it is, then DeepSpeed's CPU Adam
# built once, with what it installs and the seconds as they pass.
#   bash colab_setup.sh                            # from a checkout
#   DSNB_SOURCE=<pip source> bash colab_setup.sh   # a git URL, a wheel or a zip of the repository
set -uo pipefail
cd "$(dirname "$0")"
source=${DSNB_SOURCE:-.}
started=$SECONDS
python3 -c "import torch" 2>/dev/null || { echo "torch is missing: install the build for your CUDA first"; exit 1; }
# NVMe offload (ZeRO-Infinity) goes through libaio; without it only CPU offload works.
if ! ldconfig -p 2>/dev/null | grep -q libaio && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  (apt-get install -y -qq libaio-dev >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq libaio-dev >/dev/null 2>&1)) \
    || echo "libaio-dev could not be installed: NVMe offload will be unavailable (CPU offload still works)"
fi
export PIP_ROOT_USER_ACTION=ignore GIT_TERMINAL_PROMPT=0
python3 -m pip install -q --disable-pip-version-check --no-deps "$source" \
  || { echo "pip could not install dsnb from $source"; exit 1; }
echo "dsnb installed from $source in $((SECONDS - started)) s"
python3 -m dsnb.install
