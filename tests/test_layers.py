"""The package's shape: each module imports only from the layers below it (no cycle, nothing reaching back up),
and the lint configuration in pyproject.toml finds nothing."""
import ast
import pathlib
import shutil
import subprocess

import pytest

PACKAGE = pathlib.Path(__file__).parent.parent / "dsnb"
# Lowest first, as dsnb/__init__.py's docstring lists them.
LAYERS = ["config", "data", "fp8", "loss", "model", "zero", "metrics", "estimate", "timing", "evaluate", "card",
          "preflight", "planning", "tracking", "flat_step", "dropout", "loop", "train", "launch", "publish", "compare",
          "sweep", "bench", "capacity", "advise", "report", "notebook", "cli", "child", "install", "__init__",
          "__main__"]


def imported(path: pathlib.Path) -> set[str]:
    """dsnb modules a file imports, at the top or inside functions."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names.update([node.module.split(".")[0]] if node.module else [a.name for a in node.names])
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dsnb."):
            names.add(node.module.split(".")[1])
    return names


def test_every_module_has_a_layer():
    assert sorted(p.stem for p in PACKAGE.glob("*.py")) == sorted(LAYERS)


@pytest.mark.parametrize("module", LAYERS)
def test_imports_point_down(module):
    below = set(LAYERS[:LAYERS.index(module)])
    upward = imported(PACKAGE / f"{module}.py") - below
    assert not upward, f"dsnb.{module} imports {sorted(upward)}, which sit above it"


def test_lint_finds_nothing():
    ruff = shutil.which("ruff")
    assert ruff, "ruff is in requirements-dev.txt; run setup.sh"
    done = subprocess.run([ruff, "check", "--no-cache", "."], cwd=PACKAGE.parent, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:]


@pytest.mark.parametrize("module", LAYERS)
def test_imports_sit_at_the_top_unless_deferring_one_is_said_to_save_time(module):
    """A dsnb module imported inside a function says why on its line (# deferred: ...): keeping torch out of a
    process that never trains, or out of `import dsnb`."""
    path = PACKAGE / f"{module}.py"
    lines = path.read_text().splitlines()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for inner in ast.walk(node):
                if isinstance(inner, ast.ImportFrom) and inner.level == 1:
                    said = "# deferred" in lines[inner.lineno - 1] or "# deferred" in lines[inner.end_lineno - 1]
                    assert said, f"dsnb/{module}.py:{inner.lineno}: .{inner.module} imported in {node.name}(), not why"
