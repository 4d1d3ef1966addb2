"""What a notebook's setup cell (and colab_setup.sh) runs after `pip install --no-deps <dsnb>`: the requirements this
machine lacks, leaving every installed package that already satisfies dsnb as it is (Colab's torch, transformers,
datasets, pyarrow, ...), then DeepSpeed's CPU Adam built once.

    python -m dsnb.install            # prints what it installed, kept and how long it took; exit 1 on failure
    python -m dsnb.install --read     # only what reading a store needs (notebook 03): mlflow, pandas, matplotlib

Only the standard library and `packaging` (which pip itself ships) are used here, so it runs before the rest of dsnb
can be imported. Installed versions that satisfy a requirement become pins (a constraints file), so pip neither
upgrades them nor pulls another torch; a requirement that is missing, or installed at a version dsnb cannot use, is
installed.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from importlib import metadata

READ_ONLY = ("mlflow", "pandas", "matplotlib", "pyyaml", "psutil", "tqdm", "ipython")  # notebook 03's needs


def requirement_class():
    """packaging's Requirement, from the package or, where only pip has it, from pip's own copy."""
    try:
        from packaging.requirements import Requirement
    except ImportError:
        from pip._vendor.packaging.requirements import Requirement
    return Requirement


def requirements(read_only: bool = False) -> list[str]:
    """dsnb's runtime requirements, as its package metadata lists them (requirements.txt)."""
    Requirement = requirement_class()
    wanted = [Requirement(r) for r in metadata.requires("dsnb") or [] if "extra ==" not in r]
    if read_only:
        wanted = [r for r in wanted if r.name.lower() in READ_ONLY]
    return [str(r) for r in wanted]


def plan(wanted: list[str]) -> tuple[list[str], list[str]]:
    """(requirements to install, pins for what is installed and serves): a requirement installed at a version it
    allows is pinned to that version; one missing or outside it is installed."""
    Requirement = requirement_class()
    install, pins = [], []
    for text in wanted:
        req = Requirement(text)
        try:
            have = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            install.append(text)
            continue
        if req.specifier.contains(have, prereleases=True):
            pins.append(f"{req.name}=={have}")
        else:
            install.append(text)
    for name in ("torch", "torchvision", "torchaudio"):  # never replaced, whatever a requirement pulls in
        try:
            pins.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            pass
    return install, pins


def main(argv: list[str]) -> int:
    started = time.time()
    read_only = "--read" in argv
    install, pins = plan(requirements(read_only))
    print(f"dsnb setup: {len(pins)} installed package(s) kept as they are, {len(install)} to install: "
          f"{', '.join(install) or 'none'}", flush=True)
    if install:
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write("\n".join(pins) + "\n")
        done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                               "-c", f.name, *install])
        os.remove(f.name)
        if done.returncode:
            print(f"dsnb setup: pip could not install {', '.join(install)} (its message is above)", flush=True)
            return 1
    if not read_only:
        done = subprocess.run([sys.executable, "-m", "dsnb", "prepare"])
        if done.returncode:
            return 1
    print(f"dsnb setup: ready in {time.time() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
