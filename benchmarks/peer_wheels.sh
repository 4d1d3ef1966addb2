#!/usr/bin/env bash
# The peers' wheels for `gpu_runs.sh peers` (benchmarks/peers.py): TRL, Liger Kernel and Unsloth with what the GPU
# image lacks (../shared/device/have.txt), Python 3.12, into a git-ignored folder (default .whl_peers/) that a GPU
# call carries beside .whl/ and installs into its own target (/tmp/peers), so the peers' pins (Unsloth wants
# datasets < 5 and trl <= 1.15) never touch dsnb's own packages:
#   bash benchmarks/peer_wheels.sh     # once, on the CPU machine, after ../shared/device/wheels.sh
# Unsloth's wheel carries its web UI ("studio", 25 MB of the 28); the benchmark imports none of it, and a GPU call
# carries 64 MiB at most, so the copy here leaves that folder out. xformers is not carried (no wheel for the image's
# torch 2.11 / CUDA 13): Unsloth then attends through torch's SDPA, as it says it does where xformers is missing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dest=${PEER_WHEELS_DIR:-.whl_peers}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
python3 -m pip download -q "${plat[@]}" --no-deps -d "$tmp" \
  "trl==1.15.*" "liger-kernel==0.8.*" "unsloth==2026.10.9" "unsloth_zoo==2026.10.9" "datasets==4.8.*" \
  tyro docstring-parser typeguard shtab torchao cut-cross-entropy hf-transfer msgspec structlog json5 nest-asyncio \
  "dill<0.4.1" "multiprocess<0.70.19" 2>&1 | { grep -v "is ignored" || true; }
mkdir -p "$dest"
rm -f "$dest"/*.whl
python3 - "$tmp" "$dest" <<'PY'
import os, sys, zipfile
src, dest = sys.argv[1:]
drop = {"unsloth": ("studio/",)}  # unsloth_zoo/mlx stays: unsloth_zoo imports it on every platform
total = 0
for f in sorted(os.listdir(src)):
    out = os.path.join(dest, f)
    prefixes = drop.get(f.split("-")[0], ())
    with zipfile.ZipFile(os.path.join(src, f)) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zout:
        for item in zin.infolist():
            if not item.filename.startswith(prefixes):
                zout.writestr(item, zin.read(item.filename))
    total += os.path.getsize(out)
print(f"{len(os.listdir(dest))} wheels, {total / 2**20:.1f} MiB in {dest}")
PY
grep -qx "/$dest/" .git/info/exclude 2>/dev/null || echo "/$dest/" >> .git/info/exclude
