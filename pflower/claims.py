"""Each paper's claims checked against the records: the checklists of the reproduction pages.

``bench/claims.toml`` lists a paper's tables (each proposed method against every other method
the table and a suite's grid share, the pair ordered by the paper's figures), the findings it
states, and what no suite reproduces. :func:`verdict` marks each claim from the recorded seeds
by one rule; the pages' checklists (:func:`checklist_markdown`) and the README's counts
(:func:`counts_markdown`) are generated from the records alone (``python docs/hooks.py --write``).
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pflower.bench import DOCS, anchor, load_record, load_suite, mean_std, suite_page
from pflower.verdict import FAILS, MARKS, RULE, UNTESTED, Verdict, verdict


@dataclass(frozen=True)
class Line:
    """One checklist line: the claim, where the paper makes it, our figures, its mark."""

    claim: str
    source: str
    ours: str
    verdict: Verdict
    group: str = ""  # the paper's table it belongs to (its setting and our suite), or a kind of line


def _figures(suite: str, grid: str, label: str, value: str, suites: Path, records: Path, cache: dict) -> dict[int, float]:
    """The final ``value`` (accuracy, global-accuracy, mib) of ``label`` in a grid's records, by seed."""
    if suite not in cache:
        cache[suite] = load_suite(suites, suite, count_ids=False)
    _, runs = cache[suite]
    mine = [r for r in runs if r.grid == grid and r.label == label]
    if not mine:
        raise ValueError(f"bench/claims.toml: suite '{suite}' grid '{grid}' runs no '{label}'")
    out = {}
    for r in mine:
        doc = load_record(r, records, suite)
        if doc is None:
            continue
        final = doc["final"]
        out[r.seed] = (final["bytes-down"] + final["bytes-up"]) / 2**20 if value == "mib" else final[value]
    return out


def _cell(xs: list[float], value: str) -> str:
    """A method's figure over seeds: MiB as a mean, accuracy as the tables show it."""
    return f"{np.mean(xs):.1f} MiB" if value == "mib" else mean_std(xs)


def _ours(a: list[float], b: list[float], value: str, names: tuple[str, str]) -> str:
    return f"{names[0]} {_cell(a, value)}, {names[1]} {_cell(b, value)} ({len(a)} and {len(b)} seeds)"


#: What a stated finding may compare, and how.
VALUES, KINDS = ("accuracy", "global-accuracy", "mib"), ("above", "no-worse")


def _line(claim: str, source: str, spec: dict, a: str, b: str, group: str, suites: Path, records: Path, cache: dict) -> Line:
    value, lower, factor = spec.get("value", "accuracy"), spec.get("value") == "mib", float(spec.get("factor", 1.0))
    if value not in VALUES or spec.get("kind", "above") not in KINDS:
        raise ValueError(f"bench/claims.toml: {claim!r}: value must be one of {VALUES} and kind one of {KINDS}")
    by_a = _figures(spec["suite"], spec["grid"], a, value, suites, records, cache)
    value_b = spec.get("value-b", value)
    if value_b not in VALUES:
        raise ValueError(f"bench/claims.toml: {claim!r}: value-b must be one of {VALUES}")
    by_b = _figures(spec["suite"], spec["grid"], b, value_b, suites, records, cache)
    fa, fb = list(by_a.values()), list(by_b.values())
    if not fa or not fb:
        return Line(claim, source, "—", Verdict(UNTESTED, f"no record yet: `pflower-bench {spec['suite']}`"), UNTESTED_GROUP)
    v = verdict(fa, fb, lower=lower, factor=factor, kind=spec.get("kind", "above"))
    if len(by_a) > 1 and by_a.keys() == by_b.keys() and value != "mib":  # the same seeds: how many put a ahead
        ahead = sum((by_a[k] < factor * by_b[k]) if lower else (by_a[k] > factor * by_b[k]) for k in by_a)
        v = Verdict(v.mark, f"{v.detail}; ahead on {ahead} of {len(by_a)} seeds")
    return Line(claim, source, _ours(fa, fb, value, (a, b)), v, group)


def evidence(spec: dict, page: str) -> str:
    """A link from ``page`` (a path under docs/) to the table of a claim's suite and grid."""
    held = suite_page(spec["suite"])
    target = os.path.relpath(held, (DOCS / page).parent) if held is not None else ""
    return f"[`{spec['suite']}`, grid `{spec['grid']}`]({Path(target).as_posix()}#{anchor(spec['suite'], spec['grid'])})"


