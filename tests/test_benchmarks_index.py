"""benchmarks/README.md indexes every result file, and the tables of current figures agree with the files they cite.

The conventions the test reads:
- a file is indexed by a markdown link to it, relative to the page: [name](results/...);
- a table whose header has `variant`, `samples/s`, `peak allocated` and `source` columns (benchmarks/README.md's
  current H200 summary, README.md's headline results) cites, in each row, a source file by a link and a row of that
  file's tables by its variant (the row's `variant` cell, or its first cell); the row's samples/s must equal the
  source row's samples/s (or samples_per_second) and its peak ("9,271 MB" or "97.3 GB") the source row's allocator
  peak in that unit.
"""
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
INDEX = ROOT / "benchmarks" / "README.md"
RESULTS = ROOT / "benchmarks" / "results"
LINK = re.compile(r"\]\(([^)\s#]+)\)")
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
# The summary's column -> the names the same quantity has in the result files' tables.
SOURCE_COLUMNS = {"samples/s": ("samples/s", "samples_per_second"), "MB": ("peak alloc MB", "peak allocated MB"),
                  "GB": ("peak_allocated_gb",)}
CITING = ("variant", "samples/s", "peak allocated", "source")


def links(page: pathlib.Path) -> set[pathlib.Path]:
    """Every relative link of a markdown page, as a resolved path."""
    return {(page.parent / target).resolve() for target in LINK.findall(page.read_text(encoding="utf-8"))
            if "://" not in target and not target.startswith("mailto:")}


def tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """The markdown tables of a text: (header, rows), cells stripped of spaces and backticks."""
    found, block = [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            block.append([cell.strip().strip("`").strip() for cell in line.strip().strip("|").split("|")])
            continue
        if len(block) >= 2:
            found.append((block[0], [row for row in block[1:] if not set("".join(row)) <= set("-: ")]))
        block = []
    return found


def number(cell: str) -> float | None:
    match = NUMBER.search(cell)
    return float(match.group().replace(",", "")) if match else None


def name_of(header: list[str], row: list[str]) -> str:
    """A result table's row name: its `variant` cell, or its first (a `run` column)."""
    return row[header.index("variant")] if "variant" in header else row[0]


def citing_rows(page: pathlib.Path) -> list:
    """(page, header, row) for each row of the page's tables that cite a source."""
    if not page.exists():
        return []
    return [pytest.param(page, header, row, id=f"{page.relative_to(ROOT)}:{row[header.index('variant')]}")
            for header, rows in tables(page.read_text(encoding="utf-8")) if set(CITING) <= set(header)
            for row in rows]


def test_every_result_file_is_indexed_and_every_link_of_the_index_exists():
    linked = links(INDEX)
    gone = sorted(str(p.relative_to(ROOT)) for p in linked if not p.exists())
    assert not gone, f"benchmarks/README.md links to files that do not exist: {gone}"
    files = {p.resolve() for p in RESULTS.rglob("*") if p.is_file()}
    unlisted = sorted(str(p.relative_to(ROOT)) for p in files - linked)
    assert not unlisted, (f"result files benchmarks/README.md does not list (add each with the command that made it, "
                          f"its commit and whether it is current; superseded ones go to results/archive/): {unlisted}")


def test_the_index_has_a_current_summary_that_cites_its_sources():
    rows = citing_rows(INDEX)
    assert len(rows) >= 10, "benchmarks/README.md's current H200 summary (variant, samples/s, peak allocated, source)"
    assert len(citing_rows(ROOT / "README.md")) >= 8, "README.md's headline results, each citing its file"


@pytest.mark.parametrize("page, header, row", citing_rows(INDEX) + citing_rows(ROOT / "README.md"))
def test_a_current_figure_agrees_with_the_result_file_it_cites(page, header, row):
    cell = dict(zip(header, row, strict=False))
    variant, name = cell["variant"], page.relative_to(ROOT)
    [target] = LINK.findall(cell["source"]) or [None]
    assert target, f"{name}: the row of {variant} links no source file"
    source = (page.parent / target).resolve()
    assert source.exists() and "archive" not in source.parts, f"{name}: {variant} cites {target}: not current"
    matches = [(h, r) for h, rs in tables(source.read_text(encoding="utf-8")) for r in rs
               if set(h) & set(SOURCE_COLUMNS["samples/s"]) and name_of(h, r) == variant]
    assert len(matches) == 1, f"{target} has {len(matches)} table rows named {variant!r} (want exactly one)"
    src_header, src_row = matches[0]
    src = dict(zip(src_header, src_row, strict=False))
    checks = [("samples/s", cell["samples/s"], SOURCE_COLUMNS["samples/s"])]
    unit = cell["peak allocated"].split()[-1]
    assert unit in ("MB", "GB"), f"{name}: {variant}'s peak {cell['peak allocated']!r} is not in MB or GB"
    checks.append(("peak allocated", cell["peak allocated"], SOURCE_COLUMNS[unit]))
    for what, value, names in checks:
        [column] = [name for name in names if name in src] or [None]
        assert column, f"{target}'s table has no column {' or '.join(names)} for {what}"
        assert number(value) == number(src[column]), (
            f"{name} says {variant} {what} {value}; {target} says {src[column]} ({column})")


@pytest.mark.parametrize("profile", sorted(RESULTS.rglob("profile_*.txt")), ids=lambda p: p.name)
def test_a_profiles_categories_hold_every_kernel_it_lists(profile):
    """benchmarks/profile_categories.py puts every kernel of a committed profile's table in a named category, and
    the table's kernels add up to no more than the step's GPU time that the file's first line states (a long table
    lists only its top rows)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("profile_categories", ROOT / "benchmarks" / "profile_categories.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = profile.read_text(encoding="utf-8")
    stated = re.search(r"GPU kernels ([\d.]+) ms", text.splitlines()[0])
    if not stated:
        pytest.skip("a profile of the host side only")
    found = module.categories(text)
    listed = sum(ms for _, ms in module.kernels(text))
    assert "uncategorized" not in found and sum(found.values()) == pytest.approx(listed), found
    assert 0.9 * float(stated.group(1)) <= listed <= float(stated.group(1)) + 0.3, (listed, stated.group(1))
