"""Errors before anything starts: pflower-check and pflower-sim validate the run config (and the
results-dir) without starting a SuperLink, Ray or a ServerApp."""

import pytest
from conftest import ROOT

from pflower import launcher
from pflower.check import check, main


@pytest.mark.parametrize("overrides,message", [
    ("num-rounds=5", "'num-rounds' = 5 is not allowed: unknown key; did you mean 'num-server-rounds'?"),
    ("method='fedavgg'", "'method' = 'fedavgg' is not allowed: must be one of 'apfl'"),
    ("method='fedavg' superfed.mu=5.0", "'superfed.mu' = 5.0 is not allowed: belongs to method 'superfed', but method is 'fedavg'"),
    ("lr=-0.1", "'lr' = -0.1 is not allowed: Input should be greater than 0"),
    ("results-dir='/proc/pflower-results'", "'results-dir' = '/proc/pflower-results' is not allowed: must be a directory the server can write"),
])  # fmt: skip
def test_a_bad_run_config_is_named_before_anything_starts(monkeypatch, capsys, overrides, message):
    assert message in check(ROOT, overrides)
    monkeypatch.setattr(launcher, "simulate", lambda *a, **k: pytest.fail("pflower-sim started a simulation"))
    assert launcher.main(["-c", overrides]) == 2
    assert message in capsys.readouterr().err


def test_a_valid_run_config_passes(tmp_path, capsys):
    assert check(ROOT, f"method='fedprox' fedprox.mu=0.1 results-dir='{tmp_path}'") is None
    assert main(["-c", f"num-server-rounds=3 results-dir='{tmp_path}'"]) == 0
    assert "valid" in capsys.readouterr().out


def test_the_serverapp_refuses_an_unwritable_results_dir_before_any_message(grid_factory):
    from conftest import run_config
    from flwr.app import Context, RecordDict

    from pflower.config import ConfigError
    from pflower.server_app import app

    cfg = run_config(results_dir="/proc/pflower-results")
    grid = grid_factory(cfg, 2)
    with pytest.raises(ConfigError, match="'results-dir' = '/proc/pflower-results' is not allowed: must be a directory the server can write"):
        app._main(grid, Context(1, 0, {}, RecordDict(), cfg))
    assert grid.sent == []
