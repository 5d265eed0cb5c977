"""The claim checklists: one rule marks every claim from the recorded seeds (pflower/claims.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pflower import claims
from pflower.verdict import FAILS, HOLDS, NO_VERDICT, UNTESTED, WITHIN, verdict

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("a", "b", "kw", "mark"),
    [
        ([0.70, 0.72, 0.74], [0.60, 0.61, 0.62], {}, HOLDS),  # margin 0.11 > spread 0.02
        ([0.627, 0.61, 0.645], [0.626, 0.59, 0.66], {}, WITHIN),  # the cifar10-pfedla-long case: a gap under the spread
        ([0.60, 0.61, 0.62], [0.60, 0.61, 0.62], {}, FAILS),  # level: margin 0
        ([0.50, 0.51, 0.52], [0.60, 0.61, 0.62], {}, FAILS),
        ([0.7], [0.6], {}, NO_VERDICT),  # one seed gives no verdict, however large the gap
        ([0.7, 0.8], [0.6], {}, NO_VERDICT),
        ([100.0, 100.0], [190.0, 190.0], {"lower": True}, HOLDS),  # bytes: less is better, no spread
        ([100.0, 100.0], [190.0, 190.0], {"lower": True, "factor": 0.5}, FAILS),  # not under half
        ([90.0, 90.0], [190.0, 190.0], {"lower": True, "factor": 0.5}, HOLDS),
        ([0.83, 0.79, 0.87], [0.84, 0.80, 0.88], {"kind": "no-worse"}, WITHIN),  # behind by less than the spread
        ([0.60, 0.61, 0.62], [0.80, 0.81, 0.82], {"kind": "no-worse"}, FAILS),
        ([0.85, 0.86, 0.87], [0.80, 0.81, 0.82], {"kind": "no-worse"}, HOLDS),
    ],
)
def test_the_rule(a, b, kw, mark):
    assert verdict(a, b, **kw).mark == mark


def test_a_gap_within_the_spread_says_so():
    assert verdict([0.60, 0.62, 0.64], [0.61, 0.63, 0.65]).detail.endswith("within the spread")
    assert "within" not in verdict([0.50, 0.51, 0.52], [0.60, 0.61, 0.62]).detail


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "claims.toml"
    path.write_text(text)
    return path


def test_a_table_makes_each_proposed_method_a_claim_against_every_other_ordered_by_the_papers_figures(tmp_path, monkeypatch):
    figures = {"p": [0.7, 0.72], "q": [0.65, 0.66], "r": [0.8, 0.81], "s": []}
    monkeypatch.setattr(claims, "_figures", lambda suite, grid, label, value, *a: dict(enumerate(figures[label])))
    paper = claims.load_claims(
        _write(
            tmp_path,
            """
[x]
title = "X"
page = "x.md"
[[x.table]]
source = "Table 1"
suite = "s1"
grid = "g"
proposed = ["p", "q"]
paper = { r = "80", p = "70", q = "65" }
[[x.untested]]
what = "Table 9"
why = "proprietary"
""",
        )
    )["x"]
    got = [(line.claim, line.verdict.mark) for line in claims.lines(paper, Path(), Path())]
    against = " (a baseline the paper ranks above its method)"
    assert got == [(f"r above p{against}", HOLDS), ("p above q", HOLDS), (f"r above q{against}", HOLDS), ("Table 9", UNTESTED)]


def test_a_table_without_records_is_one_untested_line(tmp_path, monkeypatch):
    monkeypatch.setattr(claims, "_figures", lambda *a: {})
    paper = {"table": [{"source": "Table 2", "suite": "s9", "grid": "g", "proposed": ["p"], "paper": {"p": "1", "q": "2", "r": "3"}}]}
    [line] = claims.lines(paper, Path(), Path())
    assert line.claim == "Table 2: its 2 orderings" and line.verdict.mark == UNTESTED and "pflower-bench s9" in line.verdict.detail
    assert line.group == claims.UNTESTED_GROUP


def test_every_committed_claim_names_a_grid_and_labels_the_suites_run():
    """bench/claims.toml against bench/suites.toml: each table's and claim's labels are run by its grid."""
    papers = claims.load_claims(ROOT / "bench" / "claims.toml")
    assert set(papers) == {"pfedla", "federico", "superfed", "doublehead"}
    for paper in papers.values():
        rows = claims.lines(paper, ROOT / "bench" / "suites.toml", ROOT / "bench" / "records")
        assert rows and all(r.verdict.mark in claims.MARKS for r in rows)
        assert (ROOT / "docs" / paper["page"]).is_file()