def lines(paper: dict, suites: Path, records: Path) -> list[Line]:
    """Every line of one paper's checklist: its tables' pairs, its stated findings, what is untested."""
    page = paper.get("page", "")
    out: list[Line] = []
    cache: dict = {}
    for table in paper.get("table", []):
        figures = {k: float(v) for k, v in table["paper"].items()}
        group = f"{table['source']} (ours: {evidence(table, page)})"
        pairs: list[Line] = []
        for proposed in table["proposed"]:
            for other in table["paper"]:
                if other == proposed or (other in table["proposed"] and table["proposed"].index(other) < table["proposed"].index(proposed)):
                    continue
                a, b = (proposed, other) if figures[proposed] >= figures[other] else (other, proposed)
                source = f"{table['paper'][a]} % against {table['paper'][b]} %"
                against = " (a baseline the paper ranks above its method)" if a not in table["proposed"] else ""
                pairs.append(_line(f"{a} above {b}{against}", source, table, a, b, group, suites, records, cache))
        if pairs and all(p.verdict.mark == UNTESTED for p in pairs):  # a table without records: one line
            pairs = [Line(f"{table['source']}: its {len(pairs)} orderings", "", "—", pairs[0].verdict, UNTESTED_GROUP)]
        out += pairs
    for claim in paper.get("claim", []):
        line = _line(claim["text"], claim["source"], claim, claim["a"], claim["b"], FINDINGS, suites, records, cache)
        out.append(line if line.verdict.mark == UNTESTED else Line(line.claim, line.source, f"{line.ours} ({evidence(claim, page)})", line.verdict, FINDINGS))
    for item in paper.get("untested", []):
        out.append(Line(item["what"], "", "—", Verdict(UNTESTED, item["why"]), UNTESTED_GROUP))
    return out


#: The checklist's groups besides the paper's tables.
FINDINGS, UNTESTED_GROUP = "Findings the paper states", "Not tested here"


def load_claims(path: Path) -> dict[str, dict[str, Any]]:
    return tomllib.loads(path.read_text())


def checklist_markdown(name: str, claims: Path, suites: Path, records: Path) -> str:
    """Paper ``name``'s checklist: its counts, then one row per claim."""
    papers = load_claims(claims)
    if name not in papers:
        raise ValueError(f"{claims} has no paper '{name}' (it has {', '.join(papers)})")
    rows = lines(papers[name], suites, records)
    out = [f"{_summary(rows)} ({len(rows)} lines; a table without records is one line; the rule is at the end)."]
    for group in dict.fromkeys(r.group for r in rows):
        mine = [r for r in rows if r.group == group]
        out += ["", f"**{group}**", ""]
        if group == UNTESTED_GROUP:
            out += [f"- {r.claim} ({r.verdict.detail})" for r in mine]
            continue
        out += [
            f"| claim | {'paper' if group != FINDINGS else 'where the paper says it'} | ours (final, mean ± std over seeds) | mark |",
            "| --- | --- | --- | --- |",
        ]
        for r in mine:
            mark = f"**{r.verdict.mark}**" + (f" ({r.verdict.detail})" if r.verdict.detail else "")
            out.append(f"| {r.claim} | {r.source or '—'} | {r.ours} | {mark} |")
    out += ["", RULE]
    return "\n".join(out)


def _counts(rows: list[Line]) -> dict[str, int]:
    return {m: sum(r.verdict.mark == m for r in rows) for m in MARKS}


def _level(rows: list[Line]) -> int:
    """The lines that do not hold by a gap within the spread (level, not reversed)."""
    return sum(r.verdict.mark == FAILS and "within the spread" in r.verdict.detail for r in rows)


def _summary(rows: list[Line]) -> str:
    counts, level = _counts(rows), _level(rows)
    return ", ".join(f"{counts[m]} {m}" + (f" ({level} of them level within the spread)" if m == FAILS and level else "") for m in MARKS if counts[m])


def counts_markdown(claims: Path, suites: Path, records: Path, link: str = "docs/{page}") -> str:
    """The README's table: each paper's count of claims by mark, linked to its checklist."""
    out = ["| paper | " + " | ".join(MARKS) + " |", "| --- |" + " ---: |" * len(MARKS)]
    for paper in load_claims(claims).values():
        rows = lines(paper, suites, records)
        counts = _counts(rows)
        target = link.format(page=paper["page"]) + "#claims"
        level = _level(rows)
        cells = [f"{counts[m]} ({level} level)" if m == FAILS and level else str(counts[m]) for m in MARKS]
        out.append(f"| [{paper['title']}]({target}) | " + " | ".join(cells) + " |")
    return "\n".join(out)
