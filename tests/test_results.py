"""metrics.json is standard JSON: a non-finite number never reaches it as NaN or Infinity."""

import json
import logging
import math

from pflower.results import write_json


def _strict(text: str):
    def refuse(constant):
        raise ValueError(f"{constant} is not standard JSON")

    return json.loads(text, parse_constant=refuse)


def test_non_finite_numbers_are_written_as_null_and_named(tmp_path, caplog):
    doc = {"rounds": [{"round": 1, "server-evaluation": {"loss": math.nan}, "alpha": [[1.0, math.inf]]}], "final": {"accuracy": 0.5}}
    with caplog.at_level(logging.WARNING, logger="flwr"):
        path = write_json(tmp_path / "metrics.json", doc, indent=1)
    got = _strict(path.read_text())
    assert got["rounds"][0]["server-evaluation"] == {"loss": None} and got["rounds"][0]["alpha"] == [[1.0, None]]
    assert got["final"] == {"accuracy": 0.5}
    assert "rounds[0].server-evaluation.loss" in caplog.text and "rounds[0].alpha[0][1]" in caplog.text
    assert not list(tmp_path.glob("*.tmp"))


def test_finite_documents_are_written_as_they_are(tmp_path):
    doc = {"a": [1, 2.5, None, "x"], "b": {"c": -1e300}}
    assert _strict(write_json(tmp_path / "m.json", doc).read_text()) == doc
