"""What a notebook's setup cell (and colab_setup.sh) runs after `pip install --no-deps <dsnb>`: the requirements this
machine lacks, leaving every installed package that already satisfies dsnb as it is (Colab's torch, transformers,
datasets, pyarrow, ...), then DeepSpeed's CPU Adam built once.

    python -m dsnb.install            # prints what it installed, kept and how long it took; exit 1 on failure
    python -m dsnb.install --read     # only what reading a store needs (notebook 03): mlflow, pandas, matplotlib

Only the standard library and `packaging` (which pip itself ships) are used here, so it runs before the rest of dsnb
can be imported. Every installed package is pinned at its version (a constraints file), so what pip adds for a
missing requirement cannot upgrade what Colab has, nor pull another torch; a requirement that is missing, or installed
at a version dsnb cannot use, is installed. Where keeping everything is impossible (a new package needs a newer one of
Colab's), pip is asked again with only dsnb's own requirements and torch pinned, and says what it changed.
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


def plan(wanted: list[str]) -> tuple[list[str], list[str], list[str]]:
    """(requirements to install, pins for every installed package, pins for dsnb's own installed requirements and
    torch): a requirement installed at a version it allows is kept; one missing or outside it is installed (and its
    installed version left unpinned)."""
    Requirement = requirement_class()
    install, own = [], []
    for text in wanted:
        req = Requirement(text)
        try:
            have = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            install.append(text)
            continue
        if req.specifier.contains(have, prereleases=True):
            own.append(f"{req.name}=={have}")
        else:
            install.append(text)
    for name in ("torch", "torchvision", "torchaudio"):  # never replaced, whatever a requirement pulls in
        try:
            own.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            pass
    replaced = {norm(Requirement(text).name) for text in install}
    everything = sorted(f"{name}=={version}" for name, version in versions().items() if name not in replaced)
    return install, everything, own


def norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def versions() -> dict[str, str]:
    import importlib

    importlib.invalidate_caches()
    found: dict[str, str] = {}
    for d in metadata.distributions():  # in sys.path order: the first of a name is the one Python imports
        if d.metadata["Name"]:
            found.setdefault(norm(d.metadata["Name"]), d.version)
    return found


def pip_install(install: list[str], pins: list[str]) -> tuple[int, bool]:
    """(pip's exit code, whether it failed because the pins conflict), pip's messages passed on."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(pins) + "\n")
    try:
        done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                               "-c", f.name, *install], capture_output=True, text=True)
    finally:
        os.remove(f.name)
    print(done.stdout + done.stderr, end="", flush=True)
    conflict = "ResolutionImpossible" in done.stderr or "conflicting dependencies" in done.stderr
    return done.returncode, conflict


def main(argv: list[str]) -> int:
    started = time.time()
    read_only = "--read" in argv
    install, everything, own = plan(requirements(read_only))
    print(f"dsnb setup: every installed package kept as it is ({len(everything)}), {len(install)} to install: "
          f"{', '.join(install) or 'none'}", flush=True)
    code, conflict = pip_install(install, everything) if install else (0, False)
    if code and not conflict:
        print(f"dsnb setup: pip could not install {', '.join(install)} (its message is above)", flush=True)
        return 1
    if code:
        print("dsnb setup: not installable beside every installed package as it is (the versions conflict); again with "
              "only dsnb's own requirements and torch kept (pip may change other packages)", flush=True)
        before = versions()
        if pip_install(install, own)[0]:
            print(f"dsnb setup: pip could not install {', '.join(install)} (its message is above)", flush=True)
            return 1
        after = versions()
        changed = [f"{n} {v} -> {after[n]}" for n, v in sorted(before.items()) if after.get(n, v) != v]
        print(f"dsnb setup: changed {', '.join(changed) or 'nothing installed before'}", flush=True)
    if not read_only:
        done = subprocess.run([sys.executable, "-m", "dsnb", "prepare"])
        if done.returncode:
            return 1
    print(f"dsnb setup: ready in {time.time() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
