"""What a notebook's setup cell (and colab_setup.sh) runs after `pip install --no-deps <dsnb>`: the requirements this
machine lacks, leaving every installed package that already satisfies dsnb as it is (Colab's torch, transformers,
datasets, pyarrow, ...), then DeepSpeed's CPU Adam built once.

    python -m dsnb.install            # what it installs, then the build, with seconds as they pass; exit 1 on failure
    python -m dsnb.install --read     # only what reading a store needs (notebook 03): mlflow, pandas, matplotlib

Only the standard library and `packaging` (which pip itself ships) are used here, so it runs before the rest of dsnb
can be imported. Every installed package is pinned at its version (a constraints file), so what pip adds for a
missing requirement cannot upgrade what Colab has, nor pull another torch; a requirement that is missing, or installed
at a version dsnb cannot use, is installed. Where keeping everything is impossible (a new package needs a newer one of
Colab's), pip is asked again with only dsnb's own requirements and torch pinned, and every package it changed is named.
Nothing is silent for long: each step prints its seconds every TICK_S while it runs (the CPU Adam build takes minutes,
and a cell that prints nothing invites a restart), and pip's own messages are shown only where it fails.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from importlib import metadata

READ_ONLY = ("mlflow", "pandas", "matplotlib", "pyyaml", "psutil", "tqdm", "ipython")  # notebook 03's needs
TICK_S = 15
DEEPSPEED_LOG = re.compile(r"^\[\d{4}-\d\d-\d\d [\d:,]+\] \[(INFO|WARNING)\]")  # DeepSpeed's accelerator notes


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


def plan(wanted: list[str], have: dict[str, str] | None = None) -> tuple[list[str], list[str], list[str]]:
    """(requirements to install, pins for every installed package, pins for dsnb's own installed requirements and
    torch) against `have` (name -> version; this Python's packages unless given): a requirement installed at a
    version it allows is kept; one missing or outside it is installed (and its installed version left unpinned)."""
    Requirement = requirement_class()
    have = versions() if have is None else {norm(name): version for name, version in have.items()}
    install, own = [], []
    for text in wanted:
        req = Requirement(text)
        version = have.get(norm(req.name))
        if version is not None and req.specifier.contains(version, prereleases=True):
            own.append(f"{req.name}=={version}")
        else:
            install.append(text)
    own += [f"{name}=={have[name]}" for name in ("torch", "torchvision", "torchaudio") if name in have]  # kept always
    replaced = {norm(Requirement(text).name) for text in install}
    replaced |= {tied for name in replaced if name in have for tied in exactly_pinned(name, have[name])}
    everything = sorted(f"{name}=={version}" for name, version in have.items() if name not in replaced)
    return install, everything, own


def exactly_pinned(name: str, version: str) -> set[str]:
    """The packages that `name` at `version`, installed in this Python, requires at one version (MLflow its
    mlflow-skinny and mlflow-tracing): they move with it, so they are not held where it is replaced (held, pip found no
    version to install). None where this Python has no such package at that version (a plan for another's list)."""
    Requirement = requirement_class()
    try:
        if metadata.version(name) != version:
            return set()
        requires = metadata.requires(name) or []
    except metadata.PackageNotFoundError:
        return set()
    tied = set()
    for text in requires:
        req = Requirement(text)
        if (req.marker is None or req.marker.evaluate({"extra": ""})) and any(
                spec.operator in ("==", "===") for spec in req.specifier):
            tied.add(norm(req.name))
    return tied


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def versions() -> dict[str, str]:
    import importlib

    importlib.invalidate_caches()
    found: dict[str, str] = {}
    for d in metadata.distributions():  # in sys.path order: the first of a name is the one Python imports
        if d.metadata["Name"]:
            found.setdefault(norm(d.metadata["Name"]), d.version)
    return found


def run(label: str, command: list[str], show=lambda line: False) -> tuple[int, str]:
    """(exit code, output) of `command`, its stdout and stderr together; the lines `show` picks are printed as they
    come, and `label` with the seconds so far every TICK_S while it runs."""
    started = time.time()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env={**os.environ, "PIP_ROOT_USER_ACTION": "ignore"})
    lines: list[str] = []

    def read():
        for line in child.stdout:
            lines.append(line)
            if show(line):
                print(line, end="", flush=True)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    while True:
        reader.join(TICK_S)
        if not reader.is_alive():
            break
        print(f"dsnb setup: {label}: {time.time() - started:.0f} s", flush=True)
    return child.wait(), "".join(lines)


def pip_install(install: list[str], pins: list[str]) -> tuple[int, str]:
    """(pip's exit code, its messages), every package in `pins` held at its version."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(pins) + "\n")
    try:
        return run(f"installing {', '.join(install)}",
                   [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-warn-conflicts",
                    "--progress-bar", "off", "-c", f.name, *install])
    finally:
        os.remove(f.name)


def changes(before: dict[str, str], after: dict[str, str]) -> str:
    """What an install added and changed, by name and version."""
    added = [f"{n} {v}" for n, v in sorted(after.items()) if n not in before]
    changed = [f"{n} {v} -> {after[n]}" for n, v in sorted(before.items()) if after.get(n, v) != v]
    return f"added {', '.join(added) or 'nothing'}; changed {', '.join(changed) or 'nothing installed before'}"


def install_missing(read_only: bool) -> bool:
    """dsnb's missing requirements installed, every installed package kept where pip can; False where pip failed."""
    before = versions()
    install, everything, own = plan(requirements(read_only), before)
    print(f"dsnb setup: {len(everything)} installed packages kept as they are; to install: "
          f"{', '.join(install) or 'nothing'}", flush=True)
    if not install:
        return True
    code, out = pip_install(install, everything)
    if code and ("ResolutionImpossible" in out or "conflicting dependencies" in out):
        print("dsnb setup: not installable beside every installed package as it is (the versions conflict); again "
              "with only dsnb's own requirements and torch kept (pip may change other packages)", flush=True)
        code, out = pip_install(install, own)
    if code:
        print(out + f"dsnb setup: pip could not install {', '.join(install)} (its message is above)", flush=True)
        return False
    after = versions()
    still = plan(requirements(read_only), after)[0]
    if still:
        print(out + f"dsnb setup: pip ended without error, but {', '.join(still)} is still not installed", flush=True)
        return False
    print(f"dsnb setup: {changes(before, after)}", flush=True)
    return True


def main(argv: list[str]) -> int:
    started = time.time()
    read_only = "--read" in argv
    if not install_missing(read_only):
        return 1
    if not read_only:
        code, _ = run("DeepSpeed's CPU Adam", [sys.executable, "-m", "dsnb", "prepare"],
                      show=lambda line: not DEEPSPEED_LOG.match(line))
        if code:
            print("dsnb setup: `python -m dsnb prepare` failed (its message is above)", flush=True)
            return 1
    print(f"dsnb setup: ready in {time.time() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
