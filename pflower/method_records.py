"""A method's recorded runs across the benchmark suites, as its docs page shows them.

Every run label of the method with committed records in a grid of ``bench/suites.toml`` (the
``examples`` suite aside: the page shows that run on its own) gives one row: the mean final
accuracy over seeds, the bytes, its place among the grid's runs and its difference from the grid's
FedAvg and Local, seed by seed. Written from the records, so the page's figures follow them.
Reading them does not open a natural-id grid's data, so its records are not checked against the
number of ids the data has here; ``pflower-bench SUITE --report-only`` checks that where the data is."""

from __future__ import annotations

import textwrap
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from pflower.bench import DOCS, RECORDS, SUITES, grid_rows, load_suite, mean_std, suite_page

#: The methods a row is compared with: in each grid, the one run of the method at its declared
#: keys (the grid's entry names nothing but the method), whatever its label.
REFERENCES = ("fedavg", "local")


def _plain(entry: str | dict[str, Any]) -> str | None:
    """The method of a grid entry that sets no key of its own; None for one that does."""
    if isinstance(entry, str):
        return entry
    return entry["method"] if entry.keys() <= {"method", "label"} else None


def _references(entries: list[str | dict[str, Any]], rows: list[dict[str, Any]]) -> dict[str, dict[str, Any] | None]:
    """Each reference method's row in a grid: its one plain entry's (None where it has none or several)."""
    labels = {ref: [] for ref in REFERENCES}
    for entry in entries:
        if (method := _plain(entry)) in labels:
            labels[method].append(entry if isinstance(entry, str) else entry.get("label", method))
    by_label = {r["method"]: r for r in rows}
    return {ref: by_label.get(found[0]) if len(found) == 1 else None for ref, found in labels.items()}


def _shown(row: dict[str, Any]) -> float:
    """The row's mean accuracy as its table shows it (four decimals): ranks follow what is read."""
    return round(float(np.mean(row["accuracy"])), 4)


def rank(row: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """The row's place among the grid's rows that have all their seeds, best first, by the mean
    shown; "=" marks a place shared at that precision; a dash for a row short of its seeds
    (its mean is over other seeds than theirs)."""
    if row["seeds"] != row["declared"]:
        return "—"
    complete = [r for r in rows if r["seeds"] == r["declared"]]
    above = sum(_shown(r) > _shown(row) for r in complete)
    level = sum(_shown(r) == _shown(row) for r in complete) > 1
    return f"{'=' if level else ''}{above + 1} of {len(complete)}"


@cache
def _rows(suites: Path, records: Path, docs: Path) -> list[dict[str, Any]]:
    """Every recorded label of every grid: suite, grid, its page, the label's method and its row."""
    out = []
    for name in tomllib.loads(suites.read_text()):
        if name == "examples":
            continue
        suite, runs = load_suite(suites, name, count_ids=False)
        page = suite_page(name, docs)
        for grid in suite["grid"]:
            in_grid = [r for r in runs if r.grid == grid["name"]]
            methods = {r.label: r.config.get("method") for r in in_grid}
            rows = grid_rows(in_grid, records, name)
            references = _references(grid["methods"], rows)
            for row in rows:
                out.append(
                    {
                        "suite": name,
                        "grid": grid["name"],
                        "page": page,
                        "method": methods[row["method"]],
                        "row": row,
                        "rank": rank(row, rows),
                        "references": references,
                    }
                )
    return out


def _seeds(row: dict[str, Any]) -> dict[int, float]:
    return {d["config"]["seed"]: d["final"]["accuracy"] for d in row["docs"]}


def difference(row: dict[str, Any], reference: dict[str, Any] | None) -> str:
    """The row's mean minus the reference's, and on how many of the seeds both have it is above."""
    if reference is None or reference is row:
        return "—"
    mine, theirs = _seeds(row), _seeds(reference)
    both = sorted(mine.keys() & theirs.keys())
    if not both:
        return "—"
    delta = round(float(np.mean([mine[s] for s in both]) - np.mean([theirs[s] for s in both])), 3)
    above = sum(mine[s] > theirs[s] for s in both)
    level = sum(mine[s] == theirs[s] for s in both)
    shown = f"{delta:+.3f}" if delta else "0.000"  # level to 3 decimals: no sign, not "-0.000"
    return f"{shown} ({above} of {len(both)} above{f', {level} level' if level else ''})"


def method_records_markdown(name: str, suites: Path = SUITES, records: Path = RECORDS, docs: Path = DOCS, link: str = "../") -> str:
    """Method ``name``'s rows (:func:`_rows`) as a Markdown table; ``link`` leads from the
    page to the docs folder."""
    rows = [r for r in _rows(suites, records, docs) if r["method"] == name]
    if not rows:
        return f"No benchmark suite has a record of `{name}` yet.\n"
    intro = (
        f"Every recorded run of `{name}` in the benchmark suites, from `bench/records/`: its mean final "
        "accuracy over seeds; its rank among the grid's runs that have all their seeds, by the mean as "
        'shown ("=" for a shared place, "—" for a run short of seeds); and its difference from the '
        "mean of the grid's FedAvg run and of its Local run (each at the method's defaults), over the "
        "seeds it shares with that run, with on how many of those seeds it is above (and, where any, "
        'level); "—" where the grid has no such run or the row is that run.'
    )
    lines = [
        *textwrap.wrap(intro, 100, break_on_hyphens=False),
        "",
        "| suite / grid | run | seeds | accuracy | MiB | rank | vs FedAvg | vs Local |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        row, refs = r["row"], r["references"]
        where = f"{r['suite']} / {r['grid']}"
        if r["page"] is not None:
            where = f"[{where}]({link}{r['page'].relative_to(docs).as_posix()})"
        seeds = str(row["seeds"]) if row["seeds"] == row["declared"] else f"{row['seeds']} of {row['declared']}"
        lines.append(
            f"| {where} | `{row['method']}` | {seeds} | {mean_std(row['accuracy'])} | {row['mb']:.1f} | {r['rank']} "
            f"| {difference(row, refs['fedavg'])} | {difference(row, refs['local'])} |"
        )
    return "\n".join(lines) + "\n"
